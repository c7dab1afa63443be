"""Fixtures shared by the CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from planaria.contract import shapes
from planaria.planner import accelerators, synthetic
from planaria.spec import profile_file


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic profile of the `small` model (10 planner layers) for 2-GPU nodes, b = 2."""
    path = tmp_path_factory.mktemp("profiles") / "small.json"
    source = synthetic.synthesize(shapes.named("small"), accelerators.named("a100-80gb"), 2, 2)
    profile_file.dump_profile(source, path)
    return path
