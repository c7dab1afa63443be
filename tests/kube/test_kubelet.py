"""The kubelet harness: pods of the API emulator run as local processes.

Covers: `$(VAR)` expansion, downward-API and secret env, emptyDir and secret volumes (with
`items`) and the mountPath rewriting; distinct pod IPs and node names; readiness from a TCP
probe and `set_ready`; exit codes to Succeeded/Failed, OnFailure restarts, `kill` (128+signal);
deletion (SIGTERM, then the pod released), `evict` (DisruptionTarget), a missing secret
(CreateContainerConfigError); `close()` leaving no process behind, grandchildren included;
the executable mapping and entrypoints.
"""

import asyncio
import ipaddress
import json
import pathlib
import signal
import sys
from collections.abc import Callable
from typing import Any

import pytest

from tests.kube.support import containers, serving
from tests.kube.support import kubelet as harness

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
        "metadata": {"name": name, "namespace": "default"},
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


async def until(api: serving.KubeApi, pod: str, check: Callable[[Json], bool]) -> Json:
    """The pod once `check` holds (AssertionError after 10 s)."""
    for _ in range(500):
        obj = api.get("v1", "Pod", pod, "default")
        if obj is not None and check(obj):
            return obj
        await asyncio.sleep(0.02)
    raise AssertionError(f"pod {pod} never got there: {api.get('v1', 'Pod', pod, 'default')}")


async def gone(api: serving.KubeApi, pod: str) -> None:
    for _ in range(500):
        if api.get("v1", "Pod", pod, "default") is None:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"pod {pod} was never released")


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


@pytest.mark.asyncio
async def test_a_pod_runs_with_expanded_args_env_and_volumes(
    kube_api: serving.KubeApi, kubelet: harness.Kubelet, tmp_path: pathlib.Path
) -> None:
    kube_api.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
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
    kube_api.apply(
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
    kube_api.apply(python_pod("second", "pass"))
    done = await until(kube_api, "reporter", phase("Succeeded"))
    report = json.loads((scratch(tmp_path, "reporter") / "out.json").read_text())
    first_ip, second_ip = str(kubelet.ip_base + 1), str(kubelet.ip_base + 2)
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
    second = await until(kube_api, "second", phase("Succeeded"))
    assert (second["spec"]["nodeName"], second["status"]["podIP"]) == ("node-2", second_ip)
    state = done["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 0


@pytest.mark.asyncio
async def test_readiness_follows_the_probe_port_and_set_ready(
    kube_api: serving.KubeApi, kubelet: harness.Kubelet
) -> None:
    kube_api.apply(server_pod("web", 8080, delay_s=0.3))
    running = await until(kube_api, "web", phase("Running"))
    assert condition("Ready", "False")(running)
    ready = await until(kube_api, "web", condition("Ready", "True"))
    assert ready["status"]["containerStatuses"][0]["ready"] is True
    await kubelet.set_ready("web", False)
    await until(kube_api, "web", condition("Ready", "False"))
    await kubelet.set_ready("web", True)
    await until(kube_api, "web", condition("Ready", "True"))


@pytest.mark.asyncio
async def test_exit_codes_fail_the_pod_and_kill_reports_the_signal(
    kube_api: serving.KubeApi, kubelet: harness.Kubelet
) -> None:
    kube_api.apply(python_pod("fails", "import sys; sys.exit(3)"))
    kube_api.apply(python_pod("sleeps", "import time; time.sleep(60)"))
    failed = await until(kube_api, "fails", phase("Failed"))
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    await until(kube_api, "sleeps", phase("Running"))
    await kubelet.kill("sleeps", container="main", signal=signal.SIGTERM)
    killed = await until(kube_api, "sleeps", phase("Failed"))
    assert killed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143


@pytest.mark.asyncio
async def test_an_executable_that_cannot_start_fails_the_pod(
    kube_api: serving.KubeApi, kubelet: harness.Kubelet
) -> None:
    kube_api.apply(python_pod("broken", "pass", container={"command": ["/nonexistent/program"]}))
    failed = await until(kube_api, "broken", phase("Failed"))
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (128, "StartError")


@pytest.mark.asyncio
async def test_on_failure_restarts_the_container(
    kube_api: serving.KubeApi, kubelet: harness.Kubelet
) -> None:
    script = (
        "import os, sys; f = sys.argv[1]\n"
        "n = int(open(f).read()) + 1 if os.path.exists(f) else 1\n"
        "open(f, 'w').write(str(n)); sys.exit(0 if n > 1 else 1)"
    )
    # Paths are rewritten in arguments, not inside a script's text: pass the path.
    kube_api.apply(python_pod("flaky", script, "/scratch/tries", restartPolicy="OnFailure"))
    done = await until(kube_api, "flaky", phase("Succeeded"))
    assert done["status"]["containerStatuses"][0]["restartCount"] == 1


@pytest.mark.asyncio
async def test_deletion_terminates_then_releases_the_pod(
    kube_api: serving.KubeApi, kubelet: harness.Kubelet, tmp_path: pathlib.Path
) -> None:
    kube_api.apply(server_pod("web", 8080))
    await until(kube_api, "web", condition("Ready", "True"))
    [process] = kubelet.processes()
    kube_api.delete("v1", "Pod", "web", "default")
    await gone(kube_api, "web")
    assert (scratch(tmp_path, "web") / "mark").read_text() == "terminated"
    assert not alive(process.pid) and kubelet.processes() == []


@pytest.mark.asyncio
async def test_evict_marks_a_disruption_target_and_deletes(
    kube_api: serving.KubeApi, kubelet: harness.Kubelet
) -> None:
    pod = python_pod("victim", "import time; time.sleep(60)")
    pod["metadata"]["finalizers"] = ["example.com/hold"]  # keeps the object to look at
    kube_api.apply(pod)
    await until(kube_api, "victim", phase("Running"))
    [process] = kubelet.processes()
    await kubelet.evict("victim")
    held = await until(
        kube_api, "victim", lambda obj: obj["metadata"].get("deletionGracePeriodSeconds") == 0
    )
    assert condition("DisruptionTarget", "True")(held) and not alive(process.pid)
    kube_api.apply({**pod, "metadata": {"name": "victim", "finalizers": None}})
    await gone(kube_api, "victim")


@pytest.mark.asyncio
async def test_a_missing_secret_leaves_the_pod_pending(
    kube_api: serving.KubeApi, kubelet: harness.Kubelet
) -> None:
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]
    kube_api.apply(python_pod("stuck", "pass", container={"env": env}))

    def waiting(obj: Json) -> Json:
        statuses = obj["status"].get("containerStatuses") or [{"state": {}}]
        return statuses[0]["state"].get("waiting") or {"reason": "ContainerCreating"}

    stuck = await until(
        kube_api, "stuck", lambda obj: waiting(obj)["reason"] != "ContainerCreating"
    )
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
    kube_api: serving.KubeApi, tmp_path: pathlib.Path
) -> None:
    async with harness.Kubelet(kube_api.url, tmp_path / "kubelet", label_selector="app=x") as k:
        kube_api.apply(python_pod("ignored", "import time; time.sleep(60)"))
        kube_api.apply(
            {
                **python_pod("parent", GRANDPARENT, "/scratch/child"),
                "metadata": {"name": "parent", "labels": {"app": "x"}},
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
    ignored = kube_api.get("v1", "Pod", "ignored", "default")
    assert ignored is not None and "nodeName" not in ignored["spec"]


# -- the pure parts: expansion, executables, mounts ----------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("$(A)-$(B)", "1-2"), ("$$(A)", "$(A)"), ("$(C)", "$(C)"), ("a$$b", "a$b"), ("$A", "$A")],
    ids=["defined", "escaped", "undefined stays", "double dollar", "not a reference"],
)
def test_expansion_follows_kubernetes(text: str, expected: str) -> None:
    assert containers.expand(text, {"A": "1", "B": "2"}) == expected


def test_executables_and_entrypoints() -> None:
    planaria = {"name": "c", "image": "planaria:1", "command": ["planaria"], "args": ["agent"]}
    assert containers.argv(planaria, {}, {}) == [sys.executable, "-m", "planaria", "agent"]
    bare = {"name": "c", "image": "planaria:1", "args": ["run"]}
    assert containers.argv(bare, {}, {"planaria": ["planaria"]})[-2:] == ["planaria", "run"]
    with pytest.raises(containers.ContainerError, match="entrypoints"):
        containers.argv(bare, {}, {})


def test_the_mapped_executable_is_never_remounted() -> None:
    # A checkout under /tmp (CI's clean clone) with a pod mounting an emptyDir at /tmp: the
    # container's own paths move into the volume, this machine's interpreter does not.
    here = str(pathlib.Path(sys.executable).parent)
    table = [(here, "/volume"), ("/etc/tls", "/local/tls")]
    spec = {"name": "c", "command": ["planaria"], "args": ["agent", "/etc/tls", f"{here}/x"]}
    assert containers.argv(spec, {}, {}, table) == [
        *(sys.executable, "-m", "planaria", "agent"),
        *("/local/tls", "/volume/x"),
    ]


def test_mount_paths_are_rewritten_longest_first(tmp_path: pathlib.Path) -> None:
    container = {
        "volumeMounts": [
            {"name": "a", "mountPath": "/etc"},
            {"name": "b", "mountPath": "/etc/tls", "subPath": "x"},
        ]
    }
    table = containers.mount_table(container, {"a": tmp_path / "a", "b": tmp_path / "b"})
    assert containers.remount("/etc/tls/ca.crt", table) == f"{tmp_path}/b/x/ca.crt"
    assert containers.remount("/etc/hosts", table) == f"{tmp_path}/a/hosts"
    assert containers.remount("/etcetera", table) == "/etcetera"
