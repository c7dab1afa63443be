"""The kubelet harness on a real control plane (Kubernetes 1.20): the pods a test creates run
as local processes, bound through `pods/binding` as the scheduler does, their status written
through `pods/status` as a kubelet's.

Covers: `$(VAR)` expansion, downward-API and secret env, emptyDir and secret volumes (with
`items`) and the mountPath rewriting; distinct pod IPs and node names; readiness from a TCP
probe and `set_ready`; exit codes to Succeeded/Failed, OnFailure restarts, `kill` (128+signal);
deletion (SIGTERM, then the pod released), `evict` (DisruptionTarget), a missing secret
(CreateContainerConfigError); `close()` leaving no process behind, grandchildren included, and
a pod outside its label selector left unbound. The harness's pure parts: tests/kube/test_kubelet.py.
Every pod and Secret a test makes carries LABELS and is removed after it (forcibly: the harness
that would release a running pod has stopped by then), since the server outlives the test.
"""

import asyncio
import ipaddress
import json
import pathlib
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.kube.real import cluster
from tests.kube.real.conftest import NAMESPACE
from tests.kube.support import kubelet as harness

LABELS = {"planaria.dev/test": "kubelet"}
WAIT_S = 30.0

Json = dict[str, Any]

# A tiny server: listens on the pod IP once started, and exits 0 on SIGTERM (writing a mark).
SERVE = """
import signal, socket, sys, time
mark = sys.argv[3]
def bye(*_):
    open(mark, "w").write("terminated")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
time.sleep(float(sys.argv[4]))
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
while True:
    time.sleep(0.05)
"""


def python_pod(name: str, script: str, *args: str, **spec: Any) -> Json:
    container = {
        "name": "main",
        "image": "python",
        "command": ["python", "-c", script],
        "args": list(args),
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(LABELS)},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [container],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            **spec,
        },
    }


def server_pod(name: str, port: int, delay_s: float = 0.0) -> Json:
    probe = {
        "readinessProbe": {"tcpSocket": {"port": "http"}},
        "ports": [{"name": "http", "containerPort": port}],
    }
    return python_pod(
        name, SERVE, "$(POD_IP)", str(port), "/scratch/mark", str(delay_s), container=probe
    )


def scratch(tmp_path: pathlib.Path, pod: str) -> pathlib.Path:
    return tmp_path / "kubelet" / f"default_{pod}" / "volumes" / "scratch"


async def until(api: cluster.Client, pod: str, check: Callable[[Json], bool]) -> Json:
    """The pod once `check` holds (AssertionError after WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        obj = api.get("v1", "Pod", pod, NAMESPACE)
        if obj is not None and check(obj):
            return obj
        await asyncio.sleep(0.05)
    raise AssertionError(f"pod {pod} never got there: {api.get('v1', 'Pod', pod, NAMESPACE)}")


async def gone(api: cluster.Client, pod: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if api.get("v1", "Pod", pod, NAMESPACE) is None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"pod {pod} was never released")


async def gone_from(kubelet: harness.Kubelet, pod: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while any(p.pod == pod for p in kubelet.processes()):
        assert time.monotonic() < deadline, f"the harness still runs pod {pod}"
        await asyncio.sleep(0.05)


def phase(wanted: str) -> Callable[[Json], bool]:
    return lambda obj: obj.get("status", {}).get("phase") == wanted


def condition(kind: str, value: str) -> Callable[[Json], bool]:
    return lambda obj: any(
        c["type"] == kind and c["status"] == value
        for c in obj.get("status", {}).get("conditions", [])
    )


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


REPORT = """
import json, os, sys
out, ip, token_file = sys.argv[1:4]
report = {"argv": sys.argv[1:], "token": open(token_file).read(),
          "env": {k: os.environ.get(k) for k in ("NAME", "NODE", "TOKEN", "GREETING", "ESCAPED")}}
open(out, "w").write(json.dumps(report))
"""


def _release(admin: cluster.Client, pod: str) -> None:
    """Drop `pod`'s finalizers (a merge patch: a real server refuses a pod PUT that drops the
    fields it set, such as spec.nodeName)."""
    path = f"{cluster.collection('v1', 'Pod', NAMESPACE)}/{pod}"
    admin.request("PATCH", path, {"metadata": {"finalizers": None}}, "application/merge-patch+json")


@pytest.fixture(autouse=True)
def _removed_after(admin: cluster.Client) -> Iterator[None]:
    """After the test (and its harness): every pod and Secret it made deleted at once."""
    yield
    selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
    for kind in ("Pod", "Secret"):
        for obj in admin.list("v1", kind, NAMESPACE, selector):
            name = obj["metadata"]["name"]
            if kind == "Pod" and obj["metadata"].get("finalizers"):
                _release(admin, name)
            path = f"{cluster.collection('v1', kind, NAMESPACE)}/{name}"
            admin.request("DELETE", path, {"gracePeriodSeconds": 0})


@pytest.mark.asyncio
async def test_a_pod_runs_with_expanded_args_env_and_volumes(
    admin: cluster.Client, real_kubelet: harness.Kubelet, tmp_path: pathlib.Path
) -> None:
    admin.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": NAMESPACE, "labels": dict(LABELS)},
            "stringData": {"token": "s3cret", "other": "x"},
        }
    )
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "GREETING", "value": "hi $(NAME) on $(MISSING)"},
        {"name": "ESCAPED", "value": "$$(NAME)"},
    ]
    mounts = [
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "creds", "mountPath": "/etc/creds"},
    ]
    secret = {"secretName": "creds", "items": [{"key": "token", "path": "sub/tok"}]}
    admin.apply(
        python_pod(
            "reporter",
            REPORT,
            "/scratch/out.json",
            "$(POD_IP)",
            "/etc/creds/sub/tok",
            container={"env": env, "volumeMounts": mounts},
            volumes=[{"name": "scratch", "emptyDir": {}}, {"name": "creds", "secret": secret}],
        )
    )
    admin.apply(python_pod("second", "pass"))
    done = await until(admin, "reporter", phase("Succeeded"))
    report = json.loads((scratch(tmp_path, "reporter") / "out.json").read_text())
    first_ip, second_ip = str(real_kubelet.ip_base + 1), str(real_kubelet.ip_base + 2)
    assert ipaddress.ip_address(first_ip).is_loopback and first_ip != "127.0.0.1"
    assert done["spec"]["nodeName"] == "node-1" and done["status"]["podIP"] == first_ip
    assert report["argv"][1] == first_ip and report["token"] == "s3cret"
    assert report["env"] == {
        "NAME": "reporter",
        "NODE": "node-1",
        "TOKEN": "s3cret",
        "GREETING": "hi reporter on $(MISSING)",
        "ESCAPED": "$(NAME)",
    }
    assert sorted(p.name for p in (scratch(tmp_path, "reporter").parent / "creds").rglob("*")) == [
        "sub",
        "tok",
    ]
    second = await until(admin, "second", phase("Succeeded"))
    assert (second["spec"]["nodeName"], second["status"]["podIP"]) == ("node-2", second_ip)
    state = done["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 0


@pytest.mark.asyncio
async def test_readiness_follows_the_probe_port_and_set_ready(
    admin: cluster.Client, real_kubelet: harness.Kubelet
) -> None:
    admin.apply(server_pod("web", 8080, delay_s=0.3))
    running = await until(admin, "web", phase("Running"))
    assert condition("Ready", "False")(running)
    ready = await until(admin, "web", condition("Ready", "True"))
    assert ready["status"]["containerStatuses"][0]["ready"] is True
    await real_kubelet.set_ready("web", False)
    await until(admin, "web", condition("Ready", "False"))
    await real_kubelet.set_ready("web", True)
    await until(admin, "web", condition("Ready", "True"))


@pytest.mark.asyncio
async def test_exit_codes_fail_the_pod_and_kill_reports_the_signal(
    admin: cluster.Client, real_kubelet: harness.Kubelet
) -> None:
    admin.apply(python_pod("fails", "import sys; sys.exit(3)"))
    admin.apply(python_pod("sleeps", "import time; time.sleep(60)"))
    failed = await until(admin, "fails", phase("Failed"))
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    await until(admin, "sleeps", phase("Running"))
    await real_kubelet.kill("sleeps", container="main", signal=signal.SIGTERM)
    killed = await until(admin, "sleeps", phase("Failed"))
    assert killed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143


@pytest.mark.asyncio
async def test_an_executable_that_cannot_start_fails_the_pod(
    admin: cluster.Client, real_kubelet: harness.Kubelet
) -> None:
    admin.apply(python_pod("broken", "pass", container={"command": ["/nonexistent/program"]}))
    failed = await until(admin, "broken", phase("Failed"))
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (128, "StartError")


@pytest.mark.asyncio
async def test_on_failure_restarts_the_container(
    admin: cluster.Client, real_kubelet: harness.Kubelet
) -> None:
    script = (
        "import os, sys; f = sys.argv[1]\n"
        "n = int(open(f).read()) + 1 if os.path.exists(f) else 1\n"
        "open(f, 'w').write(str(n)); sys.exit(0 if n > 1 else 1)"
    )
    # Paths are rewritten in arguments, not inside a script's text: pass the path.
    admin.apply(python_pod("flaky", script, "/scratch/tries", restartPolicy="OnFailure"))
    done = await until(admin, "flaky", phase("Succeeded"))
    assert done["status"]["containerStatuses"][0]["restartCount"] == 1


@pytest.mark.asyncio
async def test_deletion_terminates_then_releases_the_pod(
    admin: cluster.Client, real_kubelet: harness.Kubelet, tmp_path: pathlib.Path
) -> None:
    admin.apply(server_pod("web", 8080))
    await until(admin, "web", condition("Ready", "True"))
    [process] = real_kubelet.processes()
    admin.delete("v1", "Pod", "web", NAMESPACE)
    await gone(admin, "web")
    assert (scratch(tmp_path, "web") / "mark").read_text() == "terminated"
    assert not alive(process.pid)
    # The server forgets the pod when the harness deletes it; the harness forgets it when
    # the DELETED event comes back.
    await gone_from(real_kubelet, "web")


@pytest.mark.asyncio
async def test_evict_marks_a_disruption_target_and_deletes(
    admin: cluster.Client, real_kubelet: harness.Kubelet
) -> None:
    pod = python_pod("victim", "import time; time.sleep(60)")
    pod["metadata"]["finalizers"] = ["example.com/hold"]  # keeps the object to look at
    admin.apply(pod)
    await until(admin, "victim", phase("Running"))
    [process] = real_kubelet.processes()
    await real_kubelet.evict("victim")
    held = await until(
        admin, "victim", lambda obj: obj["metadata"].get("deletionGracePeriodSeconds") == 0
    )
    assert condition("DisruptionTarget", "True")(held) and not alive(process.pid)
    _release(admin, "victim")
    await gone(admin, "victim")


@pytest.mark.asyncio
async def test_a_missing_secret_leaves_the_pod_pending(
    admin: cluster.Client, real_kubelet: harness.Kubelet
) -> None:
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]
    admin.apply(python_pod("stuck", "pass", container={"env": env}))

    def waiting(obj: Json) -> Json:
        statuses = obj["status"].get("containerStatuses") or [{"state": {}}]
        return statuses[0]["state"].get("waiting") or {"reason": "ContainerCreating"}

    stuck = await until(admin, "stuck", lambda obj: waiting(obj)["reason"] != "ContainerCreating")
    assert stuck["status"]["phase"] == "Pending"
    assert waiting(stuck)["reason"] == "CreateContainerConfigError"
    assert "absent" in waiting(stuck)["message"]


GRANDPARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(60)
"""


@pytest.mark.asyncio
async def test_close_leaves_no_process_behind(
    control_plane: cluster.ControlPlane, admin: cluster.Client, tmp_path: pathlib.Path
) -> None:
    async with harness.Kubelet(
        control_plane.server,
        tmp_path / "kubelet",
        namespace=NAMESPACE,
        label_selector="app=x",
        token=control_plane.admin_token,
        ca_file=control_plane.ca_file,
    ) as k:
        admin.apply(python_pod("ignored", "import time; time.sleep(60)"))
        admin.apply(
            {
                **python_pod("parent", GRANDPARENT, "/scratch/child"),
                "metadata": {
                    "name": "parent",
                    "namespace": NAMESPACE,
                    "labels": {**LABELS, "app": "x"},
                },
            }
        )
        child_file = scratch(tmp_path, "parent") / "child"
        for _ in range(250):
            if child_file.exists() and child_file.read_text():
                break
            await asyncio.sleep(0.02)
        [process] = k.processes()
        child = int(child_file.read_text())
        assert process.pod == "parent" and alive(process.pid) and alive(child)
    for _ in range(100):  # the orphaned grandchild is reaped by init, asynchronously
        if not alive(child):
            break
        await asyncio.sleep(0.02)
    assert not alive(process.pid) and not alive(child) and not k.errors
    ignored = admin.get("v1", "Pod", "ignored", NAMESPACE)
    assert ignored is not None and "nodeName" not in ignored["spec"]
