"""Fixtures for the evaluation tests: a copy of the bench's store (the offline hub settings and the shipped tiny
model are in tests/conftest.py, for every folder)."""

from tests.bench_store import store_copy  # noqa: F401 - a private copy of the bench's shared store
