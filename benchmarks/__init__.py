"""Benchmarks of Sea for workflows against plain Nipype, run as ``python -m benchmarks.run``."""
