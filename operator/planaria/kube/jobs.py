"""One ResilientJob's life inside the operator: validation, the objects it needs, and the run of
its controller (what the kopf daemon of `planaria.kube.handlers` awaits).

    jobs = Jobs(client=api, config=OperatorConfig(agent_image=..., pod_ip=..., store_port=0))
    spec = validate(body)                   # JobSpecError (a ValueError) saying what to fix
    await jobs.prepare(body, spec)          # Service, TLS Secrets (idempotent)
    await jobs.run(body, spec, stopped, emit)  # the controller, until the job ends or stopped

A job runs as `planaria.control.controller.Controller` over a `KubeBackend`, a `StatusWriter`
(the CRD status and Events) and a `ConfigMapJournal`. When the state ConfigMap holds an epoch
record (the operator restarted mid-job), the controller adopts it instead of starting over
(`Controller(adopt=...)`), and the recovery count goes on from the previous status'.

Stopping (`stopped`, kopf's flag): an operator exiting or pausing (another replica leads now)
detaches the controller, leaving the agents training for the successor to adopt; a deleted
job stops its agents and deletes its pods (owned objects also go by garbage collection). A job
that ended (Succeeded or Failed) stopped its agents and deleted its pods itself; its
ResilientJob keeps the final status, and an operator restart does not run it again (it only
deletes pods left behind by an operator stopped between the final status and the cleanup).

The TLS credentials (issue #10) are issued once per job into two Secrets owned by the job: the
controller's (CA, controller and agent certificates and keys; read back after an operator
restart) and the agents' (CA certificate, agent certificate and key; mounted into the pods),
always made from the controller's, so the two match whoever creates them first.

Errors: `job.JobSpecError` from `validate`; `api.KubeError` from the API (kopf retries the
handler or the daemon); `tls.TlsError` for a controller Secret that does not load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
import pydantic

from planaria.control import clock, controller, metrics
from planaria.control import status as statuses
from planaria.kube import api, backend, constants, journal, pods, reporting
from planaria.rpc import tls
from planaria.spec import conversion, job

LOG = logging.getLogger(__name__)
ENDED = ("Succeeded", "Failed")
# The controller Secret also keeps the agents' certificate and key, so that the agents' Secret
# is always made from the one controller Secret that won (the daemon and the create handler may
# both get there first; two replicas may too): a mismatched pair would fail every handshake.
AGENT_CERT = "agent.crt"
AGENT_KEY = "agent.key"
Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorConfig:
    """What every job of one operator shares: the agent image, where the stores listen."""

    agent_image: str
    pod_ip: str = "127.0.0.1"
    store_port: int = constants.STORE_PORT  # 0: any free port
    status_interval_s: float = reporting.MIN_INTERVAL_S


def validate(body: Mapping[str, Any]) -> job.JobSpec:
    """The spec of a ResilientJob's `body`, checked as the CRD cannot (cross-field rules, the
    name's length); JobSpecError with one line saying what to change."""
    name = str((body.get("metadata") or {}).get("name", ""))
    if len(name) > constants.MAX_JOB_NAME:
        raise job.JobSpecError(
            f"metadata.name: {name!r} is {len(name)} characters; give at most "
            f"{constants.MAX_JOB_NAME} (pod, Service and Secret names derive from it)"
        )
    try:
        spec = job.JobSpec.model_validate(body.get("spec") or {})
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in first["loc"])
        raise job.JobSpecError(f"spec.{path}: {first['msg']}") from None
    conversion.to_settings(spec, name, corpus_default())  # the cross-field rules and the name
    return spec


def corpus_default() -> str:
    """The agents' default corpus: the standard library of the image's Python. The operator
    runs the same image, so its own path is the agents' (`planaria.agent.training.data`)."""
    return sysconfig.get_paths()["stdlib"]


@dataclass(slots=True, kw_only=True)
class Jobs:
    """The running jobs of one operator (kept in kopf's memo, not a module global)."""

    client: api.Api
    config: OperatorConfig
    running: dict[Key, backend.KubeBackend] = field(default_factory=dict)
    metrics: dict[Key, metrics.MetricsSink] = field(default_factory=dict)
    taken_ports: set[int] = field(default_factory=set)

    def observe(self, namespace: str, job_name: str, kind: str | None, pod: dict[str, Any]) -> None:
        """Route one pod event to its job's backend (ignored when the job does not run here)."""
        running = self.running.get((namespace, job_name))
        if running is not None:
            running.observe(kind, pod)

    async def reconcile(self, namespace: str, job_name: str) -> None:
        """Replace the job's dead pods and create missing ones (when it runs here)."""
        running = self.running.get((namespace, job_name))
        if running is not None:
            await running.reconcile()

    async def prepare(self, body: Mapping[str, Any], spec: job.JobSpec) -> tls.ControllerTls:
        """Create the job's Service and TLS Secrets when missing; the controller's TLS."""
        owner = pods.Owner.of(body)
        with contextlib.suppress(api.Conflict):
            await self.client.create(api.SERVICES, owner.namespace, pods.service(owner, spec))
        return await self._credentials(owner)

    async def _credentials(self, owner: pods.Owner) -> tls.ControllerTls:
        """The job's controller TLS; the Secrets are made once, race-free (module docstring)."""
        files = await self._controller_secret(owner)
        agent_files = {
            tls.CA_CERT: files[tls.CA_CERT],
            tls.CERT: files[AGENT_CERT],
            tls.KEY: files[AGENT_KEY],
        }
        agent = pods.secret(owner, constants.agent_secret_name(owner.name), agent_files)
        with contextlib.suppress(api.Conflict):  # made before, from the same controller Secret
            await self.client.create(api.SECRETS, owner.namespace, agent)
        return tls.from_controller_files({k: files[k] for k in tls.CONTROLLER_FILES})

    async def _controller_secret(self, owner: pods.Owner) -> dict[str, bytes]:
        """The controller Secret's files: read back, or issued and created (on a lost race,
        the winner's)."""
        name = constants.controller_secret_name(owner.name)
        try:
            return pods.secret_files(await self.client.get(api.SECRETS, owner.namespace, name))
        except api.NotFound:
            pass
        creds = tls.issue(owner.name)
        files = {
            **tls.controller_files(creds),
            AGENT_CERT: creds.agent_cert_pem,
            AGENT_KEY: creds.agent_key_pem,
        }
        try:
            await self.client.create(api.SECRETS, owner.namespace, pods.secret(owner, name, files))
        except api.Conflict:
            return pods.secret_files(await self.client.get(api.SECRETS, owner.namespace, name))
        return files

    async def run(
        self, body: Mapping[str, Any], spec: job.JobSpec, stopped: Any, emit: reporting.Emit
    ) -> None:
        """Run the job's controller until the job ends or `stopped` (kopf's daemon flag) is
        set (module docstring)."""
        owner = pods.Owner.of(body)
        status: Mapping[str, Any] = body.get("status") or {}
        if status.get("phase") in ENDED:  # the final status stands; leftovers go
            await self._remove_pods(owner)
            return
        controller_tls = await self.prepare(body, spec)
        states = journal.ConfigMapJournal(self.client, owner)
        adopt = await states.read()
        store = backend.host_store(self.config.pod_ip, self.config.store_port, self.taken_ports)
        workers = backend.KubeBackend(
            client=self.client,
            owner=owner,
            spec=spec,
            image=self.config.agent_image,
            tls=controller_tls,
            store=store,
            taken=self.taken_ports,
        )
        writer = self._writer(owner, body, spec, emit)
        key = (owner.namespace, owner.name)
        gauges = self.metrics[key] = metrics.MetricsSink(f"{owner.namespace}/{owner.name}")
        settings = conversion.to_settings(spec, owner.name, corpus_default())
        core = controller.Controller(
            settings,
            workers,
            clock=clock.RealClock(),
            sink=_Sinks((writer, gauges)),
            journal=states,
            adopt=adopt,
        )
        self.running[key] = workers
        try:
            await _until_done_or_stopped(core, stopped, workers)
            await writer.flush()
        finally:
            del self.running[key], self.metrics[key]

    async def _remove_pods(self, owner: pods.Owner) -> None:
        """Delete the pods of a job that ended (an operator that stopped right after the final
        status was written, before deleting them, left them behind)."""
        selector = f"{constants.LABEL_JOB}={owner.name}"
        for pod in await self.client.list(api.PODS, owner.namespace, labels=selector):
            with contextlib.suppress(api.NotFound):
                await self.client.delete(api.PODS, owner.namespace, pod["metadata"]["name"])

    def _writer(
        self, owner: pods.Owner, body: Mapping[str, Any], spec: job.JobSpec, emit: reporting.Emit
    ) -> reporting.StatusWriter:
        async def write(status: dict[str, Any]) -> None:
            await self.client.patch(api.JOB_STATUS, owner.namespace, owner.name, {"status": status})

        return reporting.StatusWriter(
            write=write,
            emit=emit,
            generation=int((body.get("metadata") or {}).get("generation") or 0),
            total_steps=spec.steps,
            previous=body.get("status"),
            min_interval_s=self.config.status_interval_s,
        )


@dataclass(frozen=True, slots=True)
class _Sinks:
    """Publishes every status to each of `sinks` in turn (the CRD, then the metrics)."""

    sinks: tuple[reporting.StatusWriter, metrics.MetricsSink]

    async def publish(self, status: statuses.JobStatus) -> None:
        for sink in self.sinks:
            await sink.publish(status)


async def _until_done_or_stopped(
    core: controller.Controller, stopped: Any, workers: backend.KubeBackend
) -> None:
    """Run `core` until it returns, or until kopf's `stopped` flag is set: then detach it (the
    operator exits or pauses) or stop the job (it was deleted), per the flag's reason."""
    runner = asyncio.ensure_future(core.run())
    stopping = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({runner, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if runner.done():
        if not runner.cancelled() and runner.exception() is not None:
            # kopf retries the daemon; the traceback is said here, where the job's log is
            LOG.error("job controller crashed", exc_info=runner.exception())
        runner.result()
        return
    leaving = _operator_leaves(stopped.reason)
    if leaving:
        core.detach()
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    if leaving:
        workers.close()
    LOG.info("job daemon stopped (%s)", stopped.reason)


def _operator_leaves(reason: Any) -> bool:
    """Whether kopf stops the daemon because the operator exits or pauses (not the job)."""
    leaving = (
        kopf.DaemonStoppingReason.OPERATOR_EXITING | kopf.DaemonStoppingReason.OPERATOR_PAUSING
    )
    return bool(reason is not None and reason & leaving)
