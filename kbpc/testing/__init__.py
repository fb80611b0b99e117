"""Helpers for the test suite and the kernel benchmarks (GPU harness, comparisons)."""
