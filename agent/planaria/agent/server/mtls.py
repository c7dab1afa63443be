"""The agent's side of mutual TLS on its gRPC port (issue #10): credentials and authorisation.

    credentials = mtls.server_credentials(Path("/etc/planaria/tls"))   # ca.crt, tls.crt, tls.key
    server = grpc.server(pool, interceptors=[mtls.ControllerOnly(mtls.controller_name(job))])

`server_credentials` requires a client certificate that chains to the job's CA (the only root
trusted). Authentication is not enough: the CA also signed the agents' own server certificate,
so `ControllerOnly` lets AgentService calls through only when the peer's certificate common
name is the job's controller, `controller.<job>.planaria.internal`; anyone else gets
PERMISSION_DENIED. Other services on the port (health) are left to the handshake.

The issuing side is `planaria.rpc.tls`, which this package may not import (the import
contracts): `controller_name` and `TLS_FILES` mirror it and a test keeps them equal.

Errors: `TlsFilesError` (a ValueError) for a missing, unparsable or mismatched file in the TLS
directory; the message names it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from planaria.v1 import agent_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["AgentService"].full_name
TLS_FILES = ("ca.crt", "tls.crt", "tls.key")  # planaria.rpc.tls.AGENT_FILES
TLS_DOMAIN = "planaria.internal"
_T = TypeVar("_T")

if TYPE_CHECKING:  # grpc's classes are generic in its stubs only
    Interceptor = grpc.ServerInterceptor[Any, Any]
    _Handler = grpc.RpcMethodHandler[Any, Any]
else:
    Interceptor = grpc.ServerInterceptor


class TlsFilesError(ValueError):
    """The agent's TLS directory cannot be used; the message names the file and the fix."""


def controller_name(job: str) -> str:
    """The one client name AgentService answers under TLS (`planaria.rpc.tls.controller_name`)."""
    return f"controller.{job}.{TLS_DOMAIN}"


def server_credentials(tls_dir: Path) -> grpc.ServerCredentials:
    """Mutual TLS credentials from `tls_dir` (`TLS_FILES`): this agent's certificate, and the
    job's CA as the only root a client certificate may chain to (one is required)."""
    pem = {name: _read_pem(tls_dir / name) for name in TLS_FILES}
    _check_pair(pem["tls.crt"], pem["tls.key"], tls_dir)
    return grpc.ssl_server_credentials(
        [(pem["tls.key"], pem["tls.crt"])],
        root_certificates=pem["ca.crt"],
        require_client_auth=True,
    )


def _read_pem(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsFilesError(
            f"cannot read {path}: {exc.strerror}; give --tls-dir a directory with "
            f"{', '.join(TLS_FILES)}"
        ) from exc
    if b"-----BEGIN " not in data:
        raise TlsFilesError(f"{path} holds no PEM block; give the file planaria's TLS issuer wrote")
    return data


def _check_pair(cert_pem: bytes, key_pem: bytes, tls_dir: Path) -> None:
    """grpc reports a key that does not fit its certificate as a failure to bind: say which."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsFilesError(
            f"{tls_dir}: tls.crt or tls.key does not parse ({exc}); give the job's agent files"
        ) from exc
    if cert.public_key() != key.public_key():
        raise TlsFilesError(
            f"{tls_dir}: tls.key is not the key of tls.crt; give the pair issued together"
        )


class ControllerOnly(Interceptor):
    """Authorisation after mutual TLS: AgentService answers only a peer whose certificate's
    common name is `allowed` (the job's controller); others get PERMISSION_DENIED. The health
    service is left to the handshake (any certificate of the job's CA may probe it)."""

    def __init__(self, allowed: str) -> None:
        self._allowed = allowed.encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], _Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = continuation(details)
        if handler is None or not details.method.startswith(f"/{SERVICE}/"):
            return handler
        if handler.unary_stream is not None:  # Watch; every other method is unary-unary
            return grpc.unary_stream_rpc_method_handler(
                self._guarded(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        assert handler.unary_unary is not None  # add_to_server registers no other kind
        return grpc.unary_unary_rpc_method_handler(
            self._guarded(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _guarded(
        self, behaviour: Callable[[Any, grpc.ServicerContext], _T]
    ) -> Callable[[Any, grpc.ServicerContext], _T]:
        def guarded(request: Any, context: grpc.ServicerContext) -> _T:
            # grpc maps each property to a list of values (its stub says one bytes value)
            names = cast(list[bytes], context.auth_context().get("x509_common_name", []))
            if self._allowed not in names:
                shown = b", ".join(names).decode(errors="replace") or "no certificate"
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"peer {shown} is not {self._allowed.decode()}; only the job's controller "
                    f"may call AgentService",
                )
            return behaviour(request, context)

        return guarded
