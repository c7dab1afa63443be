"""Benchmark: what exact gradient reduction costs against fast, and how often its condition fails.

Exact mode (`messages.Reduction.EXACT`, planaria.agent.training.reduction) sums each micro-batch's
float32 gradient into a float64 sum, all-reduces float64 buckets and computes with one intra-op
thread; fast mode sums float32 gradients in plan order. On model `small` (global batch 32 of
micro-batches of 4, so 8 per step), this measures, on the real code path:

1. Step time, per plan (data parallel 2x1, a symmetric 2x2 pipeline plan, the 2x2 plan with its
   failed stage rerouted to the peer), on worker processes of `local_cluster.LocalCluster` (gloo on
   loopback, one torch thread per worker, so exact mode's thread pin changes nothing there).
   Rounds of one fast and one exact run of each plan in the same cluster, alternating which
   comes first (AB, BA, AB, ...). A run's step time is the harness's per-step wall time
   (`RunResult.step_s`, measured by the executor around `run_step`): per worker the median
   after WARMUP_STEPS, the slowest worker's is the run's. Wall time on a shared machine is
   noisy, so each run's CPU seconds per step are taken too: the user and system CPU time
   (/proc/PID/stat) of the plan's workers over the whole run, divided by its steps (the epoch's
   set-up and the warm-up steps included, alike in both modes). Reported: the medians over
   rounds of each mode and the medians over rounds of the exact / fast ratios. Also, in this
   process, a reference trainer's step: CPU seconds fast vs exact, both with one thread (the
   float64 sums' own cost), and wall seconds of fast with every core vs exact (pinned to one
   thread), each the median over steps of the step's ratio.
2. Memory, computed from parameter counts (torch's CPU tensors are invisible to tracemalloc).
   From a step's first backward to its optimizer step exact mode holds a float64 sum per
   parameter where fast mode holds a float32 gradient: 4 bytes more per parameter held. At the
   end of each backward (the fresh float32 gradients beside the sums, before `absorb`) and
   during an all-reduce of everything held (float64 sums and bucket against float32 gradients
   and bucket) it is 8 bytes more. So a step's peak grows by 4 to 8 bytes per parameter
   held: 4 where the peak is the activations at the end of a forward. An all-reduce moves 8
   bytes per element instead of 4. Measured beside it, for the reference trainer (whole model,
   one process): the rise of peak RSS over a few steps above the RSS with the trainer built, in
   a fresh process per mode; VmHWM, reset through /proc/self/clear_refs (getrusage's ru_maxrss
   cannot be reset), with glibc's mmap threshold fixed at 64 KiB so that a freed tensor leaves
   RSS at once instead of staying in the heap.
3. Bitwise: the last run of each mode per plan against a reference trainer of the same mode
   (one thread, like the workers), every copy of every layer (`LayerState.tensors()`): the
   number of elements that differ (exact: none is the claim).
4. The exactness condition of planaria.agent.training.reduction on real gradients: the reference
trains
   in exact mode; for each step every micro-batch's float32 gradient is captured, and for each
   element with n nonzero contributions the span in binary orders between their largest and
   smallest ulp is compared with 29 - ceil(log2 n). Counted: elements where it fails, and
   elements whose float64 sum rounded to float32 differs between orders (forward, reversed,
   two halves added as two data-parallel workers would); for contrast, float32 sums in those
   orders (fast mode's sensitivity to the plan).

Writes bench/results/exact.json, with the machine's load average before and after.

    .venv/bin/python bench/exact.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from planaria.agent.harness import local_cluster, run_results
from planaria.agent.training import data, model, reduction, reference, semantics
from planaria.contract import instructions, plan, schedule, shapes
from planaria.wire import messages

RESULTS = Path(__file__).parent / "results" / "exact.json"
SHAPE = shapes.named("small")
L = SHAPE.num_planner_layers  # 10 for "small": embedding, 8 blocks, head
MICRO_BATCH = 4
GLOBAL_BATCH = 32  # every plan below runs 8 micro-batches: one reference serves them all
SEED = 0
WARMUP_STEPS = 2
CORPUS_BYTES = 2_000_000
CORES = len(os.sched_getaffinity(0))
FAST, EXACT = messages.Reduction.FAST, messages.Reduction.EXACT
MODES = (FAST, EXACT)
SUM_BYTES = reduction.SUM_DTYPE.itemsize  # a float64 sum per parameter
GRAD_BYTES = torch.float32.itemsize  # a float32 gradient
STATE_BYTES = 16  # float32 parameter, gradient and two AdamW moments
MANTISSA_BITS = 23  # float32: ulp(x) = 2^(floor(log2|x|) - 23), at least 2^-149
MIN_ULP_EXPONENT = -149
SPAN_LIMIT = 29  # reduction.py: exact while span <= 29 - ceil(log2 n)
TIGHT_MARGIN = 1  # binary orders from failing that count as a near miss
Stages = list[tuple[int, int, tuple[int, ...]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    rounds: int
    steps: int  # per run, warm-up included
    inprocess_steps: int
    rss_steps: int
    capture_steps: int


def make_plan(*pipelines: tuple[Stages, int], reroutes: tuple[plan.Reroute, ...] = ()) -> plan.Plan:
    return plan.Plan(
        pipelines=tuple(
            plan.Pipeline(
                stages=tuple(
                    plan.Stage(layer_start=a, layer_stop=b, workers=tuple(map(plan.WorkerId, ws)))
                    for a, b, ws in stages
                ),
                num_micro_batches=n,
            )
            for stages, n in pipelines
        ),
        micro_batch_size=MICRO_BATCH,
        reroutes=reroutes,
    )


PLANS = {
    "data parallel 2x1": make_plan(([(0, L, (0,))], 4), ([(0, L, (1,))], 4)),
    "pipelines 2x2": make_plan(
        ([(0, 5, (0,)), (5, L, (1,))], 4), ([(0, 5, (2,)), (5, L, (3,))], 4)
    ),
    "2x2, stage rerouted": make_plan(
        ([(0, 5, (0,)), (5, L, (1,))], 4),
        ([(0, 5, (2,)), (5, L, ())], 4),
        reroutes=(plan.Reroute(pipeline=1, stage=1, peer_pipeline=0, micro_batches=(0, 1, 2, 3)),),
    ),
}


def config_for(mode: messages.Reduction) -> semantics.TrainingConfig:
    return semantics.TrainingConfig(
        shape=SHAPE,
        seed=SEED,
        global_batch_size=GLOBAL_BATCH,
        micro_batch_size=MICRO_BATCH,
        reduction=mode,
    )


# --- 1. step time on worker processes, 3. bitwise against the reference --------------------------


def period_s(run: run_results.RunResult) -> float:
    """The slowest worker's median step time over the steps after the warm-up."""
    return max(statistics.median(steps[WARMUP_STEPS:]) for steps in run.step_s.values())


Samples = dict[str, list[float]]  # "fast_s", "exact_cpu_s", ...: one value per round


def time_plans(
    cluster: local_cluster.LocalCluster, settings: Settings
) -> tuple[dict[str, Samples], dict[str, dict[str, run_results.RunResult]]]:
    """Per plan its step times (wall and CPU) of every round, and each mode's last run. Rounds
    are the outer loop, so drifting load from elsewhere touches every plan alike."""
    times: dict[str, Samples] = {name: {} for name in PLANS}
    last: dict[str, dict[str, run_results.RunResult]] = {name: {} for name in PLANS}
    for r in range(settings.rounds):
        for name, p in PLANS.items():
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                pids = [cluster.pids[w] for w in p.workers]
                cpu_before = sum(map(cpu_s, pids))
                run = cluster.run(config_for(mode), p, range(settings.steps))
                if not run.ok:
                    raise RuntimeError(f"{name} {mode}: {run.errors} lost {run.lost}")
                cpu = (sum(map(cpu_s, pids)) - cpu_before) / settings.steps
                times[name].setdefault(f"{mode.value}_s", []).append(period_s(run))
                times[name].setdefault(f"{mode.value}_cpu_s", []).append(cpu)
                last[name][mode.value] = run
    return times, last


def cpu_s(pid: int) -> float:
    """User and system CPU seconds process `pid` has used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def differing_elements(run: run_results.RunResult, trainer: reference.ReferenceTrainer) -> int:
    """Elements of every worker's copy of every layer (parameters, moments, step counts) that
    are not bitwise equal to the trainer's."""
    count = 0
    for states in run.states.values():
        for index, state in states.items():
            want = trainer.layer_state(index).tensors()
            count += sum(int((a != b).sum()) for a, b in zip(state.tensors(), want, strict=True))
    return count


def compared_elements(run: run_results.RunResult) -> int:
    return sum(t.numel() for s in run.states.values() for ls in s.values() for t in ls.tensors())


def step_rows(
    times: dict[str, Samples],
    last: dict[str, dict[str, run_results.RunResult]],
    trainers: dict[str, reference.ReferenceTrainer],
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, samples in times.items():
        runs = last[name]
        row: dict[str, object] = {"plan": name, "workers": len(PLANS[name].workers)}
        row.update({key: statistics.median(values) for key, values in samples.items()})
        for unit, label in (("s", "wall"), ("cpu_s", "cpu")):
            pairs = zip(samples[f"exact_{unit}"], samples[f"fast_{unit}"], strict=True)
            row[f"exact_over_fast_{label}"] = statistics.median(e / f for e, f in pairs)
        row["rounds"] = samples
        row["compared_elements"] = compared_elements(runs[EXACT.value])
        row["exact_differing"] = differing_elements(runs[EXACT.value], trainers[EXACT.value])
        row["fast_differing"] = differing_elements(runs[FAST.value], trainers[FAST.value])
        rows.append(row)
    return rows


def train_references(tokens: data.Tokens, steps: int) -> dict[str, reference.ReferenceTrainer]:
    """A reference trainer per mode after `steps` steps, with one thread like the workers (exact
    mode pins itself; fast mode's kernels would split their sums over more threads)."""
    trainers = {m.value: reference.ReferenceTrainer(config_for(m), tokens) for m in MODES}
    torch.set_num_threads(1)
    for trainer in trainers.values():
        for step in range(steps):
            trainer.step(step)
    return trainers


# --- 1b. in this process: the float64 sums' CPU cost, the thread pin's wall cost -----------------


def time_in_process(tokens: data.Tokens, settings: Settings) -> dict[str, float]:
    """Three reference trainers stepped in turn: fast with one thread, exact (one thread, by
    its pin), fast with every core. Medians after one warm-up step."""
    runs: dict[str, tuple[messages.Reduction, int]] = {
        "fast_1_thread": (FAST, 1),
        "exact": (EXACT, 1),
        f"fast_{CORES}_threads": (FAST, CORES),
    }
    trainers = {k: reference.ReferenceTrainer(config_for(m), tokens) for k, (m, _) in runs.items()}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    wall: dict[str, list[float]] = {k: [] for k in runs}
    for step in range(settings.inprocess_steps + 1):
        for key, (_, threads) in runs.items():
            torch.set_num_threads(threads)
            started_cpu, started = time.process_time(), time.perf_counter()
            trainers[key].step(step)
            cpu[key].append(time.process_time() - started_cpu)
            wall[key].append(time.perf_counter() - started)
    torch.set_num_threads(1)
    out = {f"{k}_cpu_s": statistics.median(v[1:]) for k, v in cpu.items()}
    out.update({f"{k}_wall_s": statistics.median(v[1:]) for k, v in wall.items()})
    out["exact_over_fast_cpu"] = _median_ratio(cpu["exact"], cpu["fast_1_thread"])
    out["exact_over_fast_threads_wall"] = _median_ratio(
        wall["exact"], wall[f"fast_{CORES}_threads"]
    )
    return out


def _median_ratio(top: list[float], bottom: list[float]) -> float:
    """The median over steps after the first of top / bottom."""
    return statistics.median(t / b for t, b in zip(top[1:], bottom[1:], strict=True))


# --- 2. memory ---------------------------------------------------------------------------------


def layer_sizes() -> list[int]:
    """Parameters per planner layer."""
    return [sum(p.numel() for p in layer.parameters()) for layer in model.build_layers(SHAPE, SEED)]


def memory_rows() -> list[dict[str, object]]:
    """Per plan, from parameter counts: the parameters of the worker holding most, its fast-mode
    layer state (STATE_BYTES each), exact mode's extra for it between a step's first backward
    and its optimizer step (4 bytes each) and at most (8 bytes each), and the bytes
    all-reduced per step, summed over workers, in each mode."""
    sizes = layer_sizes()
    rows: list[dict[str, object]] = []
    for name, p in PLANS.items():
        streams = schedule.compile_schedule(p).streams
        held = max(sum(sizes[i] for i in s.layers) for s in streams)
        reduced = sum(
            sizes[i]
            for s in streams
            for op in s.instructions
            if isinstance(op, instructions.AllReduce)
            for i in op.layers
        )
        rows.append(
            {
                "plan": name,
                "max_params_held": held,
                "fast_state_bytes": STATE_BYTES * held,
                "exact_extra_bytes": (SUM_BYTES - GRAD_BYTES) * held,
                "exact_extra_max_bytes": SUM_BYTES * held,
                "allreduce_fast_bytes": GRAD_BYTES * reduced,
                "allreduce_exact_bytes": SUM_BYTES * reduced,
            }
        )
    return rows


def _status_kib(key: str) -> int:
    """A line of /proc/self/status in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(key)


def rss_child(mode: messages.Reduction, steps: int) -> int:
    """Run by `measure_rss` in a fresh process: the rise of peak RSS (bytes) over `steps`
    reference steps above the RSS with the trainer built."""
    torch.set_num_threads(1)
    tokens = data.load_default_corpus(max_bytes=CORPUS_BYTES)
    trainer = reference.ReferenceTrainer(config_for(mode), tokens)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = _status_kib("VmRSS")
    for step in range(steps):
        trainer.step(step)
    return 1024 * (_status_kib("VmHWM") - before)


def measure_rss(settings: Settings) -> dict[str, int]:
    """`rss_child` per mode, each in its own process, with glibc returning every freed block
    of 64 KiB or more to the system at once, so that RSS follows the live tensors."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    out: dict[str, int] = {}
    for mode in MODES:
        command = [sys.executable, __file__, "--rss-child", mode.value, str(settings.rss_steps)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        out[f"{mode.value}_peak_rise_bytes"] = int(done.stdout.split()[-1])
    out["exact_minus_fast_bytes"] = out["exact_peak_rise_bytes"] - out["fast_peak_rise_bytes"]
    out["computed_bytes"] = (SUM_BYTES - GRAD_BYTES) * sum(layer_sizes())
    return out


# --- 4. the exactness condition on real gradients ----------------------------------------------


def capture_gradients(trainer: reference.ReferenceTrainer, step: int) -> torch.Tensor:
    """Step `step`'s float32 gradient of every parameter per micro-batch, [M, parameters]:
    forward, loss and backward as `ReferenceTrainer._step` runs them, with exact mode's thread."""
    config = trainer.config
    (micro_batches,) = trainer.sampler.split(step, MICRO_BATCH, [config.num_micro_batches])
    params = [p for layer in trainer.layers for p in layer.parameters()]
    rows = []
    with reduction.compute_threads(EXACT):
        for samples in micro_batches:
            inputs, targets = trainer.dataset.batch(samples)
            logits = model.run_layers(trainer.layers, inputs)
            loss = model.micro_batch_loss(logits, targets, config.global_batch_size)
            torch.autograd.backward(loss)
            rows.append(torch.cat([_grad(p).reshape(-1) for p in params]))
            for p in params:
                p.grad = None
    return torch.stack(rows)


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def ulp_exponents(grads: torch.Tensor) -> torch.Tensor:
    """log2 of each float32's ulp: floor(log2|x|) - 23, at least -149 (meaningless for 0)."""
    _, exponent = torch.frexp(grads)  # x = m * 2^e with 1/2 <= |m| < 1: floor(log2|x|) = e - 1
    return torch.clamp(exponent.to(torch.int32) - 1 - MANTISSA_BITS, min=MIN_ULP_EXPONENT)


def condition_margins(grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per element: n, its nonzero contributions, and the margin 29 - ceil(log2 n) - span (the
    span in binary orders between their largest and smallest ulp); the condition fails where
    the margin is negative. Elements without contributions get margin SPAN_LIMIT."""
    nonzero = grads != 0
    n = nonzero.sum(0)
    exponents = ulp_exponents(grads)
    top = torch.where(nonzero, exponents, MIN_ULP_EXPONENT).amax(0)
    bottom = torch.where(nonzero, exponents, 0).amin(0)
    ceil_log2 = torch.tensor([max(k - 1, 0).bit_length() for k in range(len(grads) + 1)])
    margin = SPAN_LIMIT - ceil_log2[n] - (top - bottom)
    return n, torch.where(n > 0, margin, SPAN_LIMIT)


def ordered_sums(grads: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sums over micro-batches (dim 0) in three orders, in grads' dtype: forward, reversed, and
    each half forward then the two halves added."""
    half = len(grads) // 2

    def forward(rows: torch.Tensor) -> torch.Tensor:
        total = torch.zeros_like(rows[0])
        for row in rows:
            total += row
        return total

    return {
        "forward": forward(grads),
        "reversed": forward(grads.flip(0)),
        "halves": forward(grads[:half]) + forward(grads[half:]),
    }


def order_differences(grads: torch.Tensor, fails: torch.Tensor) -> dict[str, int]:
    """Elements whose sum, float64 rounded once to float32 or float32 throughout, differs from
    the forward order's; float64 counted among all elements and among those failing."""
    out: dict[str, int] = {}
    for dtype, label in ((torch.float64, "f64"), (torch.float32, "f32")):
        sums = ordered_sums(grads.to(dtype))
        rounded = {k: v.to(torch.float32) for k, v in sums.items()}
        for order in ("reversed", "halves"):
            differ = rounded[order] != rounded["forward"]
            out[f"{label}_{order}_differ"] = int(differ.sum())
            if label == "f64":
                out[f"f64_{order}_differ_failing"] = int((differ & fails).sum())
    return out


def parameter_names(trainer: reference.ReferenceTrainer) -> list[tuple[str, int]]:
    """(layer.parameter name, numel) in capture order."""
    return [
        (f"{i}.{name}", p.numel())
        for i, layer in enumerate(trainer.layers)
        for name, p in layer.named_parameters()
    ]


def check_condition(tokens: data.Tokens, settings: Settings) -> dict[str, object]:
    """Train the exact reference `capture_steps` steps, analysing each step's gradients first;
    counts are summed over steps. `tight` are elements within TIGHT_MARGIN of failing."""
    trainer = reference.ReferenceTrainer(config_for(EXACT), tokens)
    names = parameter_names(trainer)
    totals: dict[str, int] = {}
    tight_by_parameter: dict[str, int] = {}
    min_margin = SPAN_LIMIT
    for step in range(settings.capture_steps):
        grads = capture_gradients(trainer, step)
        n, margin = condition_margins(grads)
        fails, tight = margin < 0, margin <= TIGHT_MARGIN
        counts = {
            "elements": grads.shape[1],
            "with_contributions": int((n > 0).sum()),
            "with_several": int((n > 1).sum()),
            "failing": int(fails.sum()),
            "tight": int(tight.sum()),
            **order_differences(grads, fails),
        }
        totals = {k: totals.get(k, 0) + v for k, v in counts.items()}
        min_margin = min(min_margin, int(margin.min()))
        for (name, _), part in zip(names, torch.split(tight, [k for _, k in names]), strict=True):
            tight_by_parameter[name] = tight_by_parameter.get(name, 0) + int(part.sum())
        trainer.step(step)  # the real exact step, from the same state
    worst = sorted(((v, k) for k, v in tight_by_parameter.items() if v), reverse=True)[:5]
    return {**totals, "min_margin": min_margin, "tight_parameters": {k: v for v, k in worst}}


# --- main ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    steps: list[dict[str, object]]  # per plan: step times and bitwise counts
    in_process: dict[str, float]
    memory: list[dict[str, object]]  # per plan, computed
    rss: dict[str, int]  # measured, the reference trainer
    condition: dict[str, object]


def run_all(settings: Settings, tokens: data.Tokens) -> Report:
    with local_cluster.LocalCluster(workers=range(4), tokens=tokens, timeout_s=120.0) as cluster:
        times, last = time_plans(cluster, settings)
    trainers = train_references(tokens, settings.steps)
    return Report(
        steps=step_rows(times, last, trainers),
        in_process=time_in_process(tokens, settings),
        memory=memory_rows(),
        rss=measure_rss(settings),
        condition=check_condition(tokens, settings),
    )


def print_steps(rows: list[dict[str, object]]) -> None:
    print(f"model {SHAPE.name}, {GLOBAL_BATCH} samples/step in micro-batches of {MICRO_BATCH}")
    print("s/step (median over rounds): wall (slowest worker), CPU (the plan's workers together)")
    print(
        f"{'plan':<22} {'workers':>7} {'fast':>6} {'exact':>6} {'ratio':>6} {'fast CPU':>8} "
        f"{'exact CPU':>9} {'ratio':>6} {'elements':>10} {'exact diff':>10} {'fast diff':>10}"
    )
    for r in rows:
        print(
            f"{r['plan']!s:<22} {r['workers']!s:>7} {r['fast_s']:>6.3f} {r['exact_s']:>6.3f} "
            f"{r['exact_over_fast_wall']:>6.3f} {r['fast_cpu_s']:>8.3f} {r['exact_cpu_s']:>9.3f} "
            f"{r['exact_over_fast_cpu']:>6.3f} {r['compared_elements']!s:>10} "
            f"{r['exact_differing']!s:>10} {r['fast_differing']!s:>10}"
        )


def print_in_process(seconds: dict[str, float]) -> None:
    print("\nreference trainer in this process, s/step (median):")
    for key, value in seconds.items():
        if key.endswith("_s"):
            print(f"  {key:<24} {value:.3f}")
    one, many = seconds["exact_over_fast_cpu"], seconds["exact_over_fast_threads_wall"]
    print(
        f"  exact / fast: CPU, one thread each {one:.3f}; wall, fast on {CORES} threads {many:.3f}"
    )


def print_memory(rows: list[dict[str, object]], rss: dict[str, int]) -> None:
    print("\nmemory, computed, MB (the worker holding most; all-reduce: per step, all workers):")
    keys = [k for k in rows[0] if k != "plan"]
    print(f"{'plan':<22} " + " ".join(f"{k.removesuffix('_bytes'):>22}" for k in keys))
    for r in rows:
        cells = (f"{r[k]!s:>22}" if k == "max_params_held" else f"{_mb(r[k]):>22.2f}" for k in keys)
        print(f"{r['plan']!s:<22} " + " ".join(cells))
    print("reference trainer, peak RSS rise over the steps, MB, measured:")
    print("  " + ", ".join(f"{k.removesuffix('_bytes')} {v / 1e6:.2f}" for k, v in rss.items()))


def _mb(value: object) -> float:
    assert isinstance(value, int)
    return value / 1e6


def print_condition(condition: dict[str, object], steps: int) -> None:
    several = condition["with_several"]
    assert isinstance(several, int)
    print(f"\nexactness condition, {steps} steps of the exact reference, elements x steps:")
    for key, value in condition.items():
        if isinstance(value, int) and key not in ("elements", "min_margin"):
            print(f"  {key:<28} {value:>9} ({value / several:.2e} of with_several)")
        else:
            print(f"  {key:<28} {value}")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of fewer steps")
    parser.add_argument("--rss-child", nargs=2, help=argparse.SUPPRESS)  # measure_rss's
    args = parser.parse_args(argv)
    if args.rss_child:
        print(rss_child(messages.Reduction(args.rss_child[0]), int(args.rss_child[1])))
        return
    settings = (
        Settings(rounds=1, steps=4, inprocess_steps=2, rss_steps=2, capture_steps=2)
        if args.quick
        else Settings(rounds=7, steps=6, inprocess_steps=5, rss_steps=2, capture_steps=8)
    )
    tokens = data.load_default_corpus(max_bytes=CORPUS_BYTES)
    load_before, started = os.getloadavg(), time.perf_counter()
    report = run_all(settings, tokens)
    machine = {
        "cpu": cpu_model(),
        "cores": CORES,
        "torch": torch.__version__,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
    }
    print_steps(report.steps)
    print_in_process(report.in_process)
    print_memory(report.memory, report.rss)
    print_condition(report.condition, settings.capture_steps)
    print(f"\nmachine: {json.dumps(machine)}")
    out = {
        "settings": dataclasses.asdict(settings),
        "machine": machine,
        **dataclasses.asdict(report),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
