"""Test helpers shipped with trajkit: fake OpenAI-compatible endpoints for tests and load benchmarks."""
