"""Fixtures shared by the operator tests: `corpus`, a small corpus file for the e2e jobs. The
real control plane's fixtures are in tests/kube/real/conftest.py."""

import pathlib

import pytest

from planaria.agent.training import data


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A small corpus file for the operator e2e jobs (`operating.e2e_spec`)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_bytes(data.load_default_corpus(max_bytes=100_000).tobytes())
    return path
