"""Failures of the emulated API server, as the `Status` bodies a real one answers.

`ApiError` carries a Status's code, reason, message and details; the constructors below build
the ones the API server uses (NotFound, AlreadyExists, Conflict, Invalid with causes, ...),
with its message wording, which clients and tests match on.
"""

from typing import Any

from tests.kube.support import kinds

Obj = dict[str, Any]


class ApiError(Exception):
    """An API failure with the fields of a Kubernetes `Status` (code, reason, message)."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "code": self.code,
            "reason": self.reason,
            "message": self.message,
            "details": self.details,
        }


def not_found(kind: kinds.Kind, name: str) -> ApiError:
    details = {"name": name, "group": kind.group, "kind": kind.plural}
    return ApiError(404, "NotFound", f'{kind.qualified} "{name}" not found', details)


def invalid(kind: kinds.Kind, name: str, causes: list[tuple[str, str]]) -> ApiError:
    texts = [f"{field}: {message}" if field else message for field, message in causes]
    joined = texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"
    subject = f"{kind.kind}.{kind.group}" if kind.group else kind.kind
    details = {
        "name": name,
        "group": kind.group,
        "kind": kind.kind,
        "causes": [
            {"reason": "FieldValueInvalid", "message": message, "field": field}
            for field, message in causes
        ],
    }
    return ApiError(422, "Invalid", f'{subject} "{name}" is invalid: {joined}', details)


def conflict(kind: kinds.Kind, name: str, why: str) -> ApiError:
    details = {"name": name, "group": kind.group, "kind": kind.plural}
    message = f'Operation cannot be fulfilled on {kind.qualified} "{name}": {why}'
    return ApiError(409, "Conflict", message, details)


def already_exists(kind: kinds.Kind, name: str) -> ApiError:
    details = {"name": name, "group": kind.group, "kind": kind.plural}
    return ApiError(409, "AlreadyExists", f'{kind.qualified} "{name}" already exists', details)


def not_served() -> ApiError:
    """A URL that names no served resource (or an absent subresource)."""
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)
