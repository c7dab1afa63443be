"""The contract's domain side: what the controller and the agents tell each other, as dataclasses.

These mirror the messages of planaria.v1 that have no home among the shared types (the plan,
layer transfers and profiles live in `planaria.contract`). The controller core imports only this
module of the wire package, never the codec nor the generated code, so it stays free of protobuf
and gRPC (an import contract in .importlinter keeps it so).

Values are checked on construction: a `ValueError` names the field and what to change. The codec
turns those into `WireError`s that name the message field, for messages that arrive from the
network.

Conventions (the same as the .proto file): seconds in `*_s` floats, bytes in `*_bytes` ints;
steps count committed optimizer steps from 1 with 0 meaning none yet; epochs count
configurations from 1 with 0 meaning never configured.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from planaria.contract import plan as plans
from planaria.contract import precision

# The largest value a uint32 / uint64 field of the contract can carry.
MAX_UINT32 = 2**32 - 1
MAX_UINT64 = 2**64 - 1
MAX_DIGEST_CHARS = 128  # a HeldSnapshot digest ("xxh3:" and 16 hex digits today)
# The largest integer a JSON number carries exactly (a float64 mantissa), and so the largest a
# user-facing field may take: the Kubernetes API server compares schema bounds as float64, and
# 2**63 - 1 rounds up to 2**63 there (the CRD with such a `maximum` is refused).
MAX_JSON_INTEGER = 2**53 - 1


class AgentState(StrEnum):
    """What an agent is doing (see AgentState in agent.proto)."""

    IDLE = "idle"
    CONFIGURING = "configuring"
    TRANSFERRING = "transferring"
    RUNNING = "running"
    PAUSED = "paused"
    FAILED = "failed"
    STOPPED = "stopped"
    FINISHED = "finished"


class RecoveryTier(StrEnum):
    """Where a worker found a layer's state in a new epoch, cheapest first (agent.proto)."""

    INITIAL = "initial"
    KEPT = "kept"
    LIVE_REPLICA = "live_replica"
    LOCAL_SNAPSHOT = "local_snapshot"
    PEER_SNAPSHOT = "peer_snapshot"
    CHECKPOINT = "checkpoint"


# The tiers from cheapest to costliest: an epoch's setup reports the costliest one it needed.
TIER_ORDER = (
    RecoveryTier.KEPT,
    RecoveryTier.LIVE_REPLICA,
    RecoveryTier.LOCAL_SNAPSHOT,
    RecoveryTier.PEER_SNAPSHOT,
    RecoveryTier.CHECKPOINT,
    RecoveryTier.INITIAL,
)


def costliest_tier(tiers: Iterable[RecoveryTier]) -> RecoveryTier:
    """The costliest of `tiers` in `TIER_ORDER` (KEPT when there are none): an epoch's setup
    reports it over a worker's layers, the controller over the workers."""
    return max(tiers, key=TIER_ORDER.index, default=RecoveryTier.KEPT)


class ErrorKind(StrEnum):
    """Kinds of errors an agent latches for the controller's recovery decision (agent.proto).

    PEER_LOST and TIMEOUT: a peer died or hangs, this worker survives it. INTERNAL and
    OUT_OF_MEMORY: this worker is broken (a bug, a device, its memory). INVALID_CONFIG and
    INVALID_DATA: the job's settings, plan or data cannot be used, whichever worker tries.
    SNAPSHOT_UNAVAILABLE: a layer's state is in no recovery tier here. How the controller acts
    on each: docs/controller.md, "Errors an agent latches of its own".
    """

    PEER_LOST = "peer_lost"
    TIMEOUT = "timeout"
    INTERNAL = "internal"
    INVALID_CONFIG = "invalid_config"
    OUT_OF_MEMORY = "out_of_memory"
    SNAPSHOT_UNAVAILABLE = "snapshot_unavailable"
    INVALID_DATA = "invalid_data"


class RedundancyMode(StrEnum):
    """How host-memory snapshot shards are protected (REFT §4.2: ARC copies, AEC parity, AOR)."""

    NONE = "none"
    COPY = "copy"
    XOR = "xor"
    RECOMPUTE = "recompute"


class Reduction(StrEnum):
    """How gradients are summed over micro-batches and workers (agent.proto, docs/numerics.md).

    FAST sums float32 gradients in whatever order the plan computes them: the parameters equal
    a fault-free run's up to float32 summation order. EXACT adds each micro-batch's gradient
    into a float64 sum, all-reduces in float64 and rounds once to the parameter dtype before the
    optimizer step: the parameters do not depend on the plan, rerouting or failures.
    """

    FAST = "fast"
    EXACT = "exact"


# The arithmetic of forward and backward (agent.proto, docs/numerics.md "Precision"): a shared
# type, since profiles record it too.
Precision = precision.Precision


class Backend(StrEnum):
    """The torch.distributed backend of an epoch's process group."""

    GLOO = "gloo"
    NCCL = "nccl"


class Device(StrEnum):
    """Where a worker computes."""

    CPU = "cpu"
    CUDA = "cuda"


def _check_range(owner: str, field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValueError(f"{owner}: {field} is {value}; give a whole number in [{low}, {high}]")


def _check_seconds(owner: str, field: str, value: float, *, positive: bool) -> None:
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{owner}: {field} is {value}; give a finite number of seconds {bound}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Rendezvous:
    """Where and how an epoch's process group forms: the controller's TCP store, this worker's
    rank, and the timeout bounding every blocking wait of the group."""

    store_host: str
    store_port: int
    key_prefix: str
    rank: int
    world_size: int
    backend: Backend
    timeout_s: float

    def __post_init__(self) -> None:
        if not self.store_host:
            raise ValueError("rendezvous: store_host is empty; give the store's host or address")
        _check_range("rendezvous", "store_port", self.store_port, 1, 65535)
        if not self.key_prefix:
            raise ValueError("rendezvous: key_prefix is empty; give the epoch's prefix (epoch-N)")
        _check_range("rendezvous", "world_size", self.world_size, 1, MAX_UINT32)
        _check_range("rendezvous", "rank", self.rank, 0, self.world_size - 1)
        _check_seconds("rendezvous", "timeout_s", self.timeout_s, positive=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerSettings:
    """AdamW's hyper-parameters."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"optimizer: lr is {self.lr}; give a finite learning rate > 0")
        for name, beta in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not 0 <= beta < 1:
                raise ValueError(f"optimizer: {name} is {beta}; give a decay in [0, 1)")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"optimizer: eps is {self.eps}; give a finite eps > 0")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"optimizer: weight_decay is {self.weight_decay}; give one >= 0")


class DataFormat(StrEnum):
    """How the corpus files hold their documents (agent.proto, docs/running.md)."""

    TEXT = "text"
    JSONL = "jsonl"
    PARQUET = "parquet"


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSettings:
    """The corpus files, read in order, and how they become tokens.

    `max_bytes` caps the text read; `text_field` names the JSONL field or Parquet column of the
    text; `tokenizer_path` is a `tokenizer.json` ("" = byte tokens); `separator` is appended
    after every document ("" = none; with a tokenizer, one of its tokens); `cache_dir` holds
    the tokenised corpus ("" = the worker's default cache).
    """

    corpus_paths: tuple[str, ...]
    max_bytes: int | None = None
    format: DataFormat = DataFormat.TEXT
    text_field: str = "text"
    tokenizer_path: str = ""
    separator: str = ""
    cache_dir: str = ""

    def __post_init__(self) -> None:
        if not self.corpus_paths or not all(self.corpus_paths):
            raise ValueError(f"data: corpus_paths {self.corpus_paths}; give non-empty paths")
        if self.max_bytes is not None:
            _check_range("data", "max_bytes", self.max_bytes, 1, MAX_UINT64)
        if not self.text_field:
            raise ValueError("data: text_field is empty; name the JSONL field or Parquet column")

    @property
    def needs_tokenising(self) -> bool:
        """Whether the corpus is more than the files' bytes (then it is tokenised and cached)."""
        return bool(self.format is not DataFormat.TEXT or self.tokenizer_path or self.separator)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSettings:
    """The job's settings that never change with the plan.

    `snapshot_interval_steps` = 0 takes no periodic snapshots (TakeSnapshot still works).
    `checkpoint_dir` = "" or `checkpoint_interval_steps` = 0 writes no persistent checkpoints;
    otherwise the interval is a multiple of the snapshot interval (checkpoints are copied from
    complete snapshots).
    """

    model: str
    seed: int
    optimizer: OptimizerSettings
    global_batch_size: int
    data: DataSettings
    device: Device
    snapshot_interval_steps: int
    redundancy: RedundancyMode
    checkpoint_dir: str = ""
    checkpoint_interval_steps: int = 0
    reduction: Reduction = Reduction.FAST
    precision: Precision = Precision.FP32

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("settings: model is empty; give a model shape name such as 'tiny'")
        _check_range("settings", "seed", self.seed, 0, MAX_UINT64)
        _check_range("settings", "global_batch_size", self.global_batch_size, 1, MAX_UINT32)
        _check_range(
            "settings", "snapshot_interval_steps", self.snapshot_interval_steps, 0, MAX_UINT32
        )
        _check_range(
            "settings", "checkpoint_interval_steps", self.checkpoint_interval_steps, 0, MAX_UINT32
        )
        if self.checkpoint_interval_steps and self.checkpoint_dir:
            snap = self.snapshot_interval_steps
            if snap == 0 or self.checkpoint_interval_steps % snap:
                raise ValueError(
                    f"settings: checkpoint_interval_steps {self.checkpoint_interval_steps} is "
                    f"not a multiple of snapshot_interval_steps {snap}; checkpoints are copied "
                    "from snapshots, so make it a multiple (and snapshots periodic)"
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """Everything one worker needs to run an epoch (the Configure RPC).

    `resume_step` is the last committed step; training continues with the next one. `transfers`
    are the layer copies this worker takes part in, as destination or as a source; a worker may
    be a source without being in the plan (its old layers are still wanted). The plan's global
    batch must equal the settings' global batch: the plan may change, the batch never does.
    `stop_step` (None: train until paused or stopped) is the last step to train before holding
    in state FINISHED.
    """

    epoch: int
    worker: plans.WorkerId
    plan: plans.Plan
    resume_step: int
    rendezvous: Rendezvous
    transfers: tuple[plans.LayerTransfer, ...]
    settings: TrainingSettings
    stop_step: int | None = None

    def __post_init__(self) -> None:
        _check_range("worker config", "epoch", self.epoch, 1, MAX_UINT64)
        if self.stop_step is not None:
            _check_range("worker config", "stop_step", self.stop_step, self.resume_step, MAX_UINT64)
        _check_range("worker config", "worker", self.worker, 0, MAX_UINT32)
        _check_range("worker config", "resume_step", self.resume_step, 0, MAX_UINT64)
        if self.plan.global_batch_size != self.settings.global_batch_size:
            raise ValueError(
                f"worker config: the plan's global batch is {self.plan.global_batch_size} "
                f"samples but settings.global_batch_size is {self.settings.global_batch_size}; "
                "make the plan's micro_batch_size x micro-batches equal the global batch"
            )
        seen: set[tuple[int, plans.WorkerId]] = set()
        for transfer in self.transfers:
            self._check_transfer(transfer)
            if (transfer.layer, transfer.destination) in seen:
                raise ValueError(
                    f"worker config: layer {transfer.layer} is sent to worker "
                    f"{transfer.destination} twice; give one transfer per layer and destination"
                )
            seen.add((transfer.layer, transfer.destination))

    def _check_transfer(self, transfer: plans.LayerTransfer) -> None:
        if self.worker != transfer.destination and self.worker not in transfer.sources:
            raise ValueError(
                f"worker config: transfer of layer {transfer.layer} to {transfer.destination} "
                f"does not involve worker {self.worker}; send each worker only its own transfers"
            )
        if transfer.layer >= self.plan.num_layers:
            raise ValueError(
                f"worker config: a transfer names layer {transfer.layer} but the plan has "
                f"{self.plan.num_layers} layers; give a layer in [0, {self.plan.num_layers})"
            )
        holders = _holders(self.plan, transfer.layer)
        if transfer.destination not in holders:
            raise ValueError(
                f"worker config: transfer of layer {transfer.layer} goes to worker "
                f"{transfer.destination}, which does not hold that layer in the plan; send it "
                f"to one of {sorted(holders)}"
            )


# The plan whose holders were indexed last, and the index: the controller builds every worker's
# WorkerConfig of an epoch from one Plan object, and a plan walked once per copy was 407 s of
# the event loop for a scale-up's 8,192 Configures at 1,024 nodes of 8 GPUs (0.7 s indexed,
# docs/benchmarks.md). Keyed by identity and kept with its plan, so the identity stays valid.
_indexed: tuple[plans.Plan, dict[int, frozenset[plans.WorkerId]]] | None = None


def _holders(plan: plans.Plan, layer: int) -> frozenset[plans.WorkerId]:
    """The workers that hold `layer` in `plan`."""
    global _indexed
    indexed = _indexed
    if indexed is None or indexed[0] is not plan:
        held: dict[int, set[plans.WorkerId]] = {}
        for stage in (s for p in plan.pipelines for s in p.stages):
            for held_layer in stage.layers:
                held.setdefault(held_layer, set()).update(stage.workers)
        indexed = _indexed = (plan, {k: frozenset(v) for k, v in held.items()})
    return indexed[1].get(layer, frozenset())


@dataclass(frozen=True, slots=True, kw_only=True)
class Timings:
    """Seconds the last step spent in each phase (phases may overlap, so they need not sum to
    `step_s`)."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    communication_s: float = 0.0
    allreduce_s: float = 0.0
    optimizer_s: float = 0.0
    snapshot_s: float = 0.0
    step_s: float = 0.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            _check_seconds("timings", field.name, getattr(self, field.name), positive=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberDigest:
    """The digest of member `member`'s files of `layer` in one snapshot: equal at a member's
    holder and at its mirror, which keep the same files."""

    layer: int
    member: int
    digest: str

    def __post_init__(self) -> None:
        _check_range("member digest", "layer", self.layer, 0, MAX_UINT32)
        _check_range("member digest", "member", self.member, 0, MAX_UINT32)
        _check_digest("member digest", self.digest)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldSnapshot:
    """A complete snapshot in a worker's store: its step and a digest of its files' checksums
    (the same digest for the same bytes), and one digest per member it holds (`members`,
    distinct (layer, member) pairs)."""

    step: int
    digest: str
    members: tuple[MemberDigest, ...] = ()

    def __post_init__(self) -> None:
        _check_range("held snapshot", "step", self.step, 1, MAX_UINT64)
        _check_digest("held snapshot", self.digest)
        keys = [(m.layer, m.member) for m in self.members]
        if len(set(keys)) != len(keys):
            raise ValueError("held snapshot: a (layer, member) digest is given twice")


def _check_digest(what: str, digest: str) -> None:
    if not 0 < len(digest) <= MAX_DIGEST_CHARS:
        raise ValueError(
            f"{what}: digest of {len(digest)} characters; give 1 to {MAX_DIGEST_CHARS}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotState:
    """The host-memory snapshots a worker holds: the latest complete one's step (None when none)
    and the bytes it occupies here (shards and redundancy), whether one is being taken, and the
    mean steps between the snapshots begun this epoch (0.0 until two were; above the configured
    interval when the writer could not keep up and skipped steps). `held`: every complete
    snapshot the store holds, newest first (distinct steps), confirmed elsewhere or not."""

    latest_step: int | None = None
    held_bytes: int = 0
    in_progress: bool = False
    achieved_interval_steps: float = 0.0
    held: tuple[HeldSnapshot, ...] = ()

    def __post_init__(self) -> None:
        steps = [h.step for h in self.held]
        if steps != sorted(set(steps), reverse=True):
            raise ValueError(f"snapshot: held steps {steps}; list distinct steps, newest first")
        value = self.achieved_interval_steps
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(
                f"snapshot: achieved_interval_steps is {value}; give a finite number >= 0"
            )
        if self.latest_step is not None:
            _check_range("snapshot", "latest_step", self.latest_step, 1, MAX_UINT64)
        _check_range("snapshot", "held_bytes", self.held_bytes, 0, MAX_UINT64)
        if self.latest_step is None and self.held_bytes:
            raise ValueError(
                f"snapshot: held_bytes is {self.held_bytes} but there is no snapshot; "
                "set latest_step or make held_bytes 0"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class LatchedError:
    """An error an agent hit during `step` and holds until it is reconfigured."""

    kind: ErrorKind
    message: str
    step: int
    peer_worker: plans.WorkerId | None = None

    def __post_init__(self) -> None:
        if not self.message:
            raise ValueError(f"latched error ({self.kind}): message is empty; say what happened")
        _check_range("latched error", "step", self.step, 0, MAX_UINT64)
        if self.peer_worker is not None:
            _check_range("latched error", "peer_worker", self.peer_worker, 0, MAX_UINT32)


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochSetup:
    """How a worker set up `epoch`: the costliest tier its layers needed, seconds per part, and
    the bytes of layer state it received from and sent to peers."""

    epoch: int
    tier: RecoveryTier
    regroup_s: float = 0.0
    transfer_s: float = 0.0
    load_s: float = 0.0
    received_bytes: int = 0
    sent_bytes: int = 0

    def __post_init__(self) -> None:
        _check_range("epoch setup", "epoch", self.epoch, 1, MAX_UINT64)
        for name in ("regroup_s", "transfer_s", "load_s"):
            _check_seconds("epoch setup", name, getattr(self, name), positive=False)
        _check_range("epoch setup", "received_bytes", self.received_bytes, 0, MAX_UINT64)
        _check_range("epoch setup", "sent_bytes", self.sent_bytes, 0, MAX_UINT64)


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """One report on the Watch stream: where the agent is and how its last step went.

    `loss` is the loss of `last_committed_step` (None when no step is committed, or when the
    agent resumed without it); `errors` are those latched since the epoch began; `setup` is how
    the current epoch was set up (None before the first); `checkpoint_step` the newest
    persistent checkpoint every worker of its plan completely wrote (None when none).
    """

    worker: plans.WorkerId
    epoch: int
    state: AgentState
    last_committed_step: int
    loss: float | None
    samples_processed: int
    timings: Timings
    snapshot: SnapshotState
    errors: tuple[LatchedError, ...] = ()
    setup: EpochSetup | None = None
    checkpoint_step: int | None = None

    def __post_init__(self) -> None:
        _check_range("heartbeat", "worker", self.worker, 0, MAX_UINT32)
        _check_range("heartbeat", "epoch", self.epoch, 0, MAX_UINT64)
        _check_range("heartbeat", "last_committed_step", self.last_committed_step, 0, MAX_UINT64)
        _check_range("heartbeat", "samples_processed", self.samples_processed, 0, MAX_UINT64)
        if self.last_committed_step == 0 and self.loss is not None:
            raise ValueError("heartbeat: a loss is given but no step is committed; drop the loss")
        if self.state is AgentState.FAILED and not self.errors:
            raise ValueError("heartbeat: state is failed but no error is latched; report it")
        if self.checkpoint_step is not None:
            _check_range("heartbeat", "checkpoint_step", self.checkpoint_step, 1, MAX_UINT64)


@dataclass(frozen=True, slots=True, kw_only=True)
class Acknowledgement:
    """An agent's answer to a command: accepted, or refused with a reason (stale epoch, wrong
    state). Malformed commands are not answered this way; they fail with INVALID_ARGUMENT."""

    accepted: bool
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.accepted and not self.reason:
            raise ValueError("acknowledgement: a refusal needs a reason; say why")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileOrder:
    """Ask an agent to profile `model` at `micro_batch_size` in `precision` (the job's), keeping
    the median of `repeats`."""

    model: str
    micro_batch_size: int
    repeats: int
    precision: Precision = Precision.FP32

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("profile order: model is empty; give a model shape name")
        _check_range("profile order", "micro_batch_size", self.micro_batch_size, 1, MAX_UINT32)
        _check_range("profile order", "repeats", self.repeats, 1, MAX_UINT32)


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotLoad:
    """Ask the agents of `epoch` to load their layers from the host-memory snapshots of `step`."""

    epoch: int
    step: int

    def __post_init__(self) -> None:
        _check_range("snapshot load", "epoch", self.epoch, 1, MAX_UINT64)
        _check_range("snapshot load", "step", self.step, 1, MAX_UINT64)
