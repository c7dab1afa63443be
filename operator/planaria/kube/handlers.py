"""The kopf layer: thin handlers over `planaria.kube.jobs`, registered on a registry of their
own (no import-time registration, no module globals; STYLE rule 3).

    registry = handlers.registry(reconcile_s=5.0)
    settings = handlers.settings(peering=None)        # None: standalone
    await kopf.operator(registry=registry, settings=settings, memo=kopf.Memo(jobs=jobs), ...)

Level-triggered (STYLE rule 4): every handler reads the object as it is now.

- create / resume / update of a ResilientJob: validate the spec (`jobs.validate`); an invalid
  one gets phase Invalid and the condition SpecValid False whose message says what to fix, plus
  a Warning Event, and nothing else happens (no exception, no retry storm); a valid one gets its
  Service and TLS Secrets.
- a daemon per ResilientJob runs its controller (`Jobs.run`); while the spec is invalid it
  waits and reads it again (a fixed spec starts the job).
- a timer per ResilientJob replaces dead pods and creates missing ones (`KubeBackend.reconcile`).
- login: the pod's service account, else the kubeconfig (KUBECONFIG).
- every event of a pod labelled with `constants.LABEL_JOB` goes to its job's backend, where it
  becomes worker events (deaths, preemption notices, returns).

kopf keeps its progress in annotations under `constants.KOPF_PREFIX` (the status belongs to the
controller) and its finalizer is `constants.FINALIZER` (daemons and timers need one to stop
before the object goes). kopf posts Events only for warnings and errors of its own; ours
(recoveries, plan changes) come from `planaria.kube.reporting`.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from planaria.kube import constants, jobs, reporting

LOG = logging.getLogger(__name__)
RECONCILE_S = 5.0
INVALID_RETRY_S = 10.0
DAEMON_CANCEL_S = 60.0
# How long kopf waits for a deleted job's daemon (and timer) to exit once told to, before it
# defers the check. Without it, kopf looked again only after DAEMON_CANCEL_S unless another
# change to the job came first, so a deleted running job kept its finalizer for 60 s (its
# daemon needs milliseconds to stop: longer than kopf's few zero-time loop cycles).
DAEMON_EXIT_S = 5.0
RESOURCE = (constants.GROUP, constants.VERSION, constants.PLURAL)


def settings(*, peering: str | None, priority: int = 0) -> kopf.OperatorSettings:
    """kopf's settings for the operator; `peering` names the peering object of the replicas'
    leader election (None: standalone, one replica)."""
    chosen = kopf.OperatorSettings()
    chosen.persistence.finalizer = constants.FINALIZER
    chosen.background.instant_exit_timeout = DAEMON_EXIT_S
    chosen.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=constants.KOPF_PREFIX
    )
    chosen.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=constants.KOPF_PREFIX, key="last-handled-configuration"
    )
    chosen.posting.level = logging.WARNING  # kopf's own INFO lines are not Events
    # The namespaces are named, never patterns, and the CRD is installed before the operator
    # (the chart): no cluster-wide watch of namespaces and CRDs, so no cluster-wide RBAC.
    chosen.scanning.disabled = True
    chosen.peering.standalone = peering is None
    chosen.peering.mandatory = peering is not None
    chosen.peering.name = peering or "default"
    chosen.peering.priority = priority
    return chosen


def registry(*, reconcile_s: float = RECONCILE_S) -> kopf.OperatorRegistry:
    """A registry with the operator's handlers (module docstring)."""
    chosen = kopf.OperatorRegistry()
    kopf.on.login(registry=chosen, id="login")(_login)
    for cause in (kopf.on.create, kopf.on.resume, kopf.on.update):
        cause(*RESOURCE, registry=chosen, id="validate")(_validate)
    kopf.daemon(*RESOURCE, registry=chosen, id="controller", cancellation_timeout=DAEMON_CANCEL_S)(
        _run
    )
    kopf.timer(*RESOURCE, registry=chosen, id="pods", interval=reconcile_s)(_reconcile)
    kopf.on.event("pods", registry=chosen, labels={constants.LABEL_JOB: kopf.PRESENT})(_pod)
    return chosen


def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account in a cluster, else the kubeconfig (as `planaria.kube.api`)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


async def _validate(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """An invalid spec: status Invalid, a Warning Event; a valid one: Service and Secrets."""
    try:
        spec = jobs.validate(body)
    except ValueError as exc:
        generation = int(body.metadata.get("generation") or 0)
        previous = body.get("status")
        patch.status.update(
            reporting.invalid_body(str(exc), generation=generation, previous=previous)
        )
        kopf.warn(body, reason="InvalidSpec", message=str(exc))
        return
    await memo.jobs.prepare(body, spec)


async def _run(body: kopf.Body, stopped: Any, memo: kopf.Memo, **_: Any) -> None:
    """The job's controller, once its spec is valid (module docstring)."""
    while not stopped:
        try:
            spec = jobs.validate(body)
        except ValueError:  # _validate reported it; a fixed spec is picked up here
            await stopped.wait(INVALID_RETRY_S)
            continue
        await memo.jobs.run(body, spec, stopped, _emitter(body))
        return


async def _reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await memo.jobs.reconcile(body.metadata.namespace, body.metadata.name)


async def _pod(event: kopf.RawEvent, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    pod = event.get("object") or {}
    namespace = (pod.get("metadata") or {}).get("namespace", "")
    memo.jobs.observe(namespace, labels[constants.LABEL_JOB], event.get("type"), dict(pod))


def _emitter(body: kopf.Body) -> reporting.Emit:
    def emit(kind: str, reason: str, message: str) -> None:
        kopf.event(body, type=kind, reason=reason, message=message)

    return emit
