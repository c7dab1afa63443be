"""Fixtures of the end-to-end tests: a small text corpus and a fresh host-memory store base."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from planaria.agent.training import data


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """100 kB of the standard library's source, the agents' training text."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_bytes(data.load_default_corpus(max_bytes=100_000).tobytes())
    return path


@pytest.fixture
def shm() -> Iterator[Path]:
    """A snapshot base under /dev/shm of this test's own, removed afterwards."""
    base = Path("/dev/shm") / f"planaria-e2e-{uuid.uuid4().hex[:8]}"
    yield base
    shutil.rmtree(base, ignore_errors=True)
