"""Fixtures shared by the agent tests: torch runs single-threaded, as each agent process does
(and as the reference must, for bit-exact comparisons on a 2-core machine)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
