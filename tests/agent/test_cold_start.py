"""A fresh agent process's one-time costs (planaria.agent.recovery.cold_start).

Covers: after `warm_up`, building a layer's AdamW and stepping it imports nothing more (the
first optimizer of a process imports torch._dynamo and sympy: seconds under load, inside a
scale-up's set-up before the warm-up); without it, that first optimizer imports hundreds of
modules. Each case runs in a fresh interpreter, as an agent process starts.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# Prints how many modules the first optimizer of a layer imports, after an optional warm-up.
_PROBE = """
import sys
from planaria.agent.recovery import cold_start
from planaria.agent.training import model
from planaria.contract import shapes
if sys.argv[1] == "warm":
    cold_start.warm_up()
before = set(sys.modules)
layer = model.build_layer(shapes.named("tiny"), 0, 1)
optimizer = model.make_optimizer(layer, model.OptimizerConfig())
sum(p.sum() for p in layer.parameters()).backward()
optimizer.step()
print(len(set(sys.modules) - before))
"""


def _imported(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip())


@pytest.mark.parametrize(
    ("mode", "imports_more"),
    [("warm", False), ("cold", True)],
    ids=["after the warm-up a layer's first optimizer imports nothing", "without it, hundreds"],
)
def test_the_warm_up_imports_what_the_first_optimizer_needs(mode: str, imports_more: bool) -> None:
    imported = _imported(mode)
    assert (imported > 100) is imports_more and (imported == 0) is not imports_more, imported
