"""The job spec: what a user asks for, as the `spec` of a ResilientJob and as a local job file.

One schema for both ways of running (issue #8 item 4): a file `planaria run` accepts is a valid
custom resource, and the Kubernetes adapter validates a ResilientJob's `spec` with the same
models. Field names are camelCase as in a CRD; snake_case names are accepted too
(populate_by_name); unknown fields are refused (a typo must not silently become a default), and
numbers are strict (`true`, `4.0` or "4" is no count).
Every field carries a description, which the CRD's OpenAPI schema reuses.

A job file is either a bare spec or a whole document:

    apiVersion: planaria.dev/v1alpha1
    kind: ResilientJob
    metadata: {name: tiny-job}
    spec: {workers: 8, steps: 120, failures: [{step: 40, worker: 3}]}

`to_settings` turns a spec into the controller core's `JobSettings`; the corpus default (the
standard library's sources, found by the agent's data module) is passed in by the caller, so
this module imports no agent code. `failures` is local-mode failure injection: the operator
ignores it.

Errors:

    ValueError
    └── JobSpecError   one line: `<source>: <field path>: <problem>; <what to change>`

Per-field rules are pydantic's; the cross-field rules a CRD would state in CEL (global batch a
multiple of the micro-batch, whole nodes, fault tolerance below the node count, failures naming
existing workers and steps, checkpoints on snapshot boundaries) are checked by `check` with the
same message form, so a spec that passes converts without error.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

import pydantic
from pydantic import alias_generators

from planaria.contract import shapes
from planaria.control import settings as job_settings
from planaria.spec import durations
from planaria.spec import model_source as sources
from planaria.wire import messages

API_VERSION = "planaria.dev/v1alpha1"
KIND = "ResilientJob"
# A Kubernetes object name (RFC 1123 label): it also names the job's snapshot directories.
NAME_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class JobSpecError(ValueError):
    """A job file or spec that cannot run; one line naming the field and what to change."""


# Numbers are strict, as the CRD's schema is: `true`, `4.0` or "4" for a count and "0.1" for a
# number are refused, not coerced, so a file `planaria run` accepts is a valid resource (the
# bad-input fuzz found `gpusPerNode: true` read as 1 where the API server refuses it).
StrictInt = Annotated[int, pydantic.Field(strict=True)]
# Counts fit the contract's uint32 fields, byte counts its uint64 ones.
PositiveInt = Annotated[int, pydantic.Field(strict=True, ge=1, le=messages.MAX_UINT32)]
Count = Annotated[int, pydantic.Field(strict=True, ge=0, le=messages.MAX_UINT32)]
# Every duration is bounded: a timeout of 1e308 s overflowed a timedelta deep in the agent
# (fuzz campaign 1). A day is far beyond any sensible bound of one wait; a million hours is far
# beyond any mean time between failures.
MAX_WAIT_S = 86_400.0
MAX_MTBF_S = 3.6e9
Seconds = Annotated[float, pydantic.Field(strict=True, gt=0, le=MAX_WAIT_S, allow_inf_nan=False)]
Mtbf = Annotated[float, pydantic.Field(strict=True, gt=0, le=MAX_MTBF_S, allow_inf_nan=False)]


def _field(default: Any, description: str, **rules: Any) -> Any:
    return pydantic.Field(default=default, description=description, **rules)


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=alias_generators.to_camel,
        populate_by_name=True,
    )


class OptimizerSpec(_Model):
    """AdamW's hyper-parameters (constant learning rate)."""

    lr: float = _field(2e-3, "Learning rate.", strict=True, gt=0, allow_inf_nan=False)
    beta1: float = _field(0.9, "First-moment decay, in [0, 1).", strict=True, ge=0, lt=1)
    beta2: float = _field(0.95, "Second-moment decay, in [0, 1).", strict=True, ge=0, lt=1)
    eps: float = _field(1e-8, "Denominator term, > 0.", strict=True, gt=0, allow_inf_nan=False)
    weight_decay: float = _field(
        0.0,
        "Decoupled weight decay of matrices and embeddings, >= 0.",
        strict=True,
        ge=0,
        allow_inf_nan=False,
    )


class DataFormat(StrEnum):
    """How the corpus files hold their documents (docs/running.md, "Data")."""

    TEXT = "text"
    JSONL = "jsonl"
    PARQUET = "parquet"


class DataSpec(_Model):
    """The training text and how it becomes tokens (docs/running.md, "Data")."""

    corpus_paths: list[Annotated[str, pydantic.Field(min_length=1)]] | None = _field(
        None,
        "Files or directories of text, read in order (directories recursively). Default: the "
        "Python standard library's *.py sources on each worker.",
        min_length=1,
    )
    max_bytes: (
        Annotated[int, pydantic.Field(strict=True, ge=1, le=messages.MAX_JSON_INTEGER)] | None
    ) = _field(None, "Read at most this many bytes of the corpus text.")
    format: DataFormat = _field(
        DataFormat.TEXT,
        "text (every file one document), jsonl (one JSON object per line) or parquet.",
    )
    text_field: str = _field(
        "text", "The JSONL field or Parquet column that holds the text.", min_length=1
    )
    tokenizer: str = _field(
        "",
        "Path of a tokenizer.json (Hugging Face tokenizers; needs planaria[hf]); the model's "
        "vocabulary becomes its size. Empty: byte tokens.",
    )
    separator: str = _field(
        "",
        "Text appended after every document, e.g. an end-of-text token such as </s> (with a "
        "tokenizer: one of its tokens). Empty: documents are joined as they are.",
    )
    cache_dir: str = _field(
        "",
        "Folder of the tokenised-corpus cache; empty: $XDG_CACHE_HOME/planaria/tokens or "
        "~/.cache/planaria/tokens on each worker.",
    )


class Redundancy(StrEnum):
    """How host-memory snapshot shards survive a lost worker (REFT §4.2)."""

    NONE = "none"
    COPY = "copy"
    XOR = "xor"
    RECOMPUTE = "recompute"


class Reduction(StrEnum):
    """How gradients are summed over micro-batches and workers (docs/numerics.md)."""

    FAST = "fast"
    EXACT = "exact"


class Precision(StrEnum):
    """The arithmetic of forward and backward (docs/numerics.md, "Precision")."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"


class SnapshotSpec(_Model):
    """Host-memory snapshots (REFT), the cheap recovery tier behind live replicas."""

    interval_steps: Count = _field(1, "Snapshot every N steps; 0 takes none.")
    redundancy: Redundancy = _field(
        Redundancy.COPY, "Protection of the shards: none, copy, xor (parity) or recompute."
    )


class CheckpointSpec(_Model):
    """Persistent checkpoints, copied from complete snapshots in the background."""

    dir: str = _field("", "Directory for checkpoints (shared by all workers); empty: none.")
    interval_steps: Count = _field(
        0, "Checkpoint every N steps, a multiple of snapshots.intervalSteps; 0: none."
    )


class TimeoutSpec(_Model):
    """How long the controller waits before it calls something failed."""

    heartbeat_interval_seconds: Seconds = _field(
        0.1, "Seconds between an agent's heartbeats, at least 0.01.", ge=0.01
    )
    heartbeat_seconds: Seconds = _field(
        3.0, "An agent silent this long counts as failed; above heartbeatIntervalSeconds."
    )
    step_seconds: Seconds = _field(
        10.0, "Bound on every collective of an epoch: a hung peer fails the step after this."
    )
    configure_seconds: Seconds = _field(60.0, "Bound on a worker's setup of a new epoch.")


class FailureSpec(_Model):
    """One injected failure (local mode only): kill `worker` at a step or after a time."""

    step: PositiveInt | None = _field(None, "Kill the worker once the job reaches this step.")
    # int-or-string, as a CRD schema can state it (x-kubernetes-int-or-string).
    time: StrictInt | str | None = _field(
        None,
        'Kill it this long after the run starts: whole seconds or a duration such as "90s", '
        '"1.5m", "1m30s" (units h, m, s, ms, largest first).',
    )
    rejoin_seconds: Seconds | None = _field(
        None, "Start the killed worker again after this many seconds (a returning worker)."
    )
    worker: StrictInt | str = _field(  # int-or-string too
        "random", 'The worker id to kill, or "random" for a live one chosen at random.'
    )

    @pydantic.field_validator("worker")
    @classmethod
    def _worker_id(cls, value: int | str) -> int | str:
        if value == "random" or (isinstance(value, int) and value >= 0):
            return value
        raise ValueError(f"must be a worker id >= 0 or 'random' (got {value!r})")

    @pydantic.field_validator("time")
    @classmethod
    def _duration(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            durations.parse(value)
        return value

    @pydantic.model_validator(mode="after")
    def _one_trigger(self) -> FailureSpec:
        if (self.step is None) == (self.time is None):
            raise ValueError("give exactly one of step or time")
        return self

    @property
    def time_s(self) -> float | None:
        """`time` in seconds (None for a step trigger)."""
        return None if self.time is None else durations.parse(self.time)


# A Kubernetes resource quantity ("500m", "2", "8Gi", "1.5G"), as the API server parses it.
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
# Label keys and values as Kubernetes accepts them (prefix/name; values up to 63 characters).
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
MAX_NODE_SELECTOR = 64  # node labels to match; bounds the CRD's CEL rule over the keys
Quantity = Annotated[str, pydantic.Field(pattern=QUANTITY_PATTERN, max_length=64)]
# A byte quantity: a whole or decimal number with an optional Kubernetes suffix (binary Ki..Ti,
# decimal k..T); `memory_bytes` reads it.
BYTES_PATTERN = r"^[0-9]{1,15}(\.[0-9]{1,6})?(Ki|Mi|Gi|Ti|k|M|G|T)?$"
BYTE_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
BYTE_SUFFIXES |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
Bytes = Annotated[str, pydantic.Field(pattern=BYTES_PATTERN, max_length=32)]
MIN_DEVICE_MEMORY = 2**10  # deviceMemory below 1Ki is a typo, not a device


def memory_bytes(quantity: str) -> int:
    """The bytes of a `Bytes` quantity ("1.5Mi" -> 1572864), rounded down."""
    match = re.fullmatch(BYTES_PATTERN, quantity)
    if match is None:
        raise ValueError(f"{quantity!r} is not a byte quantity like 512Mi, 8Gi or 1000000")
    suffix: str = match.group(2) or ""
    number = quantity[: len(quantity) - len(suffix)]
    whole, _, fraction = number.partition(".")
    scale: int = BYTE_SUFFIXES[suffix]
    tenths = int("1" + "0" * len(fraction))  # 10 ** digits of the fraction
    return int(whole) * scale + int(fraction or "0") * scale // tenths


class TolerationSpec(_Model):
    """A Kubernetes toleration of the worker pods (e.g. for GPU or spot node taints)."""

    key: str = _field("", "Taint key to tolerate; empty with operator Exists: every taint.")
    operator: Literal["Exists", "Equal"] = _field("Equal", "Exists or Equal (to `value`).")
    value: str = _field("", "Taint value, with operator Equal.")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = _field(
        "", "Taint effect to tolerate; empty: every effect."
    )
    toleration_seconds: StrictInt | None = _field(
        None, "With NoExecute: seconds the pod stays bound after the taint appears.", ge=0
    )


class PodSpec(_Model):
    """How the operator builds the worker pods (Kubernetes only; `planaria run` ignores it)."""

    image: str = _field("", "Agent container image; empty: the operator's --agent-image.")
    cpu: Quantity | None = _field(None, "CPU request and limit of each worker, e.g. 2 or 500m.")
    memory: Quantity | None = _field(None, "Memory request and limit of each worker, e.g. 8Gi.")
    snapshot_memory: Quantity = _field(
        "1Gi", "Size limit of each pod's host-memory snapshot volume (emptyDir, medium Memory)."
    )
    node_selector: dict[Annotated[str, pydantic.Field(pattern=LABEL_KEY_PATTERN)], str] = _field(
        {}, "Node labels the worker pods must match.", max_length=MAX_NODE_SELECTOR
    )
    tolerations: list[TolerationSpec] = _field([], "Tolerations of the worker pods.")
    priority_class_name: str = _field("", "PriorityClass of the worker pods; empty: default.")


class JobSpec(_Model):
    """The spec of a ResilientJob (docs/running.md lists every field)."""

    model: str = _field("tiny", "Named model shape: tiny, small, gpt2, gpt3-medium, ...")
    model_source: sources.ModelSourceSpec | None = _field(
        None,
        "A Hugging Face causal LM (Llama or GPT-2 family) from its config, instead of a named "
        'shape (docs/running.md, "Models").',
    )
    workers: PositiveInt = _field(8, "Worker processes (pods) at full strength.")
    gpus_per_node: PositiveInt = _field(1, "Workers per node; workers is whole nodes.")
    steps: PositiveInt = _field(100, "Train steps 1..steps, then the job has Succeeded.")
    micro_batch_size: PositiveInt = _field(4, "Samples per micro-batch.")
    global_batch_size: PositiveInt = _field(
        32, "Samples per step, a multiple of microBatchSize; never changes with the plan."
    )
    seed: int = _field(
        0,
        "Seed of the parameters and of the sample order.",
        strict=True,
        ge=0,
        le=messages.MAX_JSON_INTEGER,
    )
    optimizer: OptimizerSpec = _field(OptimizerSpec(), "AdamW hyper-parameters.")
    data: DataSpec = _field(DataSpec(), "Training text.")
    device: Literal["cpu", "cuda"] = _field("cpu", "Where workers compute (cuda uses NCCL).")
    reduction: Reduction = _field(
        Reduction.FAST,
        "How gradients are summed: fast (float32, in the plan's order) or exact (float64 sums, "
        "one rounding: parameters bitwise independent of the plan and of failures; see "
        "docs/numerics.md).",
    )
    precision: Precision = _field(
        Precision.FP32,
        "Arithmetic of forward and backward: fp32, tf32 (CUDA matmuls on TF32 tensor cores; on "
        "the CPU the same as fp32) or bf16 (bfloat16 autocast forward; parameters, gradients "
        "and AdamW state stay float32); see docs/numerics.md.",
    )
    snapshots: SnapshotSpec = _field(SnapshotSpec(), "Host-memory snapshots.")
    checkpoints: CheckpointSpec = _field(CheckpointSpec(), "Persistent checkpoints.")
    fault_tolerance: Count = _field(
        1, "Node failures the pipeline templates must cover; below the node count."
    )
    policy: job_settings.Policy = _field(
        job_settings.Policy.ADAPTIVE,
        "Recoveries allowed: adaptive (Odyssey eq. 8), dynamic or reroute.",
    )
    mtbf_seconds: Mtbf | None = _field(
        None, "Expected seconds to the next failure for eq. 8; default: learnt from failures."
    )
    device_memory: Bytes | None = _field(
        None,
        "Memory the planner may use on each worker's device, e.g. 40Gi; default: all of it as "
        "profiled (the GPU's memory, the machine's RAM on CPU). Lower it to keep headroom; a "
        "model that does not fit one device is split into pipelines of several stages.",
    )
    timeouts: TimeoutSpec = _field(TimeoutSpec(), "Failure detection bounds.")
    failures: list[FailureSpec] = _field(
        [], "Failures to inject when run locally (`planaria run`); the operator ignores them."
    )
    pod: PodSpec = _field(
        PodSpec(), "Worker pods on Kubernetes: image, resources, scheduling; local runs ignore it."
    )


class Metadata(pydantic.BaseModel):
    """A custom resource's metadata: only the name matters here, the rest is Kubernetes'."""

    model_config = pydantic.ConfigDict(extra="allow", frozen=True)
    name: str = pydantic.Field(description="The job's name (an RFC 1123 label).")


class ResilientJob(pydantic.BaseModel):
    """A whole ResilientJob document."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    api_version: Literal["planaria.dev/v1alpha1"] = pydantic.Field(alias="apiVersion")
    kind: Literal["ResilientJob"]
    metadata: Metadata
    spec: JobSpec = JobSpec()


def check(spec: JobSpec) -> list[tuple[str, str]]:
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
    if spec.device_memory is not None and memory_bytes(spec.device_memory) < MIN_DEVICE_MEMORY:
        problems.append(
            (
                "deviceMemory",
                f"{spec.device_memory} is below {MIN_DEVICE_MEMORY} bytes; give the memory "
                "of one worker's device, e.g. 40Gi, or leave it out",
            )
        )
    problems += _check_nodes(spec) + _check_recovery(spec) + _check_failures(spec)
    return problems


def _check_model_source(spec: JobSpec) -> list[tuple[str, str]]:
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


def model_name(spec: JobSpec) -> str:
    """The contract's model string of `spec`: a shape name or a Hugging Face reference (read
    from its config file, if it names one; `model_source.reference`)."""
    if spec.model_source is None:
        return spec.model
    return sources.reference(spec.model_source)


def _check_nodes(spec: JobSpec) -> list[tuple[str, str]]:
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


def _check_recovery(spec: JobSpec) -> list[tuple[str, str]]:
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


def _check_failures(spec: JobSpec) -> list[tuple[str, str]]:
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


def to_settings(spec: JobSpec, name: str, corpus_default: str) -> job_settings.JobSettings:
    """The controller core's settings for `spec` run as job `name`; `corpus_default` is the
    corpus when the spec names none. Raises JobSpecError when `spec` breaks a `check` rule."""
    problems = check(spec)
    if problems:
        raise JobSpecError(f"spec.{problems[0][0]}: {problems[0][1]}")
    if NAME_PATTERN.match(name) is None:
        raise JobSpecError(f"metadata.name: {name!r} is not a lowercase RFC 1123 label; {NAMING}")
    return job_settings.JobSettings(
        name=name,
        workers=spec.workers,
        gpus_per_node=spec.gpus_per_node,
        steps=spec.steps,
        micro_batch_size=spec.micro_batch_size,
        training=_training(spec, corpus_default),
        fault_tolerance=spec.fault_tolerance,
        policy=spec.policy.value,
        mtbf_s=spec.mtbf_seconds,
        device_memory_bytes=(
            None if spec.device_memory is None else memory_bytes(spec.device_memory)
        ),
        backend=messages.Backend.NCCL if spec.device == "cuda" else messages.Backend.GLOO,
        heartbeat_interval_s=spec.timeouts.heartbeat_interval_seconds,
        heartbeat_timeout_s=spec.timeouts.heartbeat_seconds,
        step_timeout_s=spec.timeouts.step_seconds,
        configure_timeout_s=spec.timeouts.configure_seconds,
    )


NAMING = "use lowercase letters, digits and '-', at most 63 characters (e.g. tiny-job)"


def _training(spec: JobSpec, corpus_default: str) -> messages.TrainingSettings:
    optimizer = spec.optimizer
    return messages.TrainingSettings(
        model=model_name(spec),
        seed=spec.seed,
        optimizer=messages.OptimizerSettings(
            lr=optimizer.lr,
            beta1=optimizer.beta1,
            beta2=optimizer.beta2,
            eps=optimizer.eps,
            weight_decay=optimizer.weight_decay,
        ),
        global_batch_size=spec.global_batch_size,
        data=data_settings(spec.data, corpus_default),
        device=messages.Device(spec.device),
        snapshot_interval_steps=spec.snapshots.interval_steps,
        redundancy=messages.RedundancyMode(spec.snapshots.redundancy.value),
        checkpoint_dir=spec.checkpoints.dir if spec.checkpoints.interval_steps else "",
        checkpoint_interval_steps=spec.checkpoints.interval_steps if spec.checkpoints.dir else 0,
        reduction=messages.Reduction(spec.reduction.value),
        precision=messages.Precision(spec.precision.value),
    )


def data_settings(spec: DataSpec, corpus_default: str) -> messages.DataSettings:
    """The contract's data settings of `spec`; `corpus_default` when it names no corpus."""
    return messages.DataSettings(
        corpus_paths=tuple(spec.corpus_paths or (corpus_default,)),
        max_bytes=spec.max_bytes,
        format=messages.DataFormat(spec.format.value),
        text_field=spec.text_field,
        tokenizer_path=spec.tokenizer,
        separator=spec.separator,
        cache_dir=spec.cache_dir,
    )
