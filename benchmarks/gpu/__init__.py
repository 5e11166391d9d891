"""Checks on a lent GPU (``bash benchmarks/gpu/check.sh``): equivalence and the compiled step."""
