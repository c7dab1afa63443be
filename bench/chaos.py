"""Randomized fault trials on the local backend, and the table issue #10 asks for.

    .venv/bin/python -m bench.chaos --trials 100 [--seed 0] [--jobs 1] [--kind K] [--json PATH]
                                    [--keep] [--config data|pipeline|demo]

Trial i runs seed `--seed + i` (`tests/chaos/trials.py`: one seeded fault schedule against the
controller core, a LocalBackend and real agent processes training the tiny GPT with gloo) and
checks its invariant: Succeeded bitwise equal to the fault-free reference (the trials train in
exact reduction mode), or Suspended with a clear message and a persistent checkpoint equal to
the reference at its step; no hang past the bound; no leaked process or shared-memory store.
`--jobs` trials run at once in separate processes (on 2 cores, 1 keeps the heartbeat timings
honest). A trial that breaks the invariant is printed with its seed at once; replay it alone
with `--trials 1 --seed S --keep` (its run directory, with the controller's log and every
worker's, is kept and printed). `--kind K` runs only the seeds whose drawn kind is K: the first
`--trials` of them from `--seed` on, each with the schedule it has in a mixed run, so a seed
replays the same either way. Partition seeds need network namespaces (root, iproute2:
`tests/chaos/netns.py`); where there are none they are left out, and the run says so. `--kind
controller` runs `tests/chaos/controller_kill.py`'s trials instead (`planaria run` SIGKILLed at
a seeded moment and run again; seeds taken in order, never part of a mixed run: each starts two
controllers).

`--config pipeline` runs the trials' pipeline job instead of the data-parallel one (6 workers,
two pipelines of 2-4 stages, the policy drawn per seed from adaptive, reroute and dynamic:
`schedule.Config`); the table then has a row per policy too.

Printed: one line per trial, then per fault kind: trials, faults injected, Succeeded (survived),
Suspended with a checkpoint, Suspended without one (no checkpoint written yet), resumed (went
through Suspended and came back: no breach, but a suspension the faults may not have needed),
Failed, hangs,
differing elements (layer states against the reference, summed over the trials: any is a
breach), leaked processes, leaked segments and leaked network namespaces or links (partitions),
and the mean trial seconds.
`--json` writes every trial's record and the totals.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.chaos import controller_kill, netns, schedule, trials

SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
COLUMNS = (
    "kind",
    "trials",
    "faults",
    "survived",
    "susp+ckpt",
    "susp-ckpt",
    "resumed",
    "failed",
    "hangs",
    "differing",
    "leak-pids",
    "leak-shm",
    "leak-net",
    "mean s",
)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="how many trials (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="the first trial's seed")
    parser.add_argument("--jobs", type=int, default=1, help="trials at once (processes)")
    parser.add_argument("--json", type=Path, default=None, help="write the records here")
    parser.add_argument("--keep", action="store_true", help="keep every trial's run directory")
    parser.add_argument("--root", type=Path, default=None, help="run directories go here")
    kinds = [k.value for k in schedule.Kind]
    parser.add_argument("--kind", choices=kinds, default=None, help="only seeds of this kind")
    configs = [c.value for c in schedule.Config]
    parser.add_argument(
        "--config", choices=configs, default="data", help="the job the trials run (default data)"
    )
    args = parser.parse_args(argv)
    if args.trials < 1 or args.jobs < 1:
        parser.error("--trials and --jobs must be >= 1")
    return args


def one_trial(
    seed: int, root: Path, corpus: Path, keep: bool, kind: str | None = None, config: str = "data"
) -> dict[str, object]:
    """Run one trial of job `config` in this process; its record as plain data (`TrialResult`
    fields)."""
    workdir = root / f"seed-{seed}"
    shm = SHM / f"planaria-chaos-{seed}-{uuid.uuid4().hex[:8]}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = logging.FileHandler(workdir / "controller.log")
    log.setFormatter(logging.Formatter("%(relativeCreated)8.0f ms %(name)s %(message)s"))
    planaria = logging.getLogger("planaria")
    planaria.setLevel(logging.INFO)
    planaria.addHandler(log)
    try:
        if kind == schedule.Kind.CONTROLLER:
            shape = schedule.SHAPES[schedule.Config(config)]
            trial = controller_kill.run_trial(seed, workdir, shm, shape=shape, corpus=corpus)
            result = asyncio.run(trial)
        else:
            job = schedule.Config(config)
            result = asyncio.run(trials.run_trial(seed, workdir, shm, corpus=corpus, config=job))
    finally:
        planaria.removeHandler(log)
        log.close()
    if result.problems or keep:
        print(result.describe(), f"\n  run directory: {workdir}", flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    record = dataclasses.asdict(result)
    record["describe"] = result.describe()
    record["injected"] = result.injected
    return record


def _run(args: argparse.Namespace, root: Path) -> list[dict[str, object]]:
    corpus = trials.write_corpus(root)
    seeds = chosen_seeds(args.seed, args.trials, args.kind, schedule.Config(args.config))
    context = multiprocessing.get_context("spawn")  # no torch or asyncio state forked
    records = []
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        futures = [
            pool.submit(one_trial, s, root, corpus, args.keep, args.kind, args.config)
            for s in seeds
        ]
        try:
            for future in concurrent.futures.as_completed(futures):
                records.append(future.result())
                print(_line(records[-1], len(records), args.trials), flush=True)
        except KeyboardInterrupt:  # Ctrl-C reaches the workers too: their trials shut down
            pool.shutdown(cancel_futures=True)
            raise
    return sorted(records, key=lambda r: int(str(r["seed"])))


def chosen_seeds(
    first: int, count: int, kind: str | None, config: schedule.Config = schedule.Config.DATA
) -> list[int]:
    """`count` seeds from `first` on: every one, or those whose drawn kind (in job `config`)
    is `kind`; partition seeds are left out (with a note) where network namespaces cannot be
    made."""
    missing = netns.unavailable()
    if missing and kind == schedule.Kind.PARTITION:
        raise SystemExit(f"bench.chaos: partition trials cannot run here: {missing}")
    if kind == schedule.Kind.CONTROLLER:  # its own draw (controller_kill.draw): every seed
        return list(range(first, first + count))
    seeds: list[int] = []
    seed = first
    while len(seeds) < count:
        drawn = schedule.draw(seed, schedule.SHAPES[config]).kind
        if (kind is None or drawn == kind) and not (missing and drawn is schedule.Kind.PARTITION):
            seeds.append(seed)
        elif missing and drawn is schedule.Kind.PARTITION and kind is None:
            print(f"seed {seed} (partition) left out: {missing}", flush=True)
        seed += 1
    return seeds


def _line(record: dict[str, object], done: int, total: int) -> str:
    verdict = "ok" if not record["problems"] else "BROKEN"
    job = f"{record['config']} {record['first_plan'] or '-'} {record['policy']}"
    return (
        f"[{done}/{total}] seed {record['seed']} {record['kind']} ({job}): {record['outcome']} "
        f"{record['wall_s']:.1f}s {verdict}"
    )


def summarize(records: Iterable[dict[str, object]]) -> dict[str, dict[str, float]]:
    """Per fault kind, per policy where a run drew several ("policy adaptive"), and in total:
    the table's counts (COLUMNS)."""
    records = list(records)
    policies = {r.get("policy", "dynamic") for r in records}
    rows: dict[str, dict[str, float]] = {}
    for record in records:
        keys = [str(record["kind"]), "all"]
        if len(policies) > 1:
            keys.insert(1, f"policy {record['policy']}")
        for key in keys:
            row = rows.setdefault(key, dict.fromkeys(COLUMNS[1:], 0.0))
            _count(row, record)
    for row in rows.values():
        row["mean s"] = row["mean s"] / max(1.0, row["trials"])
    return rows


def _count(row: dict[str, float], record: dict[str, object]) -> None:
    outcome, checkpoint = record["outcome"], record["checkpoint_step"]
    row["trials"] += 1
    row["faults"] += float(str(record["injected"]))
    row["survived"] += outcome == "Succeeded"
    row["susp+ckpt"] += outcome == "Suspended" and checkpoint is not None
    row["susp-ckpt"] += outcome == "Suspended" and checkpoint is None
    row["resumed"] += "resume" in [str(m) for m in record["moves"]]  # type: ignore[attr-defined]
    row["failed"] += outcome == "Failed"
    row["hangs"] += outcome == "Hung"
    differing = record["differing"]  # None: not compared (the outcome's problem says why)
    row["differing"] += differing if isinstance(differing, int) else 0
    row["leak-pids"] += len(record["leaked_pids"])  # type: ignore[arg-type]
    row["leak-shm"] += len(record["leaked_shm"])  # type: ignore[arg-type]
    row["leak-net"] += len(record["leaked_net"])  # type: ignore[arg-type]
    row["mean s"] += float(str(record["wall_s"]))


def table(rows: dict[str, dict[str, float]]) -> str:
    """The summary as a Markdown table, the kinds in `schedule.Kind` order, then any other kind
    the records named (e.g. tests/chaos/controller_kill.py's), then all."""
    known = [k.value for k in schedule.Kind if k.value in rows]
    order = known + sorted(set(rows) - {*known, "all"}) + ["all"]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for kind in order:
        row = rows[kind]
        cells = [f"{row[c]:.1f}" if c == "mean s" else f"{row[c]:g}" for c in COLUMNS[1:]]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    root = args.root or Path(tempfile.mkdtemp(prefix="planaria-chaos-"))
    started = time.monotonic()
    records = _run(args, root)
    rows = summarize(records)
    print(table(rows))
    broken = [r for r in records if r["problems"]]
    for record in broken:
        print(record["describe"])
    elapsed = time.monotonic() - started
    print(f"{len(records)} trials in {elapsed:.0f} s; {len(broken)} broke the invariant")
    if args.json is not None:
        machine = f"{platform.node()} {platform.machine()} {os.cpu_count()} cores"
        summary = {"command": sys.argv, "machine": machine, "elapsed_s": elapsed, "rows": rows}
        args.json.write_text(json.dumps({"summary": summary, "trials": records}, indent=1))
    if not args.keep and not broken:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
