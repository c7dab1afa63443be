"""The kubelet harness's record of what it runs: per pod and container, and the status it writes.

`PodRun` and `ContainerRun` hold the run state (process, restarts, readiness, termination) and
render it as the pod's `status` (phase, IPs, conditions with lastTransitionTime kept while a
condition holds, containerStatuses with running/terminated/waiting states). `probe_port` reads a
readinessProbe's port, `ready_after` applies a probe's result. Nothing here does I/O; `kubelet`
drives it.
"""

import asyncio
import datetime
import pathlib
from typing import Any

Json = dict[str, Any]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


class ContainerRun:
    """One container's run state; mutated only by its pod's tasks."""

    def __init__(self, spec: Json, log: pathlib.Path) -> None:
        self.spec, self.log, self.name = spec, log, str(spec["name"])
        self.process: asyncio.subprocess.Process | None = None
        self.restarts, self.ready, self.started_at = 0, False, ""
        self.terminated: Json | None = None
        self.waiting: Json | None = {"reason": "ContainerCreating"}  # until launched

    def status(self) -> Json:
        if self.waiting is not None:
            state: Json = {"waiting": self.waiting}
        elif self.terminated is not None:
            state = {"terminated": self.terminated}
        else:
            state = {"running": {"startedAt": self.started_at}}
        pid = self.process.pid if self.process else 0
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "containerID": f"harness://{pid}",
            "ready": self.ready,
            "restartCount": self.restarts,
            "started": "running" in state,
            "state": state,
        }


class PodRun:
    """One pod's run state."""

    def __init__(self, obj: Json, ip: str, node: str, directory: pathlib.Path) -> None:
        meta = obj["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.obj, self.ip, self.node, self.directory = obj, ip, node, directory
        self.containers = {
            str(spec["name"]): ContainerRun(spec, directory / f"{spec['name']}.log")
            for spec in obj["spec"].get("containers") or []
        }
        self.phase, self.started_at, self.forced_unready = "Pending", now(), False
        self.terminating = False
        self.conditions: dict[str, Json] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.lock = asyncio.Lock()

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"

    def condition(self, kind: str, status: bool, reason: str = "", message: str = "") -> None:
        value = "True" if status else "False"
        old = self.conditions.get(kind)
        if old is None or old["status"] != value:
            self.conditions[kind] = {"type": kind, "status": value, "lastTransitionTime": now()}
        self.conditions[kind].update(
            {k: v for k, v in (("reason", reason), ("message", message)) if v}
        )

    def status(self) -> Json:
        ready = all(c.ready for c in self.containers.values()) and bool(self.containers)
        self.condition("ContainersReady", ready)
        self.condition("Ready", ready and not self.forced_unready)
        return {
            "phase": self.phase,
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": self.started_at,
            "conditions": list(self.conditions.values()),
            "containerStatuses": [c.status() for c in self.containers.values()],
        }


def probe_port(spec: Json) -> int | None:
    """The readinessProbe's port (a number, or a named container port), if it has one."""
    probe = spec.get("readinessProbe") or {}
    target = probe.get("tcpSocket") or probe.get("grpc")
    if not target:
        return None
    port = target.get("port")
    if isinstance(port, str) and not port.isdigit():
        named = {p.get("name"): p["containerPort"] for p in spec.get("ports") or []}
        return int(named[port]) if port in named else None
    return int(port) if port is not None else None


def ready_after(spec: Json, *, was_ready: bool, failures: int, running: bool) -> bool:
    """Readiness after a probe, `failures` the failed probes in a row up to it (0: it passed):
    a ready container turns unready only after the readinessProbe's `failureThreshold` of them
    (3 by default, as in Kubernetes); one not ready turns ready at the first success. A
    container whose process is not running is not ready."""
    threshold = int((spec.get("readinessProbe") or {}).get("failureThreshold", 3))
    return running and (failures == 0 or (was_ready and failures < threshold))
