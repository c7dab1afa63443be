"""Shared Hypothesis strategies, one section per kind of value (append yours; keep others').

Profiles (planaria.contract.profile): `link_profiles`, `layer_profiles`, `profiles`, with finite,
non-negative times and byte counts and model names that are none of the named shapes (a named
model's profile must have exactly its layer count). Model shapes: `small_shapes`, GPT shapes
small enough to cost or build in a test.

Plans (planaria.contract.plan): `plans` (valid plans, with reroutes and holes), `layer_transfers`;
`shaped_plans` (given stage counts, symmetric or not, with failed stages rerouted to peers);
`packed_plans` (one worker per stage, several stages, of one pipeline or several, per node).
Planning: `planning_layers`, `planning_profiles` (tied times, binding memory), `pipeline_costs`.
Failures (planner transfers, candidates, policy): builders `uniform_profile`, `timed_profile`,
`grid_plan`; strategies `running_plans`, `failed_workers`, `layouts` (new layouts over survivors).
Wire messages (planaria.wire.messages): `rendezvous`, `training_settings`, `worker_configs`,
`timings`, `snapshot_states`, `latched_errors`, `heartbeats`.
Failure traces (planaria.sim): `sim_traces` (per-device, per-cluster and spot traces).
Suspended jobs (planaria.control.suspension): `suspensions`, `suspension_facts`.
Bad input (tests/fuzz): `job_spec_documents` (valid job files), `job_spec_mutants` (damaged),
`job_file_texts` (damaged as text), `mutated_protos` (a message with fields set out of range),
`mutated_documents` (any JSON-like mapping, mutated below its root).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor, message
from hypothesis import assume
from hypothesis import strategies as st

from planaria.contract import plan, precision, profile, shapes
from planaria.control import suspension
from planaria.sim import traces
from planaria.wire import messages

# --- profiles ----------------------------------------------------------------------------------

_SECONDS = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)
_BYTES = st.integers(min_value=0, max_value=2**50)
_NAMES = st.text(min_size=1, max_size=12)


def link_profiles() -> st.SearchStrategy[profile.LinkProfile]:
    """Links with positive bandwidth (1 B/s .. 1 TB/s) and latency up to a second, with or
    without all-reduce figures of their own."""
    bandwidths = st.floats(min_value=1.0, max_value=1e12)
    latencies = st.floats(min_value=0.0, max_value=1.0)
    return st.builds(
        profile.LinkProfile,
        bandwidth_bytes_per_s=bandwidths,
        latency_s=latencies,
        allreduce_bandwidth_bytes_per_s=st.none() | bandwidths,
        allreduce_latency_s=st.none() | latencies,
    )


@st.composite
def layer_profiles(draw: st.DrawFn, max_gpus: int) -> profile.LayerProfile:
    """One layer with times for exactly 1..max_gpus GPUs."""
    times = st.lists(_SECONDS, min_size=max_gpus, max_size=max_gpus).map(tuple)
    return profile.LayerProfile(
        name=draw(_NAMES),
        forward_s=draw(times),
        backward_s=draw(times),
        parameter_bytes=draw(_BYTES),
        gradient_bytes=draw(_BYTES),
        optimizer_bytes=draw(_BYTES),
        activation_bytes=draw(_BYTES),
        output_bytes=draw(_BYTES),
        optimizer_s=draw(_SECONDS),
    )


@st.composite
def profiles(draw: st.DrawFn, *, max_layers: int = 8, max_gpus: int = 4) -> profile.Profile:
    """A valid profile of 1..max_layers layers, all timed for the same 1..M GPUs."""
    m = draw(st.integers(min_value=1, max_value=max_gpus))
    return profile.Profile(
        model=draw(_NAMES.filter(lambda name: name not in shapes.NAMED_SHAPES)),
        accelerator=draw(_NAMES),
        micro_batch_size=draw(st.integers(min_value=1, max_value=64)),
        memory_bytes=draw(st.integers(min_value=1, max_value=2**40)),
        layers=tuple(draw(st.lists(layer_profiles(m), min_size=1, max_size=max_layers))),
        intra_node=draw(link_profiles()),
        inter_node=draw(link_profiles()),
        synthetic=draw(st.booleans()),
        precision=draw(st.sampled_from(precision.Precision)),
    )


@st.composite
def sized_profiles(draw: st.DrawFn, num_layers: int, gpus: int, model: str) -> profile.Profile:
    """A profile of exactly `num_layers` drawn layers timed for 1..`gpus` GPUs and drawn links,
    micro-batch 1, memory unbounded: the estimators' oracle tests replay plans against it."""
    layers = draw(st.lists(layer_profiles(gpus), min_size=num_layers, max_size=num_layers))
    return profile.Profile(
        model=model,
        accelerator="test",
        micro_batch_size=1,
        memory_bytes=2**40,
        layers=tuple(layers),
        intra_node=draw(link_profiles()),
        inter_node=draw(link_profiles()),
    )


@st.composite
def small_shapes(draw: st.DrawFn, *, max_layers: int = 6) -> shapes.ModelShape:
    """A small GPT shape: heads divide d_model; ffn_dim either the default 4*d or explicit."""
    num_heads = draw(st.integers(min_value=1, max_value=8))
    d_model = num_heads * draw(st.integers(min_value=1, max_value=32))
    return shapes.ModelShape(
        name="small-drawn",
        num_layers=draw(st.integers(min_value=1, max_value=max_layers)),
        d_model=d_model,
        num_heads=num_heads,
        seq_len=draw(st.integers(min_value=1, max_value=256)),
        vocab_size=draw(st.integers(min_value=1, max_value=4096)),
        ffn_dim=draw(st.sampled_from([0, d_model, 3 * d_model + 1])),
    )


# --- plans (planaria.contract.plan) -------------------------------------------------------------


@st.composite
def _cuts(draw: st.DrawFn, num_layers: int) -> tuple[int, ...]:
    """Stage boundaries strictly inside 1..num_layers-1 (at most 3, so at most 4 stages)."""
    if num_layers == 1:
        return ()
    inner = st.integers(min_value=1, max_value=num_layers - 1)
    return tuple(sorted(draw(st.lists(inner, unique=True, max_size=min(3, num_layers - 1)))))


@st.composite
def plans(
    draw: st.DrawFn, *, max_layers: int = 8, max_pipelines: int = 3, max_gpus_per_node: int = 4
) -> plan.Plan:
    """A valid plan: pipelines of contiguous stages over the same layers (often the same cuts, so
    that reroutes are possible), every stage on a fresh node with 1..gpus_per_node distinct GPUs,
    1..8 micro-batches per pipeline, and reroutes to peers of the same layer range; a fully
    rerouted stage that nobody reroutes to may be a hole (no workers)."""
    num_layers = draw(st.integers(min_value=1, max_value=max_layers))
    gpus_per_node = draw(st.integers(min_value=1, max_value=max_gpus_per_node))
    template = draw(_cuts(num_layers))
    node = draw(st.integers(min_value=0, max_value=3))
    raw: list[tuple[list[tuple[int, int, tuple[plan.WorkerId, ...]]], int]] = []
    for _ in range(draw(st.integers(min_value=1, max_value=max_pipelines))):
        cuts = template if draw(st.booleans()) else draw(_cuts(num_layers))
        stages = []
        for start, stop in zip((0, *cuts), (*cuts, num_layers), strict=True):
            gpus = st.integers(min_value=0, max_value=gpus_per_node - 1)
            local = draw(st.lists(gpus, min_size=1, max_size=gpus_per_node, unique=True))
            stages.append(
                (start, stop, tuple(plan.WorkerId(node * gpus_per_node + g) for g in local))
            )
            node += 1 + draw(st.integers(min_value=0, max_value=2))
        raw.append((stages, draw(st.integers(min_value=1, max_value=8))))
    reroutes = draw(_reroutes(raw))
    return plan.Plan(
        pipelines=tuple(
            plan.Pipeline(
                stages=tuple(
                    plan.Stage(layer_start=a, layer_stop=b, workers=w) for a, b, w in stages
                ),
                num_micro_batches=m,
            )
            for stages, m in raw
        ),
        micro_batch_size=draw(st.integers(min_value=1, max_value=16)),
        gpus_per_node=gpus_per_node,
        reroutes=reroutes,
    )


@st.composite
def packed_plans(draw: st.DrawFn, *, max_layers: int = 4, max_pipelines: int = 3) -> plan.Plan:
    """A valid plan of one worker per stage whose workers are packed on 1..4 nodes in any
    order, so that a node may host stages of one pipeline or of several (the cases where a
    layer's holders, or its holders and their mirrors, share nodes)."""
    num_layers = draw(st.integers(min_value=1, max_value=max_layers))
    layouts = [
        draw(_cuts(num_layers))
        for _ in range(draw(st.integers(min_value=1, max_value=max_pipelines)))
    ]
    num_stages = sum(len(cuts) + 1 for cuts in layouts)
    fewest = -(-num_stages // 4)  # GPUs per node so that 4 nodes hold every stage
    gpus_per_node = draw(st.integers(min_value=fewest, max_value=fewest + 2))
    num_nodes = draw(st.integers(min_value=-(-num_stages // gpus_per_node), max_value=4))
    ids = draw(st.permutations(range(num_nodes * gpus_per_node)))
    workers = iter(plan.WorkerId(w) for w in ids)
    return plan.Plan(
        pipelines=tuple(
            plan.Pipeline(
                stages=tuple(
                    plan.Stage(layer_start=a, layer_stop=b, workers=(next(workers),))
                    for a, b in zip((0, *cuts), (*cuts, num_layers), strict=True)
                ),
                num_micro_batches=1,
            )
            for cuts in layouts
        ),
        micro_batch_size=1,
        gpus_per_node=gpus_per_node,
    )


@st.composite
def _reroutes(
    draw: st.DrawFn, raw: list[tuple[list[tuple[int, int, tuple[plan.WorkerId, ...]]], int]]
) -> tuple[plan.Reroute, ...]:
    """At most one reroute per stage, to a peer pipeline's stage with the same layers; `raw` is
    edited in place to empty the workers of fully rerouted stages chosen to be holes."""
    candidates = [
        (p, i, q)
        for p, (stages, _) in enumerate(raw)
        for i, (start, stop, _) in enumerate(stages)
        for q, (peer, _) in enumerate(raw)
        if q != p and any((a, b) == (start, stop) for a, b, _ in peer)
    ]
    if not candidates:
        return ()
    chosen = draw(st.lists(st.sampled_from(candidates), max_size=3, unique_by=lambda c: c[:2]))
    reroutes, targets = [], set()
    for p, i, q in chosen:
        start, stop, _ = raw[p][0][i]
        targets.add((q, next(j for j, s in enumerate(raw[q][0]) if s[:2] == (start, stop))))
        micro = st.integers(min_value=0, max_value=raw[p][1] - 1)
        batches = tuple(sorted(draw(st.lists(micro, unique=True, max_size=raw[p][1]))))
        reroutes.append(plan.Reroute(pipeline=p, stage=i, peer_pipeline=q, micro_batches=batches))
    for reroute in reroutes:
        p, i = reroute.pipeline, reroute.stage
        whole = len(reroute.micro_batches) == raw[p][1]
        if whole and (p, i) not in targets and draw(st.booleans()):
            raw[p][0][i] = (*raw[p][0][i][:2], ())
    return tuple(reroutes)


def _holders(p: plan.Plan, layer: int) -> list[plan.WorkerId]:
    return sorted(
        w for pl in p.pipelines for s in pl.stages if layer in s.layers for w in s.workers
    )


@st.composite
def layer_transfers(draw: st.DrawFn, p: plan.Plan, worker: plan.WorkerId) -> plan.LayerTransfer:
    """A transfer valid for `worker`'s configuration under plan `p`: it receives a layer it holds
    (when it holds any and the draw says so) or sends one of 1..3 shards of a layer to a holder."""
    others = st.integers(min_value=0, max_value=max(p.workers, default=0) + 4)
    mine = [layer for layer in range(p.num_layers) if worker in _holders(p, layer)]
    sendable = [n for n in range(p.num_layers) if set(_holders(p, n)) - {worker}]
    if mine and (not sendable or draw(st.booleans())):
        layer = draw(st.sampled_from(mine))
        senders = others.filter(lambda w: w != worker)
        sources = draw(st.lists(senders, min_size=1, max_size=3, unique=True))
        return plan.LayerTransfer(
            layer=layer, destination=worker, sources=tuple(plan.WorkerId(w) for w in sources)
        )
    layer = draw(st.sampled_from(sendable))
    destination = draw(st.sampled_from([w for w in _holders(p, layer) if w != worker]))
    senders = others.filter(lambda w: w not in (worker, destination))
    rest = draw(st.lists(senders, max_size=2, unique=True))
    position = draw(st.integers(min_value=0, max_value=len(rest)))
    rest.insert(position, worker)
    return plan.LayerTransfer(
        layer=layer, destination=destination, sources=tuple(plan.WorkerId(w) for w in rest)
    )


# --- wire messages (planaria.wire.messages) ----------------------------------------------------

_STEPS = st.integers(min_value=0, max_value=2**64 - 1)
_WORKERS = st.integers(min_value=0, max_value=2**32 - 1).map(plan.WorkerId)
_WORDS = st.text(min_size=1, max_size=16)


def rendezvous() -> st.SearchStrategy[messages.Rendezvous]:
    """A rendezvous whose rank is below its world size."""
    return st.integers(min_value=1, max_value=64).flatmap(
        lambda world: st.builds(
            messages.Rendezvous,
            store_host=_WORDS,
            store_port=st.integers(min_value=1, max_value=65535),
            key_prefix=_WORDS,
            rank=st.integers(min_value=0, max_value=world - 1),
            world_size=st.just(world),
            backend=st.sampled_from(messages.Backend),
            timeout_s=st.floats(min_value=1e-3, max_value=3600.0),
        )
    )


def training_settings(global_batch_size: int) -> st.SearchStrategy[messages.TrainingSettings]:
    """Settings for a plan whose global batch is `global_batch_size` samples."""
    optimizer = st.builds(
        messages.OptimizerSettings,
        lr=st.floats(min_value=1e-8, max_value=10.0),
        beta1=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
        beta2=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
        eps=st.floats(min_value=1e-12, max_value=1e-3),
        weight_decay=st.floats(min_value=0.0, max_value=1.0),
    )
    data = st.builds(
        messages.DataSettings,
        corpus_paths=st.lists(_WORDS, min_size=1, max_size=3).map(tuple),
        max_bytes=st.none() | st.integers(min_value=1, max_value=2**64 - 1),
        format=st.sampled_from(messages.DataFormat),
        text_field=_WORDS,
        tokenizer_path=st.just("") | _WORDS,
        separator=st.text(max_size=5),
        cache_dir=st.just("") | _WORDS,
    )
    return st.builds(
        messages.TrainingSettings,
        model=_WORDS,
        seed=_STEPS,
        optimizer=optimizer,
        global_batch_size=st.just(global_batch_size),
        data=data,
        device=st.sampled_from(messages.Device),
        snapshot_interval_steps=st.integers(min_value=0, max_value=1000),
        redundancy=st.sampled_from(messages.RedundancyMode),
        reduction=st.sampled_from(messages.Reduction),
        precision=st.sampled_from(messages.Precision),
    ).flatmap(_with_checkpoints)


def _with_checkpoints(
    settings: messages.TrainingSettings,
) -> st.SearchStrategy[messages.TrainingSettings]:
    """The settings without checkpoints, or with a directory and a multiple of the snapshot
    interval (only when snapshots are periodic)."""
    if not settings.snapshot_interval_steps:
        return st.just(settings)
    multiples = st.integers(min_value=0, max_value=8).map(
        lambda k: k * settings.snapshot_interval_steps
    )
    return st.just(settings) | st.builds(
        dataclasses.replace,
        st.just(settings),
        checkpoint_dir=_WORDS,
        checkpoint_interval_steps=multiples,
    )


@st.composite
def worker_configs(draw: st.DrawFn) -> messages.WorkerConfig:
    """A configuration for a worker of the plan (or one outside it, then only a source of
    transfers), with up to 3 transfers involving it and settings matching the plan's batch."""
    p = draw(plans())
    worker = draw(st.sampled_from([*p.workers, plan.WorkerId(max(p.workers) + 1)]))
    transfers = draw(
        st.lists(
            layer_transfers(p, worker), max_size=3, unique_by=lambda t: (t.layer, t.destination)
        )
    )
    resume_step = draw(_STEPS)
    return messages.WorkerConfig(
        epoch=draw(st.integers(min_value=1, max_value=2**64 - 1)),
        worker=worker,
        plan=p,
        resume_step=resume_step,
        stop_step=draw(st.none() | st.integers(min_value=resume_step, max_value=2**64 - 1)),
        rendezvous=draw(rendezvous()),
        transfers=tuple(transfers),
        settings=draw(training_settings(p.global_batch_size)),
    )


def timings() -> st.SearchStrategy[messages.Timings]:
    seconds = st.floats(min_value=0.0, max_value=1e4)
    return st.builds(
        messages.Timings,
        forward_s=seconds,
        backward_s=seconds,
        communication_s=seconds,
        allreduce_s=seconds,
        optimizer_s=seconds,
        snapshot_s=seconds,
        step_s=seconds,
    )


@st.composite
def snapshot_states(draw: st.DrawFn) -> messages.SnapshotState:
    """No snapshot (0 bytes held), or the latest one's step and size; any achieved interval;
    up to two held snapshots (the store's slots), newest first, with any digest."""
    latest = draw(st.none() | st.integers(min_value=1, max_value=2**64 - 1))
    held = 0 if latest is None else draw(st.integers(min_value=0, max_value=2**64 - 1))
    interval = draw(st.floats(min_value=0, max_value=1e9, allow_nan=False))
    steps = draw(st.lists(st.integers(min_value=1, max_value=2**64 - 1), max_size=2, unique=True))
    digests = st.text(min_size=1, max_size=messages.MAX_DIGEST_CHARS)
    members = st.lists(
        st.builds(
            messages.MemberDigest,
            layer=st.integers(0, 2**32 - 1),
            member=st.integers(0, 2**32 - 1),
            digest=digests,
        ),
        max_size=3,
        unique_by=lambda m: (m.layer, m.member),
    )
    stored = tuple(
        messages.HeldSnapshot(step=step, digest=draw(digests), members=tuple(draw(members)))
        for step in sorted(steps, reverse=True)
    )
    return messages.SnapshotState(
        latest_step=latest,
        held_bytes=held,
        in_progress=draw(st.booleans()),
        achieved_interval_steps=interval,
        held=stored,
    )


def latched_errors() -> st.SearchStrategy[messages.LatchedError]:
    return st.builds(
        messages.LatchedError,
        kind=st.sampled_from(messages.ErrorKind),
        message=_WORDS,
        step=_STEPS,
        peer_worker=st.none() | _WORKERS,
    )


@st.composite
def heartbeats(draw: st.DrawFn) -> messages.Heartbeat:
    """Heartbeats in any state; a failed agent has at least one latched error, and there is a
    loss (any float but NaN) only once a step is committed."""
    state = draw(st.sampled_from(messages.AgentState))
    step = draw(_STEPS)
    losses = st.floats(allow_nan=False)
    minimum = 1 if state is messages.AgentState.FAILED else 0
    return messages.Heartbeat(
        worker=draw(_WORKERS),
        epoch=draw(_STEPS),
        state=state,
        last_committed_step=step,
        loss=None if step == 0 else draw(st.none() | losses),
        samples_processed=draw(_STEPS),
        timings=draw(timings()),
        snapshot=draw(snapshot_states()),
        errors=tuple(draw(st.lists(latched_errors(), min_size=minimum, max_size=3))),
        setup=draw(st.none() | epoch_setups()),
        checkpoint_step=draw(st.none() | st.integers(min_value=1, max_value=2**64 - 1)),
    )


def epoch_setups() -> st.SearchStrategy[messages.EpochSetup]:
    seconds = st.floats(min_value=0.0, max_value=1e4)
    sizes = st.integers(min_value=0, max_value=2**64 - 1)
    return st.builds(
        messages.EpochSetup,
        epoch=st.integers(min_value=1, max_value=2**64 - 1),
        tier=st.sampled_from(messages.RecoveryTier),
        regroup_s=seconds,
        transfer_s=seconds,
        load_s=seconds,
        received_bytes=sizes,
        sent_bytes=sizes,
    )


# --- plans of given shapes, with failed stages (planaria.contract.schedule) ---------------------


@st.composite
def shaped_plans(
    draw: st.DrawFn,
    stage_counts: tuple[int, ...],
    *,
    aligned: bool = True,
    max_holes: int = 0,
    max_micro_batches: int = 8,
) -> plan.Plan:
    """Pipelines with exactly these stage counts over the same layers, one GPU per stage (worker
    ids in order, 1 or 2 GPUs per node, so neighbours may share a node), 1..max_micro_batches
    micro-batches each. `aligned`: pipelines of equal depth share their cuts (symmetric). Up to
    `max_holes` failed stages: a stage whose layers a live stage of another pipeline also has
    loses its worker and its micro-batches are spread over all such live peers at random."""
    num_layers = max(stage_counts) + draw(st.integers(min_value=0, max_value=2))
    shared = {depth: draw(_cuts_of(num_layers, depth)) for depth in set(stage_counts)}
    stages: list[list[tuple[int, int, tuple[plan.WorkerId, ...]]]] = []
    worker = 0
    for depth in stage_counts:
        cuts = shared[depth] if aligned else draw(_cuts_of(num_layers, depth))
        bounds = list(zip((0, *cuts), (*cuts, num_layers), strict=True))
        stages.append([(a, b, (plan.WorkerId(worker + i),)) for i, (a, b) in enumerate(bounds)])
        worker += depth
    counts = [draw(st.integers(min_value=1, max_value=max_micro_batches)) for _ in stage_counts]
    reroutes = draw(_holes(stages, counts, max_holes))
    return plan.Plan(
        pipelines=tuple(
            plan.Pipeline(
                stages=tuple(plan.Stage(layer_start=a, layer_stop=b, workers=w) for a, b, w in p),
                num_micro_batches=n,
            )
            for p, n in zip(stages, counts, strict=True)
        ),
        micro_batch_size=1,
        gpus_per_node=draw(st.integers(min_value=1, max_value=2)),
        reroutes=reroutes,
    )


@st.composite
def _cuts_of(draw: st.DrawFn, num_layers: int, depth: int) -> tuple[int, ...]:
    """depth - 1 distinct cuts in 1..num_layers-1."""
    inner = st.integers(min_value=1, max_value=num_layers - 1)
    cuts = st.lists(inner, min_size=depth - 1, max_size=depth - 1, unique=True)
    return tuple(sorted(draw(cuts))) if depth > 1 else ()


@st.composite
def _holes(
    draw: st.DrawFn,
    stages: list[list[tuple[int, int, tuple[plan.WorkerId, ...]]]],
    counts: list[int],
    max_holes: int,
) -> tuple[plan.Reroute, ...]:
    """Empty up to max_holes stages (edited in place) and reroute their micro-batches."""
    reroutes: list[plan.Reroute] = []
    targets: set[tuple[int, int]] = set()
    for _ in range(draw(st.integers(min_value=0, max_value=max_holes))):
        candidates = [
            (p, s, peers)
            for p, pipeline in enumerate(stages)
            for s, (a, b, workers) in enumerate(pipeline)
            if workers and (p, s) not in targets
            if (peers := _live_peers(stages, p, a, b))
        ]
        if not candidates:
            break
        p, s, peers = draw(st.sampled_from(candidates))
        stages[p][s] = (*stages[p][s][:2], ())
        chosen = [draw(st.sampled_from(peers)) for _ in range(counts[p])]
        for q, t in peers:
            mine = tuple(j for j, c in enumerate(chosen) if c == (q, t))
            targets.add((q, t))
            if mine:
                reroutes.append(
                    plan.Reroute(pipeline=p, stage=s, peer_pipeline=q, micro_batches=mine)
                )
    return tuple(reroutes)


def _live_peers(
    stages: list[list[tuple[int, int, tuple[plan.WorkerId, ...]]]], p: int, a: int, b: int
) -> list[tuple[int, int]]:
    return [
        (q, t)
        for q, pipeline in enumerate(stages)
        if q != p
        for t, (start, stop, workers) in enumerate(pipeline)
        if (start, stop) == (a, b) and workers
    ]


# --- planning profiles and pipeline costs (planaria.planner templates, batching) ---------------

# Stage times from a small set make exact ties common (they exercise the slowest-stage tie rule);
# small byte counts against a small memory make the 1F1B depth bind.
_TIED_SECONDS = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0])
_FREE_SECONDS = st.floats(min_value=0.0, max_value=4.0, allow_nan=False, allow_infinity=False)


@st.composite
def planning_layers(draw: st.DrawFn, max_gpus: int) -> profile.LayerProfile:
    """A layer with times for 1..max_gpus GPUs (tied or free values) and bytes of 0..12."""
    seconds = draw(st.sampled_from([_TIED_SECONDS, _FREE_SECONDS]))
    times = st.lists(seconds, min_size=max_gpus, max_size=max_gpus).map(tuple)
    small = st.integers(min_value=0, max_value=12)
    return profile.LayerProfile(
        name="layer",
        forward_s=draw(times),
        backward_s=draw(times),
        parameter_bytes=draw(small),
        gradient_bytes=draw(small),
        optimizer_bytes=draw(small),
        activation_bytes=draw(small),
        output_bytes=draw(st.integers(min_value=0, max_value=200)),
    )


@st.composite
def planning_profiles(
    draw: st.DrawFn, *, max_layers: int = 8, max_gpus: int = 4
) -> profile.Profile:
    """A profile for planner properties: 1..max_layers layers timed for 1..max_gpus GPUs,
    links fast or slow, GPU memory from ample down to a few layers' worth."""
    m = draw(st.integers(min_value=1, max_value=max_gpus))
    link = st.builds(
        profile.LinkProfile,
        bandwidth_bytes_per_s=st.sampled_from([10.0, 100.0, 1e9]),
        latency_s=st.sampled_from([0.0, 0.1]),
    )
    return profile.Profile(
        model="planning-drawn",
        accelerator="drawn",
        micro_batch_size=draw(st.integers(min_value=1, max_value=4)),
        memory_bytes=draw(st.sampled_from([10**6, 80, 50, 30])),
        layers=tuple(draw(st.lists(planning_layers(m), min_size=1, max_size=max_layers))),
        intra_node=draw(link),
        inter_node=draw(link),
    )


def pipeline_costs() -> st.SearchStrategy[tuple[float, float]]:
    """(fixed seconds, seconds per micro-batch) of one pipeline, T(N_b) = a + c N_b."""
    return st.tuples(
        st.floats(min_value=0.0, max_value=50.0, allow_nan=False),
        st.floats(min_value=0.0, max_value=5.0, allow_nan=False),
    )


# --- failures and new layouts (planaria.planner transfers, candidates, policy) -----------------


def uniform_profile(
    num_layers: int,
    *,
    state_bytes: int = 1000,
    memory_bytes: int = 2**40,
    bandwidth_bytes_per_s: float = 1e6,
) -> profile.Profile:
    """Identical layers (1 ms forward, 2 ms backward, `state_bytes` of parameters + optimizer
    state, none of gradients, tiny activations) on 1-GPU stages; both links alike."""
    layer = profile.LayerProfile(
        name="block",
        forward_s=(0.001,),
        backward_s=(0.002,),
        parameter_bytes=state_bytes // 4,
        gradient_bytes=0,
        optimizer_bytes=state_bytes - state_bytes // 4,
        activation_bytes=10,
        output_bytes=10,
        optimizer_s=0.0001,
    )
    link = profile.LinkProfile(bandwidth_bytes_per_s=bandwidth_bytes_per_s, latency_s=1e-6)
    return profile.Profile(
        model="uniform",
        accelerator="test",
        micro_batch_size=1,
        memory_bytes=memory_bytes,
        layers=(layer,) * num_layers,
        intra_node=link,
        inter_node=link,
    )


def timed_profile(forward_s: Sequence[float], *, memory_bytes: int = 2**40) -> profile.Profile:
    """`uniform_profile` with these per-layer forward times (backward twice as long)."""
    base = uniform_profile(len(forward_s), memory_bytes=memory_bytes)
    layers = tuple(
        dataclasses.replace(base.layers[i], name=f"layer{i}", forward_s=(t,), backward_s=(2 * t,))
        for i, t in enumerate(forward_s)
    )
    return dataclasses.replace(base, model="timed", layers=layers)


def grid_plan(dp: int, cuts: tuple[int, ...], num_layers: int, micro_batches: int) -> plan.Plan:
    """DP identical pipelines cut at `cuts`, one worker per stage in order (0, 1, ...)."""
    bounds = [0, *cuts, num_layers]
    pipelines, worker = [], 0
    for _ in range(dp):
        stages = []
        for a, b in zip(bounds, bounds[1:], strict=False):
            stages.append(plan.Stage(layer_start=a, layer_stop=b, workers=(plan.WorkerId(worker),)))
            worker += 1
        pipelines.append(plan.Pipeline(stages=tuple(stages), num_micro_batches=micro_batches))
    return plan.Plan(pipelines=tuple(pipelines), micro_batch_size=1)


@st.composite
def running_plans(
    draw: st.DrawFn, *, max_workers: int = 6, max_layers: int = 6, max_pipelines: int = 3
) -> plan.Plan:
    """A running plan: 1..max_pipelines pipelines of one-GPU stages on consecutive workers
    (1 or 2 GPUs per node), each with its own cuts of 1..max_layers layers, 1..4 micro-batches
    each, at most max_workers workers in all."""
    num_layers = draw(st.integers(min_value=1, max_value=max_layers))
    pipelines, worker = [], 0
    for _ in range(draw(st.integers(min_value=1, max_value=max_pipelines))):
        room = min(num_layers, max_workers - worker)
        if room < 1:
            break
        depth = draw(st.integers(min_value=1, max_value=room))
        cuts = draw(_cuts_of(num_layers, depth))
        bounds = list(zip((0, *cuts), (*cuts, num_layers), strict=True))
        stages = tuple(
            plan.Stage(layer_start=a, layer_stop=b, workers=(plan.WorkerId(worker + i),))
            for i, (a, b) in enumerate(bounds)
        )
        worker += depth
        micro_batches = draw(st.integers(min_value=1, max_value=4))
        pipelines.append(plan.Pipeline(stages=stages, num_micro_batches=micro_batches))
    return plan.Plan(
        pipelines=tuple(pipelines),
        micro_batch_size=1,
        gpus_per_node=draw(st.integers(min_value=1, max_value=2)),
    )


@st.composite
def failed_workers(draw: st.DrawFn, running: plan.Plan) -> frozenset[plan.WorkerId]:
    """One or more workers of `running`, leaving at least one alive."""
    workers = list(running.workers)
    assume(len(workers) >= 2)
    chosen = st.lists(st.sampled_from(workers), min_size=1, max_size=len(workers) - 1, unique=True)
    return frozenset(draw(chosen))


@st.composite
def layouts(
    draw: st.DrawFn,
    survivors: list[plan.WorkerId],
    num_layers: int,
    gpus_per_node: int,
    num_micro_batches: int,
) -> plan.Plan:
    """A new layout over some of `survivors` (shuffled), one worker per stage: 1..3 pipelines
    with their own cuts, micro-batches summing to `num_micro_batches` (one each at least)."""
    pool = draw(st.permutations(survivors))
    pipelines, used = [], 0
    count = draw(st.integers(min_value=1, max_value=min(3, num_micro_batches, len(pool))))
    for index in range(count):
        room = len(pool) - used - (count - index - 1)  # leave a worker for each one to come
        depth = draw(st.integers(min_value=1, max_value=min(num_layers, room)))
        cuts = draw(_cuts_of(num_layers, depth))
        bounds = list(zip((0, *cuts), (*cuts, num_layers), strict=True))
        stages = tuple(
            plan.Stage(layer_start=a, layer_stop=b, workers=(pool[used + i],))
            for i, (a, b) in enumerate(bounds)
        )
        used += depth
        pipelines.append(stages)
    shares = [1] * len(pipelines)
    for _ in range(num_micro_batches - len(pipelines)):
        shares[draw(st.integers(min_value=0, max_value=len(pipelines) - 1))] += 1
    return plan.Plan(
        pipelines=tuple(
            plan.Pipeline(stages=s, num_micro_batches=n)
            for s, n in zip(pipelines, shares, strict=True)
        ),
        micro_batch_size=1,
        gpus_per_node=gpus_per_node,
    )


# --- failure traces (planaria.sim) ------------------------------------------------------------


@st.composite
def sim_traces(draw: st.DrawFn, max_nodes: int = 8) -> traces.Trace:
    """A seeded trace over 2..max_nodes nodes: per-device failures, per-cluster failures down
    to one node, or spot preemptions with additions; horizons of minutes to hours."""
    num_nodes = draw(st.integers(min_value=2, max_value=max_nodes))
    seed = draw(st.integers(min_value=0, max_value=2**16))
    kind = draw(st.sampled_from(["device", "cluster", "spot"]))
    if kind == "device":
        rate = draw(st.floats(min_value=0.05, max_value=2.0))
        return traces.per_device(num_nodes, rate, draw(st.floats(600.0, 20_000.0)), seed)
    if kind == "cluster":
        mtbf_s = draw(st.floats(min_value=60.0, max_value=3600.0))
        return traces.per_cluster(num_nodes, mtbf_s, 1, seed)
    return traces.spot(
        num_nodes, draw(st.floats(60.0, 1800.0)), draw(st.floats(600.0, 20_000.0)), seed
    )


# --- membership changes (planaria.control) ----------------------------------------------------

MEMBERSHIP_ACTIONS = ("kill", "kill-silently", "hang", "notice", "join", "latch")


@st.composite
def membership_changes(
    draw: st.DrawFn, num_workers: int = 8, max_changes: int = 4, max_step: int = 40
) -> list[tuple[int, str, int]]:
    """(step, action, worker) triples sorted by step: what happens to which worker once the job
    has committed that step. Actions are MEMBERSHIP_ACTIONS (the controller tests' fakes
    apply them); several may hit one step, which makes quick successive failures."""
    changes = draw(
        st.lists(
            st.tuples(
                st.integers(min_value=1, max_value=max_step),
                st.sampled_from(MEMBERSHIP_ACTIONS),
                st.integers(min_value=0, max_value=num_workers - 1),
            ),
            min_size=1,
            max_size=max_changes,
        )
    )
    return sorted(changes)


# --- suspended jobs (planaria.control.suspension) -------------------------------------------

_TIMES = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
_CHECKPOINTS = st.none() | st.integers(min_value=0, max_value=1000)


def suspensions() -> st.SearchStrategy[suspension.Suspension]:
    """Any suspension value: checkpoints and waits set or not."""
    return st.builds(
        suspension.Suspension,
        checkpoint=_CHECKPOINTS,
        since_s=_TIMES,
        retry=st.booleans(),
        from_snapshot=st.booleans(),
        snapshot_failed=st.booleans(),
        unheard_since=st.none() | _TIMES,
        stall_since=st.none() | _TIMES,
    )


@st.composite
def suspension_facts(draw: st.DrawFn, num_workers: int = 6) -> suspension.Facts:
    """What a pass may know while Suspended, over workers 0..num_workers-1: the suspended
    plan's workers (or none), who of them ran, trains or is silent, consistently with `live`."""
    workers = [plan.WorkerId(w) for w in range(num_workers)]
    some = st.frozensets(st.sampled_from(workers))
    live = draw(some)
    members = draw(st.none() | some.filter(bool))
    ran = draw(some) & (members or frozenset())
    return suspension.Facts(
        live=live,
        plan_workers=members,
        ran=ran,
        training=draw(some) & ran & live,
        silent=draw(some) & (members or frozenset()) - live,
        unheard=draw(st.booleans()),
        arrived=draw(st.booleans()),
        infeasible=draw(st.sampled_from(["", "too few nodes"])),
        min_workers=draw(st.integers(min_value=1, max_value=num_workers)),
        heartbeat_timeout_s=draw(st.floats(min_value=0.1, max_value=5.0)),
        step_timeout_s=draw(st.floats(min_value=0.1, max_value=5.0)),
    )


# --- bad input: job specs near the valid space (planaria.spec.job; tests/fuzz) ---------------

# Values that break a field's type or range: wrong types, signs, integer widths, non-finite
# floats, near-misses of durations and enums. Drawn as copies: mutations nest into them.
BAD_LEAVES: tuple[object, ...] = (
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**32 - 1,
    2**32,
    2**63,
    2**64 - 1,
    2**64,
    2**70,
    -(2**63),
    0.5,
    1.5,
    -0.0,
    1e308,
    5e-324,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    " ",
    "x",
    "0",
    "1e3",
    "nan",
    "inf",
    "90s",
    "-5s",
    "5 m",
    "1.5.3s",
    "1e3s",
    "99999999999999999999h",
    "random",
    "Random",
    "cpu",
    "CUDA",
    "copy",
    "tiny",
    [],
    {},
    [1],
    {"a": 1},
    [[[]]],
)


@st.composite
def job_spec_documents(draw: st.DrawFn) -> dict[str, object]:
    """A valid job spec as a job file's YAML mapping holds it (camelCase keys), optional
    sections left out at random."""
    gpus, nodes = draw(st.integers(1, 4)), draw(st.integers(2, 8))
    workers, steps = gpus * nodes, draw(st.integers(2, 1000))
    micro = draw(st.integers(1, 8))
    snapshot_every = draw(st.integers(0, 5))
    spec: dict[str, object] = {
        "model": draw(st.sampled_from(sorted(shapes.NAMED_SHAPES))),
        "workers": workers,
        "gpusPerNode": gpus,
        "steps": steps,
        "microBatchSize": micro,
        "globalBatchSize": micro * draw(st.integers(1, 8)),
        "seed": draw(st.integers(0, 2**64 - 1)),
        "device": draw(st.sampled_from(["cpu", "cuda"])),
        "reduction": draw(st.sampled_from(["fast", "exact"])),
        "precision": draw(st.sampled_from(["fp32", "tf32", "bf16"])),
        "faultTolerance": draw(st.integers(0, nodes - 1)),
        "policy": draw(st.sampled_from(["adaptive", "dynamic", "reroute"])),
        "mtbfSeconds": draw(st.floats(1.0, 1e6)),
        "optimizer": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.99, "eps": 1e-8, "weightDecay": 0.1},
        "data": {"corpusPaths": ["corpus.txt"], "maxBytes": draw(st.integers(1, 2**40))},
        "snapshots": {
            "intervalSteps": snapshot_every,
            "redundancy": draw(st.sampled_from(["none", "copy", "xor", "recompute"])),
        },
        "checkpoints": {"dir": "/ckpt", "intervalSteps": snapshot_every * draw(st.integers(0, 4))},
        "timeouts": {
            "heartbeatIntervalSeconds": 0.1,
            "heartbeatSeconds": 3,
            "stepSeconds": 10,
            "configureSeconds": 60,
        },
        "failures": [
            {"step": draw(st.integers(1, steps - 1)), "worker": draw(st.integers(0, workers - 1))},
            {"time": draw(st.sampled_from([30, "90s", "1.5m", "500ms"])), "rejoinSeconds": 2},
        ],
        "pod": {
            "image": "planaria:dev",
            "cpu": "500m",
            "memory": "2Gi",
            "nodeSelector": {"planaria.dev/pool": "gpu"},
            "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    kept = draw(st.sets(st.sampled_from(sorted(spec))))
    return {key: value for key, value in spec.items() if key in kept or key == "workers"}


def _paths(value: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every key path into nested mappings and lists, the empty (root) path first."""
    out: list[tuple[object, ...]] = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _mutate_at(draw: st.DrawFn, parent: object, key: object) -> None:
    """One mutation of `parent[key]`: replaced by a bad value, dropped, renamed to its
    snake_case twin (kept beside the camelCase one or not), given an unknown sibling, wrapped
    in a list, or nested deeply."""
    assert isinstance(parent, dict | list)
    container: Any = parent
    kind = draw(st.sampled_from(["replace", "drop", "twin", "unknown", "wrap", "nest", "number"]))
    if kind == "replace":
        container[key] = draw(st.sampled_from(BAD_LEAVES).map(copy.deepcopy))
    elif kind == "number":
        container[key] = draw(st.integers() | st.floats() | st.text(max_size=6))
    elif kind == "drop":
        del container[key]
    elif kind == "twin" and isinstance(key, str) and isinstance(parent, dict):
        container[_snake(key)] = container[key] if draw(st.booleans()) else container.pop(key)
    elif kind == "unknown" and isinstance(parent, dict):
        container[draw(st.sampled_from(["bogus", "Workers", "spec", "step_seconds", "1"]))] = 1
    elif kind == "wrap":
        container[key] = [container[key]]
    else:
        for _ in range(draw(st.integers(1, 60))):
            container[key] = {"x": container[key]} if draw(st.booleans()) else [container[key]]


@st.composite
def job_spec_mutants(draw: st.DrawFn) -> object:
    """A valid job spec (bare, or inside a whole ResilientJob document) with one to four
    mutations at random places (see `_mutate_at`); the root itself may be replaced."""
    document = draw(job_spec_documents())
    if draw(st.booleans()):
        document = {
            "apiVersion": "planaria.dev/v1alpha1",
            "kind": "ResilientJob",
            "metadata": {"name": "fuzz-job"},
            "spec": document,
        }
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(document)))
        if not path:
            return draw(st.sampled_from(BAD_LEAVES).map(copy.deepcopy))  # not a mapping at all
        parent: Any = document
        for key in path[:-1]:
            parent = parent[key]
        _mutate_at(draw, parent, path[-1])
    return document


@st.composite
def job_file_texts(draw: st.DrawFn) -> str:
    """A job file's text: a mutant spec as YAML, then perhaps damaged as text (cut short, a
    key repeated, nested past any parser's recursion, binary junk or tabs spliced in), or a
    "billion laughs" of YAML aliases."""
    import yaml  # only the job-file strategies need it

    text = yaml.safe_dump(draw(job_spec_mutants()))
    kind = draw(st.sampled_from(["as is", "cut", "repeat", "deep", "junk", "tabs", "aliases"]))
    if kind == "cut":
        return text[: draw(st.integers(0, len(text)))]
    if kind == "repeat":
        return text + text.splitlines()[0] + "\n"
    if kind == "deep":
        depth = draw(st.sampled_from([100, 1_000, 3_000]))
        opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}"), ("- ", "")]))
        return opener * depth + "1" + closer * depth
    if kind == "junk":
        at = draw(st.integers(0, len(text)))
        junk = draw(st.binary(min_size=1, max_size=8)).decode("latin-1")
        return text[:at] + junk + text[at:]
    if kind == "tabs":
        return text.replace("  ", "\t")
    if kind == "aliases":  # ten levels of ten shared references: 10**10 leaves if expanded
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
        key = draw(st.sampled_from(["workers", "failures", "bogus", "optimizer", "seed"]))
        return "x:\n" + "\n".join(f"  {line}" for line in lines) + f"\n{key}: *a9\n"
    return text


# --- bad input: protobuf messages with fields mutated out of range (tests/fuzz) ------------

_FD = descriptor.FieldDescriptor
# Values at and past the edges of each scalar type (protobuf refuses what does not fit the type,
# so these are exactly the values a peer could put on the wire).
_EDGES: dict[int, st.SearchStrategy[object]] = {
    _FD.TYPE_UINT32: st.sampled_from([0, 1, 2, 2**31, 2**32 - 1]) | st.integers(0, 2**32 - 1),
    _FD.TYPE_UINT64: st.sampled_from([0, 1, 2**63, 2**64 - 1]) | st.integers(0, 2**64 - 1),
    _FD.TYPE_INT32: st.sampled_from([0, -1, -(2**31), 2**31 - 1]),
    _FD.TYPE_INT64: st.sampled_from([0, -1, -(2**63), 2**63 - 1]),
    _FD.TYPE_DOUBLE: st.sampled_from([0.0, -0.0, -1.0, 5e-324, 1e308, float("inf")]) | st.floats(),
    _FD.TYPE_FLOAT: st.floats(width=32),
    _FD.TYPE_BOOL: st.booleans(),
    _FD.TYPE_STRING: st.sampled_from(["", "\x00", "x" * 5000, "../../etc", "é"]) | st.text(),
    _FD.TYPE_BYTES: st.binary(max_size=64),
    _FD.TYPE_ENUM: st.integers(-3, 40),  # proto3 enums are open: unknown numbers parse
}


def _fields_of(msg: message.Message) -> list[tuple[message.Message, Any]]:
    """Every (message, field) pair reachable from `msg` through set sub-messages."""
    out = [(msg, field) for field in msg.DESCRIPTOR.fields]
    for field in msg.DESCRIPTOR.fields:
        if field.message_type is None:
            continue
        value: Any = getattr(msg, field.name)
        if field.is_repeated:
            for item in value:
                out += _fields_of(item)
        elif msg.HasField(field.name):
            out += _fields_of(value)
    return out


def _mutate_field(
    draw: st.DrawFn, owner: message.Message, field: descriptor.FieldDescriptor
) -> None:
    """Clear the field, or give it an edge value (repeated: drop, duplicate or add an item)."""
    value: Any = getattr(owner, field.name)
    if draw(st.integers(0, 4)) == 0:
        owner.ClearField(field.name)
    elif field.is_repeated and field.message_type is not None:
        if len(value) and draw(st.booleans()):
            del value[draw(st.integers(0, len(value) - 1))]
        elif len(value):
            value.add().CopyFrom(value[draw(st.integers(0, len(value) - 1))])
        else:
            value.add()
    elif field.is_repeated:
        value.append(draw(_EDGES[field.type]))
    elif field.message_type is not None:
        value.SetInParent()  # present but empty
    else:
        setattr(owner, field.name, draw(_EDGES[field.type]))


@st.composite
def mutated_protos(draw: st.DrawFn, base: message.Message) -> bytes:
    """`base` with one to four fields anywhere in it cleared or set to edge values, encoded."""
    mutant = type(base)()
    mutant.CopyFrom(base)
    if not mutant.DESCRIPTOR.fields:
        return draw(st.binary(max_size=32))  # nothing to mutate but the bytes
    for _ in range(draw(st.integers(1, 4))):
        owner, field = draw(st.sampled_from(_fields_of(mutant)))
        _mutate_field(draw, owner, field)
    return mutant.SerializeToString()


@st.composite
def mutated_documents(draw: st.DrawFn, base: dict[str, object]) -> dict[str, object]:
    """A copy of the JSON-like mapping `base` with one to three mutations below its root (see
    `_mutate_at`): e.g. a snapshot manifest's body, to be checksummed again (a forgery)."""
    document = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(document)[1:]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = document
        for key in path[:-1]:
            parent = parent[key]
        _mutate_at(draw, parent, path[-1])
    return document


_DURATION_UNITS_S = (("h", 3600), ("m", 60), ("s", 1), ("ms", 0.001))


@st.composite
def durations(draw: st.DrawFn) -> tuple[str, float]:
    """A duration text of `planaria.spec.durations`' grammar written from parts (a non-empty
    subset of the units, largest first; whole or decimal numbers), and its seconds."""
    units = draw(st.sets(st.sampled_from(_DURATION_UNITS_S), min_size=1))
    text, seconds = "", 0.0
    for unit, scale in sorted(units, key=lambda u: -u[1]):
        whole = draw(st.integers(min_value=0, max_value=999_999_999))
        fraction = draw(st.one_of(st.just(""), st.from_regex(r"\.[0-9]{0,9}", fullmatch=True)))
        text += f"{whole}{fraction}{unit}"
        seconds += float(f"{whole}{fraction}") * scale
    return text, seconds
