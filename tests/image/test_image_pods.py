"""A job's worker pods run from the built image: the operator (in this process) against the API
emulator, and the kubelet harness starting each pod's `planaria` container with
`scripts/build-image.sh run` instead of this machine's interpreter, so every agent runs the
image's code as uid 10001 on its read-only root. The harness's folder (the pods' emptyDirs,
Secrets and logs) is bound in writable, as a kubelet's volumes are; the pod's environment is
handed through. Skipped when the image is not built (tests/image/test_image.py says how).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest

from planaria.agent.training import data
from tests.image.test_image import SCRIPT, image_or_skip
from tests.kube import operating
from tests.kube.support import containers, serving
from tests.kube.support import kubelet as harness

# Cold starts of torch from the image on a loaded machine take tens of seconds per agent.
RUN_S = 300.0
# Long enough to see the three agents running before the job ends.
STEPS = 40


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
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image_or_skip()
    corpus_dir, workdir, api_dir = tmp_path / "corpus", tmp_path / "kubelet", tmp_path / "api"
    for folder in (corpus_dir, workdir, api_dir):
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
    with serving.serve(api_dir) as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
        async with harness.Kubelet(api.url, workdir) as kubelet:
            async with operating.running_operator(api):
                spec = operating.e2e_spec(corpus, steps=STEPS)
                spec["timeouts"] = {**spec["timeouts"], "configureSeconds": 240.0}
                api.apply(operating.job_body("imaged", **spec))

                def three_in_the_image() -> set[str] | None:
                    pods = agents_in_the_image(kubelet)
                    return pods if len(pods) == 3 else None

                in_image = await operating.wait_for(
                    three_in_the_image, RUN_S, "3 agents running from the image as uid 10001"
                )

                def ended() -> dict[str, Any] | None:
                    job = operating.get_job(api, "imaged") or {}
                    status: dict[str, Any] = job.get("status") or {}
                    return status if status.get("phase") in ("Succeeded", "Failed") else None

                final = await operating.wait_for(ended, RUN_S, "the job ended")
            logs = {p.pod: p.log.read_text(errors="replace") for p in kubelet.processes()}
        assert not kubelet.errors, kubelet.errors
    assert final["phase"] == "Succeeded", (final, logs)
    assert final["step"] == STEPS
    assert len(in_image) == 3 and set(in_image) <= set(logs)
    for log in logs.values():
        assert "Read-only file system" not in log, log[-2000:]
