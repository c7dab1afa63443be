"""A kubelet for the real control plane's pods (tests/kube/real): runs each new pod's
containers as local processes.

`Kubelet(url, workdir)` is an async context manager. It watches pods (optionally one namespace
and a label selector) over HTTP, like a kubelet, and for each new unscheduled pod:
- binds it to node `node-<k>` through `pods/<name>/binding`, as the scheduler does, and gives
  it pod IP `ip_base + k` (all of 127/8 is loopback on Linux, so each pod listens on its own
  address; by default `ip_base` is a random 127.a.b.1, so that test processes running at once
  on one machine do not share pod addresses and ports), host IP 127.0.0.1;
- makes its volumes and starts every container as a process (see `containers` for argv, env,
  `$(VAR)`, volumes and the mountPath rewriting), in its own session (process group), output
  to `<workdir>/<namespace>_<pod>/<container>.log`;
- writes status through `pods/status`: Pending with podIP, then Running with containerStatuses
  and the PodScheduled, Initialized, ContainersReady and Ready conditions. A container with a
  `tcpSocket` or `grpc` readinessProbe is ready once its port accepts TCP connections on the pod
  IP (checked every 50 ms, also after: the probe's `failureThreshold` failures in a row, 3 by
  default as in Kubernetes, each a refused connection or none within `timeoutSeconds`, 1 by
  default, make it unready); one without is ready when started. When a process exits it is
  restarted (Always; OnFailure if non-zero) or marked terminated; once all are terminated the
  phase is Succeeded (all zero) or Failed (exit codes of signals are 128+signal, as in a
  container runtime).
- on deletion (deletionTimestamp or DELETED): SIGTERM to each container's process group, SIGKILL
  after the grace period (capped at `max_grace_s`), then deletes the pod with grace 0, which
  releases it in the API server.

`token` (a bearer token) and `ca_file` (the server's CA) are how it reaches the API server.

Test hooks: `volume`, `kill`, `evict` (DisruptionTarget condition, then delete), `set_ready`,
`processes`. `close()` (the context exit) kills every process it started, its children too.
`errors` lists the exceptions that ended the harness's own per-pod tasks (the fixture fails
the test on any).
Not emulated: init containers, liveness/startup probes, restart back-off, resource limits,
image pulls, nodes as objects.

Errors: a container that cannot be run (`containers.ContainerError`) leaves its pod Pending
with the container `waiting` (reason CreateContainerConfigError, the message says why); an
executable that cannot start ends it `terminated` with exit code 128, reason StartError.
"""

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import os
import pathlib
import random
import signal
import ssl
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import aiohttp

from tests.kube.support import containers, podruns

Json = dict[str, Any]
_PROBE_S = 0.05
_RESTART_DELAY_S = 0.1
_USER_AGENT = "kubelet-harness"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ContainerProcess:
    """A snapshot of one container's process (for tests)."""

    namespace: str
    pod: str
    container: str
    pid: int
    returncode: int | None
    log: pathlib.Path


def _signal_group(process: asyncio.subprocess.Process | None, sig: int) -> None:
    if process is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)


class Kubelet:
    """Plays kubelet for the API server's pods (see the module doc)."""

    def __init__(
        self,
        url: str,
        workdir: pathlib.Path,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        entrypoints: Mapping[str, Sequence[str]] | None = None,
        max_grace_s: float = 5.0,
        ip_base: str | None = None,
        token: str | None = None,
        ca_file: pathlib.Path | None = None,
    ) -> None:
        self._url, self._workdir = url.rstrip("/"), workdir
        self._token, self._ca_file = token, ca_file
        self._namespace, self._selector = namespace, label_selector
        self._entrypoints = dict(entrypoints or {})
        self._max_grace_s = max_grace_s
        self._pods: dict[tuple[str, str], podruns.PodRun] = {}
        self._next_node = 1
        chosen = ip_base or f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.1"
        self.ip_base = ipaddress.IPv4Address(chosen)
        self._session: aiohttp.ClientSession | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._listed = asyncio.Event()
        self.errors: list[BaseException] = []  # failures of the harness's own tasks

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._workdir.mkdir(parents=True, exist_ok=True)
        headers = {"User-Agent": _USER_AGENT}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        tls = ssl.create_default_context(cafile=self._ca_file) if self._ca_file else None
        self._session = aiohttp.ClientSession(
            headers=headers, connector=aiohttp.TCPConnector(ssl=tls) if tls else None
        )
        self._watcher = asyncio.create_task(self._watch(), name="kubelet-watch")
        listed = asyncio.create_task(self._listed.wait())
        await asyncio.wait({listed, self._watcher}, return_when=asyncio.FIRST_COMPLETED)
        if self._watcher.done():
            listed.cancel()
            await self.close()
            self._watcher.result()  # raises why the first list failed
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop watching and kill every process started (SIGTERM, then SIGKILL after 1 s)."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        await asyncio.gather(*(self._stop(pod, grace_s=1.0) for pod in list(self._pods.values())))
        self._pods.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- test hooks --------------------------------------------------------------------------

    def processes(self) -> list[ContainerProcess]:
        """Every container process started and not yet cleaned up, running or exited."""
        return [
            ContainerProcess(
                namespace=pod.namespace,
                pod=pod.name,
                container=c.name,
                pid=c.process.pid,
                returncode=c.process.returncode,
                log=c.log,
            )
            for pod in self._pods.values()
            for c in pod.containers.values()
            if c.process
        ]

    def _pod(self, name: str, namespace: str) -> podruns.PodRun:
        pod = self._pods.get((namespace, name))
        if pod is None:
            raise ValueError(f"the kubelet runs no pod {namespace}/{name}: pass a running pod")
        return pod

    def volume(self, pod: str, volume: str, namespace: str = "default") -> pathlib.Path:
        """The directory of volume `volume` of the running pod `pod` (an emptyDir is the pod's
        own: a replacement under the same name gets a new, empty one)."""
        return self._pod(pod, namespace).directory / "volumes" / volume

    async def kill(
        self,
        pod: str,
        container: str | None = None,
        signal: int = signal.SIGKILL,  # the brief's name; the module is not used below
        namespace: str = "default",
    ) -> None:
        """Send `signal` to one container's process group, or every container's."""
        for c in self._pod(pod, namespace).containers.values():
            if container in (None, c.name):
                _signal_group(c.process, signal)

    async def evict(self, pod: str, namespace: str = "default") -> None:
        """Mark the pod with a DisruptionTarget condition, then delete it (gracefully)."""
        run = self._pod(pod, namespace)
        run.condition("DisruptionTarget", True, "EvictionByEvictionAPI", "Eviction API: evicting")
        await self._write_status(run)
        await self._request("DELETE", run.path)

    async def set_ready(self, pod: str, ready: bool, namespace: str = "default") -> None:
        """Force the pod's Ready condition False (or let the probes decide again)."""
        run = self._pod(pod, namespace)
        run.forced_unready = not ready
        await self._write_status(run)

    # -- API ---------------------------------------------------------------------------------

    async def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Json]:
        assert self._session is not None, "the kubelet is not started"
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        async with self._session.request(
            method, self._url + path, json=body, headers=headers
        ) as response:
            return response.status, await response.json()

    async def _write_status(self, pod: podruns.PodRun) -> None:
        async with pod.lock:
            await self._request("PATCH", f"{pod.path}/status", {"status": pod.status()})

    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{self._namespace}/pods" if self._namespace else "/api/v1/pods"

    async def _list(self) -> str:
        params = f"?labelSelector={self._selector}" if self._selector else ""
        status, listing = await self._request("GET", self._pods_path() + params)
        if status != 200:
            raise RuntimeError(f"the kubelet cannot list pods: {status} {listing}")
        for obj in listing["items"]:
            self._on_event("ADDED", obj)
        return str(listing["metadata"]["resourceVersion"])

    async def _watch(self) -> None:
        """List, then watch from the list's version; relist when the watch expires."""
        assert self._session is not None
        version = await self._list()
        self._listed.set()
        while True:
            params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "300"}
            if self._selector:
                params["labelSelector"] = self._selector
            async with self._session.get(self._url + self._pods_path(), params=params) as stream:
                try:
                    async for line in stream.content:
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            version = await self._list()
                            break
                        version = event["object"]["metadata"]["resourceVersion"]
                        self._on_event(event["type"], event["object"])
                except asyncio.CancelledError:
                    _abort(stream)
                    raise

    def _on_event(self, kind: str, obj: Json) -> None:
        meta = obj["metadata"]
        known = self._pods.get((meta["namespace"], meta["name"]))
        if known is not None and known.uid != meta["uid"]:
            self._spawn(known, self._stop(known))  # a new pod took the old one's name
            known = None
        if known is not None and (kind == "DELETED" or meta.get("deletionTimestamp")):
            if not known.terminating:
                known.terminating = True
                self._spawn(known, self._stop(known, delete=kind != "DELETED"))
        elif (
            known is None
            and kind != "DELETED"
            and not meta.get("deletionTimestamp")
            and not (obj.get("spec", {}).get("nodeName"))
        ):
            self._start(obj)

    def _spawn(self, pod: podruns.PodRun, work: Any) -> None:
        task = asyncio.create_task(work)
        pod.tasks.add(task)
        task.add_done_callback(pod.tasks.discard)
        task.add_done_callback(self._record_failure)

    def _record_failure(self, task: asyncio.Task[None]) -> None:
        """Keep what broke a pod's task (a harness bug or a dead API) for the test to see."""
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            self.errors.append(failure)

    # -- running pods ------------------------------------------------------------------------

    def _start(self, obj: Json) -> None:
        k, self._next_node = self._next_node, self._next_node + 1
        ip = str(self.ip_base + k)
        directory = self._workdir / f"{obj['metadata']['namespace']}_{obj['metadata']['name']}"
        pod = podruns.PodRun(obj, ip, f"node-{k}", directory)
        self._pods[(pod.namespace, pod.name)] = pod
        self._spawn(pod, self._run(pod))

    async def _run(self, pod: podruns.PodRun) -> None:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": pod.node},
        }
        status, answer = await self._request("POST", f"{pod.path}/binding", binding)
        if status != 201:
            raise RuntimeError(f"the kubelet cannot bind {pod.name}: {status} {answer}")
        pod.obj["spec"]["nodeName"] = pod.node
        pod.obj["status"] = {"podIP": pod.ip, "hostIP": "127.0.0.1"}
        pod.condition("PodScheduled", True)
        await self._write_status(pod)
        try:
            launches = await self._prepare(pod)
        except containers.ContainerError as exc:
            for c in pod.containers.values():
                c.waiting = {"reason": "CreateContainerConfigError", "message": str(exc)}
            await self._write_status(pod)
            return
        for c in pod.containers.values():
            try:
                await self._launch(c, *launches[c.name])
            except OSError as exc:  # as a runtime reports an executable it cannot start
                c.waiting = None
                c.terminated = {"exitCode": 128, "reason": "StartError", "message": str(exc)}
        pod.phase = "Failed" if any(c.terminated for c in pod.containers.values()) else "Running"
        pod.condition("Initialized", True)
        for c in pod.containers.values():
            if c.terminated is None:
                self._spawn(pod, self._supervise(pod, c, launches[c.name]))
                self._spawn(pod, self._probe(pod, c))
        await self._write_status(pod)

    async def _prepare(
        self, pod: podruns.PodRun
    ) -> dict[str, tuple[list[str], dict[str, str], str]]:
        """Volumes made, and per container its argv, environment and working directory."""
        secrets = await self._sources(pod, "secrets", "secret", "secretName", "secretKeyRef")
        maps = await self._sources(pod, "configmaps", "configMap", "name", "configMapKeyRef")
        pod.directory.mkdir(parents=True, exist_ok=True)
        volumes = containers.materialize(pod.obj, pod.directory / "volumes", secrets, maps)
        plans = {}
        for c in pod.containers.values():
            table = containers.mount_table(c.spec, volumes)
            variables = containers.environment(
                pod.obj,
                c.spec,
                {n: containers.decoded(s) for n, s in secrets.items()},
                {n: {k: str(v) for k, v in (m.get("data") or {}).items()} for n, m in maps.items()},
            )
            argv = containers.argv(c.spec, variables, self._entrypoints, table)
            cwd = containers.remount(c.spec.get("workingDir", ""), table) or str(pod.directory)
            plans[c.name] = (argv, containers.process_env(variables, table), cwd)
        return plans

    async def _sources(
        self, pod: podruns.PodRun, plural: str, volume_key: str, name_key: str, env_key: str
    ) -> dict[str, Json]:
        """The secrets (or configMaps) the pod's volumes and env name, fetched by name."""
        wanted = {
            v[volume_key][name_key] for v in pod.obj["spec"].get("volumes") or [] if volume_key in v
        }
        wanted |= {
            e["valueFrom"][env_key]["name"]
            for c in pod.containers.values()
            for e in c.spec.get("env") or []
            if env_key in (e.get("valueFrom") or {})
        }
        found = {}
        for name in sorted(wanted):
            status, obj = await self._request(
                "GET", f"/api/v1/namespaces/{pod.namespace}/{plural}/{name}"
            )
            if status != 200:
                raise containers.ContainerError(f"{volume_key} {name!r} not found: create it")
            found[name] = obj
        return found

    async def _launch(
        self, c: podruns.ContainerRun, argv: list[str], env: dict[str, str], cwd: str
    ) -> None:
        with c.log.open("ab") as log:
            c.process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        c.started_at, c.terminated, c.waiting = podruns.now(), None, None
        c.ready = not podruns.probe_port(c.spec)

    async def _supervise(
        self,
        pod: podruns.PodRun,
        c: podruns.ContainerRun,
        launch: tuple[list[str], dict[str, str], str],
    ) -> None:
        """Wait for the process; restart it or record its end (and the pod's)."""
        while c.process is not None:
            code = podruns.exit_code(await c.process.wait())
            _signal_group(c.process, signal.SIGKILL)  # a container's other processes die with it
            c.ready = False
            if pod.terminating:
                return
            policy = pod.obj["spec"].get("restartPolicy", "Always")
            if policy == "Always" or (policy == "OnFailure" and code != 0):
                c.restarts += 1
                await asyncio.sleep(_RESTART_DELAY_S)
                await self._launch(c, *launch)
            else:
                c.terminated = {
                    "exitCode": code,
                    "reason": "Completed" if code == 0 else "Error",
                    "startedAt": c.started_at,
                    "finishedAt": podruns.now(),
                }
                if all(other.terminated for other in pod.containers.values()):
                    codes = [
                        other.terminated["exitCode"]
                        for other in pod.containers.values()
                        if other.terminated
                    ]
                    pod.phase = "Succeeded" if not any(codes) else "Failed"
            await self._write_status(pod)
            if c.terminated:
                return

    async def _probe(self, pod: podruns.PodRun, c: podruns.ContainerRun) -> None:
        """Readiness: the probe's port accepts connections on the pod IP."""
        port = podruns.probe_port(c.spec)
        if port is None:
            return
        probe = c.spec.get("readinessProbe") or {}
        timeout_s = float(probe.get("timeoutSeconds", 1))
        failures = 0  # in a row: a slow moment of a loaded machine is not an unready pod
        while not pod.terminating and c.terminated is None:
            try:
                connecting = asyncio.open_connection(pod.ip, port)
                _, writer = await asyncio.wait_for(connecting, timeout_s)
                writer.close()
                failures = 0
            except (OSError, TimeoutError):
                failures += 1
            running = c.process is not None and c.process.returncode is None
            ready = podruns.ready_after(
                c.spec, was_ready=c.ready, failures=failures, running=running
            )
            if ready != c.ready:
                c.ready = ready
                await self._write_status(pod)
            await asyncio.sleep(_PROBE_S)

    async def _stop(
        self, pod: podruns.PodRun, *, delete: bool = False, grace_s: float | None = None
    ) -> None:
        """SIGTERM, SIGKILL after the grace period, then (if asked) release the pod object."""
        pod.terminating = True
        # Stop the pod's other tasks first, so that none starts a process after this looks.
        others = [task for task in pod.tasks if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        if grace_s is None:
            meta, spec = pod.obj["metadata"], pod.obj["spec"]
            grace_s = meta.get(
                "deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30)
            )
        procs = [c.process for c in pod.containers.values() if c.process is not None]
        for process in procs:
            _signal_group(process, signal.SIGTERM)
        waits = [asyncio.create_task(process.wait()) for process in procs]
        if waits:
            await asyncio.wait(waits, timeout=min(float(grace_s), self._max_grace_s))
        for process in procs:
            _signal_group(process, signal.SIGKILL)
        await asyncio.gather(*(process.wait() for process in procs))
        if delete:
            await self._request("DELETE", pod.path, {"gracePeriodSeconds": 0})
        if self._pods.get((pod.namespace, pod.name)) is pod:
            del self._pods[(pod.namespace, pod.name)]


def _abort(stream: aiohttp.ClientResponse) -> None:
    """Drop a cancelled watch's connection at once. Closed politely, a TLS connection first waits
    for the server's close_notify (up to 30 s), and a test's event loop closed meanwhile leaves
    its socket open, to be reported as unclosed in whichever test collects it."""
    if stream.connection is not None and stream.connection.transport is not None:
        stream.connection.transport.abort()
