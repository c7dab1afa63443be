"""The ResilientJob CRD generated from the pydantic models (planaria.kube.crd).

Covers: the schema is structural (every node typed or int-or-string, no $ref/anyOf/
patternProperties, no properties beside additionalProperties, no null defaults); every field of
JobSpec and StatusModel appears with its description; the schema's defaults, applied to an empty
spec, give exactly the model's defaults; every CEL rule compiles with cel-python and writes
regular expressions only in raw strings (cel-go refuses `\\d` in a plain string); the example
jobs (examples/, manifests/examples/) pass the schema and every rule; every integer bound is
within 2**53 - 1 (a real API server refuses 2**63 - 1); each cross-field rule of
`consistency.check` and each failure rule rejects a crafted spec with its message, and `check`
or pydantic refuses the same spec; every field but pod and failures is immutable on update, and
pod and failures may change; a failure's `time` passes the schema exactly when the model reads it
(tests/spec/duration_cases.py); the job name rule; a full status validates against the status
schema, conditions are a map keyed by type, and every printer column names a status field.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from planaria.contract import shapes
from planaria.control import status as statuses
from planaria.kube import constants, crd
from planaria.spec import consistency, job
from tests.chart import crd_validation
from tests.spec import duration_cases

ROOT = Path(__file__).resolve().parents[2]
CRD = crd.crd()
SPEC = crd_validation.spec_schema(CRD)
STRUCTURAL_KEYS = {
    "type",
    "description",
    "enum",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
    "default",
    "nullable",
    "properties",
    "items",
    "additionalProperties",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",  # a free-form map: modelSource.config
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
}


def _nodes(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path or "<root>", schema)]
    for name, child in schema.get("properties", {}).items():
        found += _nodes(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += _nodes(schema[key], f"{path}[{key}]")
    return found


ALL_NODES = _nodes(crd_validation.root_schema(CRD))


@pytest.mark.parametrize(("path", "node"), ALL_NODES, ids=[path for path, _ in ALL_NODES])
def test_every_schema_node_is_structural(path: str, node: dict[str, Any]) -> None:
    assert set(node) <= STRUCTURAL_KEYS, f"{path}: {set(node) - STRUCTURAL_KEYS}"
    assert ("type" in node) != bool(node.get("x-kubernetes-int-or-string"))
    assert not ("properties" in node and "additionalProperties" in node)
    assert "default" not in node or node["default"] is not None
    if isinstance(node.get("exclusiveMinimum"), bool):
        assert "minimum" in node
    # A real kube-apiserver compares bounds as float64 and refuses 2**63 - 1 as a maximum.
    for bound in ("minimum", "maximum"):
        assert abs(node.get(bound, 0)) <= 2**53 - 1, f"{path}: {bound} {node[bound]}"


def _rules() -> list[str]:
    return [
        rule["rule"] for _, node in ALL_NODES for rule in node.get("x-kubernetes-validations", [])
    ]


@pytest.mark.parametrize("rule", _rules())
def test_every_cel_rule_compiles_and_escapes_only_in_raw_strings(rule: str) -> None:
    crd_validation.program(rule)
    plain_strings = re.findall(r"(?<![rR])'([^']*)'", rule)
    assert not any("\\" in text for text in plain_strings)


def _model_fields(
    model: type[pydantic.BaseModel], node: dict[str, Any], path: str
) -> list[tuple[str, str, dict[str, Any]]]:
    """(path, pydantic description, schema node) of every field of `model`, nested too."""
    found = []
    for name, field in model.model_fields.items():
        alias = field.alias or name
        child = node["properties"][alias]
        found.append((f"{path}.{alias}", field.description or "", child))
        for inner in _nested_models(field.annotation):
            found += _model_fields(inner, child.get("items", child), f"{path}.{alias}")
    return found


def _nested_models(annotation: Any) -> list[type[pydantic.BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        return [m for arg in typing.get_args(annotation) for m in _nested_models(arg)]
    return []


FIELDS = _model_fields(job.JobSpec, SPEC, "spec") + _model_fields(
    crd.StatusModel, crd_validation.root_schema(CRD)["properties"]["status"], "status"
)


@pytest.mark.parametrize(("path", "description", "node"), FIELDS, ids=[f[0] for f in FIELDS])
def test_every_model_field_is_in_the_schema_with_its_description(
    path: str, description: str, node: dict[str, Any]
) -> None:
    assert description and node["description"] == description


def test_the_schema_defaults_are_the_model_defaults() -> None:
    defaulted = crd_validation.apply_defaults(SPEC, {})
    assert defaulted == job.JobSpec().model_dump(mode="json", by_alias=True, exclude_none=True)
    assert crd_validation.problems(CRD, {}) == []


def test_the_model_field_lists_the_named_shapes() -> None:
    assert SPEC["properties"]["model"]["enum"] == list(shapes.NAMED_SHAPES)
    assert crd_validation.problems(CRD, {"model": "gpt5"})[0].startswith("spec.model:")


def _example_documents() -> list[Path]:
    paths = sorted((ROOT / "examples").glob("*.yaml")) + sorted(
        (ROOT / "manifests" / "examples").glob("*.yaml")
    )
    return [
        path for path in paths if yaml.safe_load(path.read_text()).get("kind") == "ResilientJob"
    ]


@pytest.mark.parametrize("path", _example_documents(), ids=lambda p: p.name)
def test_an_example_job_passes_the_schema_and_every_rule(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    assert crd_validation.document_problems(CRD, document) == []
    assert consistency.check(job.ResilientJob.model_validate(document).spec) == []


# (spec, the one problem the CRD reports (CEL rules: the whole line; schema keywords: its start,
# the rest is jsonschema's wording), what pydantic or check says: a field path of check, or
# "pydantic" when the model itself refuses the spec)
REFUSED = {
    "a global batch that is no multiple of the micro-batch": (
        {"globalBatchSize": 30},
        "spec.globalBatchSize: globalBatchSize is not a multiple of microBatchSize; make it one",
        "globalBatchSize",
    ),
    "workers that are no whole number of nodes": (
        {"workers": 6, "gpusPerNode": 4},
        "spec.workers: workers is not a multiple of gpusPerNode; give whole nodes",
        "workers",
    ),
    "a fault tolerance of every node": (
        {"workers": 8, "gpusPerNode": 4, "faultTolerance": 2},
        "spec.faultTolerance: faultTolerance leaves no node to train on; give at most nodes - 1 "
        "(nodes = workers / gpusPerNode)",
        "faultTolerance",
    ),
    "a heartbeat timeout below the interval": (
        {"timeouts": {"heartbeatSeconds": 1, "heartbeatIntervalSeconds": 2}},
        "spec.timeouts.heartbeatSeconds: timeouts.heartbeatSeconds is not above "
        "timeouts.heartbeatIntervalSeconds; make it longer",
        "timeouts.heartbeatSeconds",
    ),
    "checkpoints off the snapshot boundaries": (
        {"checkpoints": {"dir": "/ckpt", "intervalSteps": 3}, "snapshots": {"intervalSteps": 2}},
        "spec.checkpoints.intervalSteps: checkpoints.intervalSteps is not a multiple of "
        "snapshots.intervalSteps; checkpoints are copied from snapshots, so make it a multiple "
        "(and snapshots periodic)",
        "checkpoints.intervalSteps",
    ),
    "checkpoints without periodic snapshots": (
        {"checkpoints": {"dir": "/ckpt", "intervalSteps": 3}, "snapshots": {"intervalSteps": 0}},
        "spec.checkpoints.intervalSteps: checkpoints.intervalSteps is not a multiple of "
        "snapshots.intervalSteps; checkpoints are copied from snapshots, so make it a multiple "
        "(and snapshots periodic)",
        "checkpoints.intervalSteps",
    ),
    "a failure of a worker that does not exist": (
        {"workers": 4, "failures": [{"step": 3, "worker": 4}]},
        "spec.failures: a failure names a worker that does not exist (workers 0..workers-1); "
        "give one of them or 'random'",
        "failures.0.worker",
    ),
    "a failure at or after the last step": (
        {"steps": 10, "failures": [{"step": 10}]},
        "spec.failures: a failure's step is not before the last step; give a step the job "
        "will reach",
        "failures.0.step",
    ),
    "a failure of a negative worker": (
        {"failures": [{"step": 3, "worker": -1}]},
        "spec.failures.0.worker: -1 is less than the minimum of 0",
        "pydantic",
    ),
    "a failure of a worker named neither by id nor random": (
        {"failures": [{"step": 3, "worker": "any"}]},
        "spec.failures.0.worker: 'any' does not match '^random$'",
        "pydantic",
    ),
    "a failure with both a step and a time": (
        {"failures": [{"step": 3, "time": 5}]},
        "spec.failures.0: give exactly one of step or time",
        "pydantic",
    ),
    "a failure with a time that is no duration": (
        {"failures": [{"time": "soon"}]},
        "spec.failures.0.time: 'soon' does not match",
        "pydantic",
    ),
    "a failure at a negative time after the start": (
        {"failures": [{"time": -5}]},
        "spec.failures.0.time: -5 is less than the minimum of 0",
        "pydantic",
    ),
    "a reduction that is neither fast nor exact": (
        {"reduction": "float64"},
        "spec.reduction: 'float64' is not one of ['fast', 'exact']",
        "pydantic",
    ),
    "a nodeSelector key that is no label key": (
        {"pod": {"nodeSelector": {"-gpu": "a100"}}},
        "spec.pod.nodeSelector: a nodeSelector key is not a label key (prefix/name of letters, "
        "digits, '-', '_', '.'); fix the key",
        "pydantic",
    ),
}


@pytest.mark.parametrize(("spec", "message", "check_path"), REFUSED.values(), ids=REFUSED.keys())
def test_a_cel_rule_refuses_a_spec_that_check_refuses(
    spec: dict[str, Any], message: str, check_path: str
) -> None:
    (problem,) = crd_validation.problems(CRD, spec)
    assert problem.startswith(message)
    if check_path == "pydantic":
        with pytest.raises(pydantic.ValidationError):
            job.JobSpec.model_validate(spec)
    else:
        assert check_path in [
            path for path, _ in consistency.check(job.JobSpec.model_validate(spec))
        ]


# Texts Python's re (the oracle's `pattern`) and RE2 read alike; tests/spec checks RE2 on all.
_DURATIONS = [c for c in duration_cases.CASES if c[0].isascii() and "\n" not in c[0]]


@pytest.mark.parametrize(
    ("text", "seconds"), [c[:2] for c in _DURATIONS], ids=[c[2] for c in _DURATIONS]
)
def test_a_failure_time_passes_the_schema_exactly_when_the_model_reads_it(
    text: str, seconds: float | None
) -> None:
    spec = {"failures": [{"time": text}]}
    assert (crd_validation.problems(CRD, spec) == []) == (seconds is not None)
    if seconds is None:
        with pytest.raises(pydantic.ValidationError):
            job.JobSpec.model_validate(spec)
    else:
        assert job.JobSpec.model_validate(spec).failures[0].time_s == pytest.approx(seconds)


def test_every_cel_rule_has_a_refused_spec() -> None:
    messages = {
        rule["message"]
        for _, node in _nodes(SPEC)
        for rule in node.get("x-kubernetes-validations", [])
        if "oldSelf" not in rule["rule"]
    }
    refused = {message.split(": ", 1)[1] for _, message, _ in REFUSED.values()}
    assert messages <= refused


# A valid change of every immutable field.
CHANGES: dict[str, Any] = {
    "model": "small",
    "modelSource": {"family": "llama", "config": {"hidden_size": 64, "rope_scaling": {"a": 1}}},
    "workers": 16,
    "gpusPerNode": 2,
    "steps": 200,
    "microBatchSize": 8,
    "globalBatchSize": 64,
    "seed": 1,
    "optimizer": {"lr": 0.01},
    "data": {"maxBytes": 1000},
    "device": "cuda",
    "reduction": "exact",
    "precision": "bf16",
    "snapshots": {"intervalSteps": 2},
    "checkpoints": {"dir": "/ckpt"},
    "faultTolerance": 2,
    "policy": "dynamic",
    "mtbfSeconds": 600,
    "deviceMemory": "40Gi",
    "timeouts": {"stepSeconds": 20},
}


def test_every_field_but_pod_and_failures_is_listed_as_immutable() -> None:
    assert set(CHANGES) == set(SPEC["properties"]) - set(crd.IMMUTABLE_EXCEPT)


@pytest.mark.parametrize(("field", "value"), CHANGES.items(), ids=CHANGES.keys())
def test_an_immutable_field_cannot_change(field: str, value: Any) -> None:
    changed = {field: value}
    assert crd_validation.problems(CRD, changed) == []
    assert crd_validation.problems(CRD, changed, old=changed) == []
    assert crd_validation.problems(CRD, changed, old={}) == [
        f"spec: {field} is immutable: delete and re-create the job"
    ]


def test_pod_and_failures_may_change_on_a_running_job() -> None:
    old = {"failures": [{"step": 5}], "pod": {"cpu": "1"}}
    new = {"failures": [], "pod": {"cpu": "2", "memory": "8Gi", "image": "planaria:dev"}}
    assert crd_validation.problems(CRD, new, old=old) == []


@pytest.mark.parametrize(
    ("name", "admitted"),
    [("tiny-job", True), ("9lives", False), ("a.b", False), ("x" * 40, True), ("x" * 41, False)],
)
def test_the_job_name_must_suit_pods_services_and_secrets(name: str, admitted: bool) -> None:
    document = {"apiVersion": constants.API_VERSION, "kind": constants.KIND}
    problems = crd_validation.document_problems(CRD, {**document, "metadata": {"name": name}})
    assert (problems == []) == admitted


def _status() -> crd.StatusModel:
    return crd.StatusModel.model_validate(
        {
            "phase": "Recovering",
            "observedGeneration": 2,
            "conditions": [
                {
                    "type": "Degraded",
                    "status": "True",
                    "reason": "WorkerLost",
                    "message": "worker 3 missed its heartbeats",
                    "lastTransitionTime": "2026-11-21T21:00:00Z",
                    "observedGeneration": 2,
                }
            ],
            "step": 51,
            "totalSteps": 150,
            "loss": 2.5,
            "workersReady": "7/8",
            "plan": "[4,3] dynamic",
            "lastRecovery": {"kind": "replan", "failedWorkers": [3], "seconds": 1.5},
            "checkpointStep": None,
            "startTime": "2026-11-21T20:59:00Z",
        }
    )


def test_a_full_status_passes_the_status_schema() -> None:
    status = _status().model_dump(mode="json", by_alias=True, exclude_none=True)
    schema = crd_validation.root_schema(CRD)["properties"]["status"]
    assert crd_validation.validate(schema, status, None, "status") == []
    assert crd_validation.validate(schema, {**status, "phase": "Dancing"}, None, "status")


def test_conditions_are_a_map_keyed_by_type() -> None:
    conditions = crd_validation.root_schema(CRD)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def test_printer_columns_name_status_fields_and_the_resource_names_the_constants() -> None:
    (version,) = CRD["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].split(".")
        assert path[1] == "metadata" or path[2] in status, column
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase",
        "Workers",
        "Plan",
        "Step",
        "Samples/s",
        "Recoveries",
        "Age",
    ]
    names = CRD["spec"]["names"]
    assert CRD["metadata"]["name"] == constants.CRD_NAME
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        constants.KIND,
        constants.PLURAL,
        ["rjob"],
    )
    assert version["subresources"] == {"status": {}} and CRD["spec"]["scope"] == "Namespaced"


def test_the_status_phases_are_the_controllers_and_invalid() -> None:
    # crd.Phase repeats the controller's phases (an enum cannot extend another) plus Invalid.
    assert {p.value for p in crd.Phase} == {p.value for p in statuses.Phase} | {"Invalid"}
