"""Every name the operator shares with the cluster: the API group, labels, annotations, env
variables, ports, mount paths, object names and the RBAC rules it needs (STYLE rule 7).

The Helm chart (charts/planaria) and the plain manifests (manifests/) state the same values; the
chart tests compare them with this module, so a rename here that the chart misses fails CI.
Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- the custom resource ---------------------------------------------------------------------
GROUP = "planaria.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ResilientJob"
PLURAL = "resilientjobs"
SINGULAR = "resilientjob"
SHORT_NAMES = ("rjob",)
CRD_NAME = f"{PLURAL}.{GROUP}"
# Job names become pod names (`<job>-<node>`), a Service name (must start with a letter) and
# Secret names (`<job>-agent-tls`): this bound leaves room for every suffix.
MAX_JOB_NAME = 40

# -- labels and annotations ------------------------------------------------------------------
LABEL_NAME = "app.kubernetes.io/name"  # "planaria"
LABEL_COMPONENT = "app.kubernetes.io/component"  # "worker" (pods), "operator"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"  # MANAGER
LABEL_JOB = f"{GROUP}/job"  # the ResilientJob's name, on every object the operator creates
LABEL_NODE = f"{GROUP}/node"  # a worker pod's node index (0..nodes-1)
APP_NAME = "planaria"
COMPONENT_WORKER = "worker"
MANAGER = "planaria-operator"
# Workers of a pod, comma-separated ids ("4,5"): the pod's containers serve them in order.
ANNOTATION_WORKERS = f"{GROUP}/workers"
# Set on a worker pod (by a node-termination handler, or a person) when its node will be taken
# away soon: the controller moves the pod's workers away at a planned step instead of losing them.
ANNOTATION_PREEMPTION = f"{GROUP}/preemption-notice"
# kopf's own bookkeeping (handler progress, last handled state) is kept under this prefix.
KOPF_PREFIX = f"kopf.{GROUP}"
FINALIZER = f"{GROUP}/cleanup"

# -- env variables -----------------------------------------------------------------------------
ENV_POD_IP = "POD_IP"
ENV_POD_NAME = "POD_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_AGENT_IMAGE = "PLANARIA_AGENT_IMAGE"
ENV_LOG_LEVEL = "PLANARIA_LOG_LEVEL"  # the operator's log level (the chart's logLevel)

# -- ports -------------------------------------------------------------------------------------
AGENT_PORT = 50051  # a pod's container k (its k-th worker) serves on AGENT_PORT + k
STORE_PORT = 29500  # the operator hosts each running job's rendezvous store from here up
HEALTH_PORT = 8080  # the operator's liveness endpoint (/healthz)
METRICS_PORT = 9090  # the operator's Prometheus metrics

# -- paths inside worker pods ------------------------------------------------------------------
SNAPSHOT_MOUNT = "/snapshots"  # emptyDir, medium Memory: REFT host-memory snapshots
TLS_MOUNT = "/etc/planaria/tls"  # the job's agent TLS Secret (ca.crt, tls.crt, tls.key)
TMP_MOUNT = "/tmp"  # emptyDir: the only writable path with readOnlyRootFilesystem


def pod_name(job: str, node: int) -> str:
    """The worker pod of node `node` of `job`."""
    return f"{job}-{node}"


def service_name(job: str) -> str:
    """The job's headless Service (pods get DNS names `<pod>.<service>`)."""
    return job


def agent_secret_name(job: str) -> str:
    """The Secret mounted into the job's worker pods: CA certificate, agent cert and key."""
    return f"{job}-agent-tls"


def controller_secret_name(job: str) -> str:
    """The Secret only the operator reads: the job's CA key and the controller's client cert."""
    return f"{job}-controller-tls"


def state_configmap_name(job: str) -> str:
    """The ConfigMap where the operator keeps the job's measured profile and running plan, so
    that an operator restarted mid-job adopts the running agents instead of starting over."""
    return f"{job}-state"


def job_labels(job: str) -> dict[str, str]:
    """Labels of every object the operator creates for `job`."""
    return {
        LABEL_NAME: APP_NAME,
        LABEL_MANAGED_BY: MANAGER,
        LABEL_JOB: job,
    }


# -- RBAC --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One RBAC rule: the verbs the operator uses on one resource of one API group."""

    api_group: str
    resource: str
    verbs: tuple[str, ...]


# Exactly the API calls the operator makes, per watched namespace (a Role per namespace: no
# cluster-wide access at all, and no secrets beyond the job Secrets it creates and reads back).
# tests/chart checks the chart grants these and nothing else; the operator's tests check every
# request it sends to the API emulator is covered.
RBAC_RULES: tuple[Rule, ...] = (
    Rule(api_group=GROUP, resource=PLURAL, verbs=("list", "watch", "patch")),
    Rule(api_group=GROUP, resource=f"{PLURAL}/status", verbs=("patch",)),
    Rule(api_group="", resource="pods", verbs=("get", "list", "watch", "create", "delete")),
    Rule(api_group="", resource="services", verbs=("create",)),
    Rule(api_group="", resource="secrets", verbs=("get", "create")),
    Rule(api_group="", resource="configmaps", verbs=("get", "create", "patch")),
    Rule(api_group="", resource="events", verbs=("create",)),
    Rule(api_group="kopf.dev", resource="kopfpeerings", verbs=("list", "watch", "patch")),
)
