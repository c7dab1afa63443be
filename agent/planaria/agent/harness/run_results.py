"""What a run of the local cluster yields, assembled from its workers' reports.

The parent collects each worker's `local_worker.StepDone` and `RunEnded` reports, and which
workers it lost, in a `Collected`; `run_result` turns them into the `RunResult` callers read:
the steps every worker of the plan committed, their losses (the sum of the workers' shares),
the survivors' latched errors and every reporting worker's layer states, read back from the
files the workers saved them in (plain tensors, `torch.load(weights_only=True)`).

Not here: starting workers and reading their pipes (`local_cluster`).
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from planaria.agent.harness import local_worker
from planaria.agent.training import model
from planaria.contract import plan
from planaria.wire import messages


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class RunResult:
    """What one run (one epoch) produced.

    `steps` are the steps every worker of the plan committed and `losses` their losses (the sum
    of the workers' shares, in worker order). `committed` counts each worker's committed steps,
    `step_s` its step times. `errors` holds the survivors' latched errors, `lost` the workers
    whose process died or hung. `states` holds every reporting worker's layers as of its last
    committed step.
    """

    epoch: int
    steps: tuple[int, ...]
    losses: tuple[float, ...]
    committed: Mapping[plan.WorkerId, int]
    step_s: Mapping[plan.WorkerId, tuple[float, ...]]
    errors: Mapping[plan.WorkerId, messages.LatchedError]
    lost: tuple[plan.WorkerId, ...]
    states: Mapping[plan.WorkerId, Mapping[int, model.LayerState]]

    @property
    def ok(self) -> bool:
        """True when no worker failed."""
        return not self.errors and not self.lost

    def layer_state(self, index: int) -> model.LayerState:
        """Layer `index`'s state from the lowest-numbered worker that reported holding it."""
        for worker in sorted(self.states):
            if index in self.states[worker]:
                return self.states[worker][index]
        raise KeyError(f"no reporting worker holds layer {index}")


@dataclass(slots=True)
class Collected:
    """The parent's view of a run while reports come in."""

    steps: dict[plan.WorkerId, list[local_worker.StepDone]]
    ended: dict[plan.WorkerId, local_worker.RunEnded] = field(default_factory=dict)
    lost: set[plan.WorkerId] = field(default_factory=set)

    @property
    def failed(self) -> bool:
        return bool(self.lost) or any(e.error is not None for e in self.ended.values())


def run_result(
    epoch: int, workers: tuple[plan.WorkerId, ...], steps: tuple[int, ...], collected: Collected
) -> RunResult:
    """The run's result from the reports collected (layer states are read from their files,
    which are then deleted)."""
    done = min(len(collected.steps[w]) for w in workers)
    losses = tuple(sum(collected.steps[w][i].loss for w in workers) for i in range(done))
    states = {
        w: load_states(ended.states_file)
        for w, ended in collected.ended.items()
        if ended.states_file is not None
    }
    return RunResult(
        epoch=epoch,
        steps=steps[:done],
        losses=losses,
        committed={w: len(collected.steps[w]) for w in workers},
        step_s={w: tuple(s.step_s for s in collected.steps[w]) for w in workers},
        errors={w: e.error for w, e in collected.ended.items() if e.error is not None},
        lost=tuple(sorted(collected.lost)),
        states=states,
    )


def load_states(path: str) -> dict[int, model.LayerState]:
    """Layer states a worker saved (plain tensors, loaded without unpickling objects)."""
    saved: dict[int, dict[str, typing.Any]] = torch.load(path, weights_only=True)
    os.unlink(path)
    return {
        index: model.LayerState(
            index=index,
            names=tuple(fields["names"]),
            parameters=tuple(fields["parameters"]),
            exp_avg=tuple(fields["exp_avg"]),
            exp_avg_sq=tuple(fields["exp_avg_sq"]),
            steps=tuple(fields["steps"]),
        )
        for index, fields in saved.items()
    }
