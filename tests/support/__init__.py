"""Helpers for the tests and benchmarks: ports and waits, node harness, command builders, test actors."""
