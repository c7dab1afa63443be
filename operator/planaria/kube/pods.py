"""Pure builders of the objects the operator creates for a job: worker pods, the headless
Service, the TLS Secrets (dicts in, dicts out: Kubernetes JSON, no I/O).

    owner = pods.Owner(name="tiny", namespace="ml", uid="…")
    pods.worker_pod(owner, spec, node=1, image="ghcr.io/planaria/planaria:0.1")
    pods.service(owner, spec)
    pods.secret(owner, constants.agent_secret_name("tiny"), tls.agent_files(creds))

One pod per node, named `constants.pod_name(job, node)`, with `gpusPerNode` containers
`agent-<k>`: container k serves worker `node * gpusPerNode + k` on `$(POD_IP):AGENT_PORT + k`
(Kubernetes expands `$(POD_IP)` from the env var the downward API sets). Every object carries
`constants.job_labels` and an owner reference to the ResilientJob (controller, blocking owner
deletion), so deleting the job garbage-collects it all.

Worker pods are hardened: non-root uid 10001, read-only root filesystem, no privilege escalation,
every capability dropped, the runtime's seccomp profile, no service account token (agents never
call the API). Writable paths are emptyDirs: host-memory snapshots (medium Memory, sized by
`pod.snapshotMemory`) and /tmp. The readiness probe is a TCP connect to the agent port: a gRPC
health probe cannot speak the agents' mutual TLS. `restartPolicy: Never`: a dead agent's pod is
replaced by the operator, which must notice the death anyway.

What does not live here: deciding which pods to create (`planaria.kube.backend`), calling the
API (`planaria.kube.api`). Nothing raises: the spec was validated before it gets here.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planaria.contract import plan
from planaria.kube import constants
from planaria.spec import job

UID = 10001  # the image's planaria user (Dockerfile)
GPU_RESOURCE = "nvidia.com/gpu"
SECRET_MODE = 0o440  # readable by the pod's fsGroup, which the agents run in
READY_PERIOD_S = 2
Json = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """The ResilientJob that owns every object built here."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Owner:
        """The owner named by a ResilientJob's body (`metadata` name, namespace, uid)."""
        meta = body["metadata"]
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def owner_reference(owner: Owner) -> Json:
    """An owner reference to the job: the garbage collector deletes its objects with it."""
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(owner: Owner, name: str, labels: Mapping[str, str] | None = None) -> Json:
    """Metadata of an object of the job: its labels (plus `labels`) and the owner reference."""
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": {**constants.job_labels(owner.name), **(labels or {})},
        "ownerReferences": [owner_reference(owner)],
    }


def node_workers(spec: job.JobSpec, node: int) -> tuple[plan.WorkerId, ...]:
    """The workers of `node`, in the order of its pod's containers."""
    first = node * spec.gpus_per_node
    return tuple(plan.WorkerId(first + k) for k in range(spec.gpus_per_node))


def node_of(spec: job.JobSpec, worker: plan.WorkerId) -> int:
    """The node (pod) that runs `worker`."""
    return int(worker) // spec.gpus_per_node


def worker_labels(job_name: str, node: int) -> dict[str, str]:
    """The labels of the worker pod of `node` (the job's, the component, the node)."""
    return {
        **constants.job_labels(job_name),
        constants.LABEL_COMPONENT: constants.COMPONENT_WORKER,
        constants.LABEL_NODE: str(node),
    }


def worker_pod(owner: Owner, spec: job.JobSpec, *, node: int, image: str) -> Json:
    """The pod of `node`; `image` is the agent image (the spec's `pod.image` wins over it)."""
    workers = node_workers(spec, node)
    name = constants.pod_name(owner.name, node)
    meta = metadata(owner, name, worker_labels(owner.name, node))
    meta["annotations"] = {constants.ANNOTATION_WORKERS: ",".join(str(w) for w in workers)}
    chosen = spec.pod.image or image
    containers = [_container(owner.name, spec, k, w, chosen) for k, w in enumerate(workers)]
    pod_spec: Json = {
        "containers": containers,
        "restartPolicy": "Never",
        "hostname": name,
        "subdomain": constants.service_name(owner.name),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": _volumes(owner.name, spec),
    }
    pod_spec.update(_scheduling(spec))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def _container(job_name: str, spec: job.JobSpec, k: int, worker: int, image: str) -> Json:
    port = constants.AGENT_PORT + k
    return {
        "name": f"agent-{k}",
        "image": image,
        "command": ["planaria"],
        "args": [
            *("agent", "--worker", str(worker), "--job", job_name),
            *("--listen", f"$({constants.ENV_POD_IP}):{port}"),
            *("--snapshot-base", constants.SNAPSHOT_MOUNT),
            *("--tls-dir", constants.TLS_MOUNT),
            *("--device", spec.device),
        ],
        "env": _downward_env(),
        "ports": [{"name": f"agent-{k}", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {
            "tcpSocket": {"port": port},
            "periodSeconds": READY_PERIOD_S,
            "failureThreshold": 3,
        },
        "resources": _resources(spec),
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "snapshots", "mountPath": constants.SNAPSHOT_MOUNT},
            {"name": "tmp", "mountPath": constants.TMP_MOUNT},
            {"name": "tls", "mountPath": constants.TLS_MOUNT, "readOnly": True},
        ],
    }


def _downward_env() -> list[Json]:
    fields = (
        (constants.ENV_POD_IP, "status.podIP"),
        (constants.ENV_POD_NAME, "metadata.name"),
        (constants.ENV_POD_NAMESPACE, "metadata.namespace"),
    )
    return [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": p}}} for n, p in fields]


def _resources(spec: job.JobSpec) -> Json:
    """Requests equal limits (Guaranteed QoS when both are given: the last to be evicted)."""
    amounts: dict[str, str] = {}
    if spec.pod.cpu is not None:
        amounts["cpu"] = spec.pod.cpu
    if spec.pod.memory is not None:
        amounts["memory"] = spec.pod.memory
    if spec.device == "cuda":
        amounts[GPU_RESOURCE] = "1"
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _volumes(job_name: str, spec: job.JobSpec) -> list[Json]:
    memory = {"medium": "Memory", "sizeLimit": spec.pod.snapshot_memory}
    secret = {"secretName": constants.agent_secret_name(job_name), "defaultMode": SECRET_MODE}
    return [
        {"name": "snapshots", "emptyDir": memory},
        {"name": "tmp", "emptyDir": {}},
        {"name": "tls", "secret": secret},
    ]


def _scheduling(spec: job.JobSpec) -> Json:
    """nodeSelector, tolerations and priorityClassName, only those the spec sets."""
    chosen: Json = {}
    if spec.pod.node_selector:
        chosen["nodeSelector"] = dict(spec.pod.node_selector)
    if spec.pod.tolerations:
        chosen["tolerations"] = [
            t.model_dump(by_alias=True, exclude_defaults=True) for t in spec.pod.tolerations
        ]
    if spec.pod.priority_class_name:
        chosen["priorityClassName"] = spec.pod.priority_class_name
    return chosen


def service(owner: Owner, spec: job.JobSpec) -> Json:
    """The job's headless Service: stable DNS names `<pod>.<job>` for the worker pods, ready or
    not (the operator connects by pod IP; the names are for people and logs)."""
    ports = [
        {"name": f"agent-{k}", "port": constants.AGENT_PORT + k, "protocol": "TCP"}
        for k in range(spec.gpus_per_node)
    ]
    selector = {
        **constants.job_labels(owner.name),
        constants.LABEL_COMPONENT: constants.COMPONENT_WORKER,
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, constants.service_name(owner.name)),
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": ports,
            "publishNotReadyAddresses": True,
        },
    }


def secret(owner: Owner, name: str, files: Mapping[str, bytes]) -> Json:
    """An Opaque Secret holding `files` (file name -> bytes), owned by the job."""
    data = {key: base64.b64encode(value).decode("ascii") for key, value in files.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata(owner, name),
        "data": data,
    }


def secret_files(body: Mapping[str, Any]) -> dict[str, bytes]:
    """The files of a Secret's body (base64 `data` decoded)."""
    data: Mapping[str, str] = body.get("data") or {}
    return {key: base64.b64decode(value) for key, value in data.items()}
