"""Durations as users write them: the one grammar for job files, `--fail`/`--mtbf` and the CRD.

    90         plain seconds (a number: 90, 1.5, .5, 2.)
    90s 1.5m 2h 500ms
    1h2m3.5s   Go/Kubernetes-style compound: units largest first, each at most once

Grammar (ASCII only, no spaces, no sign, no exponent):

    duration  = number | part-h [part-m] [part-s] [part-ms]
                       | part-m [part-s] [part-ms] | part-s [part-ms] | part-ms
    part-U    = number U                            (U one of h, m, s, ms)
    number    = 1-9 digits [ "." 0-9 digits ] | "." 1-9 digits

Units are those of Go's `time.ParseDuration` that training timescales need (h, m, s, ms; no
us/ns, no negative durations). A plain number without a unit is seconds, as job files have
always written `time: 90`. The digit bounds keep every accepted text finite and well inside a
float (under 1e9 hours) with a rule a regular expression can state, so the CRD's `pattern`
(`CRD_PATTERN`, read by the API server's RE2) accepts exactly the texts `parse` accepts: both
come from `BODY`. Values are summed exactly (decimal) and rounded once to a float.

What does not live here: bounds of particular fields (a positive `--mtbf`, a day's timeout),
which their callers check.

Errors: `DurationError` (a ValueError), one line naming the value and the accepted forms.
"""

from __future__ import annotations

import decimal
import math
import re

FORMS = "seconds (90, 1.5) or units h, m, s, ms largest first (90s, 1.5m, 2h, 1h2m3.5s, 500ms)"
_NUMBER = r"(?:[0-9]{1,9}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})"
_H, _M, _S, _MS = (f"{_NUMBER}{unit}" for unit in ("h", "m", "s", "ms"))
# The alternatives name the largest unit present, so no alternative matches the empty text.
BODY = f"{_NUMBER}|{_H}(?:{_M})?(?:{_S})?(?:{_MS})?|{_M}(?:{_S})?(?:{_MS})?|{_S}(?:{_MS})?|{_MS}"
# RE2's `$` (no multi-line flag) is the end of the text, Python's would allow a final newline:
# Python matches with `fullmatch` instead.
CRD_PATTERN = f"^(?:{BODY})$"
_GRAMMAR = re.compile(BODY, re.ASCII)
_PART = re.compile(r"([0-9.]+)(ms|h|m|s)?", re.ASCII)
_UNIT_S = {unit: decimal.Decimal(s) for unit, s in (("h", 3600), ("m", 60), ("s", 1), ("", 1))}
_UNIT_S["ms"] = decimal.Decimal("0.001")


class DurationError(ValueError):
    """A value that is not a duration; says which and what to write."""


def parse(value: str | int | float) -> float:
    """Seconds (>= 0, finite) in `value`: a number of seconds or text of the grammar above.
    Raises DurationError otherwise (booleans, negatives, NaN, infinities included)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DurationError(f"{value!r} is not a duration; write {FORMS}")
    if not isinstance(value, str):
        if not (math.isfinite(value) and value >= 0):
            raise DurationError(f"{value!r} is not a duration >= 0; write {FORMS}")
        return float(value)
    if _GRAMMAR.fullmatch(value) is None:
        raise DurationError(f"{value!r} is not a duration; write {FORMS}")
    total = sum(
        (decimal.Decimal(number) * _UNIT_S[unit] for number, unit in _PART.findall(value)),
        decimal.Decimal(0),
    )
    return float(total)
