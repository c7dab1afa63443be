"""Campaign 2: the CRD's schema and the pydantic model accept exactly the same specs.

`judge` validates one spec mapping twice: as the API server would (`tests/chart/
crd_validation.problems` over `planaria.kube.crd.crd()`: defaults, the structural schema with
jsonschema, every CEL rule with cel-python) and as `planaria run` and the operator do
(`JobSpec.model_validate` + `consistency.check`). ACCEPTED: both admit it; REJECTED: both refuse it;
a disagreement is a crash, named with both sides' reasons.

Where the two legitimately differ, the difference is listed here and handled explicitly:

- `incomparable` names the inputs no API server can receive, so they are left out (counted as
  REJECTED with the reason): numbers JSON cannot carry (NaN, infinities) and integers outside
  int64 (the API server decodes JSON numbers into int64 or float64).
- strings with non-ASCII characters or a line break: the oracle applies the schema's
  `pattern`s with Python's re, where \\d and \\s match Unicode digits and spaces and `$`
  matches before a final newline; the API server's RE2 does neither. Left out as not comparable
  (the model reads durations in ASCII, as RE2 does).
- snake_case field names: the model accepts them on purpose (`populate_by_name`, for job files
  written by hand), a structural schema has no aliases. The schema is asked about the spec
  with its names in camelCase (`camel_spelled`); a name given in both spellings stays as it is
  (both refuse it).
"""

from __future__ import annotations

import math
from typing import Any

import pydantic
from pydantic import alias_generators

from planaria.kube import crd
from planaria.spec import consistency, job
from tests.chart import crd_validation
from tests.fuzz import verdicts

CRD = crd.crd()
INT64 = range(-(2**63), 2**63)


def incomparable(value: object) -> str | None:
    """Why no API server could receive `value`, or None when one could."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not JSON"
    if isinstance(value, int) and not isinstance(value, bool) and value not in INT64:
        return f"{value} is outside int64"
    if isinstance(value, str) and (not value.isascii() or "\n" in value):
        return f"{value!r}: Python's re and the API server's RE2 differ on it"
    items: list[Any] = []
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, list):
        items = value
    return next((why for why in map(incomparable, items) if why), None)


# Maps whose keys are data, not field names (a node selector's label keys).
_DATA_MAPS = frozenset({"nodeSelector", "node_selector"})


def camel_spelled(value: object) -> object:
    """`value` with snake_case field names in their camelCase spelling (see the docstring)."""
    if isinstance(value, list):
        return [camel_spelled(item) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[object, object] = {}
    for key, item in value.items():
        camel = alias_generators.to_camel(key) if isinstance(key, str) else key
        name = camel if camel not in value else key
        out[name] = item if name in _DATA_MAPS else camel_spelled(item)
    return out


def model_problem(spec: object) -> str | None:
    """Why pydantic and `consistency.check` refuse `spec`, or None when they admit it."""
    try:
        validated = job.JobSpec.model_validate(spec)
    except pydantic.ValidationError as exc:
        return str(exc.errors()[0]["loc"]) + ": " + exc.errors()[0]["msg"]
    problems = consistency.check(validated)
    return f"{problems[0][0]}: {problems[0][1]}" if problems else None


def judge(spec: object) -> verdicts.Verdict:
    """One spec mapping through both validators."""
    why = incomparable(spec)
    if why:
        return verdicts.rejected(f"not comparable: {why}")
    try:
        schema = crd_validation.problems(CRD, camel_spelled(spec))
    except Exception as exc:
        return verdicts.crashed("the CRD validation", exc)
    try:
        model = model_problem(spec)
    except Exception as exc:
        return verdicts.crashed("the model", exc)
    if bool(schema) != (model is not None):
        return verdicts.crashed(
            f"schema says {schema[:2] or 'admit'}, model says {model or 'admit'}"
        )
    return verdicts.rejected(schema[0]) if schema else verdicts.ACCEPTED
