"""The translation of pydantic's JSON Schema into a structural schema (planaria.kube.openapi).

Covers, on small models: `X | None` becomes X with nullable and no null default; `int | str`
becomes int-or-string; an exclusive bound becomes minimum with a boolean flag; a bound beyond
int64 is clamped (and no longer exclusive); a Literal of one value becomes an enum; a dict
becomes additionalProperties; nested models are inlined with the field's description; a union
with no structural form, and an int-or-string with per-branch rules, raise SchemaError naming
the construct.
"""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic
import pytest

from planaria.kube import openapi


class Inner(pydantic.BaseModel):
    """An inner model."""

    size: int = pydantic.Field(default=1, description="A size.")


class Sample(pydantic.BaseModel):
    maybe: int | None = pydantic.Field(None, description="Optional.")
    either: int | str = pydantic.Field("x", description="Int or string.")
    positive: float = pydantic.Field(1.0, gt=0, description="Above zero.")
    huge: int = pydantic.Field(0, ge=0, lt=2**64, description="A uint64.")
    only: Literal["one"] = pydantic.Field("one", description="A constant.")
    counts: dict[str, int] = pydantic.Field({}, description="A map.")
    inner: Inner = pydantic.Field(Inner(), description="Nested.")


def test_each_construct_has_its_structural_form() -> None:
    properties = openapi.structural(Sample)["properties"]
    assert properties["maybe"] == {"type": "integer", "description": "Optional.", "nullable": True}
    assert properties["either"] == {
        "default": "x",
        "description": "Int or string.",
        "x-kubernetes-int-or-string": True,
    }
    assert properties["positive"]["minimum"] == 0
    assert properties["positive"]["exclusiveMinimum"] is True
    assert properties["huge"]["maximum"] == openapi.MAX_INTEGER
    assert "exclusiveMaximum" not in properties["huge"]
    assert properties["only"]["enum"] == ["one"]
    assert properties["counts"]["additionalProperties"] == {"type": "integer"}
    inner = properties["inner"]
    assert inner["description"] == "Nested." and inner["default"] == {"size": 1}
    assert inner["properties"]["size"] == {
        "default": 1,
        "description": "A size.",
        "type": "integer",
    }
    assert "$ref" not in str(properties) and "title" not in str(properties)


class Unstructured(pydantic.BaseModel):
    number: int | float = 0


class RulesPerBranch(pydantic.BaseModel):
    value: Annotated[int, pydantic.Field(ge=0)] | str = 0


@pytest.mark.parametrize(
    ("model", "text"),
    [(Unstructured, "union"), (RulesPerBranch, "int-or-string with rules per branch")],
    ids=["a union of int and float", "an int-or-string with a bound on the int"],
)
def test_a_construct_without_structural_form_raises(
    model: type[pydantic.BaseModel], text: str
) -> None:
    with pytest.raises(openapi.SchemaError, match=text):
        openapi.structural(model)
