"""The built image on the real control plane (Kubernetes 1.20, RBAC, the chart's Role):

- `planaria operator` started from the image (`scripts/build-image.sh run`: uid 10001, read-only
  root), logged in as the chart's ServiceAccount through a kubeconfig and CA bound in read-only:
  it becomes healthy (`/healthz`), creates a new job's 3 pods (the image named by
  `--agent-image`) and its Service, removes a deleted job's finalizer, and exits 0 on SIGTERM
  with no write and no call refused. The pods stay unbound: no kubelet runs them there.
- a job whose worker pods run from the image: the operator in this process, and the kubelet
  harness starting each pod's `planaria` container with `scripts/build-image.sh run` instead of
  this machine's interpreter, so every agent runs the image's code as uid 10001 on its read-only
  root. The harness's folder (the pods' emptyDirs, Secrets and logs) is bound in writable, as a
  kubelet's volumes are; the pod's environment is handed through. The job runs its steps to
  Succeeded.

Skipped when the image is not built (tests/image/test_image.py says how) or the control plane is
not (tests/kube/real/conftest.py). Every job made here is deleted before its test ends, since the
server outlives the test.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from planaria.agent.training import data
from planaria.kube import constants
from tests.image.test_image import SCRIPT, image_or_skip
from tests.kube import operating
from tests.kube.real import cluster
from tests.kube.real.conftest import NAMESPACE
from tests.kube.support import containers
from tests.kube.support import kubelet as harness

T = TypeVar("T")
# Cold starts of torch from the image on a loaded machine take tens of seconds per agent.
RUN_S = 300.0
# Long enough to see the three agents running before the job ends.
STEPS = 40

pytestmark = pytest.mark.usefixtures("as_operator")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def wait_until(check: Callable[[], T | None], process: subprocess.Popen[bytes], what: str) -> T:
    """`check()`'s first truthy value; fails if the image's process ends first or after 180 s
    (a generous bound: the first start reads torch from disk on a loaded machine)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        assert process.poll() is None, f"the operator exited ({process.returncode}) before {what}"
        time.sleep(0.2)
    raise AssertionError(f"not within 180 s: {what}")


def gone(admin: cluster.Client, job: str) -> bool:
    return operating.get_job(admin, job) is None and not operating.pods_of(admin, job)


def test_the_operator_from_the_image_runs_a_job_on_an_api_server(
    tmp_path: pathlib.Path,
    control_plane: cluster.ControlPlane,
    admin: cluster.Client,
    operator_token: str,
) -> None:
    image_or_skip()
    api_dir, data_dir = tmp_path / "api", tmp_path / "data"
    api_dir.mkdir()
    data_dir.mkdir()
    # The kubeconfig and the CA it names, in a folder uid 10001 can read (pytest's tmp_path is
    # root's alone): the operator's ServiceAccount token, as the chart's pod would have it.
    shutil.copyfile(control_plane.ca_file, api_dir / "ca.crt")
    kubeconfig = dataclasses.replace(control_plane, ca_file=api_dir / "ca.crt").kubeconfig(
        api_dir / "kubeconfig", operator_token, NAMESPACE
    )
    corpus = data_dir / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    port = free_port()
    log = tmp_path / "operator.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                *("bash", str(SCRIPT), "run", "--bind", str(api_dir), "--bind", str(data_dir)),
                *("--env", f"KUBECONFIG={kubeconfig}", "--"),
                *("operator", "--namespace", NAMESPACE, "--standalone"),
                *("--agent-image", "planaria:test", "--store-port", "0"),
                *("--health-port", str(port), "--metrics-port", "0"),
                *("--reconcile-seconds", "0.3"),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_until(lambda: healthy(port), process, "/healthz answered")
            job = admin.apply(
                operating.job_body("imaged-operator", **operating.e2e_spec(corpus, steps=5))
            )

            def three_pods() -> list[dict[str, Any]] | None:
                found = operating.pods_of(admin, "imaged-operator")
                return found if len(found) == 3 else None

            pods = wait_until(three_pods, process, "the job's 3 pods created")
            assert {p["spec"]["containers"][0]["image"] for p in pods} == {"planaria:test"}
            assert [
                s
                for s in admin.list("v1", "Service", NAMESPACE)
                if [r["uid"] for r in s["metadata"].get("ownerReferences") or []]
                == [job["metadata"]["uid"]]
            ]
            # The operator from the image removes its finalizer; the garbage collector the rest.
            admin.delete(constants.API_VERSION, constants.KIND, "imaged-operator", NAMESPACE)
            wait_until(lambda: gone(admin, "imaged-operator"), process, "the job deleted")
        finally:
            # A stop as a container runtime's: SIGTERM to the image's process (the script
            # hands it on), SIGKILL to everything left after 60 s.
            process.send_signal(signal.SIGTERM)
            try:
                returncode = process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                raise
    text = log.read_text(errors="replace")
    assert returncode == 0, text[-3000:]
    assert "Read-only file system" not in text and "Traceback" not in text, text[-3000:]
    refused = [line for line in text.splitlines() if "403" in line and "forbidden" in line.lower()]
    assert refused == [], refused  # no call outside the chart's Role


def children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(parent, []).append(int(entry))
    return tree


def agents_in_the_image(kubelet: harness.Kubelet) -> set[str]:
    """The pods whose container process has, below it, `planaria agent` running as uid 10001
    in another root (the image's), as the harness's processes are seen from this machine."""
    tree, found = children(), set()
    for process in kubelet.processes():
        if process.returncode is not None:
            continue
        stack = list(tree.get(process.pid, []))
        while stack:
            pid = stack.pop()
            stack.extend(tree.get(pid, []))
            try:
                status = pathlib.Path(f"/proc/{pid}/status").read_text()
                argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                root = os.readlink(f"/proc/{pid}/root")
            except OSError:
                continue
            uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
            if uid == "10001" and root != "/" and b"agent" in argv:
                found.add(process.pod)
    return found


@pytest.mark.asyncio
async def test_a_job_whose_pods_run_from_the_image_succeeds(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    control_plane: cluster.ControlPlane,
    admin: cluster.Client,
    refusals: Callable[[], list[str]],
) -> None:
    image_or_skip()
    corpus_dir, workdir = tmp_path / "corpus", tmp_path / "kubelet"
    for folder in (corpus_dir, workdir):
        folder.mkdir()
    corpus = corpus_dir / "corpus.txt"
    corpus.write_bytes(data.load_default_corpus(max_bytes=100_000).tobytes())
    monkeypatch.setitem(
        containers._EXECUTABLES,
        "planaria",
        [
            *("bash", str(SCRIPT), "run", "--bind-rw", str(workdir)),
            *("--bind", str(corpus_dir), "--pass-env", "--"),
        ],
    )
    async with (
        harness.Kubelet(
            control_plane.server,
            workdir,
            namespace=NAMESPACE,
            token=control_plane.admin_token,
            ca_file=control_plane.ca_file,
        ) as kubelet,
        operating.running_operator(),
    ):
        spec = operating.e2e_spec(corpus, steps=STEPS)
        spec["timeouts"] = {**spec["timeouts"], "configureSeconds": 240.0}
        admin.apply(operating.job_body("imaged", **spec))

        def three_in_the_image() -> set[str] | None:
            pods = agents_in_the_image(kubelet)
            return pods if len(pods) == 3 else None

        in_image = await operating.wait_for(
            three_in_the_image, RUN_S, "3 agents running from the image as uid 10001"
        )

        def ended() -> dict[str, Any] | None:
            job = operating.get_job(admin, "imaged") or {}
            status: dict[str, Any] = job.get("status") or {}
            return status if status.get("phase") in ("Succeeded", "Failed") else None

        final = await operating.wait_for(ended, RUN_S, "the job ended")
        logs = {p.pod: p.log.read_text(errors="replace") for p in kubelet.processes()}
        admin.delete(constants.API_VERSION, constants.KIND, "imaged", NAMESPACE)
        await operating.wait_for(lambda: gone(admin, "imaged"), 60, "the job deleted")
    assert not kubelet.errors, kubelet.errors
    assert final["phase"] == "Succeeded", (final, logs)
    assert final["step"] == STEPS
    assert len(in_image) == 3 and set(in_image) <= set(logs)
    for log in logs.values():
        assert "Read-only file system" not in log, log[-2000:]
    assert refusals() == []  # no call outside the chart's Role
