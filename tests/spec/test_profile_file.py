"""The profile file format (planaria.spec.profile_file).

Covers: round trips (any valid profile, through text and through a file; synthetic profiles of
every named model; assumptions kept); the file's layout (format and version first, one layer per
line); one-line errors naming the file, the field path and the fix, for every kind of bad input
(not JSON, not an object, wrong format, unknown or missing version, unknown or missing fields,
negative or non-finite or mistyped numbers, empty layers, forwardS/backwardS lengths, layers that
disagree on M, a named model's layer count); any corrupted number reported at its own path;
missing or unwritable files; every field documented in docs/profile-format.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from planaria.contract import profile, shapes
from planaria.planner import accelerators, synthetic
from planaria.spec import profile_file
from tests import strategies

ROOT = Path(__file__).resolve().parents[2]
TINY = synthetic.synthesize(shapes.named("tiny"), accelerators.named("a100-80gb"), 2, 4)
LAYER_NUMBERS = (
    "parameterBytes",
    "gradientBytes",
    "optimizerBytes",
    "activationBytes",
    "outputBytes",
    "optimizerS",
)


def _tiny_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(profile_file.render_profile(TINY))
    return document


def _error_for(document: object) -> str:
    with pytest.raises(profile_file.ProfileFileError) as caught:
        profile_file.parse_profile(json.dumps(document), source="profile.json")
    message = str(caught.value)
    assert "\n" not in message
    return message


@given(strategies.profiles())
def test_any_profile_survives_a_round_trip_through_text(original: profile.Profile) -> None:
    # A file whose every time is 0 is refused (tested below); any other profile round-trips.
    assume(any(t > 0 for layer in original.layers for t in (*layer.forward_s, *layer.backward_s)))
    text = profile_file.render_profile(original, assumptions="measured\non a laptop")
    parsed = profile_file.parse_profile_file(text)
    assert parsed.profile == original
    assert parsed.assumptions == "measured\non a laptop"


@pytest.mark.parametrize("name", sorted(shapes.NAMED_SHAPES))
def test_a_synthetic_profile_survives_a_file_round_trip_for(name: str, tmp_path: Path) -> None:
    accelerator = accelerators.named("h100-80gb")
    original = synthetic.synthesize(shapes.named(name), accelerator, 1, 8)
    path = tmp_path / "profile.json"
    profile_file.dump_profile(original, path, assumptions=synthetic.assumptions(accelerator, 8))
    assert profile_file.load_profile(path) == original
    assert "Korthikanti" in profile_file.read_profile_file(path).assumptions
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]


def test_the_file_starts_with_format_and_version_and_has_a_layer_per_line() -> None:
    lines = profile_file.render_profile(TINY).splitlines()
    assert lines[1:3] == ['  "format": "planaria.profile",', '  "version": 1,']
    layer_lines = [line for line in lines if line.strip().startswith('{"name"')]
    assert len(layer_lines) == TINY.num_layers
    assert json.loads("\n".join(lines))["microBatchSize"] == 2


Mutation = Callable[[dict[str, Any]], object]


def _set(key: str, value: object) -> Mutation:
    return lambda document: document.__setitem__(key, value)


def _set_layer(index: int, key: str, value: object) -> Mutation:
    return lambda document: document["layers"][index].__setitem__(key, value)


def _drop_time(index: int, key: str) -> Mutation:
    return lambda document: document["layers"][index][key].pop()


def _zero_times(document: dict[str, Any]) -> None:
    for layer in document["layers"]:
        for key in ("forwardS", "backwardS"):
            layer[key] = [0.0] * len(layer[key])


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            _set_layer(3, "forwardS", [-1.0, 0.1, 0.1, 0.1]),
            "profile.json: layers.3.forwardS.0: must be >= 0 (got -1.0)",
        ),
        (
            _set_layer(0, "backwardS", [0.1, "fast", 0.1, 0.1]),
            'profile.json: layers.0.backwardS.1: must be a number (got "fast")',
        ),
        (
            _set_layer(2, "parameterBytes", 1.5),
            "profile.json: layers.2.parameterBytes: must be a whole number (got 1.5)",
        ),
        (
            _set_layer(2, "outputBytes", True),
            "profile.json: layers.2.outputBytes: must be a whole number (got true)",
        ),
        (
            _set_layer(1, "forwardS", []),
            "profile.json: layers.1.forwardS: must not be empty",
        ),
        (
            _drop_time(4, "backwardS"),
            "profile.json: layers.4.backwardS: has 3 entries but forwardS has 4; give one time "
            "per GPU count 1..M in both",
        ),
        (
            lambda d: (_drop_time(5, "backwardS")(d), _drop_time(5, "forwardS")(d)),
            "profile.json: layers.5.forwardS: has 3 entries but layers.0 has 4; every layer "
            "needs times for 1..M GPUs with the same M",
        ),
        (
            lambda d: d["layers"].pop(),
            "profile.json: layers: profile has 5 layers but model tiny has 6: embedding, "
            "4 blocks, head",
        ),
        (_set("layers", []), "profile.json: layers: must not be empty"),
        (
            lambda d: d.pop("layers"),
            "profile.json: layers: missing; add it (see docs/profile-format.md)",
        ),
        (
            _set("version", 2),
            "profile.json: version: unknown version 2; this planaria reads version 1: use the "
            "planaria that wrote the file, or rewrite it as version 1",
        ),
        (lambda d: d.pop("version"), 'profile.json: version: missing; add "version": 1'),
        (
            _set("format", "oobleck.profile"),
            'profile.json: format: must be "planaria.profile" (got "oobleck.profile"); is this '
            "a planaria profile?",
        ),
        (
            _set_layer(0, "forward_s", [0.1]),
            "profile.json: layers.0.forward_s: unknown field; remove it or fix its spelling "
            "(fields are camelCase, e.g. forwardS)",
        ),
        (
            lambda d: d["intraNode"].__setitem__("bandwidthBytesPerS", 0),
            "profile.json: intraNode.bandwidthBytesPerS: must be > 0 (got 0)",
        ),
        (_set("microBatchSize", 0), "profile.json: microBatchSize: must be >= 1 (got 0)"),
        (_set("interNode", 25e9), "profile.json: interNode: must be an object (got 25000000000.0)"),
        (_set("model", ""), "profile.json: model: must not be empty"),
        (_set("synthetic", "yes"), 'profile.json: synthetic: must be true or false (got "yes")'),
        (
            _zero_times,
            "profile.json: layers: every forwardS and backwardS is 0; a profile needs the "
            "layers' times (`planaria profile` measures them)",
        ),
    ],
    ids=[
        "a negative forward time",
        "a forward time that is a word",
        "fractional bytes",
        "a boolean byte count",
        "a layer without forward times",
        "fewer backward than forward times",
        "a layer with another M",
        "a layer short of the named model",
        "no layers",
        "a missing layers field",
        "a newer version",
        "a missing version",
        "another format",
        "a snake_case field",
        "a zero link bandwidth",
        "a zero micro-batch",
        "a link given as a number",
        "an empty model name",
        "synthetic as a word",
        "no time in any layer (steps would take 0 s)",
    ],
)
def test_a_bad_profile_gets_one_line_naming_the_field_for(mutate: Mutation, expected: str) -> None:
    document = _tiny_document()
    mutate(document)
    assert _error_for(document) == expected


def test_several_problems_are_counted_on_the_one_line() -> None:
    document = _tiny_document()
    document["layers"][0]["forwardS"][0] = -1.0
    document["layers"][1]["forwardS"][0] = -1.0
    assert _error_for(document).endswith("(got -1.0) (and 1 more)")


def test_non_finite_numbers_are_refused() -> None:
    text = profile_file.render_profile(TINY).replace('"latencyS": 5e-06', '"latencyS": NaN', 1)
    with pytest.raises(profile_file.ProfileFileError, match=r"intraNode.latencyS: must be a fin"):
        profile_file.parse_profile(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{", "profile.json: not JSON (Expecting property name enclosed in double quotes at "),
        ("[1, 2]", "profile.json: must be a JSON object with format 'planaria.profile' (got l"),
        ("", "profile.json: not JSON (Expecting value at line 1, column 1); a profile is"),
    ],
    ids=["a truncated object", "a list", "an empty file"],
)
def test_text_that_is_no_profile_is_refused(text: str, expected: str) -> None:
    with pytest.raises(profile_file.ProfileFileError) as caught:
        profile_file.parse_profile(text, source="profile.json")
    assert str(caught.value).startswith(expected)


@given(
    st.integers(min_value=0, max_value=TINY.num_layers - 1),
    st.sampled_from(LAYER_NUMBERS + ("forwardS", "backwardS")),
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
)
def test_any_negative_number_is_reported_at_its_own_path(
    index: int, field: str, value: float
) -> None:
    document = _tiny_document()
    target = document["layers"][index]
    if field in ("forwardS", "backwardS"):
        target[field][-1] = value
        path = f"layers.{index}.{field}.{len(target[field]) - 1}"
    else:
        target[field] = value if field == "optimizerS" else -1
        path = f"layers.{index}.{field}"
    assert _error_for(document).startswith(f"profile.json: {path}: must be >= 0 (got -")


def test_an_unnamed_model_may_have_any_number_of_layers() -> None:
    document = _tiny_document()
    document["model"] = "my-own-model"
    document["layers"].pop()
    loaded = profile_file.parse_profile(json.dumps(document))
    assert loaded.num_layers == TINY.num_layers - 1
    assert loaded.model == "my-own-model"


def test_a_missing_file_says_which_and_what_to_give(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(profile_file.ProfileFileError) as caught:
        profile_file.load_profile(path)
    assert str(caught.value) == (
        f"{path}: no such file; give the path of a profile written by `planaria profile`"
    )


def test_a_directory_is_not_a_profile(tmp_path: Path) -> None:
    with pytest.raises(profile_file.ProfileFileError, match="cannot read the file"):
        profile_file.load_profile(tmp_path)


def test_writing_into_a_missing_directory_fails_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "profile.json"
    with pytest.raises(profile_file.ProfileFileError, match="check that the directory exists"):
        profile_file.dump_profile(TINY, path)
    assert not path.parent.exists()


def test_file_errors_are_value_errors() -> None:
    assert issubclass(profile_file.ProfileFileError, ValueError)


def test_every_field_is_documented() -> None:
    docs = (ROOT / "docs" / "profile-format.md").read_text(encoding="utf-8")
    models = (
        profile_file.ProfileDocument,
        profile_file.LayerDocument,
        profile_file.LinkDocument,
    )
    for model in models:
        for name, field in model.model_fields.items():
            alias = field.alias or name
            assert re.search(rf"`{alias}`", docs), f"document {alias} in docs/profile-format.md"


def test_the_documented_example_is_a_valid_profile() -> None:
    docs = (ROOT / "docs" / "profile-format.md").read_text(encoding="utf-8")
    example = re.search(r"```json\n(.*?)```", docs, re.DOTALL)
    assert example is not None
    loaded = profile_file.parse_profile(example.group(1), source="docs example")
    assert (loaded.num_layers, loaded.max_gpus_per_stage) == (3, 2)
    assert all(layer.state_bytes == 8 * layer.parameter_bytes for layer in loaded.layers)


def test_a_link_without_all_reduce_figures_is_written_and_read_as_before() -> None:
    """Old files (and analytic profiles) give only the point-to-point pair: they are written
    without the optional all-reduce fields and read back with None, so all-reduces are costed
    with the point-to-point figures as before."""
    document = _tiny_document()
    assert set(document["intraNode"]) == {"bandwidthBytesPerS", "latencyS"}
    loaded = profile_file.parse_profile(json.dumps(document), source="profile.json")
    link = loaded.intra_node
    assert (link.allreduce_latency_s, link.allreduce_bandwidth_bytes_per_s) == (None, None)
    assert link.allreduce_s(400, 4) == 2 * 3 * (link.latency_s + 100 / link.bandwidth_bytes_per_s)


def test_a_links_all_reduce_figures_are_read_and_costed() -> None:
    document = _tiny_document()
    document["interNode"] = {
        "bandwidthBytesPerS": 100.0,
        "latencyS": 0.5,
        "allreduceBandwidthBytesPerS": 10.0,
        "allreduceLatencyS": 2.0,
    }
    link = profile_file.parse_profile(json.dumps(document), source="profile.json").inter_node
    assert link.transfer_s(100) == 0.5 + 1.0  # point to point: unchanged
    assert link.allreduce_s(40, 2) == 2 * (2.0 + 20 / 10.0)  # 2(p-1)(latency + b/p/bandwidth)


def test_a_zero_all_reduce_bandwidth_is_refused() -> None:
    document = _tiny_document()
    document["intraNode"]["allreduceBandwidthBytesPerS"] = 0
    assert "allreduceBandwidthBytesPerS" in _error_for(document)
