"""Benchmarks of the trajkit harness: see BENCHMARKS.md at the repository root."""
