"""Errors of the wire translation, and the two helpers that raise them with a field path.

    WireError (ValueError)      a message breaks the contract; the text starts with the field
    ├── MissingFieldError       a required sub-message is absent
    ├── UnknownEnumError        an enum is *_UNSPECIFIED, or a value this version does not know
    └── InvalidValueError       a value breaks the domain's rules (a range, a plan invariant)

Decoding raises only these; the servicer maps every WireError to INVALID_ARGUMENT. Field paths
read like `ConfigureRequest.plan.pipelines[1].stages[0]`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class WireError(ValueError):
    """A message breaks the contract; the text names the field (`ConfigureRequest.plan...`)."""


class MissingFieldError(WireError):
    """A required sub-message is absent."""


class UnknownEnumError(WireError):
    """An enum field holds its *_UNSPECIFIED zero value or a number this version does not know."""


class InvalidValueError(WireError):
    """A value is present but breaks the domain's rules."""


@contextlib.contextmanager
def at(path: str) -> Iterator[None]:
    """Turn a ValueError raised while building a dataclass (its own validation) into an
    InvalidValueError prefixed with the message field `path`; WireErrors pass unchanged."""
    try:
        yield
    except WireError:
        raise
    except ValueError as exc:
        raise InvalidValueError(f"{path}: {exc}") from exc


def missing(path: str, field: str) -> MissingFieldError:
    """The error for an absent required sub-message `path.field` (raise it)."""
    return MissingFieldError(f"{path}.{field} is missing; set it (it is required)")
