"""The kubelet harness's pure parts (tests/kube/support/containers.py, podruns.py); the harness
itself runs pods on a real control plane in tests/kube/real/test_real_server_kubelet.py.

Covers: `$(VAR)` expansion as Kubernetes does it; the executable mapping (`planaria`, `python`)
and image entrypoints; the interpreter's own path never remounted; mount paths rewritten longest
first; readiness turned False only after the probe's failureThreshold of failures in a row.
"""

import pathlib
import sys

import pytest

from tests.kube.support import containers, podruns


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


@pytest.mark.parametrize(
    ("probe", "was_ready", "failures", "running", "ready"),
    [
        ({}, False, 0, True, True),  # the first success
        ({}, False, 1, True, False),  # not ready until a probe passes
        ({}, True, 1, True, True),  # a slow moment: still ready
        ({}, True, 2, True, True),
        ({}, True, 3, True, False),  # Kubernetes' default failureThreshold
        ({"failureThreshold": 1}, True, 1, True, False),
        ({"failureThreshold": 5}, True, 4, True, True),
        ({}, True, 0, False, False),  # the process ended
    ],
)
def test_readiness_turns_false_after_the_probes_failure_threshold(
    probe: dict[str, int], was_ready: bool, failures: int, running: bool, ready: bool
) -> None:
    spec = {"name": "agent", "readinessProbe": {"tcpSocket": {"port": 1}, **probe}}
    got = podruns.ready_after(spec, was_ready=was_ready, failures=failures, running=running)
    assert got is ready
