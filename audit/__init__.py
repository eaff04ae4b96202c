"""Audits of behaviour rather than speed: the bad-input table (``python -m audit.bad_inputs``).

Kept apart from ``bench/`` (which measures how fast bidirl is) because it checks how bidirl
fails: every case is a command line whose end is classified, and ``tests/test_bad_inputs.py``
runs a fast subset of the same cases.
"""
