"""Fixtures for every test folder."""

from tests.bench_store import tiny_store  # noqa: F401 - the bench's shared store, built once per session
