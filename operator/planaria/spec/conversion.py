"""From a job spec to what the controller core and the agents run: `to_settings` turns a
`job.JobSpec` into the controller core's `JobSettings` (and the contract's training and data
settings inside it).

`to_settings` applies `planaria.spec.consistency.check` first and raises `job.JobSpecError` on the
first problem, so a spec that passes converts without error. The corpus default (the standard
library's sources, found by the agent's data module) is passed in by the caller, so this module
imports no agent code. `failures` (local-mode failure injection) and `pod` (the operator's pod
builder) are not settings of the controller core: they are read where they are used.
"""

from __future__ import annotations

from planaria.control import settings as job_settings
from planaria.spec import consistency, job
from planaria.spec import model_source as sources
from planaria.wire import messages


def to_settings(spec: job.JobSpec, name: str, corpus_default: str) -> job_settings.JobSettings:
    """The controller core's settings for `spec` run as job `name`; `corpus_default` is the
    corpus when the spec names none. Raises JobSpecError when `spec` breaks a `check` rule."""
    problems = consistency.check(spec)
    if problems:
        raise job.JobSpecError(f"spec.{problems[0][0]}: {problems[0][1]}")
    if job.NAME_PATTERN.match(name) is None:
        raise job.JobSpecError(
            f"metadata.name: {name!r} is not a lowercase RFC 1123 label; {job.NAMING}"
        )
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
            None if spec.device_memory is None else job.memory_bytes(spec.device_memory)
        ),
        backend=messages.Backend.NCCL if spec.device == "cuda" else messages.Backend.GLOO,
        heartbeat_interval_s=spec.timeouts.heartbeat_interval_seconds,
        heartbeat_timeout_s=spec.timeouts.heartbeat_seconds,
        step_timeout_s=spec.timeouts.step_seconds,
        configure_timeout_s=spec.timeouts.configure_seconds,
    )


def _training(spec: job.JobSpec, corpus_default: str) -> messages.TrainingSettings:
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


def model_name(spec: job.JobSpec) -> str:
    """The contract's model string of `spec`: a shape name or a Hugging Face reference (read
    from its config file, if it names one; `model_source.reference`)."""
    if spec.model_source is None:
        return spec.model
    return sources.reference(spec.model_source)


def data_settings(spec: job.DataSpec, corpus_default: str) -> messages.DataSettings:
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
