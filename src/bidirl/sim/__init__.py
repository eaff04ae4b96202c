"""Discrete-event simulator of a GPU cluster running BiDiRL's controller (SimPy).

``bidirl.sim.run.simulate`` is the entry point.
"""
