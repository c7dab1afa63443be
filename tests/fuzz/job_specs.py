"""Campaign 1: job specs near the valid space through the real entry points.

`judge_text` runs a job file's text through `planaria.spec.job_file.parse_job` (what
`load_job` and `planaria run` use) and, when it parses, through
`planaria.spec.conversion.to_settings`.
`judge_object` does the same for a decoded document, and also validates a bare spec with the
pydantic model directly (`JobSpec.model_validate` + `consistency.check`, the Kubernetes adapter's
path), which must agree with the file loader about acceptance.

Clean rejection: a `ValueError` whose `planaria.cli.main.format_error` line is one line that
names a field path (`spec.workers: ...`, `failures.0.time: ...`) or, for a file that is not a
mapping or not YAML at all, says so. A spec that parses must convert (`consistency.check` is
meant to catch everything `JobSettings` would refuse). Anything else is a crash.
"""

from __future__ import annotations

import re

import pydantic
import yaml

from planaria.cli import main as cli
from planaria.spec import conversion, job, job_file
from tests.fuzz import verdicts

SOURCE = "job.yaml"
# A field path as the messages write it: names and list indexes, '.'-joined; a bad or unknown
# key is named as it was written (any characters but a colon or a line break).
_PATH = r"[^:\n]+?"
_FIELD_LINE = re.compile(rf"^{re.escape(SOURCE)}: (\(top level\)|{_PATH}): \S")
# What a file that is no spec mapping at all is told (there is no field to name).
_WHOLE_FILE = (
    "not valid YAML",
    "must be a mapping of spec fields",
    "nested too deeply",
)


def clear_line(exc: ValueError, pattern: re.Pattern[str] = _FIELD_LINE) -> str | None:
    """Why `exc`'s one-line message is not clear, or None when it is."""
    line = cli.format_error(exc)
    if "\n" in line or "Traceback" in line:
        return f"not one line: {line[:200]!r}"
    if len(line) > 4000:  # a dump of the input, not a message
        return f"{len(line)} characters long"
    if pattern.match(line) is None and not any(
        line.startswith(f"{SOURCE}: {start}") for start in _WHOLE_FILE
    ):
        return f"names no field: {line[:200]!r}"
    return None


def judge_text(text: str) -> verdicts.Verdict:
    """One job file's text through parse_job and to_settings."""
    try:
        parsed = job_file.parse_job(text, source=SOURCE, default_name="fuzz-job")
    except job.JobSpecError as exc:
        unclear = clear_line(exc)
        return verdicts.crashed(unclear) if unclear else verdicts.rejected(str(exc))
    except Exception as exc:  # the property under test: nothing else escapes
        return verdicts.crashed("parse_job", exc)
    try:
        conversion.to_settings(parsed.spec, parsed.name, "/corpus")
    except Exception as exc:
        return verdicts.crashed("to_settings of a spec that parsed", exc)
    return verdicts.ACCEPTED


def judge_object(document: object) -> verdicts.Verdict:
    """A decoded document through the file loader, and a bare spec also through the model."""
    try:
        text = yaml.safe_dump(document)
    except RecursionError:  # too deep for the dumper: judge_text's deep texts cover it
        return verdicts.rejected("too deep to write as YAML")
    verdict = judge_text(text)
    # parse_job's rule: a mapping with apiVersion or kind is a whole document.
    if isinstance(document, dict) and not {"apiVersion", "kind"} & set(document):
        direct = _judge_model(document)
        accepted = {v.outcome is verdicts.Outcome.ACCEPTED for v in (verdict, direct)}
        if direct.outcome is verdicts.Outcome.CRASHED:
            return direct
        if len(accepted) > 1:
            return verdicts.crashed(f"file loader said {verdict}, the model said {direct}")
    return verdict


_MODEL_LINE = re.compile(rf"^({_PATH}|\(top level\)): \S")


def _judge_model(spec: dict[object, object]) -> verdicts.Verdict:
    try:
        validated = job.JobSpec.model_validate(spec)
        conversion.to_settings(validated, "fuzz-job", "/corpus")
    except (pydantic.ValidationError, job.JobSpecError) as exc:
        line = cli.format_error(exc)
        pattern = _FIELD_LINE if not isinstance(exc, pydantic.ValidationError) else _MODEL_LINE
        if isinstance(exc, job.JobSpecError):
            line = f"{SOURCE}: {line}"  # to_settings names spec.<path> without a source
        unclear = clear_line(ValueError(line), pattern)
        return verdicts.crashed(unclear) if unclear else verdicts.rejected(line)
    except Exception as exc:
        return verdicts.crashed("JobSpec.model_validate / to_settings", exc)
    return verdicts.ACCEPTED
