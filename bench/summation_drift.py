"""How far float summation order alone moves training: the envelope "exact" comparisons live in.

    .venv/bin/python bench/summation_drift.py [--steps 6,12,18,24] [--eps 1e-6]
                                              [--out bench/results/summation_drift.json]

Trains the fault-free reference trainer (the tiny GPT, global batch 4, AdamW) twice in this
process, once with micro-batches of 1 sample and once of 2: the same samples and the same
mathematics, the gradients only summed in another grouping. After each given number of steps it
reports the largest relative difference, in norm, of any parameter tensor of any layer:
||a - b|| / ||b||. The lossless tests once compared a distributed run with the reference at 1e-5
relative; this showed for how many steps that bound separated a correct run (summation order
only) from a lost or repeated step (about 1e-3 and up), and why the tests now train in exact
reduction mode and compare bit for bit (docs/numerics.md). Adam divides by the root of the
second moment, so elements whose gradients are near zero turn rounding noise into full-size
updates, and the difference grows by roughly an order of magnitude every few steps.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from planaria.agent.runtime import runtime_states
from planaria.agent.training import data
from planaria.wire import messages

GLOBAL_BATCH = 4


def settings(corpus: Path, eps: float) -> messages.TrainingSettings:
    """The tiny model as the end-to-end tests train it (tests/e2e/local_job.training)."""
    return messages.TrainingSettings(
        model="tiny",
        seed=5,
        optimizer=messages.OptimizerSettings(lr=3e-3, eps=eps),
        global_batch_size=GLOBAL_BATCH,
        data=messages.DataSettings(corpus_paths=(str(corpus),)),
        device=messages.Device.CPU,
        snapshot_interval_steps=0,
        redundancy=messages.RedundancyMode.NONE,
    )


def drift(training: messages.TrainingSettings, steps: int) -> float:
    """The largest relative norm difference between the two groupings after `steps`."""
    one, _ = runtime_states.reference_states(training, 1, steps)
    two, _ = runtime_states.reference_states(training, 2, steps)
    return max(
        float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))
        for layer in one
        for a, b in zip(one[layer].parameters, two[layer].parameters, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="6,12,18,24", help="comma-separated step counts")
    parser.add_argument("--eps", type=float, default=1e-6, help="AdamW eps (the tests use 1e-6)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/summation_drift.json"))
    args = parser.parse_args()
    counts = sorted({int(s) for s in args.steps.split(",")})
    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / "corpus.txt"
        corpus.write_bytes(data.load_default_corpus(max_bytes=100_000).tobytes())
        training = settings(corpus, args.eps)
        rows = [{"steps": n, "max_relative_difference": drift(training, n)} for n in counts]
    print(f"{'steps':>6} {'max ||a-b||/||b||':>18}")
    for row in rows:
        print(f"{row['steps']:>6} {row['max_relative_difference']:>18.2e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"eps": args.eps, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
