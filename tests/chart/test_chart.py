"""The Helm chart charts/planaria, rendered and linted offline with helm-python-sdk.

Covers: `helm lint --strict` finds nothing above info, for default and custom values; the
default rendering (standalone operator watching its release namespace, no cluster-scoped
object); replicaCount 2 (kopf peering flag and a KopfPeering per watched namespace); two watched
namespaces (a Role and RoleBinding in each, bound to the release namespace's ServiceAccount);
custom operator and agent images; every rendered object survives a round trip through the
kubernetes client's model of its kind (required fields present, no unknown field); the values
schema refuses bad values; the granted RBAC rules are exactly constants.RBAC_RULES, without
wildcards; the security contexts; ports, env names and the /tmp mount match planaria.kube.
constants; the operator's flags parse with `planaria operator` when that command exists; every
value in values.yaml carries a `# --` comment, and docs/kubernetes.md lists every value, RBAC
rule and printer column; NOTES.txt renders with a sample job that the CRD
admits; the chart's CRDs are crd.crd() and the KopfPeering CRD kopf looks for.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import helm_python
import kubernetes.client
import pytest
import yaml
from kopf._cogs.structs import references

from planaria.cli import main as cli_main
from planaria.kube import constants, crd
from tests.chart import crd_validation

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "planaria"
RELEASE_NAMESPACE = "planaria-system"
UID = 10001


@pytest.fixture(scope="module")
def chart() -> Any:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


def _render(chart: Any, values: dict[str, Any] | None = None) -> dict[str, str]:
    rendered: dict[str, str] = chart.render(
        values, name="planaria", namespace=RELEASE_NAMESPACE, is_install=True
    )
    return rendered


def _objects(chart: Any, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [
        document
        for path, text in sorted(_render(chart, values).items())
        if not path.endswith("NOTES.txt")
        for document in yaml.safe_load_all(text)
        if document
    ]


def _of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = _of_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def _flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == flag]


CUSTOM = {
    "replicaCount": 2,
    "watchNamespaces": ["team-a", "team-b"],
    "image": {"repository": "registry.example/planaria", "tag": "dev", "pullPolicy": "Always"},
    "agentImage": "registry.example/planaria-agent:dev-cuda",
}


@pytest.mark.parametrize("values", [None, CUSTOM], ids=["default values", "custom values"])
def test_strict_lint_finds_nothing_above_info(values: dict[str, Any] | None) -> None:
    report = helm_python.lint(CHART, values, strict=True, namespace=RELEASE_NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_default_rendering_is_a_standalone_operator_of_its_own_namespace(chart: Any) -> None:
    objects = _objects(chart)
    assert sorted(o["kind"] for o in objects) == [
        "Deployment",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    assert {o["metadata"]["namespace"] for o in objects} == {RELEASE_NAMESPACE}
    args = _container(objects)["args"]
    assert args[0] == "operator" and "--standalone" in args and "--peering" not in args
    assert _flag_values(args, "--namespace") == [RELEASE_NAMESPACE]
    image = "ghcr.io/planaria-dev/planaria:" + chart.metadata["appVersion"]
    assert _container(objects)["image"] == image
    assert _flag_values(args, "--agent-image") == [image]


def test_two_replicas_use_kopf_peering_in_every_watched_namespace(chart: Any) -> None:
    objects = _objects(chart, CUSTOM)
    args = _container(objects)["args"]
    assert _flag_values(args, "--peering") == ["planaria"] and "--standalone" not in args
    peerings = _of_kind(objects, "KopfPeering")
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings] == [
        ("team-a", "planaria"),
        ("team-b", "planaria"),
    ]


def test_each_watched_namespace_gets_a_role_bound_to_the_operator(chart: Any) -> None:
    objects = _objects(chart, CUSTOM)
    assert _flag_values(_container(objects)["args"], "--namespace") == ["team-a", "team-b"]
    roles, bindings = _of_kind(objects, "Role"), _of_kind(objects, "RoleBinding")
    assert [r["metadata"]["namespace"] for r in roles] == ["team-a", "team-b"]
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    (account,) = _of_kind(objects, "ServiceAccount")
    for binding in bindings:
        assert binding["roleRef"]["name"] == roles[0]["metadata"]["name"]
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": account["metadata"]["name"],
                "namespace": RELEASE_NAMESPACE,
            }
        ]


def test_custom_images_reach_the_operator_and_its_agent_flag(chart: Any) -> None:
    container = _container(_objects(chart, CUSTOM))
    assert container["image"] == "registry.example/planaria:dev"
    assert container["imagePullPolicy"] == "Always"
    assert _flag_values(container["args"], "--agent-image") == [CUSTOM["agentImage"]]


MODELS = {
    "ServiceAccount": "V1ServiceAccount",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
    "Deployment": "V1Deployment",
}


def _without_nones(value: Any) -> Any:
    """`value` without the None fields a model's to_dict lists for every field it left unset."""
    if isinstance(value, dict):
        return {k: _without_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nones(v) for v in value]
    return value


@pytest.mark.parametrize("values", [None, CUSTOM], ids=["default values", "custom values"])
def test_every_object_round_trips_through_its_kubernetes_model(
    chart: Any, values: dict[str, Any] | None
) -> None:
    client = kubernetes.client.ApiClient()
    for document in _objects(chart, values):
        if document["kind"] == "KopfPeering":  # no client model; its CRD is checked below
            assert document["apiVersion"] == "kopf.dev/v1"
            continue
        model = client.deserialize(
            json.dumps(document), MODELS[document["kind"]], "application/json"
        )
        # A dropped field was unknown to the model: a typo the API server would refuse too.
        assert _without_nones(model.to_dict(serialize=True)) == document


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCount": "two"},
        {"replicaCount": 0},
        {"replicas": 2},
        {"logLevel": "loud"},
        {"watchNamespaces": ["Team_A"]},
        {"image": {"pullPolicy": "Sometimes"}},
        {"storePort": 80},
    ],
    ids=lambda values: f"refuses {values}",
)
def test_the_values_schema_refuses_a_bad_value(chart: Any, values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(chart.merge_values(values))


def _granted(role: dict[str, Any]) -> set[tuple[str, str, tuple[str, ...]]]:
    return {
        (group, resource, tuple(rule["verbs"]))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_rbac_grants_exactly_the_rules_the_operator_needs(chart: Any) -> None:
    objects = _objects(chart, CUSTOM)
    needed = {(r.api_group, r.resource, r.verbs) for r in constants.RBAC_RULES}
    for role in _of_kind(objects, "Role"):
        assert _granted(role) == needed
        assert len(role["rules"]) == len(constants.RBAC_RULES)
        assert "*" not in yaml.safe_dump(role["rules"])
    assert not [o for o in objects if o["kind"].startswith("Cluster")]


def test_the_operator_runs_non_root_read_only_without_privileges(chart: Any) -> None:
    (deployment,) = _of_kind(_objects(chart), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == UID
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = _container(_objects(chart))["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == UID
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}]


def test_ports_env_and_mounts_are_the_constants(chart: Any) -> None:
    container = _container(_objects(chart))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "store": constants.STORE_PORT,
        "health": constants.HEALTH_PORT,
        "metrics": constants.METRICS_PORT,
    }
    args = container["args"]
    assert _flag_values(args, "--store-port") == [str(constants.STORE_PORT)]
    assert _flag_values(args, "--health-port") == [str(constants.HEALTH_PORT)]
    assert _flag_values(args, "--metrics-port") == [str(constants.METRICS_PORT)]
    env = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for e in container["env"]
    }
    assert env[constants.ENV_POD_IP] == "status.podIP"
    assert env[constants.ENV_POD_NAME] == "metadata.name"
    assert env[constants.ENV_POD_NAMESPACE] == "metadata.namespace"
    (level,) = [e for e in container["env"] if e["name"] == constants.ENV_LOG_LEVEL]
    assert level["value"] == "info"
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": constants.TMP_MOUNT}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_the_operator_flags_parse_with_planaria_operator(chart: Any) -> None:
    parser = cli_main.build_parser()
    for values in (None, CUSTOM):
        args = parser.parse_args(_container(_objects(chart, values))["args"])
        assert args.command == "operator"


def _value_comments(text: str) -> tuple[list[str], list[str]]:
    """(keys of values.yaml with their own `# --` comment, leaf keys documented neither by
    their own comment nor by a parent's), as dotted paths."""
    commented: list[str] = []
    undocumented: list[str] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented) of the enclosing keys
    comment = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment = comment or stripped
            continue
        match = re.match(r"^( *)([A-Za-z][A-Za-z0-9_]*):(.*)$", line)
        if match is None:  # a blank line ends a comment block; list items keep it
            comment = comment if stripped else ""
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        own = comment.startswith("# --")
        stack.append((indent, match.group(2), own or any(d for _, _, d in stack)))
        path = ".".join(key for _, key, _ in stack)
        if own:
            commented.append(path)
        elif match.group(3).strip() and not stack[-1][2]:
            undocumented.append(path)
        comment = ""
    return commented, undocumented


def test_every_value_is_documented_by_a_helm_docs_comment(chart: Any) -> None:
    text = (CHART / "values.yaml").read_text()
    assert _value_comments(text)[1] == []
    assert _value_comments("a:\n  # -- b\n  b: 1\n  c: 2\n") == (["a.b"], ["a.c"])
    assert set(chart.values) == set(yaml.safe_load(text))


def test_docs_kubernetes_lists_every_value_rbac_rule_and_printer_column() -> None:
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    commented, _ = _value_comments((CHART / "values.yaml").read_text())
    assert [path for path in commented if f"| `{path}` |" not in docs] == []
    for rule in constants.RBAC_RULES:
        group = f"`{rule.api_group}`" if rule.api_group else "core"
        assert f"| {group} | `{rule.resource}` | {', '.join(rule.verbs)} |" in docs
    (version,) = crd.crd()["spec"]["versions"]
    for column in version["additionalPrinterColumns"]:
        assert f"| {column['name']} | `{column['jsonPath']}` |" in docs


def test_notes_render_a_sample_job_the_crd_admits_and_how_to_watch_it(chart: Any) -> None:
    notes = _render(chart, CUSTOM)["planaria/templates/NOTES.txt"]
    assert "kubectl get rjob -n team-a -w" in notes
    assert "kubectl describe rjob tiny-job -n team-a" in notes
    sample = notes.split("<<'YAML'\n", 1)[1].split("  YAML\n", 1)[0]
    document = yaml.safe_load(sample)
    assert crd_validation.document_problems(crd.crd(), document) == []


def test_the_chart_crds_are_resilientjob_and_kopfs_peering(chart: Any) -> None:
    loaded = {c["name"]: yaml.safe_load(c["data"]) for c in chart.crds}
    assert loaded["crds/resilientjobs.yaml"] == crd.crd()
    assert yaml.safe_load((ROOT / "manifests" / "crd.yaml").read_text()) == crd.crd()
    peering = loaded["crds/kopfpeerings.yaml"]["spec"]
    selector = references.NAMESPACED_PEERINGS_K
    assert (peering["group"], peering["names"]["plural"], peering["scope"]) == (
        selector.group,
        selector.any_name,
        "Namespaced",
    )
    assert [v["name"] for v in peering["versions"]] == [selector.version]
