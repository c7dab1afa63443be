"""The controller tests run in virtual time: every async test here gets looptime's event loop
through pytest-asyncio's loop-factory hook (`scenarios` module docstring).

Not looptime's own pytest plugin (off in pyproject's addopts): on Python before 3.14, with
pytest-asyncio 1.4 or later, its call hook asks the policy for the current loop before every
test, which for a synchronous test creates one and never closes it; `filterwarnings = error`
then fails whichever later test the garbage collector reports it in (unclosed event loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from tests.control import scenarios


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return scenarios.loop_factories()
