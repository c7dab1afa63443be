"""Fixtures shared by the CLI tests; their async tests drive a controller, in virtual time
(tests/control/conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from planaria.contract import shapes
from planaria.planner import accelerators, synthetic
from planaria.spec import profile_file
from tests.control import scenarios


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return scenarios.loop_factories()


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic profile of the `small` model (10 planner layers) for 2-GPU nodes, b = 2."""
    path = tmp_path_factory.mktemp("profiles") / "small.json"
    source = synthetic.synthesize(shapes.named("small"), accelerators.named("a100-80gb"), 2, 2)
    profile_file.dump_profile(source, path)
    return path
