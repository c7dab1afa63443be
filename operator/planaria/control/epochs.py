"""What the controller sends to open an epoch: one `WorkerConfig` per worker of the plan.

The epoch's process group is exactly the plan's workers, ranked by worker id (the same order
as `planaria.agent.groups.worker_ranks`), under the key prefix "epoch-E" of the backend's store;
the group's collectives time out after the job's `step_timeout_s`. Each worker receives only
the transfers it takes part in. Also here: the costliest recovery tier of a set, and the
combined report of an epoch's setups (`Setups`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from planaria.control import ports
from planaria.control import settings as job_settings
from planaria.planner import plan as plans
from planaria.wire import messages


def ranks(plan: plans.Plan) -> dict[plans.WorkerId, int]:
    """Rank of every worker of `plan` in its epoch's group: position in sorted worker ids."""
    return {worker: rank for rank, worker in enumerate(sorted(plan.workers))}


def configs(
    *,
    epoch: int,
    plan: plans.Plan,
    transfers: Iterable[plans.LayerTransfer],
    resume_step: int,
    job: job_settings.JobSettings,
    store: ports.StoreAddress,
) -> dict[plans.WorkerId, messages.WorkerConfig]:
    """The Configure of every worker of `plan` for `epoch` (module docstring)."""
    copies = tuple(transfers)
    ranked = ranks(plan)
    return {
        worker: messages.WorkerConfig(
            epoch=epoch,
            worker=worker,
            plan=plan,
            resume_step=resume_step,
            rendezvous=messages.Rendezvous(
                store_host=store.host,
                store_port=store.port,
                key_prefix=f"epoch-{epoch}",
                rank=rank,
                world_size=len(ranked),
                backend=job.backend,
                timeout_s=job.step_timeout_s,
            ),
            transfers=tuple(t for t in copies if worker == t.destination or worker in t.sources),
            settings=job.training,
            stop_step=max(job.steps, resume_step),
        )
        for worker, rank in ranked.items()
    }


def costliest(tiers: Iterable[messages.RecoveryTier]) -> messages.RecoveryTier:
    """The costliest of `tiers` in `messages.TIER_ORDER` (KEPT when there are none)."""
    return max(tiers, key=messages.TIER_ORDER.index, default=messages.RecoveryTier.KEPT)


@dataclass(frozen=True, slots=True, kw_only=True)
class Setups:
    """An epoch's setups over its workers: the costliest tier, the slowest regroup and
    transfer (workers set up in parallel), and the bytes received in all."""

    tier: messages.RecoveryTier
    regroup_s: float
    transfer_s: float
    received_bytes: int


def combine(setups: Mapping[plans.WorkerId, messages.EpochSetup]) -> Setups:
    """`Setups` of the workers' reports of one epoch."""
    values = list(setups.values())
    return Setups(
        tier=costliest(s.tier for s in values),
        regroup_s=max((s.regroup_s for s in values), default=0.0),
        transfer_s=max((s.transfer_s + s.load_s for s in values), default=0.0),
        received_bytes=sum(s.received_bytes for s in values),
    )
