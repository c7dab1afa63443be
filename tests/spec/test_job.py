"""The job spec and job files (planaria.spec.job, .consistency, .conversion, .job_file).

Covers: defaults; camelCase aliases and snake_case names; a bare spec named after its file and a
whole ResilientJob document named by metadata.name; overrides checked like the file's own values;
every kind of invalid field (type, strict numbers as in the CRD, range, enum, unknown field,
cross-field rules, failures, names, not YAML, nested past the YAML parser's recursion, not a
mapping, missing file) reported as one line with the field path as written in the file and a fix; an
offending value made of shared YAML aliases shown without expanding it; durations; conversion to the
controller's JobSettings (corpus default, NCCL on cuda, checkpoints only when both dir and interval
are given, the gradient reduction, the precision); a fuzz of random documents: parsing raises
nothing but JobSpecError with a path, and any spec that parses converts to settings; every spec
field has a description and is documented in docs/running.md.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.control import settings as job_settings
from planaria.spec import conversion, job, job_file
from planaria.wire import messages

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = """
apiVersion: planaria.dev/v1alpha1
kind: ResilientJob
metadata: {name: tiny-job, namespace: ml}
spec:
  workers: 4
  steps: 50
  microBatchSize: 2
  globalBatchSize: 16
  timeouts: {stepSeconds: 5}
  failures: [{step: 10, worker: 3}, {time: 30s}]
"""


def _parse(text: str, **kwargs: Any) -> job_file.JobFile:
    return job_file.parse_job(text, source="job.yaml", **kwargs)


def _error(text: str) -> str:
    with pytest.raises(job.JobSpecError) as caught:
        _parse(text)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_empty_file_is_the_default_spec() -> None:
    parsed = _parse("", default_name="demo")
    assert parsed.name == "demo" and not parsed.document
    spec = parsed.spec
    assert (spec.model, spec.workers, spec.gpus_per_node, spec.device) == ("tiny", 8, 1, "cpu")
    assert spec.global_batch_size % spec.micro_batch_size == 0
    assert spec.snapshots.interval_steps == 1 and spec.snapshots.redundancy == "copy"
    assert spec.policy is job_settings.Policy.ADAPTIVE and spec.failures == []
    assert spec.reduction is job.Reduction.FAST
    assert spec.precision is job.Precision.FP32


def test_camel_case_and_snake_case_names_are_both_accepted() -> None:
    camel = _parse("microBatchSize: 2\ntimeouts: {stepSeconds: 4}").spec
    snake = _parse("micro_batch_size: 2\ntimeouts: {step_seconds: 4}").spec
    assert camel == snake
    assert camel.micro_batch_size == 2 and camel.timeouts.step_seconds == 4


def test_a_whole_document_is_named_by_its_metadata() -> None:
    parsed = _parse(DOCUMENT, default_name="ignored")
    assert parsed.document and parsed.name == "tiny-job"
    assert parsed.spec.workers == 4 and parsed.spec.steps == 50
    assert [f.step for f in parsed.spec.failures] == [10, None]
    assert parsed.spec.failures[1].time_s == 30.0


def test_a_bare_spec_is_named_after_its_file(tmp_path: Path) -> None:
    path = tmp_path / "My_Tiny Job.yaml"
    path.write_text("workers: 2\n", encoding="utf-8")
    assert job_file.load_job(path).name == "my-tiny-job"


def test_overrides_replace_the_files_values_and_are_checked_the_same_way() -> None:
    assert _parse(DOCUMENT, overrides={"workers": 6}).spec.workers == 6
    with pytest.raises(job.JobSpecError, match=r"^job.yaml: spec.workers: must be >= 1"):
        _parse(DOCUMENT, overrides={"workers": 0})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("workers: 0", r"^job.yaml: workers: must be >= 1 \(got 0\)$"),
        ("workers: many", r"^job.yaml: workers: must be a whole number"),
        ("wrkers: 3", r"^job.yaml: wrkers: unknown field; remove it or fix its spelling"),
        ("optimizer: {lr: -1}", r"^job.yaml: optimizer.lr: must be > 0"),
        ("optimizer: {beta1: 1}", r"^job.yaml: optimizer.beta1: must be < 1"),
        ("device: gpu", r"^job.yaml: device: must be one of 'cpu' or 'cuda'"),
        ("policy: random", r"^job.yaml: policy: must be one of 'adaptive'"),
        ("snapshots: {redundancy: raid}", r"^job.yaml: snapshots.redundancy: must be one of"),
        ("reduction: float64", r"^job.yaml: reduction: must be one of 'fast' or 'exact'"),
        ("precision: fp16", r"^job.yaml: precision: must be one of 'fp32', 'tf32' or 'bf16'"),
        ("precision: BF16", r"^job.yaml: precision: must be one of 'fp32', 'tf32' or 'bf16'"),
        ("data: {corpusPaths: []}", r"^job.yaml: data.corpusPaths: must not be empty"),
        ("data: {format: csv}", r"^job.yaml: data.format: must be one of 'text', 'jsonl' or"),
        ("data: {textField: ''}", r"^job.yaml: data.textField: must not be empty"),
        ("data: {tokenizer: 3}", r"^job.yaml: data.tokenizer: must be a string"),
        ("seed: 1.5", r"^job.yaml: seed: must be a whole number"),
        ("seed: 9007199254740992", r"^job.yaml: seed: must be <= 9007199254740991"),
        ("gpusPerNode: true", r"^job.yaml: gpusPerNode: must be a whole number \(got true\)"),
        ("workers: 4.0", r"^job.yaml: workers: must be a whole number \(got 4.0\)"),
        ("optimizer: {lr: '0.1'}", r"^job.yaml: optimizer.lr: must be a number \(got \"0.1\"\)"),
        ("failures: [{time: 1.0e+6}]", r"^job.yaml: failures.0.time: must be a whole number"),
        ("mtbfSeconds: 0", r"^job.yaml: mtbfSeconds: must be > 0"),
        ("deviceMemory: 8GB", r"^job.yaml: deviceMemory: must be a byte quantity like 512Mi, 40Gi"),
        ("deviceMemory: '100'", r"^job.yaml: deviceMemory: 100 is below 1024 bytes; give the"),
        ("globalBatchSize: 30", r"^job.yaml: globalBatchSize: 30 is not a multiple of micro"),
        ("workers: 6\ngpusPerNode: 4", r"^job.yaml: workers: 6 is not a multiple of gpusPerNode"),
        ("workers: 2\nfaultTolerance: 2", r"^job.yaml: faultTolerance: 2 leaves no node"),
        ("model: gpt5", r"^job.yaml: model: unknown model 'gpt5'; give one of"),
        ("timeouts: {heartbeatSeconds: 0.05}", r"^job.yaml: timeouts.heartbeatSeconds: 0.05 is"),
        (
            "checkpoints: {dir: /tmp/c, intervalSteps: 3}\nsnapshots: {intervalSteps: 2}",
            r"^job.yaml: checkpoints.intervalSteps: 3 is not a multiple of snapshots",
        ),
        ("failures: [{step: 4, time: 3}]", r"^job.yaml: failures.0: give exactly one of step or"),
        ("failures: [{worker: 1}]", r"^job.yaml: failures.0: give exactly one of step or time"),
        ("failures: [{step: 4, worker: 8}]", r"^job.yaml: failures.0.worker: worker 8 does not"),
        ("failures: [{step: 4, worker: -1}]", r"^job.yaml: failures.0.worker: must be a worker"),
        ("failures: [{step: 4, worker: any}]", r"^job.yaml: failures.0.worker: must be a worker"),
        ("failures: [{step: 100}]", r"^job.yaml: failures.0.step: step 100 is not before the"),
        ("failures: [{time: soon}]", r"^job.yaml: failures.0.time: 'soon' is not a duration"),
        ("failures: [{time: \u0663s}]", r"^job.yaml: failures.0.time: '\u0663s' is not a dura"),
        ("[1, 2]", r"^job.yaml: must be a mapping of spec fields or a ResilientJob document"),
        ("workers: [", r"^job.yaml: not valid YAML at line 1"),
        ("[" * 5000 + "]" * 5000, r"^job.yaml: nested too deeply to be a job file; a job"),
        ("kind: ResilientJob\nmetadata: {name: x}", r"^job.yaml: apiVersion: missing; add it"),
        (
            "apiVersion: planaria.dev/v1\nkind: ResilientJob\nmetadata: {name: x}",
            r"^job.yaml: apiVersion: must be one of 'planaria.dev/v1alpha1'",
        ),
        (
            "apiVersion: planaria.dev/v1alpha1\nkind: ResilientJob\nmetadata: {name: Tiny}",
            r"^job.yaml: metadata.name: 'Tiny' is not a valid job name; start with a lowercase",
        ),
        (  # the API server refuses it too (the CRD's rule): a Service is named after the job
            "apiVersion: planaria.dev/v1alpha1\nkind: ResilientJob\nmetadata: {name: 9job}",
            r"^job.yaml: metadata.name: '9job' is not a valid job name; start with a lowercase",
        ),
        (
            "apiVersion: planaria.dev/v1alpha1\nkind: ResilientJob\nmetadata: {name: x}\n"
            "spec: {steps: 0}",
            r"^job.yaml: spec.steps: must be >= 1",
        ),
        (
            "apiVersion: planaria.dev/v1alpha1\nkind: ResilientJob\nmetadata: {name: x}\n"
            "spec: {workers: 2, failures: [{step: 1, worker: 2}]}",
            r"^job.yaml: spec.failures.0.worker: worker 2 does not exist",
        ),
    ],
    ids=lambda value: value if len(value) < 40 else value[:37] + "...",
)
def test_an_invalid_field_is_named_with_its_path_and_a_fix(text: str, expected: str) -> None:
    assert re.search(expected, _error(text)), _error(text)


def test_a_value_of_shared_yaml_aliases_is_shown_without_expanding_it() -> None:
    # Ten levels of ten aliases: 10**10 leaves if rendered in full (it once took 11 s and 1 GB
    # for eight levels, to print the first 40 characters).
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    text = "defs:\n" + "\n".join(f"  {line}" for line in lines) + "\nworkers: *a9\n"
    started = time.monotonic()
    with pytest.raises(job.JobSpecError, match=r"workers: must be a whole number \(got \[\[\["):
        job_file.parse_job(text, source="job.yaml")
    assert time.monotonic() - started < 5


def test_a_missing_file_says_which_and_where_to_look(tmp_path: Path) -> None:
    with pytest.raises(job.JobSpecError, match=r"no such file; give the path of a job file"):
        job_file.load_job(tmp_path / "absent.yaml")


def test_a_failure_time_reads_compound_durations() -> None:
    assert job.FailureSpec(time="1m30s").time_s == 90.0 and job.FailureSpec(time=7).time_s == 7.0


def test_settings_take_every_field_and_the_corpus_default() -> None:
    spec = _parse(DOCUMENT).spec
    out = conversion.to_settings(spec, "tiny-job", "/stdlib")
    assert (out.name, out.workers, out.steps, out.micro_batch_size) == ("tiny-job", 4, 50, 2)
    assert out.training.global_batch_size == 16 and out.step_timeout_s == 5.0
    assert out.training.data.corpus_paths == ("/stdlib",)
    assert out.backend is messages.Backend.GLOO and out.policy == "adaptive"
    assert out.training.redundancy is messages.RedundancyMode.COPY
    assert out.training.reduction is messages.Reduction.FAST
    assert out.training.checkpoint_dir == "" and out.training.checkpoint_interval_steps == 0


def test_settings_of_a_cuda_job_with_corpus_and_checkpoints() -> None:
    spec = _parse(
        "device: cuda\ndata: {corpusPaths: [a.txt, b], maxBytes: 1000}\n"
        "checkpoints: {dir: /ckpt, intervalSteps: 10}\npolicy: reroute\nmtbfSeconds: 60"
    ).spec
    out = conversion.to_settings(spec, "gpu-job", "/stdlib")
    assert out.backend is messages.Backend.NCCL and out.training.device is messages.Device.CUDA
    assert out.training.data.corpus_paths == ("a.txt", "b")
    assert out.training.data.max_bytes == 1000
    assert (out.training.checkpoint_dir, out.training.checkpoint_interval_steps) == ("/ckpt", 10)
    assert out.policy == "reroute" and out.mtbf_s == 60.0


def test_device_memory_reaches_the_settings_in_bytes() -> None:
    out = conversion.to_settings(_parse("deviceMemory: 1.5Mi").spec, "job", "/stdlib")
    assert out.device_memory_bytes == 1_572_864
    assert (
        conversion.to_settings(_parse("workers: 2").spec, "job", "/stdlib").device_memory_bytes
        is None
    )


@given(
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(sorted(job.BYTE_SUFFIXES)),
    st.integers(min_value=0, max_value=999),
)
def test_byte_quantities_read_as_their_exact_bytes_rounded_down(
    whole: int, suffix: str, thousandths: int
) -> None:
    scale = job.BYTE_SUFFIXES[suffix]
    assert job.memory_bytes(f"{whole}{suffix}") == whole * scale
    assert job.memory_bytes(f"{whole}.{thousandths:03d}{suffix}") == (
        whole * scale + thousandths * scale // 1000
    )


def test_the_data_section_reaches_the_training_settings() -> None:
    spec = _parse(
        "data: {corpusPaths: [d], format: parquet, textField: body, tokenizer: t.json, "
        "separator: '</s>', cacheDir: /cache}"
    ).spec
    out = conversion.to_settings(spec, "job", "/stdlib").training.data
    assert out == messages.DataSettings(
        corpus_paths=("d",),
        format=messages.DataFormat.PARQUET,
        text_field="body",
        tokenizer_path="t.json",
        separator="</s>",
        cache_dir="/cache",
    )
    default = conversion.to_settings(_parse("").spec, "job", "/stdlib").training.data
    assert default == messages.DataSettings(corpus_paths=("/stdlib",))
    assert not default.needs_tokenising and out.needs_tokenising


@pytest.mark.parametrize("reduction", list(job.Reduction), ids=lambda r: f"reduction {r}")
def test_the_reduction_reaches_the_training_settings(reduction: job.Reduction) -> None:
    spec = _parse(f"reduction: {reduction}").spec
    assert spec.reduction is reduction
    out = conversion.to_settings(spec, "job", "/stdlib")
    assert out.training.reduction is messages.Reduction(reduction.value)


@pytest.mark.parametrize("precision", list(job.Precision), ids=lambda p: f"precision {p}")
def test_the_precision_reaches_the_training_settings(precision: job.Precision) -> None:
    spec = _parse(f"precision: {precision}\nreduction: exact").spec
    assert spec.precision is precision
    out = conversion.to_settings(spec, "job", "/stdlib")
    assert out.training.precision is messages.Precision(precision.value)
    assert out.training.reduction is messages.Reduction.EXACT  # bf16 is allowed in exact mode


def test_settings_refuse_a_bad_name() -> None:
    with pytest.raises(job.JobSpecError, match=r"^metadata.name: 'Bad_Name' is not"):
        conversion.to_settings(job.JobSpec(), "Bad_Name", "/stdlib")


_KEYS = st.sampled_from(
    [
        "model",
        "workers",
        "gpusPerNode",
        "steps",
        "microBatchSize",
        "globalBatchSize",
        "seed",
        "device",
        "reduction",
        "precision",
        "policy",
        "mtbfSeconds",
        "faultTolerance",
        "bogus",
    ]
)
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=2**66)
    | st.floats(allow_nan=True)
    | st.sampled_from(["tiny", "cpu", "cuda", "reroute", "exact", "90s", "", "x"])
)
_NESTED = {
    "optimizer": st.dictionaries(st.sampled_from(["lr", "beta1", "eps", "weightDecay"]), _LEAVES),
    "snapshots": st.dictionaries(st.sampled_from(["intervalSteps", "redundancy"]), _LEAVES),
    "checkpoints": st.dictionaries(st.sampled_from(["dir", "intervalSteps"]), _LEAVES),
    "timeouts": st.dictionaries(st.sampled_from(["heartbeatSeconds", "stepSeconds"]), _LEAVES),
    "data": st.dictionaries(st.sampled_from(["corpusPaths", "maxBytes"]), _LEAVES),
    "failures": st.lists(
        st.dictionaries(st.sampled_from(["step", "time", "worker"]), _LEAVES), max_size=3
    ),
}


@st.composite
def _documents(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = draw(st.dictionaries(_KEYS, _LEAVES, max_size=6))
    for key in draw(st.lists(st.sampled_from(sorted(_NESTED)), unique=True, max_size=3)):
        spec[key] = draw(_NESTED[key] | _LEAVES)
    if draw(st.booleans()):
        return {
            "apiVersion": job.API_VERSION,
            "kind": job.KIND,
            "metadata": {"name": "j"},
            "spec": spec,
        }
    return spec


@settings(max_examples=150, deadline=None)
@given(_documents())
def test_random_documents_fail_only_with_a_path_and_what_parses_converts(
    document: dict[str, Any],
) -> None:
    text = yaml.safe_dump(document)
    try:
        parsed = _parse(text)
    except job.JobSpecError as exc:
        assert re.match(r"^job.yaml: [A-Za-z0-9_.]+: \S", str(exc)), str(exc)
        return
    settings_ = conversion.to_settings(parsed.spec, parsed.name, "/stdlib")
    assert settings_.workers == parsed.spec.workers


def _fields(model: type[Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        out.append((path, field))
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
            out += _fields(annotation, f"{path}.")
    return out


def test_every_spec_field_has_a_description_and_is_documented() -> None:
    docs = (ROOT / "docs" / "running.md").read_text(encoding="utf-8")
    fields = (
        _fields(job.JobSpec)
        + _fields(job.FailureSpec, "failures[].")
        + _fields(job.TolerationSpec, "pod.tolerations[].")
    )
    for path, field in fields:
        assert field.description, path
        assert f"`{path.rsplit('.', 1)[-1]}`" in docs, f"docs/running.md lacks `{path}`"


def test_the_pod_section_takes_kubernetes_quantities_and_scheduling() -> None:
    spec = job.JobSpec.model_validate(
        {
            "pod": {
                "cpu": "500m",
                "memory": "8Gi",
                "nodeSelector": {"cloud.google.com/gke-spot": "true"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            }
        }
    )
    assert spec.pod.memory == "8Gi" and spec.pod.snapshot_memory == "1Gi"
    assert spec.pod.tolerations[0].effect == ""
    for bad in ({"cpu": "two"}, {"memory": "8 Gi"}, {"nodeSelector": {"bad key!": "x"}}):
        with pytest.raises(pydantic.ValidationError):
            job.JobSpec.model_validate({"pod": bad})
