"""Benchmarks: scripts that print figures (python -m bench.NAME)."""
