"""Benchmarks of Vigil (see bench/README.md). A package so that `python -m bench.compare` runs."""
