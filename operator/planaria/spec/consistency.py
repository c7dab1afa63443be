"""The cross-field rules of a job spec: the ones a CRD states in CEL, not per-field schema.

`check` returns every problem of a `job.JobSpec` as (field path, problem and fix): the global
batch a multiple of the micro-batch, whole nodes, fault tolerance below the node count, failures
naming existing workers and steps, checkpoints on snapshot boundaries, a known model or a
readable model source, a device memory that is one. `failure_problems` is the one rule for an
injected failure, shared by the job file's `failures` and `planaria run --fail`.

The rules report problems as values and raise nothing: `planaria.spec.job_file` turns the first
into a `job.JobSpecError` naming the file, `planaria.spec.conversion.to_settings` into one
naming the spec, and the CRD (`planaria.kube.crd`) states the same rules in CEL with the same
wording. The schema itself (per-field rules) is `planaria.spec.job`'s.
"""

from __future__ import annotations

from planaria.contract import shapes
from planaria.spec import job
from planaria.spec import model_source as sources

MIN_DEVICE_MEMORY = 2**10  # deviceMemory below 1Ki is a typo, not a device


def check(spec: job.JobSpec) -> list[tuple[str, str]]:
    """Cross-field problems of `spec` as (field path, problem and fix); empty when it is sound."""
    problems: list[tuple[str, str]] = []
    if spec.model not in shapes.NAMED_SHAPES:
        known = ", ".join(sorted(shapes.NAMED_SHAPES))
        problems.append(("model", f"unknown model {spec.model!r}; give one of {known}"))
    problems += _check_model_source(spec)
    if spec.global_batch_size % spec.micro_batch_size:
        problems.append(
            (
                "globalBatchSize",
                f"{spec.global_batch_size} is not a multiple of microBatchSize "
                f"{spec.micro_batch_size}; make it one",
            )
        )
    if spec.device_memory is not None and job.memory_bytes(spec.device_memory) < MIN_DEVICE_MEMORY:
        problems.append(
            (
                "deviceMemory",
                f"{spec.device_memory} is below {MIN_DEVICE_MEMORY} bytes; give the memory "
                "of one worker's device, e.g. 40Gi, or leave it out",
            )
        )
    problems += _check_nodes(spec) + _check_recovery(spec) + _check_failures(spec)
    return problems


def _check_model_source(spec: job.JobSpec) -> list[tuple[str, str]]:
    if spec.model_source is None:
        return []
    if "model" in spec.model_fields_set:
        return [("model", "a job trains either a named model or a modelSource; remove one")]
    try:
        sources.reference(spec.model_source)
    except sources.ModelSourceError as exc:
        field, _, problem = str(exc).partition(": ")
        return [(field, problem)]
    return []


def _check_nodes(spec: job.JobSpec) -> list[tuple[str, str]]:
    if spec.workers % spec.gpus_per_node:
        return [
            (
                "workers",
                f"{spec.workers} is not a multiple of gpusPerNode {spec.gpus_per_node}; "
                "give whole nodes",
            )
        ]
    nodes = spec.workers // spec.gpus_per_node
    if spec.fault_tolerance >= nodes:
        return [
            (
                "faultTolerance",
                f"{spec.fault_tolerance} leaves no node to train on ({nodes} nodes); "
                f"give at most {nodes - 1}",
            )
        ]
    return []


def _check_recovery(spec: job.JobSpec) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    timeouts = spec.timeouts
    if timeouts.heartbeat_seconds <= timeouts.heartbeat_interval_seconds:
        problems.append(
            (
                "timeouts.heartbeatSeconds",
                f"{timeouts.heartbeat_seconds:g} is not above heartbeatIntervalSeconds "
                f"{timeouts.heartbeat_interval_seconds:g}; make it longer",
            )
        )
    every, snap = spec.checkpoints.interval_steps, spec.snapshots.interval_steps
    if spec.checkpoints.dir and every and (snap == 0 or every % snap):
        problems.append(
            (
                "checkpoints.intervalSteps",
                f"{every} is not a multiple of snapshots.intervalSteps {snap}; checkpoints are "
                "copied from snapshots, so make it a multiple (and snapshots periodic)",
            )
        )
    return problems


def _check_failures(spec: job.JobSpec) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for i, failure in enumerate(spec.failures):
        worker = failure.worker if isinstance(failure.worker, int) else None
        for field, problem in failure_problems(
            step=failure.step, worker=worker, workers=spec.workers, steps=spec.steps
        ):
            problems.append((f"failures.{i}.{field}", problem))
    return problems


def failure_problems(
    *, step: int | None, worker: int | None, workers: int, steps: int
) -> list[tuple[str, str]]:
    """What keeps an injected failure (a step trigger or None, a worker id or None for a random
    one) from happening in a job of `workers` and `steps`, as (field, problem and fix); empty
    when it can happen. The one rule for the job file's `failures` and `planaria run --fail`
    (`planaria.local.faults.parse_failures`): a step trigger fires once that step is committed,
    so one at or past the last step never fires."""
    problems: list[tuple[str, str]] = []
    if worker is not None and worker >= workers:
        problems.append(
            (
                "worker",
                f"worker {worker} does not exist (workers 0..{workers - 1}); "
                "give one of them or 'random'",
            )
        )
    if step is not None and step >= steps:
        problems.append(
            (
                "step",
                f"step {step} is not before the last step {steps}; give a step the job will reach",
            )
        )
    return problems
