"""The operator end to end on a real control plane (Kubernetes 1.20: etcd, kube-apiserver with
RBAC, kube-controller-manager), as the chart's ServiceAccount with the chart's Role; the
kubelet harness runs each worker pod's container as a real `planaria agent` process.

Covered: a job runs with one pod's agent killed -> the survivors are reconfigured without a
restart (same pids), the dead pod is replaced, the status shows the recovery (lastRecovery tier,
seconds, reason) and the job Succeeds, with Recovered / PlanChanged / Succeeded Events; an
operator stopped mid-job and a new one started adopts the running agents; a job deleted while
running has its pods, Service, Secrets and state ConfigMap removed (the controller manager's
garbage collector, through their ownerReferences); one pipeline of three stages (exact
reduction) whose middle pod is killed (its layers' only replica and its emptyDir gone) -> rebuilt
from the snapshot mirrors on the other pods; the replacement killed again after its mirrors on
the other pods were damaged -> the damaged pieces are rejected and the checkpoint tier serves,
said in the status and an Event; the job Succeeds and its last checkpoint equals the
single-process reference bit for bit. A job that ended has its pods deleted.

The server refuses any call outside the chart's Role (HTTP 403), and tests/chart checks that the
Role grants exactly `constants.RBAC_RULES`; each test here also checks that the operator logged
no refused call (the `refusals` fixture), since some refusals (an Event, say) are only logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from planaria.agent.runtime import runtime_states
from planaria.agent.state import checkpoints, manifests, snapshot_store
from planaria.agent.training import comparison
from planaria.kube import constants
from planaria.spec import conversion
from planaria.spec import job as job_spec
from tests.e2e import local_job
from tests.kube import operating
from tests.kube.real import cluster
from tests.kube.real.conftest import NAMESPACE
from tests.kube.support import kubelet

ENDED = ("Succeeded", "Failed")
RUN_S = 180.0
STEPS = 60

pytestmark = pytest.mark.usefixtures("as_operator")


def _reasons(admin: cluster.Client, job: str) -> list[str]:
    events = admin.list("v1", "Event", NAMESPACE)
    return [e.get("reason", "") for e in events if e["involvedObject"].get("name") == job]


def _status(admin: cluster.Client, name: str) -> dict[str, Any]:
    job = operating.get_job(admin, name) or {}
    status: dict[str, Any] = job.get("status") or {}
    return status


def _pods(admin: cluster.Client, job: str) -> list[dict[str, Any]]:
    return operating.pods_of(admin, job)


def _pids(harness: kubelet.Kubelet, pods: tuple[str, ...]) -> dict[str, int]:
    return {p.pod: p.pid for p in harness.processes() if p.pod in pods and p.returncode is None}


async def _until(admin: cluster.Client, name: str, check: Any, what: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status = _status(admin, name)
        return status if check(status) else None

    return await operating.wait_for(probe, RUN_S, f"{name}: {what} ({_status(admin, name)})")


def _running(name: str) -> Any:
    return lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 3


@contextlib.asynccontextmanager
async def _recording(plane: cluster.ControlPlane) -> AsyncIterator[set[tuple[str, str]]]:
    seen: set[tuple[str, str]] = set()
    task = asyncio.create_task(cluster.record_pods(plane, NAMESPACE, seen))
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.asyncio
async def test_a_killed_pod_is_survived_without_restarting_the_others(
    control_plane: cluster.ControlPlane,
    admin: cluster.Client,
    real_kubelet: kubelet.Kubelet,
    corpus: pathlib.Path,
    refusals: Callable[[], list[str]],
) -> None:
    async with (
        _recording(control_plane) as seen,
        operating.running_operator(),
    ):
        admin.apply(operating.job_body("kill", **operating.e2e_spec(corpus, steps=STEPS)))
        await _until(admin, "kill", _running("kill"), "step 3")
        before = _pids(real_kubelet, ("kill-0", "kill-2"))
        assert len(before) == 2
        (old,) = [
            p["metadata"]["uid"] for p in _pods(admin, "kill") if p["metadata"]["name"] == "kill-1"
        ]
        await real_kubelet.kill("kill-1")
        # The survivors may break their epoch before worker 1's death reaches the controller:
        # then a regroup comes first (no worker failed) and the loss of worker 1 after it.
        recovered = await _until(
            admin,
            "kill",
            lambda s: (s.get("lastRecovery") or {}).get("failedWorkers") == [1],
            "the recovery from worker 1's loss",
        )
        recovery = recovered["lastRecovery"]
        assert recovery["reason"] and recovery["tier"] in ("kept", "live_replica")
        await _until(admin, "kill", lambda s: s["lastRecovery"]["seconds"] > 0, "its seconds")
        assert _pids(real_kubelet, ("kill-0", "kill-2")) == before  # reconfigured, not restarted
        final = await _until(admin, "kill", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == STEPS and final["recoveries"] >= 1
        assert {uid for name, uid in seen if name == "kill-1"} - {old}, "kill-1 never replaced"
        await operating.wait_for(lambda: not _pods(admin, "kill"), 60, "the pods deleted")
        assert {"Recovered", "PlanChanged", "Succeeded"} <= set(_reasons(admin, "kill"))
    assert refusals() == []  # no call outside the chart's Role


@pytest.mark.asyncio
async def test_an_operator_restarted_mid_job_adopts_the_running_agents(
    admin: cluster.Client,
    real_kubelet: kubelet.Kubelet,
    corpus: pathlib.Path,
    refusals: Callable[[], list[str]],
) -> None:
    pods = ("adopt-0", "adopt-1", "adopt-2")
    async with operating.running_operator():
        admin.apply(operating.job_body("adopt", **operating.e2e_spec(corpus, steps=40)))
        await _until(admin, "adopt", _running("adopt"), "step 3")
        before = _pids(real_kubelet, pods)
        assert len(before) == 3
    left = _status(admin, "adopt")
    assert left["phase"] not in ENDED, "the job ended before the operator restart"
    assert _pids(real_kubelet, pods) == before  # a stopping operator leaves the agents training
    async with operating.running_operator():
        # On a quiet machine the agents may finish before the new operator adopts them; the
        # job then goes straight to Succeeded.
        await _until(
            admin,
            "adopt",
            lambda s: (
                (s.get("phase") == "Running" and s["step"] >= left["step"] + 3)
                or s.get("phase") in ENDED
            ),
            "training under the new operator",
        )
        assert _pids(real_kubelet, pods) == before  # adopted, not restarted
        final = await _until(admin, "adopt", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == 40
        await operating.wait_for(lambda: not _pods(admin, "adopt"), 60, "the pods deleted")
    assert refusals() == []  # no call outside the chart's Role


def _owned_by(admin: cluster.Client, uid: str) -> list[str]:
    """Kind/name of every object in the namespace whose owner is `uid`."""
    return [
        f"{kind}/{o['metadata']['name']}"
        for kind in ("Pod", "Service", "Secret", "ConfigMap")
        for o in admin.list("v1", kind, NAMESPACE)
        if any(r["uid"] == uid for r in o["metadata"].get("ownerReferences") or [])
    ]


@pytest.mark.asyncio
async def test_a_deleted_job_takes_its_pods_service_secrets_and_state_with_it(
    admin: cluster.Client,
    real_kubelet: kubelet.Kubelet,
    corpus: pathlib.Path,
    refusals: Callable[[], list[str]],
) -> None:
    async with operating.running_operator():
        job = admin.apply(operating.job_body("gone", **operating.e2e_spec(corpus, steps=100_000)))
        await _until(admin, "gone", _running("gone"), "step 3")
        owned = _owned_by(admin, job["metadata"]["uid"])
        kinds = {o.split("/")[0] for o in owned}
        assert kinds == {"Pod", "Service", "Secret", "ConfigMap"}, owned
        admin.delete(constants.API_VERSION, constants.KIND, "gone", NAMESPACE)
        # The finalizer goes once the job's daemon has stopped: kopf waits up to
        # handlers.DAEMON_EXIT_S for that (without it, a deleted running job kept its finalizer
        # for handlers.DAEMON_CANCEL_S, 60 s, unless another change to it came first).
        started = time.monotonic()
        await operating.wait_for(
            lambda: operating.get_job(admin, "gone") is None,
            30,
            "the job deleted",
        )
        print(f"deleting the running job took {time.monotonic() - started:.1f} s")
        await operating.wait_for(
            lambda: not _owned_by(admin, job["metadata"]["uid"]),
            120,
            f"the job's objects garbage-collected ({_owned_by(admin, job['metadata']['uid'])})",
        )
        assert not [
            p
            for p in real_kubelet.processes()
            if p.pod.startswith("gone-") and p.returncode is None
        ]
    assert refusals() == []  # no call outside the chart's Role


def _newest_snapshot(harness: kubelet.Kubelet, pod: str) -> manifests.Manifest | None:
    """The newest complete snapshot in `pod`'s own snapshot volume (its node's memory)."""
    found = [
        snapshot_store.read_manifest(slot.parent)
        for slot in harness.volume(pod, "snapshots").glob("*/*/slot-*/manifest.json")
    ]
    return max(found, key=lambda m: m.step, default=None)


def _mirrored_from(snapshot: manifests.Manifest, worker: int) -> list[manifests.LayerEntry]:
    """The entries of `snapshot` that mirror members held by `worker`."""
    return [e for e in snapshot.layers if e.group[e.member] == worker != snapshot.worker]


def _mirrored_snapshot(
    harness: kubelet.Kubelet, pods: tuple[str, ...], worker: int, epoch: int
) -> int | None:
    """The step of the newest snapshot, taken in `epoch` or later, that `pods` hold complete
    alike with mirrors of `worker`'s members among them; None while there is none."""
    newest = [_newest_snapshot(harness, pod) for pod in pods]
    steps = {m.step for m in newest if m is not None and m.epoch >= epoch}
    mirrors = [e for m in newest if m is not None for e in _mirrored_from(m, worker)]
    if len(steps) != 1 or None in newest or not mirrors:
        return None
    return steps.pop()


def _damage_mirrors(harness: kubelet.Kubelet, pods: tuple[str, ...], worker: int) -> list[int]:
    """Flip one byte in the middle of every file that `pods` mirror of `worker`'s members in
    their newest snapshot (the manifest keeps the sender's checksums); the layers damaged."""
    layers = []
    for pod in pods:
        snapshot = _newest_snapshot(harness, pod)
        assert snapshot is not None
        (slot,) = [
            s.parent
            for s in harness.volume(pod, "snapshots").glob("*/*/slot-*/manifest.json")
            if snapshot_store.read_manifest(s.parent).step == snapshot.step
        ]
        for entry in _mirrored_from(snapshot, worker):
            for stored in entry.files:
                raw = bytearray((slot / stored.file).read_bytes())
                raw[len(raw) // 2] ^= 0xFF
                (slot / stored.file).write_bytes(bytes(raw))
            layers.append(entry.layer)
    return sorted(layers)


def _complete_with_checkpoint(
    harness: kubelet.Kubelet, pods: tuple[str, ...], epoch: int, checkpoint: pathlib.Path
) -> int | None:
    """`_mirrored_snapshot` of worker 1 in `epoch`, once every worker's checkpoint part of that
    step is complete too (the tier the damaged mirrors fall to)."""
    step = _mirrored_snapshot(harness, pods, 1, epoch)
    if step is None or checkpoints.complete_step(checkpoint, (0, 1, 2), after=step - 1) != step:
        return None
    return step


def _quiet(harness: kubelet.Kubelet, pods: tuple[str, ...]) -> bool:
    """No snapshot in progress in `pods`: every slot of theirs holds a committed manifest (a
    snapshot begins by removing its target slot's manifest, `snapshot_store`)."""
    for pod in pods:
        slots = list(harness.volume(pod, "snapshots").glob("*/*/slot-*"))
        if not slots or any(not (slot / "manifest.json").exists() for slot in slots):
            return False
    return True


async def _damage_and_kill(
    harness: kubelet.Kubelet, pods: tuple[str, ...], epoch: int, checkpoint: pathlib.Path
) -> tuple[int, list[int]]:
    """Damage the mirrors of worker 1's members in the newest snapshot that `pods` hold
    complete (and checkpointed), then kill worker 1's pod: all while every pod is stopped
    (SIGSTOP), so that no newer snapshot can complete between the damage and the kill, however
    slow the machine (a newer one would serve the recovery). Tried again after a short run
    while a snapshot is in progress or not yet checkpointed. The step and the layers damaged."""
    everyone = (*pods, "mirror-1")
    deadline = time.monotonic() + RUN_S
    while True:
        for pod in everyone:
            await harness.kill(pod, signal=signal.SIGSTOP)
        step = _complete_with_checkpoint(harness, pods, epoch, checkpoint)
        if step is not None and _quiet(harness, pods):
            damaged = _damage_mirrors(harness, pods, 1)
            await harness.kill("mirror-1")
            for pod in pods:
                await harness.kill(pod, signal=signal.SIGCONT)
            return step, damaged
        for pod in everyone:
            await harness.kill(pod, signal=signal.SIGCONT)
        assert time.monotonic() < deadline, "no quiet moment with a checkpointed mirror"
        await asyncio.sleep(0.1)


async def _recovery_from(admin: cluster.Client, worker: int, epoch: int) -> dict[str, Any]:
    """The job's first recovery after `epoch` that names `worker` lost."""
    recovered = await _until(
        admin,
        "mirror",
        lambda s: (
            worker in ((s.get("lastRecovery") or {}).get("failedWorkers") or [])
            and s["lastRecovery"]["epoch"] > epoch
        ),
        f"the recovery from worker {worker}'s loss",
    )
    recovery: dict[str, Any] = recovered["lastRecovery"]
    return recovery


def _assert_checkpoint_like_reference(spec: dict[str, Any], checkpoint: pathlib.Path) -> None:
    """The job's checkpoint of its last step equals the single-process reference trainer's
    state bit for bit (parameters, AdamW moments, step counts; exact reduction)."""
    settings = conversion.to_settings(job_spec.JobSpec.model_validate(spec), "mirror", "")
    got = checkpoints.load_checkpoint(checkpoint, settings.steps)
    want, _ = runtime_states.reference_states(settings.training, 1, settings.steps)
    found = comparison.compare(got, want)
    assert found.equal, found.describe()


# Snapshots (and checkpoints) every 10 steps: the test damages the newest one's mirrors and
# kills their holder with every pod stopped between two snapshots (`_damage_and_kill`). Long
# enough for the killed pod to be replaced and to rejoin before the second loss.
MIRROR_STEPS = 300
MIRROR_INTERVAL = 10


@pytest.mark.asyncio
async def test_a_stages_only_replica_lost_twice_comes_back_from_its_mirrors_then_the_checkpoint(
    admin: cluster.Client,
    real_kubelet: kubelet.Kubelet,
    corpus: pathlib.Path,
    tmp_path: pathlib.Path,
    refusals: Callable[[], list[str]],
) -> None:
    """Issue #20 on the operator: one pipeline of three stages (the device too small for the
    model, no fault tolerance), exact reduction, every pod its own snapshot emptyDir.
    1. The middle stage's pod killed: its layers' only replica and its own snapshot are gone,
       but each member's snapshot is mirrored on another pod: the job goes on from those
       copies (tier peer_snapshot, or local_snapshot where the new plan gives a lost layer to
       the pod that mirrors it), not the checkpoint.
    2. Once the replaced pod has rejoined (three stages again), the survivors' mirrors of its
       members are damaged (one flipped byte per file, checksums unchanged) and it is killed
       again: the damaged pieces are rejected and the checkpoint serves (tier checkpoint).
    The job Succeeds and its last checkpoint equals the single-process reference bit for bit."""
    ckpt = tmp_path / "ckpt"
    spec = operating.e2e_spec(corpus, steps=MIRROR_STEPS)
    spec.update(
        faultTolerance=0,
        deviceMemory=str(local_job.pipelined_profile(1).memory_bytes),
        reduction="exact",
        snapshots={"intervalSteps": MIRROR_INTERVAL, "redundancy": "xor"},
        checkpoints={"dir": str(ckpt), "intervalSteps": MIRROR_INTERVAL},
    )
    others = ("mirror-0", "mirror-2")
    async with operating.running_operator():
        admin.apply(operating.job_body("mirror", **spec))
        running = await _until(admin, "mirror", lambda s: s.get("phase") == "Running", "run")
        assert running["plan"].startswith("[3]"), running["plan"]  # one pipeline of 3 stages
        await operating.wait_for(
            lambda: _mirrored_snapshot(real_kubelet, others, 1, 0), RUN_S, "a mirrored snapshot"
        )
        await real_kubelet.kill("mirror-1")
        first = await _recovery_from(admin, 1, epoch=running["epoch"])
        assert "no live replica" in first["reason"], first
        assert first["tier"] in ("peer_snapshot", "local_snapshot"), first

        back = await _until(
            admin,
            "mirror",
            lambda s: s["epoch"] > first["epoch"] and s["plan"].startswith("[3]"),
            "worker 1 back in a pipeline of three stages",
        )
        step, damaged = await _damage_and_kill(real_kubelet, others, back["epoch"], ckpt)
        assert damaged, "no mirror of worker 1's members to damage"
        second = await _recovery_from(admin, 1, epoch=back["epoch"])
        assert second["tier"] == "checkpoint", (step, damaged, second)
        print(f"mirrors: first loss {first}; damaged layers {damaged} at step {step}: {second}")
        final = await _until(admin, "mirror", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == MIRROR_STEPS
        said = [
            e.get("message", "")
            for e in admin.list("v1", "Event", NAMESPACE)
            if e["involvedObject"].get("name") == "mirror"
        ]
        assert any("from tier checkpoint after losing workers [1]" in m for m in said), said
        await operating.wait_for(lambda: not _pods(admin, "mirror"), 60, "the pods deleted")
    _assert_checkpoint_like_reference(spec, ckpt)
    assert refusals() == []  # no call outside the chart's Role
