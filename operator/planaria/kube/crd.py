"""The ResilientJob CustomResourceDefinition, generated from the pydantic models (STYLE rule 6).

`spec_schema()` turns `planaria.spec.job.JobSpec` into a structural OpenAPI v3 schema
(`planaria.kube.openapi`) and adds the cross-field rules of
`planaria.spec.consistency.check` as CEL `x-kubernetes-validations`, plus transition rules that make
every field but `pod` and `failures` immutable. `StatusModel` is the status the operator writes;
`status_schema()` is its schema. `crd()` assembles the whole object; charts/planaria/crds and
manifests/crd.yaml are renderings of it (scripts/render_manifests.py, checked by tests/chart).

What does not live here: the translation from pydantic's JSON Schema (`planaria.kube.openapi`),
evaluating the CEL rules (the API server does; tests/chart evaluates them with cel-python), the
kopf handlers and status computation (`planaria.kube`'s other modules), the pydantic spec.

Errors: `openapi.SchemaError` (a ValueError) from spec_schema() and status_schema() when a model
gains a field type with no structural form.
"""

from __future__ import annotations

import copy
from enum import StrEnum
from typing import Any

import pydantic
from pydantic import alias_generators

from planaria.contract import shapes
from planaria.kube import constants, openapi
from planaria.spec import durations, job

# Cost bound for the CEL rules iterating over `failures` (the API server estimates a rule's cost
# from the list's maxItems; an unbounded list is sized from the 3 MiB request limit).
MAX_FAILURES = 1000
# Kubernetes accepts any DNS subdomain as an object name; a job's name also names a Service
# (a DNS-1035 label: starts with a letter) and pods and Secrets with suffixes.
JOB_NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
# The duration text `planaria.spec.durations.parse` reads, from the same expression. A
# `pattern`, not a CEL rule: the API server bounds each rule's estimated cost, and a regular
# expression over an unbounded string in each list item exceeds it.
DURATION_RE2 = durations.CRD_PATTERN
IMMUTABLE_EXCEPT = ("pod", "failures")


# -- CEL rules -------------------------------------------------------------------------------
def _rule(rule: str, message: str, field_path: str = "") -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


# The cross-field rules of `planaria.spec.consistency.check`, same wording; the API server has
# applied the schema's defaults before it evaluates them, so every defaulted field is present.
SPEC_RULES = (
    _rule(
        "self.globalBatchSize % self.microBatchSize == 0",
        "globalBatchSize is not a multiple of microBatchSize; make it one",
        ".globalBatchSize",
    ),
    _rule(
        "self.workers % self.gpusPerNode == 0",
        "workers is not a multiple of gpusPerNode; give whole nodes",
        ".workers",
    ),
    _rule(
        "self.workers % self.gpusPerNode != 0 || "
        "self.faultTolerance < self.workers / self.gpusPerNode",
        "faultTolerance leaves no node to train on; give at most nodes - 1 "
        "(nodes = workers / gpusPerNode)",
        ".faultTolerance",
    ),
    _rule(
        "self.timeouts.heartbeatSeconds > self.timeouts.heartbeatIntervalSeconds",
        "timeouts.heartbeatSeconds is not above timeouts.heartbeatIntervalSeconds; make it longer",
        ".timeouts.heartbeatSeconds",
    ),
    _rule(
        "self.checkpoints.dir == '' || self.checkpoints.intervalSteps == 0 || "
        "(self.snapshots.intervalSteps != 0 && "
        "self.checkpoints.intervalSteps % self.snapshots.intervalSteps == 0)",
        "checkpoints.intervalSteps is not a multiple of snapshots.intervalSteps; checkpoints "
        "are copied from snapshots, so make it a multiple (and snapshots periodic)",
        ".checkpoints.intervalSteps",
    ),
    _rule(
        "self.failures.all(f, type(f.worker) != int || f.worker < self.workers)",
        "a failure names a worker that does not exist (workers 0..workers-1); "
        "give one of them or 'random'",
        ".failures",
    ),
    _rule(
        "self.failures.all(f, !has(f.step) || f.step < self.steps)",
        "a failure's step is not before the last step; give a step the job will reach",
        ".failures",
    ),
)

# The per-failure rule pydantic states as a validator on `FailureSpec`; its other validators
# (worker id or "random", time a duration) are `minimum` and `pattern` on the int-or-string
# fields, which apply to the integer and the string alternative respectively.
FAILURE_RULES = (_rule("has(self.step) != has(self.time)", "give exactly one of step or time"),)
FAILURE_VALUE_RULES = {
    "worker": {"minimum": 0, "pattern": "^random$"},
    "time": {"minimum": 0, "pattern": DURATION_RE2},
}


def immutability_rules(properties: dict[str, Any]) -> list[dict[str, str]]:
    """Transition rules keeping every spec field but `IMMUTABLE_EXCEPT` as created: a running
    job's shape, batch and data cannot change under it."""
    rules = []
    for name, node in properties.items():
        if name in IMMUTABLE_EXCEPT:
            continue
        message = f"{name} is immutable: delete and re-create the job"
        if "default" in node:
            rules.append(_rule(f"self.{name} == oldSelf.{name}", message))
        else:  # optional without default: present in both and equal, or absent in both
            rules.append(
                _rule(
                    f"has(self.{name}) == has(oldSelf.{name}) && "
                    f"(!has(self.{name}) || self.{name} == oldSelf.{name})",
                    message,
                )
            )
    return rules


def spec_schema() -> dict[str, Any]:
    """The structural schema of a ResilientJob's `spec`, with its CEL rules."""
    schema = openapi.structural(job.JobSpec)
    properties = schema["properties"]
    # `check` refuses unknown model names; the schema names the known ones.
    properties["model"]["enum"] = list(shapes.NAMED_SHAPES)
    failures = properties["failures"]
    failures["maxItems"] = MAX_FAILURES
    failures["items"]["x-kubernetes-validations"] = list(FAILURE_RULES)
    for name, rules in FAILURE_VALUE_RULES.items():
        failures["items"]["properties"][name].update(rules)
    # A structural schema cannot pattern map keys: CEL checks nodeSelector's label keys.
    selector = properties["pod"]["properties"]["nodeSelector"]
    selector["x-kubernetes-validations"] = [
        _rule(
            f"self.all(k, k.matches('{job.LABEL_KEY_PATTERN}'))",
            "a nodeSelector key is not a label key (prefix/name of letters, digits, '-', '_', "
            "'.'); fix the key",
        )
    ]
    schema["x-kubernetes-validations"] = [*SPEC_RULES, *immutability_rules(properties)]
    return schema


# -- the status ------------------------------------------------------------------------------
class Phase(StrEnum):
    """The job's summary state (the conditions carry the detail)."""

    PENDING = "Pending"
    PROFILING = "Profiling"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    INVALID = "Invalid"


class _StatusPart(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=alias_generators.to_camel,
        populate_by_name=True,
    )


def _f(default: Any, description: str, **rules: Any) -> Any:
    return pydantic.Field(default=default, description=description, **rules)


class Condition(_StatusPart):
    """One condition, keyed by `type` (Kubernetes API conventions)."""

    type: str = pydantic.Field(description="Condition type in CamelCase, e.g. Ready, Degraded.")
    status: str = pydantic.Field(
        description="True, False or Unknown.", pattern="^(True|False|Unknown)$"
    )
    reason: str = _f("", "CamelCase reason of the last transition, e.g. WorkerLost.")
    message: str = _f("", "Human-readable detail of the last transition.")
    last_transition_time: pydantic.AwareDatetime | None = _f(
        None, "When status last changed (RFC 3339)."
    )
    observed_generation: int | None = _f(
        None, "metadata.generation the condition was computed for.", ge=0
    )


class RecoveryReport(_StatusPart):
    """The last recovery: what failed, what the controller chose, how long each phase took."""

    kind: str = _f("", "Recovery chosen: reroute, replan, rollback, ...")
    tier: str = _f("", "Where state came from: replica, snapshot, checkpoint, ...")
    reason: str = _f("", "Why this recovery won (the planner's readable reason).")
    failed_workers: list[int] = _f([], "Worker ids lost.")
    epoch: int = _f(0, "Epoch that the recovery started.", ge=0)
    seconds: float = _f(0.0, "Wall time from detection to training again.", ge=0)
    detect_seconds: float = _f(0.0, "Failure to detection.", ge=0)
    stop_seconds: float = _f(0.0, "The surviving workers stopping their failed step.", ge=0)
    plan_seconds: float = _f(0.0, "Choosing the recovery and the new plan.", ge=0)
    regroup_seconds: float = _f(0.0, "Building the new process groups.", ge=0)
    transfer_seconds: float = _f(0.0, "Moving parameters and optimizer state.", ge=0)
    resume_seconds: float = _f(0.0, "First step of the new epoch.", ge=0)
    lost_steps: int = _f(0, "Committed steps redone (rollback to a snapshot or checkpoint).", ge=0)
    transferred_bytes: int = _f(0, "Bytes of state moved between workers.", ge=0)


class StatusModel(_StatusPart):
    """The status the operator writes (one patch per reconcile pass, STYLE rule 5); dump it
    with `model_dump(mode="json", by_alias=True, exclude_none=True)`."""

    phase: Phase = _f(Phase.PENDING, "Summary state: Pending, Profiling, Running, ...")
    observed_generation: int = _f(0, "metadata.generation this status reflects.", ge=0)
    conditions: list[Condition] = _f([], "Conditions, one per type.")
    epoch: int = _f(0, "Current epoch (a new one after each plan change).", ge=0)
    step: int = _f(0, "Last committed step.", ge=0)
    total_steps: int = _f(0, "spec.steps.", ge=0)
    loss: float | None = _f(None, "Training loss of the last committed step.")
    samples_per_second: float = _f(
        0.0,
        "Throughput over the last steps, rounded to one decimal (the exact value is the "
        "planaria_samples_per_second metric).",
        ge=0,
    )
    live_workers: int = _f(0, "Workers alive now.", ge=0)
    workers: int = _f(0, "Workers at full strength (spec.workers).", ge=0)
    workers_ready: str = _f("", 'Live over full strength, e.g. "7/8" (printer column).')
    plan: str = _f("", 'The running plan, e.g. "[4,4] dynamic" (printer column).')
    recoveries: int = _f(0, "Recoveries so far.", ge=0)
    last_recovery: RecoveryReport | None = _f(None, "The last recovery, when there was one.")
    checkpoint_step: int | None = _f(None, "Step of the last complete checkpoint.", ge=0)
    snapshot_interval_steps: float | None = _f(
        None,
        "Achieved steps between host-memory snapshots in the running epoch (above "
        "spec.snapshots.intervalSteps when the writers could not keep up; null while unknown).",
        ge=0,
    )
    message: str = _f("", "Human-readable summary of the current state.")
    start_time: pydantic.AwareDatetime | None = _f(None, "When training started (RFC 3339).")
    completion_time: pydantic.AwareDatetime | None = _f(
        None, "When the job Succeeded or Failed (RFC 3339)."
    )


def status_schema() -> dict[str, Any]:
    """The structural schema of a ResilientJob's `status`."""
    schema = openapi.structural(StatusModel)
    conditions = schema["properties"]["conditions"]
    # One entry per type, merged by key under server-side apply.
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return schema


# -- the CRD ---------------------------------------------------------------------------------
def _column(name: str, path: str, kind: str, description: str) -> dict[str, str]:
    return {"name": name, "type": kind, "jsonPath": path, "description": description}


PRINTER_COLUMNS = (
    _column("Phase", ".status.phase", "string", "Summary state."),
    _column("Workers", ".status.workersReady", "string", "Live workers over full strength."),
    _column("Plan", ".status.plan", "string", "The running plan."),
    _column("Step", ".status.step", "integer", "Last committed step."),
    _column("Samples/s", ".status.samplesPerSecond", "number", "Recent throughput, one decimal."),
    _column("Recoveries", ".status.recoveries", "integer", "Recoveries so far."),
    _column("Age", ".metadata.creationTimestamp", "date", "Time since creation."),
)


def _root_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "A training job that survives the loss of workers (docs/kubernetes.md).",
        "properties": {
            "apiVersion": {"type": "string", "description": "planaria.dev/v1alpha1"},
            "kind": {"type": "string", "description": "ResilientJob"},
            # Only name and generateName may carry restrictions; the rule below checks name.
            "metadata": {"type": "object"},
            "spec": {**spec_schema(), "default": {}},
            "status": status_schema(),
        },
        "x-kubernetes-validations": [
            _rule(
                f"self.metadata.name.matches('{JOB_NAME_PATTERN}') && "
                f"size(self.metadata.name) <= {constants.MAX_JOB_NAME}",
                "metadata.name must start with a letter, hold only lowercase letters, digits "
                f"and '-', and be at most {constants.MAX_JOB_NAME} characters (pods, a Service "
                "and Secrets are named after it)",
            )
        ],
    }


def crd() -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of ResilientJob."""
    version = {
        "name": constants.VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": _root_schema()},
        "subresources": {"status": {}},
        "additionalPrinterColumns": [dict(column) for column in PRINTER_COLUMNS],
    }
    return copy.deepcopy(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {
                "name": constants.CRD_NAME,
                "labels": {constants.LABEL_NAME: constants.APP_NAME},
            },
            "spec": {
                "group": constants.GROUP,
                "scope": "Namespaced",
                "names": {
                    "kind": constants.KIND,
                    "listKind": f"{constants.KIND}List",
                    "plural": constants.PLURAL,
                    "singular": constants.SINGULAR,
                    "shortNames": list(constants.SHORT_NAMES),
                    "categories": ["all", constants.APP_NAME],
                },
                "versions": [version],
            },
        }
    )
