"""bidirl's benchmarks, one module a benchmark, run from the repository root as
``python -m bench.<name>``; ``BENCHMARKS.md`` gives each one's command and latest figures.
``bench.measure`` holds what they share (running ``bidirl train``, the commit measured)."""
