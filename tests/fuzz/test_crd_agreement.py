"""The CRD's schema and the pydantic model admit the same specs (issue #10, bad input,
campaign 2; tests/fuzz/crd_agreement.py).

Covers: mutants of valid bare specs (wrong types and widths, strict numbers, bad enums,
cross-field breaks, durations, failures, pod sections) are admitted by the CRD (structural
schema with defaults + every CEL rule, as the API server evaluates them) exactly when
`JobSpec.model_validate` + `consistency.check` admit them, snake_case names compared in camelCase;
hand-picked edge strings (duration spellings, worker ids, label keys, quantities, tolerations)
and numbers (int64 edges, denormals) agree too, label keys included (a CEL rule on
nodeSelector, since a structural schema cannot pattern map keys).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.kube import constants, crd
from planaria.spec import job
from tests import strategies
from tests.fuzz import crd_agreement, verdicts

BASE: dict[str, Any] = {"workers": 2, "steps": 10, "faultTolerance": 0}
_BARE_SPECS = strategies.job_spec_mutants().filter(
    lambda spec: isinstance(spec, dict) and not {"apiVersion", "kind"} & set(spec)
)


@settings(max_examples=80, deadline=None)
@given(_BARE_SPECS)
def test_schema_and_model_admit_the_same_mutants(spec: dict[str, Any]) -> None:
    verdict = crd_agreement.judge(spec)
    assert verdict.outcome is not verdicts.Outcome.CRASHED, verdict.detail


_EDGES: list[Any] = [
    *({"failures": [{"time": t}]} for t in ["5 s", ".5m", "00", "1e3", "5S", "+5s", "", -5, 0]),
    *({"failures": [{"step": 3, "worker": w}]} for w in ["Random", "random", "0", -1, 1, 2]),
    *(
        {"pod": {"nodeSelector": {k: "v"}}}
        for k in ["a/b", "A", "planaria.dev/x", "a_b", "-a", "a/", "a b", ""]
    ),
    *({"pod": {"cpu": q}} for q in ["1", "1.5Gi", "1Ki", "1e3", "1 ", "", "e"]),
    *(
        {"pod": {"tolerations": [t]}}
        for t in [{"operator": "exists"}, {"tolerationSeconds": -1}, {"tolerationSeconds": 5}]
    ),
    *({"data": {"corpusPaths": p}} for p in [[], [""], ["a"], None]),
    *({"mtbfSeconds": v} for v in [0, -0.0, 5e-324, 1e308, None]),
    *({"seed": s} for s in [2**63 - 1, -1]),
    {"checkpoints": {"dir": "/c", "intervalSteps": 2}, "snapshots": {"intervalSteps": 0}},
    {"checkpoints": {"dir": "", "intervalSteps": 3}, "snapshots": {"intervalSteps": 2}},
]


@pytest.mark.parametrize("change", _EDGES, ids=lambda change: repr(change)[:60])
def test_schema_and_model_agree_on_edge_values(change: dict[str, Any]) -> None:
    verdict = crd_agreement.judge({**BASE, **change})
    assert verdict.outcome is not verdicts.Outcome.CRASHED, verdict.detail
    assert not verdict.detail.startswith("not comparable"), verdict.detail


@given(st.from_regex(r"[-a-z0-9A_.]{0,70}", fullmatch=True))
def test_a_job_name_the_api_server_accepts_is_one_planaria_run_accepts(name: str) -> None:
    # Within the CRD's length limit (pods are named after the job) the two rules agree: a job
    # file `planaria run` takes, `kubectl apply` takes too, and the reverse.
    crd_rule = re.fullmatch(crd.JOB_NAME_PATTERN.strip("^$"), name) is not None
    if len(name) <= constants.MAX_JOB_NAME:
        assert (job.NAME_PATTERN.match(name) is not None) == crd_rule, name
