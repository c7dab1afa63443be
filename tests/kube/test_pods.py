"""The pure object builders of `planaria.kube.pods`.

Covered: a worker pod per node (name, labels, the workers annotation, owner reference, one
container per GPU serving worker node*gpusPerNode+k on $(POD_IP):AGENT_PORT+k, downward-API env,
volumes: snapshot emptyDir with medium Memory and the spec's size, /tmp, the agent TLS Secret;
the hardened security context; no service account token; TCP readiness probe; resources from
the spec with one nvidia.com/gpu per container on cuda; nodeSelector, tolerations,
priorityClassName; hostname and subdomain); the headless Service; Secrets round-tripping their
files; every object deserialises as the kubernetes client's model (V1Pod, V1Service, V1Secret).
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes
import pytest

from planaria.contract import plan
from planaria.kube import constants, pods
from planaria.spec import job

OWNER = pods.Owner(name="tiny", namespace="ml", uid="0b7c6f2e-1111-2222-3333-444455556666")


def _spec(**changes: Any) -> job.JobSpec:
    values: dict[str, Any] = {"workers": 4, "gpusPerNode": 2, "steps": 10}
    values.update(changes)
    return job.JobSpec.model_validate(values)


def _model(body: dict[str, Any], kind: str) -> Any:
    """`body` as the kubernetes client's model: raises when a field has the wrong shape."""

    class _Response:
        data = json.dumps(body)

    client = kubernetes.client.ApiClient()
    return client.deserialize(_Response.data, kind, "application/json")


def test_a_worker_pod_runs_one_agent_per_gpu_on_its_nodes_workers() -> None:
    pod = pods.worker_pod(OWNER, _spec(), node=1, image="planaria:test")
    assert pod["metadata"]["name"] == constants.pod_name("tiny", 1) == "tiny-1"
    assert pod["metadata"]["annotations"][constants.ANNOTATION_WORKERS] == "2,3"
    containers = pod["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent-0", "agent-1"]
    for k, container in enumerate(containers):
        args = container["args"]
        assert container["command"] == ["planaria"] and args[0] == "agent"
        assert args[args.index("--worker") + 1] == str(2 + k)
        assert args[args.index("--listen") + 1] == f"$(POD_IP):{constants.AGENT_PORT + k}"
        assert args[args.index("--tls-dir") + 1] == constants.TLS_MOUNT
        assert args[args.index("--snapshot-base") + 1] == constants.SNAPSHOT_MOUNT
        assert args[args.index("--device") + 1] == "cpu"
        assert args[args.index("--job") + 1] == "tiny"
        assert container["readinessProbe"]["tcpSocket"]["port"] == constants.AGENT_PORT + k
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
        assert env[constants.ENV_POD_IP] == "status.podIP"
        assert container["image"] == "planaria:test"


def test_a_worker_pod_is_labelled_owned_and_named_in_the_service() -> None:
    pod = pods.worker_pod(OWNER, _spec(), node=0, image="i")
    labels = pod["metadata"]["labels"]
    assert labels[constants.LABEL_JOB] == "tiny"
    assert labels[constants.LABEL_NODE] == "0"
    assert labels[constants.LABEL_COMPONENT] == constants.COMPONENT_WORKER
    assert labels[constants.LABEL_MANAGED_BY] == constants.MANAGER
    (owner,) = pod["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "name": "tiny",
        "uid": OWNER.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert pod["spec"]["hostname"] == "tiny-0"
    assert pod["spec"]["subdomain"] == constants.service_name("tiny")
    assert pod["spec"]["restartPolicy"] == "Never"


def test_a_worker_pod_is_hardened_and_mounts_memory_snapshots_and_tls() -> None:
    pod = pods.worker_pod(OWNER, _spec(pod={"snapshotMemory": "3Gi"}), node=0, image="i")
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == pods.UID
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["snapshots"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "3Gi"}
    assert volumes["tmp"]["emptyDir"] == {}
    assert volumes["tls"]["secret"]["secretName"] == constants.agent_secret_name("tiny")
    for container in spec["containers"]:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert set(mounts) == {constants.SNAPSHOT_MOUNT, constants.TMP_MOUNT, constants.TLS_MOUNT}
        assert mounts[constants.TLS_MOUNT]["readOnly"] is True


@pytest.mark.parametrize(
    ("device", "gpu"), [("cpu", None), ("cuda", "1")], ids=["cpu asks no GPU", "cuda asks one"]
)
def test_resources_follow_the_spec(device: str, gpu: str | None) -> None:
    spec = _spec(device=device, pod={"cpu": "2", "memory": "8Gi"})
    for container in pods.worker_pod(OWNER, spec, node=0, image="i")["spec"]["containers"]:
        resources = container["resources"]
        assert resources["requests"] == resources["limits"]
        assert resources["limits"]["cpu"] == "2" and resources["limits"]["memory"] == "8Gi"
        assert resources["limits"].get(pods.GPU_RESOURCE) == gpu
        assert container["args"][container["args"].index("--device") + 1] == device


def test_scheduling_fields_come_from_the_spec_and_the_image_from_it_first() -> None:
    spec = _spec(
        pod={
            "image": "mine:1",
            "nodeSelector": {"pool": "spot"},
            "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "training",
        }
    )
    pod = pods.worker_pod(OWNER, spec, node=0, image="default:1")
    assert pod["spec"]["nodeSelector"] == {"pool": "spot"}
    assert pod["spec"]["tolerations"] == [
        {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["spec"]["priorityClassName"] == "training"
    assert {c["image"] for c in pod["spec"]["containers"]} == {"mine:1"}
    plain = pods.worker_pod(OWNER, _spec(), node=0, image="default:1")["spec"]
    assert not {"nodeSelector", "tolerations", "priorityClassName"} & set(plain)


def test_the_service_is_headless_over_the_jobs_worker_pods() -> None:
    service = pods.service(OWNER, _spec())
    assert service["metadata"]["name"] == constants.service_name("tiny")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    pod_labels = pods.worker_pod(OWNER, _spec(), node=1, image="i")["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["port"] for p in service["spec"]["ports"]] == [
        constants.AGENT_PORT,
        constants.AGENT_PORT + 1,
    ]


def test_a_secret_holds_its_files_and_gives_them_back() -> None:
    files = {"ca.crt": b"\x00pem\xff", "tls.key": b"key"}
    secret = pods.secret(OWNER, constants.agent_secret_name("tiny"), files)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert pods.secret_files(secret) == files


def test_every_object_is_a_valid_kubernetes_model() -> None:
    spec = _spec(device="cuda", pod={"cpu": "500m", "tolerations": [{"key": "a"}]})
    pod = _model(pods.worker_pod(OWNER, spec, node=1, image="i"), "V1Pod")
    assert pod.spec.containers[1].ports[0].container_port == constants.AGENT_PORT + 1
    assert pod.spec.volumes[0].empty_dir.medium == "Memory"
    service = _model(pods.service(OWNER, spec), "V1Service")
    assert service.spec.cluster_ip == "None"
    secret = _model(pods.secret(OWNER, "s", {"a": b"b"}), "V1Secret")
    assert secret.data == {"a": "Yg=="}


def test_workers_map_to_nodes_and_back() -> None:
    spec = _spec(workers=6, gpusPerNode=3)
    assert pods.node_workers(spec, 1) == (3, 4, 5)
    assert [pods.node_of(spec, plan.WorkerId(w)) for w in range(6)] == [0, 0, 0, 1, 1, 1]
