"""The benchmark suite: one script per claim of docs/results/, grouped by what it measures.

Run a script as a module from the repository root (``python -m benchmarks.engine.trees --help``)
or every claim of a group with ``python -m benchmarks run GROUP``; benchmarks/README.md lists them.
"""
