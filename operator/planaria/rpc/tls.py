"""Per-job mutual TLS material for the controller-agent channel (issue #10).

    creds = tls.issue("tiny")                              # a CA and two leaf certificates
    tls.write_dir(tls.agent_files(creds), run_dir / "tls" / "agent")       # --tls-dir
    tls.write_dir(tls.controller_files(creds), run_dir / "tls" / "controller")
    channel_tls = tls.read_controller_dir(run_dir / "tls" / "controller")  # a ControllerTls
    await client.AgentClient.connect(w, address, timeout_s=10, tls=channel_tls)

Every job has its own certificate authority (EC P-256, self-signed, CA:true with pathlen 0). It
signs two leaves and nothing else:

- the agents' server certificate, one for all the job's agents (EKU serverAuth only; CN and DNS
  SAN `agent_server_name(job)`, `agent.<job>.planaria.internal`). Agents are addressed by IP,
  so the client checks this name through `grpc.ssl_target_name_override`, not the address.
- the controller's client certificate (EKU clientAuth only; CN and DNS SAN
  `controller_name(job)`). The agent authorises this name alone: the CA also signed the agent's
  certificate, which must not steer other agents.

Two file sets, meant as two Kubernetes Secrets (keys are the file names):

- `agent_files`: `AGENT_FILES`, what `planaria agent --tls-dir` reads (the CA certificate to
  verify the controller, the server certificate and its key). Mounted into every worker pod.
- `controller_files`: `CONTROLLER_FILES`, the CA certificate and key plus the controller's
  certificate and key. Read by the controller alone (the operator, after a restart, reads it back
  with `from_controller_files`; the CA key is kept so a later version can reissue leaves).

What deliberately does not live here: rotation (certificates live `valid_days`, 365 by default,
and a job that outlives them must be given new Secrets), revocation, and the agent side, which
cannot import `planaria.rpc` (the import contracts) and reads its three files in
`planaria.agent.server.mtls`; `controller_name` is written there too and a test keeps the two equal.

Errors: `TlsError` (a ValueError) for a bad job name or unreadable, incomplete or mismatched
material; the message names the file or key and what to supply.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DOMAIN = "planaria.internal"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CERT = "tls.crt"
KEY = "tls.key"
AGENT_FILES = (CA_CERT, CERT, KEY)
CONTROLLER_FILES = (CA_CERT, CA_KEY, CERT, KEY)
DEFAULT_VALID_DAYS = 365
CLOCK_SKEW = datetime.timedelta(minutes=5)  # not_before is backdated: nodes' clocks differ
DIR_MODE = 0o700
FILE_MODE = 0o600
# An RFC 1123 subdomain (a Kubernetes object name), so that the names below are valid DNS names.
_JOB_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_JOB_NAME = 253 - len(f"controller..{DOMAIN}")


class TlsError(ValueError):
    """TLS material that cannot be issued, read or used; the message says what to supply."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCredentials:
    """Everything `issue` made for one job (PEM bytes; keys are unencrypted PKCS#8)."""

    job: str
    ca_cert_pem: bytes
    ca_key_pem: bytes
    agent_cert_pem: bytes
    agent_key_pem: bytes
    controller_cert_pem: bytes
    controller_key_pem: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerTls:
    """What the controller holds of a job's material: the client side of the channel."""

    job: str
    ca_cert_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def server_name(self) -> str:
        """The name the agents' certificate carries (the target name override)."""
        return agent_server_name(self.job)


def agent_server_name(job: str) -> str:
    """The DNS name in the job's agents' server certificate."""
    return f"agent.{job}.{DOMAIN}"


def controller_name(job: str) -> str:
    """The CN and DNS name of the job's controller certificate, the one client agents accept."""
    return f"controller.{job}.{DOMAIN}"


def issue(
    job: str, *, valid_days: int = DEFAULT_VALID_DAYS, now: datetime.datetime | None = None
) -> JobCredentials:
    """A fresh CA for `job` and the agents' and controller's certificates, valid from `now`
    (less `CLOCK_SKEW`) for `valid_days`. TlsError for a job name that is no DNS name."""
    _check_job(job)
    if valid_days < 1:
        raise TlsError(f"valid_days is {valid_days}; give 1 or more")
    start = (now or datetime.datetime.now(datetime.UTC)) - CLOCK_SKEW
    end = start + CLOCK_SKEW + datetime.timedelta(days=valid_days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(job, ca_key, start, end)
    agent_key, agent_cert = _leaf(
        ca_cert, ca_key, agent_server_name(job), ExtendedKeyUsageOID.SERVER_AUTH, start, end
    )
    controller_key, controller_cert = _leaf(
        ca_cert, ca_key, controller_name(job), ExtendedKeyUsageOID.CLIENT_AUTH, start, end
    )
    return JobCredentials(
        job=job,
        ca_cert_pem=_cert_pem(ca_cert),
        ca_key_pem=_key_pem(ca_key),
        agent_cert_pem=_cert_pem(agent_cert),
        agent_key_pem=_key_pem(agent_key),
        controller_cert_pem=_cert_pem(controller_cert),
        controller_key_pem=_key_pem(controller_key),
    )


def agent_files(creds: JobCredentials) -> dict[str, bytes]:
    """The agents' directory (or Secret): `AGENT_FILES`."""
    return {CA_CERT: creds.ca_cert_pem, CERT: creds.agent_cert_pem, KEY: creds.agent_key_pem}


def controller_files(creds: JobCredentials) -> dict[str, bytes]:
    """The controller's directory (or Secret): `CONTROLLER_FILES`."""
    return {
        CA_CERT: creds.ca_cert_pem,
        CA_KEY: creds.ca_key_pem,
        CERT: creds.controller_cert_pem,
        KEY: creds.controller_key_pem,
    }


def controller_tls(creds: JobCredentials) -> ControllerTls:
    """The controller's part of freshly issued credentials."""
    return from_controller_files(controller_files(creds))


def write_dir(files: Mapping[str, bytes], path: Path) -> None:
    """Write `files` into `path` (created if missing): the directory 0700, each file 0600,
    whatever the umask; an existing file is replaced atomically."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)
    for name, data in files.items():
        temporary = path / f".{name}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(descriptor, "wb") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)  # O_CREAT's mode is masked by the umask
            handle.write(data)
        os.replace(temporary, path / name)


def read_controller_dir(path: Path) -> ControllerTls:
    """`from_controller_files` over the files of `path` (`CONTROLLER_FILES`)."""
    files: dict[str, bytes] = {}
    for name in CONTROLLER_FILES:
        try:
            files[name] = (path / name).read_bytes()
        except OSError as exc:
            raise TlsError(
                f"cannot read {path / name}: {exc.strerror}; give the directory "
                f"controller_files wrote"
            ) from exc
    return from_controller_files(files)


def from_controller_files(files: Mapping[str, bytes]) -> ControllerTls:
    """Check and load a controller's material (e.g. a Secret's data). TlsError when a key is
    missing, a PEM does not parse, a key does not match its certificate, the certificate is
    not the CA's, or it is not a controller certificate."""
    missing = [name for name in CONTROLLER_FILES if name not in files]
    if missing:
        raise TlsError(f"controller TLS material lacks {', '.join(missing)}; give all of them")
    ca_cert = _load_cert(files[CA_CERT], CA_CERT)
    cert = _load_cert(files[CERT], CERT)
    _check_pair(ca_cert, _load_key(files[CA_KEY], CA_KEY), CA_CERT, CA_KEY)
    _check_pair(cert, _load_key(files[KEY], KEY), CERT, KEY)
    _check_signed(cert, ca_cert)
    job = _controller_job(cert)
    return ControllerTls(
        job=job,
        ca_cert_pem=files[CA_CERT],
        ca_key_pem=files[CA_KEY],
        cert_pem=files[CERT],
        key_pem=files[KEY],
    )


# -- issuing ---------------------------------------------------------------------------------


def _check_job(job: str) -> None:
    if len(job) > _MAX_JOB_NAME or not _JOB_NAME.fullmatch(job):
        raise TlsError(
            f"job name {job!r} cannot name a certificate; give lower-case letters, digits, '-' "
            f"and '.' (an RFC 1123 name of at most {_MAX_JOB_NAME} characters)"
        )


def _ca_certificate(
    job: str, key: ec.EllipticCurvePrivateKey, start: datetime.datetime, end: datetime.datetime
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"planaria job {job} CA")])
    usage = x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    return (
        _builder(name, name, key.public_key(), start, end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )


def _leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    dns_name: str,
    purpose: x509.ObjectIdentifier,
    start: datetime.datetime,
    end: datetime.datetime,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_name)])
    # ECDHE-ECDSA suites sign the handshake: digital signature is the only key usage needed.
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    authority = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        _builder(subject, ca_cert.subject, key.public_key(), start, end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(authority),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    start: datetime.datetime,
    end: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(secrets.randbits(159) + 1)  # positive, at most 20 octets (RFC 5280)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


# -- checking --------------------------------------------------------------------------------


def _load_cert(pem: bytes, name: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise TlsError(f"{name} is not a PEM certificate; give the file issue() wrote") from exc


def _load_key(pem: bytes, name: str) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsError(
            f"{name} is not an unencrypted PEM private key; give the file issue() wrote"
        ) from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TlsError(f"{name} is not an EC private key; give the file issue() wrote")
    return key


def _check_pair(
    cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, cert_name: str, key_name: str
) -> None:
    if cert.public_key() != key.public_key():
        raise TlsError(f"{key_name} is not the key of {cert_name}; give the pair issued together")


def _check_signed(cert: x509.Certificate, ca_cert: x509.Certificate) -> None:
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise TlsError(
            f"{CERT} was not issued by {CA_CERT}; give the job's CA with its certificate"
        ) from exc


def _controller_job(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    common = str(names[0].value) if names else ""
    prefix, suffix = "controller.", f".{DOMAIN}"
    job = common.removeprefix(prefix).removesuffix(suffix)
    if not (common.startswith(prefix) and common.endswith(suffix)) or not _JOB_NAME.fullmatch(job):
        raise TlsError(
            f"{CERT} names {common!r}, not a job's controller; give controller_files' {CERT}"
        )
    return job
