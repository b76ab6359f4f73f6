"""Benchmarks of where a job's predictions go."""
