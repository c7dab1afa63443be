"""Issue #9's acceptance, end to end: `planaria operator` (kopf, the real handlers) against the API
emulator, with the kubelet harness running each worker pod's container as a real
`planaria agent` process (mutual TLS from the job's Secret, snapshots in the pod's emptyDir),
the tiny model on a small corpus, 3 workers.

Covered: a job runs to Succeeded with the CRD status showing its steps; one pod's agent killed
(the pod goes Failed) -> the survivors are reconfigured over gRPC without a restart (same
pids), the status shows the recovery (lastRecovery tier, seconds, reason) with Recovered,
PlanChanged and Succeeded Events, the dead pod is replaced, and the job Succeeds; the operator
stopped mid-job and a new one started -> the job goes on with the same agent processes and
Succeeds; one pipeline of three stages (exact reduction) whose middle pod is killed (its layers'
only replica and its emptyDir gone) -> rebuilt from the snapshot mirrors on the other pods; the
replacement killed again after its mirrors on the other pods were damaged -> the damaged pieces
are rejected and the checkpoint tier serves, said in the status and an Event; the job Succeeds
and its last checkpoint equals the single-process reference bit for bit;
every API request the operator made is covered by `constants.RBAC_RULES`; a job
that ended has its pods deleted.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from planaria.agent.runtime import runtime_states
from planaria.agent.state import checkpoints, manifests, snapshot_store
from planaria.agent.training import comparison
from planaria.kube import constants
from planaria.spec import job as job_spec
from tests.e2e import local_job
from tests.kube import operating
from tests.kube.support import emulator, kubelet, serving

ENDED = ("Succeeded", "Failed")
RUN_S = 120.0


def _status(kube_api: serving.KubeApi, name: str) -> dict[str, Any]:
    job = operating.get_job(kube_api, name) or {}
    status: dict[str, Any] = job.get("status") or {}
    return status


def _pods(kube_api: serving.KubeApi, job: str) -> list[dict[str, Any]]:
    return operating.pods_of(kube_api, job)


def _pids(harness: kubelet.Kubelet, pods: tuple[str, ...]) -> dict[str, int]:
    return {p.pod: p.pid for p in harness.processes() if p.pod in pods and p.returncode is None}


async def _until(kube_api: serving.KubeApi, name: str, check: Any, what: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status = _status(kube_api, name)
        return status if check(status) else None

    return await operating.wait_for(probe, RUN_S, f"{name}: {what} ({_status(kube_api, name)})")


def _assert_rbac_covers(calls: list[emulator.ApiCall]) -> None:
    ours = [c for c in calls if c.user_agent != "kubelet-harness"]
    outside = [
        c
        for c in ours
        if not any(
            r.api_group == c.group
            and r.resource == (f"{c.resource}/{c.subresource}" if c.subresource else c.resource)
            and c.verb in r.verbs
            for r in constants.RBAC_RULES
        )
    ]
    assert not outside, f"requests outside RBAC_RULES: {outside}"
    used = sorted({(c.group, c.resource, c.subresource or "", c.verb) for c in ours})
    print(f"operator API calls (group, resource, subresource, verb): {used}")


# Long enough that the timer (every 0.3 s here) replaces the dead pod before the job ends:
# the recovery comes at step 3 or later, and a step takes tens of milliseconds.
STEPS = 60


@pytest.mark.asyncio
async def test_a_killed_pod_is_survived_without_restarting_the_others(
    kube_api: serving.KubeApi, kubelet: kubelet.Kubelet, corpus: pathlib.Path
) -> None:
    async with operating.running_operator(kube_api):
        kube_api.apply(operating.job_body("kill", **operating.e2e_spec(corpus, steps=STEPS)))
        await _until(
            kube_api, "kill", lambda s: s.get("phase") == "Running" and s["step"] >= 3, "step 3"
        )
        before = _pids(kubelet, ("kill-0", "kill-2"))
        assert len(before) == 2
        (old,) = [
            p["metadata"]["uid"]
            for p in _pods(kube_api, "kill")
            if p["metadata"]["name"] == "kill-1"
        ]
        await kubelet.kill("kill-1")
        # The survivors may break their epoch before worker 1's death reaches the controller:
        # then a regroup comes first (no worker failed) and the loss of worker 1 after it.
        recovered = await _until(
            kube_api,
            "kill",
            lambda s: (s.get("lastRecovery") or {}).get("failedWorkers") == [1],
            "the recovery from worker 1's loss",
        )
        recovery = recovered["lastRecovery"]
        assert recovery["reason"] and recovery["tier"] in ("kept", "live_replica")
        await _until(kube_api, "kill", lambda s: s["lastRecovery"]["seconds"] > 0, "its seconds")
        assert _pids(kubelet, ("kill-0", "kill-2")) == before  # reconfigured, not restarted
        final = await _until(kube_api, "kill", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == STEPS and final["recoveries"] >= 1
        # The timer replaced the failed pod so that worker 1 could come back. The emulator's
        # history, not a poll: a replacement made just before the job ended lives milliseconds.
        replacements = [
            p["metadata"]["uid"]
            for p in kube_api.created("v1", "Pod", operating.NAMESPACE)
            if p["metadata"]["name"] == "kill-1" and p["metadata"]["uid"] != old
        ]
        assert replacements, "the failed pod kill-1 was never replaced"
        await operating.wait_for(lambda: not _pods(kube_api, "kill"), 30, "the pods deleted")
        events = kube_api.list("v1", "Event", operating.NAMESPACE)
        reasons = {e.get("reason") for e in events}
        assert {"Recovered", "PlanChanged", "Succeeded"} <= reasons
    _assert_rbac_covers(kube_api.requests)


@pytest.mark.asyncio
async def test_an_operator_restarted_mid_job_adopts_the_running_agents(
    kube_api: serving.KubeApi, kubelet: kubelet.Kubelet, corpus: pathlib.Path
) -> None:
    pods = ("adopt-0", "adopt-1", "adopt-2")
    async with operating.running_operator(kube_api):
        kube_api.apply(operating.job_body("adopt", **operating.e2e_spec(corpus, steps=40)))
        await _until(
            kube_api, "adopt", lambda s: s.get("phase") == "Running" and s["step"] >= 3, "step 3"
        )
        before = _pids(kubelet, pods)
        assert len(before) == 3
    left = _status(kube_api, "adopt")
    assert left["phase"] not in ENDED, "the job ended before the operator restart"
    assert _pids(kubelet, pods) == before  # a stopping operator leaves the agents training
    async with operating.running_operator(kube_api, load_crd=False):
        # The agents train on while no operator watches: on a quiet machine they may finish
        # the job before the new operator adopts them, and it then goes straight to Succeeded.
        await _until(
            kube_api,
            "adopt",
            lambda s: (
                (s.get("phase") == "Running" and s["step"] >= left["step"] + 3)
                or s.get("phase") in ENDED
            ),
            "training under the new operator",
        )
        assert _pids(kubelet, pods) == before  # adopted, not restarted
        final = await _until(kube_api, "adopt", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == 40
        await operating.wait_for(lambda: not _pods(kube_api, "adopt"), 30, "the pods deleted")
    _assert_rbac_covers(kube_api.requests)


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


def _assert_checkpoint_like_reference(spec: dict[str, Any], checkpoint: pathlib.Path) -> None:
    """The job's checkpoint of its last step equals the single-process reference trainer's
    state bit for bit (parameters, AdamW moments, step counts; exact reduction)."""
    settings = job_spec.to_settings(job_spec.JobSpec.model_validate(spec), "mirror", "")
    got = checkpoints.load_checkpoint(checkpoint, settings.steps)
    want, _ = runtime_states.reference_states(settings.training, 1, settings.steps)
    found = comparison.compare(got, want)
    assert found.equal, found.describe()


# Snapshots (and checkpoints) every 10 steps: the test damages the newest one's mirrors and
# kills their holder well before the next is written. Long enough for the killed pod to be
# replaced and to rejoin before the second loss.
MIRROR_STEPS = 300
MIRROR_INTERVAL = 10


@pytest.mark.asyncio
async def test_a_stages_only_replica_lost_twice_comes_back_from_its_mirrors_then_the_checkpoint(
    kube_api: serving.KubeApi,
    kubelet: kubelet.Kubelet,
    corpus: pathlib.Path,
    tmp_path: pathlib.Path,
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
    async with operating.running_operator(kube_api):
        kube_api.apply(operating.job_body("mirror", **spec))
        running = await _until(kube_api, "mirror", lambda s: s.get("phase") == "Running", "run")
        assert running["plan"].startswith("[3]"), running["plan"]  # one pipeline of 3 stages
        await operating.wait_for(
            lambda: _mirrored_snapshot(kubelet, others, 1, 0), RUN_S, "a mirrored snapshot"
        )
        await kubelet.kill("mirror-1")
        first = await _recovery_from(kube_api, 1, epoch=running["epoch"])
        assert "no live replica" in first["reason"], first
        assert first["tier"] in ("peer_snapshot", "local_snapshot"), first

        back = await _until(
            kube_api,
            "mirror",
            lambda s: s["epoch"] > first["epoch"] and s["plan"].startswith("[3]"),
            "worker 1 back in a pipeline of three stages",
        )
        step = await operating.wait_for(
            lambda: _complete_with_checkpoint(kubelet, others, back["epoch"], ckpt),
            RUN_S,
            "a mirrored snapshot of the rejoined worker, and its checkpoint",
        )
        damaged = _damage_mirrors(kubelet, others, 1)
        await kubelet.kill("mirror-1")
        assert damaged, "no mirror of worker 1's members to damage"
        second = await _recovery_from(kube_api, 1, epoch=back["epoch"])
        assert second["tier"] == "checkpoint", (step, damaged, second)
        print(f"mirrors: first loss {first}; damaged layers {damaged} at step {step}: {second}")
        final = await _until(kube_api, "mirror", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == MIRROR_STEPS
        said = [e.get("message", "") for e in kube_api.list("v1", "Event", operating.NAMESPACE)]
        assert any("from tier checkpoint after losing workers [1]" in m for m in said), said
    _assert_checkpoint_like_reference(spec, ckpt)


def _complete_with_checkpoint(
    harness: kubelet.Kubelet, pods: tuple[str, ...], epoch: int, checkpoint: pathlib.Path
) -> int | None:
    """`_mirrored_snapshot` of worker 1 in `epoch`, once every worker's checkpoint part of that
    step is complete too (the tier the damaged mirrors fall to)."""
    step = _mirrored_snapshot(harness, pods, 1, epoch)
    if step is None or checkpoints.complete_step(checkpoint, (0, 1, 2), after=step - 1) != step:
        return None
    return step


async def _recovery_from(kube_api: serving.KubeApi, worker: int, epoch: int) -> dict[str, Any]:
    """The job's first recovery after `epoch` that names `worker` lost."""
    recovered = await _until(
        kube_api,
        "mirror",
        lambda s: (
            worker in ((s.get("lastRecovery") or {}).get("failedWorkers") or [])
            and s["lastRecovery"]["epoch"] > epoch
        ),
        f"the recovery from worker {worker}'s loss",
    )
    recovery: dict[str, Any] = recovered["lastRecovery"]
    return recovery
