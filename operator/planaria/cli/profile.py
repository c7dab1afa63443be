"""`planaria profile`: write a profile file (measured here, or synthetic), or check one.

    planaria profile --model NAME --micro-batch B --out FILE [--repeats R] [--warmup W]
                     [--device DEV] [--precision {fp32,tf32,bf16}]
    planaria profile --synthetic MODEL --accelerator NAME --micro-batch B [--gpus-per-node M]
                     [--precision {fp32,tf32,bf16}] --out FILE
    planaria profile --check FILE

Each mode's required options are checked before anything runs, all at once, as argparse's own
usage error (exit status 2): argparse cannot make an option required only in one mode.
--precision is the arithmetic the profile is for, the job's `precision`: measuring runs in it
(default fp32, a job's default), a synthetic profile models it (default bf16, what GPU clusters
train in); a job refuses a profile of another precision. Measuring runs the agent's profiler
(torch) on this machine; it is imported only when measuring because torch is slow to import.
Synthetic profiles come from `planaria.planner.synthetic`.
Every user error is a ValueError (ProfileCommandError here, or the planner's and the file
format's), which `planaria.cli.main` prints as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from planaria.cli import tables
from planaria.contract import precision as arithmetic
from planaria.contract import profile as planner_profile
from planaria.contract import shapes
from planaria.planner import accelerators, synthetic
from planaria.spec import profile_file

DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 2
# What each mode (the dest of its flag) needs besides itself.
NEEDS: dict[str, tuple[str, ...]] = {
    "model": ("--micro-batch", "--out"),
    "synthetic": ("--accelerator", "--micro-batch", "--out"),
    "check": (),
}
USAGE = (
    "%(prog)s [-h] --model NAME --micro-batch B --out FILE [--repeats R] [--warmup W] "
    "[--device DEV] [--precision P]\n"
    "       %(prog)s [-h] --synthetic MODEL --accelerator NAME --micro-batch B --out FILE "
    "[--gpus-per-node M] [--precision P]\n"
    "       %(prog)s [-h] --check FILE"
)


class ProfileCommandError(ValueError):
    """Options that do not fit together or are out of range; the message names the option."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="measure, synthesise or check a profile file (per-layer costs for the planner)",
        description="Write a profile of a model (measured on this machine, or analytic for a "
        "named accelerator), or validate an existing profile file.",
        usage=USAGE,
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--model", metavar="NAME", help="measure this named model on this machine")
    mode.add_argument("--synthetic", metavar="MODEL", help="compute an analytic profile")
    mode.add_argument("--check", metavar="FILE", help="validate a profile file and summarise it")
    parser.add_argument("--micro-batch", metavar="B", help="micro-batch size (sequences), >= 1")
    parser.add_argument("--out", metavar="FILE", help="where to write the profile (JSON)")
    known = ", ".join(sorted(accelerators.NAMED_ACCELERATORS))
    parser.add_argument("--accelerator", metavar="NAME", help=f"with --synthetic: one of {known}")
    parser.add_argument(
        "--gpus-per-node",
        metavar="M",
        help="with --synthetic: GPUs per node, the widest stage costed (default: the "
        "accelerator's usual node)",
    )
    parser.add_argument(
        "--repeats",
        metavar="R",
        help=f"with --model: timed runs per layer (default: {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--warmup",
        metavar="W",
        help=f"with --model: untimed runs first (default: {DEFAULT_WARMUP})",
    )
    parser.add_argument("--device", metavar="DEV", help="with --model: torch device (default: cpu)")
    parser.add_argument(
        "--precision",
        choices=[p.value for p in arithmetic.Precision],
        help="with --model or --synthetic: the job's precision, measured in or modelled "
        "(default: fp32 when measuring, as a job; bf16 for --synthetic, as GPU clusters train; "
        "docs/numerics.md)",
    )
    parser.set_defaults(handler=functools.partial(run, parser=parser))


def run(args: argparse.Namespace, *, parser: argparse.ArgumentParser) -> int:
    """Check the mode's required options (a usage error naming all missing ones), then run it."""
    mode = next(m for m in NEEDS if getattr(args, m) is not None)
    missing = [flag for flag in NEEDS[mode] if getattr(args, flag[2:].replace("-", "_")) is None]
    if missing:
        parser.error(f"the following arguments are required with --{mode}: {', '.join(missing)}")
    if args.check is not None:
        return _check(args)
    if args.synthetic is not None:
        return _synthesize(args)
    return _measure(args)


def _check(args: argparse.Namespace) -> int:
    _reject(
        args,
        (
            "micro_batch",
            "out",
            "accelerator",
            "gpus_per_node",
            "repeats",
            "warmup",
            "device",
            "precision",
        ),
    )
    document = profile_file.read_profile_file(args.check)
    print(f"{args.check}: a valid planaria profile (format version {profile_file.VERSION})")
    print(summarize(document.profile))
    if document.assumptions:
        print(f"assumptions: {document.assumptions}")
    return 0


def _synthesize(args: argparse.Namespace) -> int:
    _reject(args, ("repeats", "warmup", "device"))
    shape = shapes.named(args.synthetic)
    accelerator = accelerators.named(args.accelerator)
    micro_batch = _positive(args.micro_batch, "--micro-batch")
    gpus = _positive(args.gpus_per_node, "--gpus-per-node", accelerator.default_gpus_per_node)
    out: str = args.out
    chosen = _precision(args, arithmetic.Precision.BF16)
    result = synthetic.synthesize(shape, accelerator, micro_batch, gpus, chosen)
    text = synthetic.assumptions(accelerator, gpus, chosen)
    profile_file.dump_profile(result, out, assumptions=text)
    print(summarize(result))
    print(f"wrote {out}")
    return 0


def _measure(args: argparse.Namespace) -> int:
    _reject(args, ("accelerator", "gpus_per_node"))
    shape = shapes.named(args.model)
    micro_batch = _positive(args.micro_batch, "--micro-batch")
    repeats = _positive(args.repeats, "--repeats", DEFAULT_REPEATS)
    warmup = _count(args.warmup, "--warmup", DEFAULT_WARMUP)
    device: str = args.device or "cpu"
    out: str = args.out
    # Imported here: torch takes seconds to import and only measuring needs it.
    from planaria.agent.execution import profiler

    chosen = _precision(args, arithmetic.Precision.FP32)
    result = profiler.measure_profile(
        shape, micro_batch, warmup=warmup, repeats=repeats, device=device, arithmetic=chosen
    )
    note = (
        f"Measured by planaria profile on {device} in {chosen}: {warmup} warm-up and {repeats} "
        "timed runs."
    )
    profile_file.dump_profile(result, out, assumptions=note)
    print(summarize(result))
    print(f"wrote {out}")
    return 0


def _precision(args: argparse.Namespace, default: arithmetic.Precision) -> arithmetic.Precision:
    return arithmetic.Precision(args.precision or default)


def _reject(args: argparse.Namespace, options: Sequence[str]) -> None:
    mode = "--check" if args.check else "--synthetic" if args.synthetic else "--model"
    for option in options:
        if getattr(args, option) is not None:
            flag = "--" + option.replace("_", "-")
            raise ProfileCommandError(f"{flag} does not apply to {mode}; leave it out")


def _positive(value: str | None, flag: str, default: int | None = None) -> int:
    number = _whole(value, flag, default)
    if number < 1:
        raise ProfileCommandError(f"{flag} must be >= 1 (got {number})")
    return number


def _count(value: str | None, flag: str, default: int) -> int:
    number = _whole(value, flag, default)
    if number < 0:
        raise ProfileCommandError(f"{flag} must be >= 0 (got {number})")
    return number


def _whole(value: str | None, flag: str, default: int | None) -> int:
    if value is None:
        assert default is not None, f"{flag} is required (NEEDS) and was checked by run"
        return default
    try:
        return int(value)
    except ValueError:
        raise ProfileCommandError(f"{flag} must be a whole number (got {value!r})") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Group:
    """Consecutive layers sharing a name stem (block.0 .. block.31), summarised as one row."""

    label: str
    layers: tuple[planner_profile.LayerProfile, ...]


def _stem(name: str) -> str:
    return re.sub(r"[._-]?\d+$", "", name)


def _groups(layers: Sequence[planner_profile.LayerProfile]) -> list[_Group]:
    runs: list[list[planner_profile.LayerProfile]] = []
    for layer in layers:
        if runs and _stem(runs[-1][-1].name) == _stem(layer.name):
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return [
        _Group(
            label=run[0].name if len(run) == 1 else f"{run[0].name} .. {run[-1].name}",
            layers=tuple(run),
        )
        for run in runs
    ]


def summarize(result: planner_profile.Profile) -> str:
    """A short table: layer groups (per-layer means), totals, and the profile's context."""
    m = result.max_gpus_per_stage
    widest = f"fwd {m} GPUs" if m > 1 else "fwd 1 GPU"
    header = ("layers", "count", "fwd 1 GPU", "bwd 1 GPU", widest, "state", "activations")
    rows = [_row(group.label, group.layers, m, mean=True) for group in _groups(result.layers)]
    rows.append(_row("total", result.layers, m, mean=False))
    lines = tables.render(header, rows, right=range(1, len(header)))
    lines.append(_context(result))
    return "\n".join(lines)


def _row(
    label: str, layers: Sequence[planner_profile.LayerProfile], m: int, *, mean: bool
) -> tuple[str, ...]:
    scale = 1 / len(layers) if mean else 1.0
    return (
        label,
        str(len(layers)),
        _seconds(scale * sum(layer.forward_s[0] for layer in layers)),
        _seconds(scale * sum(layer.backward_s[0] for layer in layers)),
        _seconds(scale * sum(layer.forward_s[m - 1] for layer in layers)),
        _bytes(scale * sum(layer.state_bytes for layer in layers)),
        _bytes(scale * sum(layer.activation_bytes for layer in layers)),
    )


def _context(result: planner_profile.Profile) -> str:
    kind = "synthetic" if result.synthetic else "measured"
    shape = shapes.NAMED_SHAPES.get(result.model)
    params = ""
    if shape is not None and shape.num_planner_layers == result.num_layers:
        params = f", {_parameters(sum(shape.layer_parameters()))} parameters"
    return (
        f"{kind} {result.precision} profile of {result.model}{params} on {result.accelerator}: "
        "micro-batch "
        f"{result.micro_batch_size}, 1..{result.max_gpus_per_stage} GPUs per stage, "
        f"{_bytes(result.memory_bytes)} per GPU (rows of several layers show per-layer means)"
    )


def _parameters(count: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return str(count)


def _seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"
