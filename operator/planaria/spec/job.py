"""The job spec's schema: what a user asks for, as the `spec` of a ResilientJob and as a local job
file.

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

Here live the models, their per-field rules (pydantic's), the quantities they parse
(`memory_bytes`) and the job name's form. Deliberately not here: the cross-field rules a CRD
would state in CEL (`planaria.spec.consistency.check`), reading a file
(`planaria.spec.job_file`) and the conversion into the controller core's settings
(`planaria.spec.conversion.to_settings`). `failures` is local-mode failure injection: the
operator ignores it.

Errors, for the job spec's modules (`consistency` returns problems as values; `job_file` and
`conversion` raise them as this one exception):

    ValueError
    └── JobSpecError   one line: `<source>: <field path>: <problem>; <what to change>`
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

import pydantic
from pydantic import alias_generators

from planaria.control import settings as job_settings
from planaria.spec import durations
from planaria.spec import model_source as sources
from planaria.wire import messages

API_VERSION = "planaria.dev/v1alpha1"
KIND = "ResilientJob"
# A Kubernetes name that a Service may take (RFC 1035 label: a letter first, as the CRD's rule,
# kube.crd.JOB_NAME_PATTERN, asks): it also names the job's snapshot directories.
NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
NAMING = (
    "start with a lowercase letter, then use lowercase letters, digits and '-', at most 63 "
    "characters (e.g. tiny-job)"
)


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
