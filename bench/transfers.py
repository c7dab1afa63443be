"""Benchmark: bytes moved by the min-cost matching against naive assignments of survivors.

Random reconfigurations of a GPT-3 2.7B synthetic profile (34 planner layers, A100-40GB): a
running DP x PP plan (symmetric, DP 2..8, PP 2..6, even split with the remainder placed at
random), 1..3 failed workers, and a new layout drawn from the candidate search's DP/PP
configurations (Odyssey Alg. 1) with its layer split's remainder placed at random. Each new
layout is bound to the survivors three ways:

- matched: `transfers.match`, Kuhn-Munkres per node (Odyssey §IV-B);
- identity: the layout's roles, in pipeline and stage order, to the survivors in worker order
  (what restarting with ranks in order does);
- greedy: each role, in order, to the unbound survivor holding the most of its bytes.

Prints, per GPUs per node, the mean bytes received per reconfiguration and the matched share of
each baseline, how often the matching strictly beats identity, how often any baseline beat the
matching (must be 0), and the milliseconds per trial (all three bindings with their transfer
lists and times). Writes bench/results/transfers.json.

    .venv/bin/python bench/transfers.py [--trials N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from planaria.contract import plan, profile, shapes
from planaria.planner import accelerators, candidates, distribution, synthetic, transfers

RESULTS = Path(__file__).parent / "results" / "transfers.json"
GIB = 2**30


def running_plan(rng: random.Random, num_layers: int, gpus: int) -> plan.Plan:
    dp, pp = rng.randint(2, 8), rng.randint(2, 6)
    counts = rng.choice(list(distribution.remainder_placements(num_layers, pp)))
    pipelines = [
        distribution.pipeline_of(counts, [plan.WorkerId(p * pp + s) for s in range(pp)], 4)
        for p in range(dp)
    ]
    return plan.Plan(pipelines=tuple(pipelines), micro_batch_size=1, gpus_per_node=gpus)


def new_layout(rng: random.Random, old: plan.Plan, survivors: list[plan.WorkerId]) -> plan.Plan:
    """A random configuration of the search, laid out on the survivors in worker order."""
    options = candidates.configurations(
        len(survivors), len(old.pipelines), old.num_layers, old.num_micro_batches, dp_radius=2
    )
    depths = rng.choice(options)
    pipelines, used = [], 0
    for depth in depths:
        counts = rng.choice(list(distribution.remainder_placements(old.num_layers, depth)))
        pipelines.append(distribution.pipeline_of(counts, survivors[used : used + depth], 1))
        used += depth
    shares = [1] * len(pipelines)
    for i in range(old.num_micro_batches - len(pipelines)):
        shares[i % len(pipelines)] += 1
    return plan.Plan(
        pipelines=tuple(
            plan.Pipeline(stages=p.stages, num_micro_batches=n)
            for p, n in zip(pipelines, shares, strict=True)
        ),
        micro_batch_size=1,
        gpus_per_node=old.gpus_per_node,
    )


def greedy(
    held: transfers.Holdings, layout: plan.Plan, prof: profile.Profile
) -> dict[plan.WorkerId, plan.WorkerId]:
    """Each role in order to the free survivor already holding the most of its bytes, kept
    within one node per layout node (so the plan stays valid with several GPUs per node)."""
    sizes = [transfers.moved_bytes(layer) for layer in prof.layers]
    free = list(held)
    node_of: dict[int, int] = {}
    binding: dict[plan.WorkerId, plan.WorkerId] = {}
    gpus = layout.gpus_per_node
    for worker, role in transfers.roles(layout).items():
        allowed = [
            s
            for s in free
            if node_of.get(worker // gpus, s // gpus) == s // gpus
            and (worker // gpus in node_of or s // gpus not in node_of.values())
        ]
        best = max(allowed, key=lambda s: (sum(sizes[i] for i in role & held[s]), -s))
        binding[worker] = best
        node_of[worker // gpus] = best // gpus
        free.remove(best)
    return binding


def trial(rng: random.Random, prof: profile.Profile, gpus: int) -> dict[str, float] | None:
    old = running_plan(rng, prof.num_layers, gpus)
    failed = set(rng.sample(list(old.workers), rng.randint(1, 3)))
    held = transfers.holdings(old, failed)
    layout = new_layout(rng, old, list(held))
    overheads = transfers.Overheads()
    identity = {w: w for w in layout.workers}
    try:
        ways = {
            "matched": transfers.replan(held, layout, prof, overheads),
            "identity": transfers.replan(held, layout, prof, overheads, binding=identity),
            "greedy": transfers.replan(
                held, layout, prof, overheads, binding=greedy(held, layout, prof)
            ),
        }
    except ValueError:  # greedy found no node-consistent survivor for a role
        return None
    result = {f"{k}_bytes": float(v.moved_bytes) for k, v in ways.items()}
    result.update({f"{k}_s": v.transfer_s for k, v in ways.items()})
    result["workers"] = float(len(old.workers))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    prof = synthetic.synthesize(shapes.named("gpt3-2.7b"), accelerators.named("a100-40gb"), 1, 1)
    report = {}
    print(
        f"{'GPUs/node':>9} {'trials':>6} {'matched GiB':>11} {'identity GiB':>12} "
        f"{'greedy GiB':>10} {'vs identity':>11} {'vs greedy':>9} {'beats id':>8} "
        f"{'worse':>5} {'ms/trial':>8}"
    )
    for gpus in (1, 2, 4):
        rng = random.Random(args.seed * 100 + gpus)
        rows: list[dict[str, float]] = []
        start = time.perf_counter()
        while len(rows) < args.trials:
            row = trial(rng, prof, gpus)
            if row is not None:
                rows.append(row)
        elapsed_ms = (time.perf_counter() - start) * 1e3 / len(rows)
        summary = summarise(rows)
        summary["ms_per_trial_three_bindings"] = elapsed_ms
        report[f"gpus_per_node_{gpus}"] = summary
        print(
            f"{gpus:>9} {len(rows):>6} {summary['matched_gib']:>11.2f} "
            f"{summary['identity_gib']:>12.2f} {summary['greedy_gib']:>10.2f} "
            f"{summary['matched_over_identity']:>11.3f} {summary['matched_over_greedy']:>9.3f} "
            f"{summary['strictly_fewer_than_identity']:>8.0%} {summary['baseline_better']:>5} "
            f"{elapsed_ms:>8.1f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"seed": args.seed, "profile": prof.model, **report}, indent=2))
    print(f"wrote {RESULTS}")


def summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    mean = {
        k: statistics.fmean(r[f"{k}_bytes"] for r in rows)
        for k in ("matched", "identity", "greedy")
    }
    return {
        "trials": len(rows),
        "matched_gib": mean["matched"] / GIB,
        "identity_gib": mean["identity"] / GIB,
        "greedy_gib": mean["greedy"] / GIB,
        "matched_over_identity": mean["matched"] / mean["identity"],
        "matched_over_greedy": mean["matched"] / mean["greedy"],
        "strictly_fewer_than_identity": sum(r["matched_bytes"] < r["identity_bytes"] for r in rows)
        / len(rows),
        "baseline_better": sum(
            r["matched_bytes"] > min(r["identity_bytes"], r["greedy_bytes"]) for r in rows
        ),
        "mean_transfer_s_matched": statistics.fmean(r["matched_s"] for r in rows),
        "mean_transfer_s_identity": statistics.fmean(r["identity_s"] for r in rows),
    }


if __name__ == "__main__":
    main()
