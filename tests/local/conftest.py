"""Fixtures of the local-mode tests: the end-to-end tests' corpus and host-memory store base
(tests/e2e/conftest.py), for the whole jobs run here."""

from tests.e2e.conftest import corpus, shm

__all__ = ["corpus", "shm"]
