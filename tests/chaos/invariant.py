"""The outcome half of a chaos trial's invariant: layer states against the fault-free reference.

`succeeded` checks the final states read from the snapshot stores at the last step; `suspended`
checks that the status message says why and where the job would resume, and that the
persistent checkpoint it names loads and equals the reference at that step. Both return the
number of elements that differ (None when nothing could be compared) and append every breach to
`problems`, so a trial reports all of them at once instead of the first.

Equal means bitwise (`comparison.compare` without bounds: parameters, AdamW moments and step
counts): the trials train in exact reduction mode (`local_job.training`), whose result depends
on neither the plan nor the faults. Reference runs are cached per process: settings that do not
change the numbers (redundancy, checkpoints) are left out of the key.

Not here: running the trial and the leak checks (`trials`, `processes`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path

from planaria.agent.runtime import runtime_states
from planaria.agent.state import checkpoints
from planaria.agent.training import comparison, model
from planaria.control import status as statuses
from planaria.wire import messages
from tests.e2e import local_job

States = Mapping[int, model.LayerState]


def succeeded(
    status: statuses.JobStatus,
    states: States | None,
    settings: local_job.job_settings.JobSettings,
    problems: list[str],
) -> int | None:
    """Succeeded at the last step with every layer equal to the reference's there."""
    if status.step != settings.steps:
        problems.append(f"Succeeded at step {status.step}, not {settings.steps}")
    if states is None:
        problems.append("Succeeded, but the final states were not read")
        return None
    return compare(states, settings, settings.steps, problems)


def suspended(
    status: statuses.JobStatus,
    checkpoint_dir: Path,
    settings: local_job.job_settings.JobSettings,
    problems: list[str],
) -> int | None:
    """A clear message; the checkpoint it names loads and equals the reference."""
    message, step = status.message, status.checkpoint_step
    if not message.startswith("suspended: ") or "workers are live" not in message:
        problems.append(f"Suspended without a clear message: {message!r}")
    if step is None:
        if "no persistent checkpoint" not in message:
            problems.append(f"no checkpoint step, and the message does not say so: {message}")
        return None
    if f"checkpoint is step {step}" not in message:
        problems.append(f"the message does not name checkpoint step {step}: {message}")
    try:
        states = checkpoints.load_checkpoint(checkpoint_dir, step)
    except Exception as exc:  # the trial's finding, reported with the others
        problems.append(f"the checkpoint of step {step} the status names does not load: {exc}")
        return None
    return compare(states, settings, step, problems)


def compare(
    got: States, settings: local_job.job_settings.JobSettings, step: int, problems: list[str]
) -> int | None:
    """How many elements of `got` differ from the reference at `step` (None when layers are
    missing or unexpected: not every layer could be compared)."""
    found = comparison.compare(got, reference(settings.training, settings.micro_batch_size, step))
    if not found.equal:
        problems.append(f"states differ from the reference at step {step}: {found.describe()}")
    return None if found.missing or found.extra else found.num_differing


def reference(
    training: messages.TrainingSettings, micro_batch_size: int, step: int
) -> dict[int, model.LayerState]:
    """The fault-free reference trainer's layers after `step` (cached, module docstring)."""
    numeric = dataclasses.replace(
        training,
        redundancy=messages.RedundancyMode.NONE,
        checkpoint_dir="",
        checkpoint_interval_steps=0,
    )
    return _reference(numeric, micro_batch_size, step)


@functools.cache
def _reference(
    training: messages.TrainingSettings, micro_batch_size: int, step: int
) -> dict[int, model.LayerState]:
    return runtime_states.reference_states(training, micro_batch_size, step)[0]
