"""Which GPU each local worker computes on: one GPU per worker, by worker index.

    gpus = devices.visible_gpus(os.environ, count=torch.cuda.device_count())
    assignment = devices.assign(workers=4, gpus=gpus)          # DeviceError when it cannot
    agent_args, placement = devices.launch("cuda", assignment)  # for LocalBackend(...)

Local mode runs every node's workers on this one machine, so worker w (node w // gpusPerNode,
local index w % gpusPerNode) takes the w-th GPU this process sees: GPU ids are read from
CUDA_VISIBLE_DEVICES when it is set (its entries, in order) and are 0..count-1 otherwise.
Each agent is started with `--device cuda` and with CUDA_VISIBLE_DEVICES naming its GPU only, so
inside the agent it is `cuda:0` and no two workers ever share a GPU (two NCCL ranks on one GPU
fail their first collective with "invalid usage"). A restarted worker gets the same GPU again.
On Kubernetes the same rule holds per pod: container k of a node's pod asks for one
`nvidia.com/gpu` and the device plugin gives it one (planaria.kube.pods).

Errors: `DeviceError` (a ValueError), one line naming what the machine shows and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from planaria.contract import plan
from planaria.local import launching  # torch-free: `planaria run` checks devices before it loads

VISIBLE = "CUDA_VISIBLE_DEVICES"


class DeviceError(ValueError):
    """The job's device cannot be given to its workers on this machine."""


def visible_gpus(env: Mapping[str, str], *, count: int) -> tuple[str, ...]:
    """The ids of the `count` GPUs this process sees (torch.cuda.device_count() already
    honours CUDA_VISIBLE_DEVICES), as CUDA_VISIBLE_DEVICES would name them to a child."""
    listed = env.get(VISIBLE)
    if listed is None:
        return tuple(str(index) for index in range(count))
    return tuple(entry.strip() for entry in listed.split(",") if entry.strip())[:count]


def assign(*, workers: int, gpus: tuple[str, ...]) -> dict[plan.WorkerId, str]:
    """Worker w -> the w-th visible GPU; DeviceError when there are fewer GPUs than workers."""
    if not gpus:
        raise DeviceError(
            "device: cuda, but no GPU is visible here (torch sees 0 CUDA devices); give "
            "device: cpu, or run on a machine with a GPU and a CUDA build of torch"
        )
    if workers > len(gpus):
        shown = f"{len(gpus)} GPU" + ("s" if len(gpus) > 1 else "")
        raise DeviceError(
            f"device: cuda with {workers} workers, but this machine shows {shown} "
            f"({', '.join(gpus)}); local mode runs one worker per GPU: give workers: "
            f"{len(gpus)} or fewer, or device: cpu"
        )
    return {plan.WorkerId(w): gpus[w] for w in range(workers)}


def launch(
    device: str, assignment: Mapping[plan.WorkerId, str]
) -> tuple[tuple[str, ...], Callable[[plan.WorkerId], launching.Placement]]:
    """The agent arguments and the per-worker placement that start each worker on `device`,
    on its own GPU from `assignment` when the device is cuda."""
    gpus = dict(assignment)

    def placement(worker: plan.WorkerId) -> launching.Placement:
        if worker not in gpus:
            return launching.Placement()
        return launching.Placement(env={VISIBLE: gpus[worker]})

    return ("--device", device), placement
