"""Benchmarks: `make bench` runs them; see README.md."""
