"""`planaria reference`: train a model in this one process, a check that it learns on a corpus.

    planaria reference [--model NAME] [--corpus PATH [PATH ...]] [--max-corpus-bytes N]
                       [--steps N] [--global-batch B] [--micro-batch b] [--seed S] [--lr X]
                       [--reduction {fast,exact}] [--precision {fp32,tf32,bf16}]
                       [--log-every K]

Runs the agent's reference trainer (`planaria.agent.training.reference`), the oracle that
distributed runs are compared against, and prints step, loss and samples/s every K steps, then a
summary. Without --corpus it trains on the Python standard library's sources; --reduction sums the
gradients as a job's `reduction` does (docs/numerics.md). torch is imported only inside the
handler so that `planaria --help` stays fast. User errors are ValueErrors (ReferenceCommandError
here; the planner's for an unknown model; the agent's data errors for a missing or empty
corpus), printed by `planaria.cli.main` as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from planaria.contract import shapes
from planaria.wire import messages

if TYPE_CHECKING:  # torch-heavy: imported for real only inside the handler
    from planaria.agent.training import reference

# Defaults: a demo that shows learning in about ten seconds on one CPU core (tiny on the
# standard library: loss 5.57 -> about 2.5 nats per byte in 200 steps).
DEFAULT_MODEL = "tiny"
DEFAULT_STEPS = 200
DEFAULT_GLOBAL_BATCH = 16
DEFAULT_MICRO_BATCH = 4
DEFAULT_LR = 2e-3
DEFAULT_LOG_EVERY = 20


class ReferenceCommandError(ValueError):
    """An option out of range or options that do not fit together; names the option."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "reference",
        help="train a model in one process (the reference trainer) and show that it learns",
        description="Single-process training with gradient accumulation: the oracle that "
        "distributed runs must match. Prints step, loss and samples/s, then a summary.",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME", help="named model")
    parser.add_argument(
        "--corpus",
        nargs="+",
        metavar="PATH",
        help="files or directories of text (default: the Python standard library's *.py)",
    )
    parser.add_argument(
        "--max-corpus-bytes", type=int, metavar="N", help="read at most N bytes of the corpus"
    )
    _int(parser, "--steps", "N", DEFAULT_STEPS, "training steps")
    _int(parser, "--global-batch", "B", DEFAULT_GLOBAL_BATCH, "samples per step")
    _int(parser, "--micro-batch", "b", DEFAULT_MICRO_BATCH, "samples per micro-batch, divides B")
    _int(parser, "--seed", "S", 0, "seed of the parameters and of the sample order")
    parser.add_argument(
        "--lr",
        type=float,
        default=DEFAULT_LR,
        metavar="X",
        help="AdamW learning rate",
    )
    parser.add_argument(
        "--reduction",
        choices=[r.value for r in messages.Reduction],
        default=messages.Reduction.FAST.value,
        help="how gradients are summed: fast (float32, in order) or exact (float64 sums, one "
        "rounding; docs/numerics.md)",
    )
    parser.add_argument(
        "--precision",
        choices=[p.value for p in messages.Precision],
        default=messages.Precision.FP32.value,
        help="arithmetic of forward and backward, as a job's precision (docs/numerics.md)",
    )
    _int(parser, "--log-every", "K", DEFAULT_LOG_EVERY, "print a line every K steps")
    parser.set_defaults(handler=run)


def _int(parser: argparse.ArgumentParser, flag: str, metavar: str, default: int, text: str) -> None:
    parser.add_argument(flag, type=int, default=default, metavar=metavar, help=text)


def run(args: argparse.Namespace) -> int:
    shape = shapes.named(args.model)
    _validate(args)
    # Imported here: torch takes seconds to import and only training needs it.
    from planaria.agent.training import data, model, reference, semantics

    if args.corpus is None:
        tokens = data.load_default_corpus(max_bytes=args.max_corpus_bytes)
    else:
        tokens = data.load_corpus(args.corpus, max_bytes=args.max_corpus_bytes)
    config = semantics.TrainingConfig(
        shape=shape,
        seed=args.seed,
        global_batch_size=args.global_batch,
        micro_batch_size=args.micro_batch,
        optimizer=model.OptimizerConfig(lr=args.lr),
        reduction=messages.Reduction(args.reduction),
        precision=messages.Precision(args.precision),
    )
    trainer = reference.ReferenceTrainer(config, tokens)
    print(
        f"training {shape.name} ({sum(shape.layer_parameters()):,} parameters) on "
        f"{len(tokens):,} bytes ({trainer.dataset.num_samples:,} samples of {shape.seq_len} "
        f"tokens): {args.steps} steps of {args.global_batch} samples in micro-batches of "
        f"{args.micro_batch}"
    )
    losses, elapsed_s = _train(trainer, args)
    print(_summary(losses, elapsed_s, args))
    return 0


def _validate(args: argparse.Namespace) -> None:
    for flag in ("steps", "global_batch", "micro_batch", "log_every"):
        _at_least(args, flag, 1)
    _at_least(args, "seed", 0)
    if args.max_corpus_bytes is not None:
        _at_least(args, "max_corpus_bytes", 1)
    if not args.lr > 0:
        raise ReferenceCommandError(f"--lr must be > 0 (got {args.lr})")
    if args.global_batch % args.micro_batch:
        raise ReferenceCommandError(
            f"--global-batch {args.global_batch} is not a multiple of --micro-batch "
            f"{args.micro_batch}; choose a micro-batch that divides the global batch"
        )


def _at_least(args: argparse.Namespace, name: str, minimum: int) -> None:
    value = getattr(args, name)
    if value < minimum:
        flag = "--" + name.replace("_", "-")
        raise ReferenceCommandError(f"{flag} must be >= {minimum} (got {value})")


def _train(
    trainer: reference.ReferenceTrainer, args: argparse.Namespace
) -> tuple[list[float], float]:
    """Run the steps, printing a line every --log-every steps; (losses, seconds)."""
    losses: list[float] = []
    started_s = window_started_s = time.perf_counter()
    window_first_step = 0
    for step in range(args.steps):
        losses.append(trainer.step(step))
        if (step + 1) % args.log_every and step + 1 < args.steps:
            continue
        now = time.perf_counter()
        samples = (step + 1 - window_first_step) * args.global_batch
        rate = samples / max(now - window_started_s, 1e-9)
        print(f"step {step + 1:6d}  loss {losses[-1]:.4f}  samples/s {rate:9.1f}", flush=True)
        window_started_s, window_first_step = now, step + 1
    return losses, time.perf_counter() - started_s


def _summary(losses: list[float], elapsed_s: float, args: argparse.Namespace) -> str:
    first, last = losses[0], losses[-1]
    change = (last - first) / first * 100 if first else 0.0
    rate = len(losses) * args.global_batch / max(elapsed_s, 1e-9)
    return (
        f"done: {len(losses)} steps in {elapsed_s:.1f} s ({rate:.1f} samples/s); "
        f"loss {first:.4f} -> {last:.4f} ({change:+.1f}%)"
    )
