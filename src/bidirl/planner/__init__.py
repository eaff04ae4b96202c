"""The static planner: resource envelopes, hot-switch compatibility, Algorithm 1's search.

``planner.plan.plan(scenario)`` returns a ``PlanResult``; ``scenario_with_envelope``
applies its envelope.  The entry points live in the ``plan`` module (not re-exported
here, so that ``from bidirl.planner import plan`` names the module).  Pure: imports no
torch, ray, vllm or simpy, nor the simulator (``Pools`` comes from ``bidirl.perf.scenario``).
"""
