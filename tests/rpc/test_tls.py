"""Mutual TLS on the controller-agent channel: issued material and a real agent server.

Covers, against `service.serve` with `tls_dir` on loopback (a fake runtime behind it): the
job's controller credentials Pause, Watch and Stop through `AgentClient` (Configure over TLS is
in tests/local, against real agents) and probe health;
refused with UNAVAILABLE (the handshake fails): a plaintext client, a TLS client with no
certificate, a client certificate of another job's CA; refused with PERMISSION_DENIED (the
handshake passes, authorisation does not): a client certificate of the job's CA that names
anything but the controller; the agent's own server certificate presented as a client
certificate (refused one way or the other, the code is stated); `AgentClient.connect` with
another job's credentials is AgentUnreachable; a missing --tls-dir file or a key that is not
the certificate's stops the agent with a TlsFilesError naming it; the agent's controller name
is `tls.controller_name`.

Issued material: CA constraints (CA:true, pathlen 0, cert-sign usage), the leaves' EKUs (one
each), SANs, CN, validity from an injected `now`, distinct random serials, SKI/AKI linkage;
`write_dir` makes the directory 0700 and files 0600 under umask 0; `from_controller_files`
round-trips and names what is wrong when a file is missing, a key does not match, the
certificate is another CA's or is not a controller's; a job name that is no DNS name is refused.
"""

from __future__ import annotations

import datetime
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from planaria.agent.server import mtls, service
from planaria.contract import plan, profile
from planaria.control import ports
from planaria.rpc import client, tls
from planaria.v1 import agent_pb2 as pb
from planaria.v1 import agent_pb2_grpc
from planaria.wire import messages

JOB = "tls-job"
W = plan.WorkerId


class _FakeRuntime:
    """Accepts every command and records it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _ack(self, name: str) -> messages.Acknowledgement:
        self.calls.append(name)
        return messages.Acknowledgement(accepted=True)

    def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement:
        return self._ack("configure")

    def heartbeat(self) -> messages.Heartbeat:
        return messages.Heartbeat(
            worker=W(1),
            epoch=1,
            state=messages.AgentState.RUNNING,
            last_committed_step=len(self.calls),
            loss=None,
            samples_processed=0,
            timings=messages.Timings(),
            snapshot=messages.SnapshotState(),
        )

    def pause(self, epoch: int) -> messages.Acknowledgement:
        return self._ack("pause")

    def resume(self, epoch: int) -> messages.Acknowledgement:
        return self._ack("resume")

    def stop(self, grace_s: float) -> messages.Acknowledgement:
        return self._ack("stop")

    def take_snapshot(self, epoch: int) -> messages.Acknowledgement:
        return self._ack("take_snapshot")

    def snapshot_state(self) -> messages.SnapshotState:
        return messages.SnapshotState()

    def load_snapshot(self, load: messages.SnapshotLoad) -> messages.Acknowledgement:
        return self._ack("load_snapshot")

    def profile(self, order: messages.ProfileOrder) -> profile.Profile:
        raise ValueError("busy")

    crashed = False  # RuntimeLike: this fake never stops by itself

    def wait_stopped(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True, kw_only=True)
class _Agent:
    address: str
    creds: tls.JobCredentials
    runtime: _FakeRuntime


@pytest.fixture(scope="module")
def creds() -> tls.JobCredentials:
    return tls.issue(JOB)


@pytest.fixture
def agent(tmp_path: Path, creds: tls.JobCredentials) -> Iterator[_Agent]:
    tls.write_dir(tls.agent_files(creds), tmp_path / "agent-tls")
    runtime, ready = _FakeRuntime(), tmp_path / "ready"
    options = service.Options(
        worker=W(1), job=JOB, ready_file=ready, grace_s=0.2, tls_dir=tmp_path / "agent-tls"
    )
    thread = threading.Thread(target=service.serve, args=(options, runtime))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert thread.is_alive() and time.monotonic() < deadline, "the agent never served"
            time.sleep(0.02)
        address = ready.read_text().strip()
        yield _Agent(address=address, creds=creds, runtime=runtime)
    finally:
        if thread.is_alive():
            _stop(address, creds)
        thread.join(10)
        assert not thread.is_alive()


def _stop(address: str, creds: tls.JobCredentials) -> None:
    key, cert = creds.controller_key_pem, creds.controller_cert_pem
    with _channel(address, creds.ca_cert_pem, key, cert) as channel:
        try:
            agent_pb2_grpc.AgentServiceStub(channel).Stop(pb.StopRequest(grace_s=0.2), timeout=5)
        except grpc.RpcError as exc:  # a test stopped it already and the server is going
            assert exc.code() is grpc.StatusCode.UNAVAILABLE


def _channel(
    address: str, root: bytes, key: bytes | None = None, cert: bytes | None = None
) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(root, key, cert)
    options = (("grpc.ssl_target_name_override", tls.agent_server_name(JOB)),)
    return grpc.secure_channel(address, credentials, options=options)


def _pause_code(channel: grpc.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        agent_pb2_grpc.AgentServiceStub(channel).Pause(pb.PauseRequest(epoch=1), timeout=5)
    code: grpc.StatusCode = caught.value.code()
    return code


# -- the channel -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_controller_pauses_watches_and_stops(agent: _Agent) -> None:
    controller = tls.controller_tls(agent.creds)
    link = await client.AgentClient.connect(W(1), agent.address, timeout_s=5, tls=controller)
    try:
        assert (await link.pause(1)).accepted
        async for heartbeat in link.watch(0.05):
            assert heartbeat.worker == W(1)
            break
        assert (await link.stop(0.2)).accepted
    finally:
        await link.close()
    assert agent.runtime.calls[:2] == ["pause", "stop"]


def test_health_answers_over_the_same_tls_port(agent: _Agent) -> None:
    key, cert = agent.creds.controller_key_pem, agent.creds.controller_cert_pem
    with _channel(agent.address, agent.creds.ca_cert_pem, key, cert) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service.SERVICE), timeout=5
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_a_plaintext_client_is_refused(agent: _Agent) -> None:
    with grpc.insecure_channel(agent.address) as channel:
        assert _pause_code(channel) is grpc.StatusCode.UNAVAILABLE
    assert agent.runtime.calls == []


def test_a_client_without_a_certificate_is_refused(agent: _Agent) -> None:
    with _channel(agent.address, agent.creds.ca_cert_pem) as channel:
        assert _pause_code(channel) is grpc.StatusCode.UNAVAILABLE
    assert agent.runtime.calls == []


def test_a_certificate_of_another_jobs_ca_is_refused(agent: _Agent) -> None:
    other = tls.issue("other-job")
    key, cert = other.controller_key_pem, other.controller_cert_pem
    with _channel(agent.address, agent.creds.ca_cert_pem, key, cert) as channel:
        assert _pause_code(channel) is grpc.StatusCode.UNAVAILABLE
    assert agent.runtime.calls == []


def test_the_agents_own_certificate_cannot_steer_an_agent(agent: _Agent) -> None:
    key, cert = agent.creds.agent_key_pem, agent.creds.agent_cert_pem
    with _channel(agent.address, agent.creds.ca_cert_pem, key, cert) as channel:
        # BoringSSL refuses a serverAuth-only certificate as a client's; were it accepted, the
        # agent's own name is not the controller's and the call is PERMISSION_DENIED instead.
        assert _pause_code(channel) is grpc.StatusCode.UNAVAILABLE
    assert agent.runtime.calls == []


def test_a_client_certificate_of_the_jobs_ca_naming_someone_else_is_denied(
    agent: _Agent,
) -> None:
    key, cert = _client_cert(agent.creds, f"agent.{JOB}.{tls.DOMAIN}")
    with _channel(agent.address, agent.creds.ca_cert_pem, key, cert) as channel:
        assert _pause_code(channel) is grpc.StatusCode.PERMISSION_DENIED
        # the health service is left to the handshake, which this certificate passes
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert agent.runtime.calls == []


@pytest.mark.asyncio
async def test_another_jobs_controller_cannot_connect(agent: _Agent) -> None:
    other = tls.controller_tls(tls.issue("other-job"))
    with pytest.raises(ports.AgentUnreachable, match="worker 1"):
        await client.AgentClient.connect(W(1), agent.address, timeout_s=0.5, tls=other)


@pytest.mark.parametrize(
    ("key", "said"),
    [(None, r"tls\.key.*--tls-dir"), (b"other", "tls.key is not the key of tls.crt")],
    ids=["a missing key", "another job's key"],
)
def test_unusable_tls_files_stop_the_agent_naming_the_file(
    tmp_path: Path, creds: tls.JobCredentials, key: bytes | None, said: str
) -> None:
    files = tls.agent_files(creds)
    del files[tls.KEY]
    if key is not None:
        files[tls.KEY] = tls.issue("other-job").agent_key_pem
    tls.write_dir(files, tmp_path)
    options = service.Options(worker=W(1), job=JOB, tls_dir=tmp_path)
    with pytest.raises(mtls.TlsFilesError, match=said):
        service.serve(options, _FakeRuntime())


def test_the_agent_and_the_issuer_agree_on_the_controllers_name() -> None:
    assert mtls.controller_name(JOB) == tls.controller_name(JOB)
    assert mtls.TLS_FILES == tls.AGENT_FILES


def _client_cert(creds: tls.JobCredentials, name: str) -> tuple[bytes, bytes]:
    """A clientAuth certificate of the job's CA for `name` (what a stolen CA key could make)."""
    ca_cert = x509.load_pem_x509_certificate(creds.ca_cert_pem)
    ca_key = serialization.load_pem_private_key(creds.ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


# -- issued material -------------------------------------------------------------------------

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def dated() -> tls.JobCredentials:
    return tls.issue("demo", valid_days=30, now=NOW)


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_the_ca_may_sign_leaves_only(dated: tls.JobCredentials) -> None:
    ca = _cert(dated.ca_cert_pem)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and not usage.digital_signature
    assert ca.subject == ca.issuer
    assert ca.subject.rfc4514_string() == "CN=planaria job demo CA"
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)


@pytest.mark.parametrize(
    ("which", "name", "purpose"),
    [
        ("agent", "agent.demo.planaria.internal", ExtendedKeyUsageOID.SERVER_AUTH),
        ("controller", "controller.demo.planaria.internal", ExtendedKeyUsageOID.CLIENT_AUTH),
    ],
    ids=["the agents' certificate serves only", "the controller's certificate is a client only"],
)
def test_leaves_carry_one_purpose_and_their_name(
    dated: tls.JobCredentials, which: str, name: str, purpose: x509.ObjectIdentifier
) -> None:
    ca = _cert(dated.ca_cert_pem)
    leaf = _cert(getattr(dated, f"{which}_cert_pem"))
    leaf.verify_directly_issued_by(ca)
    assert list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [purpose]
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [name]
    assert leaf.subject.rfc4514_string() == f"CN={name}"
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest


def test_validity_runs_from_now_less_the_skew_for_the_days_asked(
    dated: tls.JobCredentials,
) -> None:
    for pem in (dated.ca_cert_pem, dated.agent_cert_pem, dated.controller_cert_pem):
        cert = _cert(pem)
        assert cert.not_valid_before_utc == NOW - tls.CLOCK_SKEW
        assert cert.not_valid_after_utc == NOW + datetime.timedelta(days=30)


def test_serials_are_random_and_distinct(dated: tls.JobCredentials) -> None:
    again = tls.issue("demo", valid_days=30, now=NOW)
    pems = [dated.ca_cert_pem, dated.agent_cert_pem, dated.controller_cert_pem]
    pems += [again.ca_cert_pem, again.agent_cert_pem, again.controller_cert_pem]
    serials = {_cert(pem).serial_number for pem in pems}
    assert len(serials) == 6 and all(0 < s < 2**159 + 1 for s in serials)


def test_write_dir_makes_0700_and_0600_whatever_the_umask(
    tmp_path: Path, dated: tls.JobCredentials
) -> None:
    previous = os.umask(0)
    try:
        tls.write_dir(tls.controller_files(dated), tmp_path / "controller")
    finally:
        os.umask(previous)
    folder = tmp_path / "controller"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == sorted(tls.CONTROLLER_FILES)
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o600}


def test_controller_material_round_trips_through_a_directory(
    tmp_path: Path, dated: tls.JobCredentials
) -> None:
    tls.write_dir(tls.controller_files(dated), tmp_path)
    loaded = tls.read_controller_dir(tmp_path)
    assert loaded == tls.controller_tls(dated)
    assert (loaded.job, loaded.server_name) == ("demo", "agent.demo.planaria.internal")
    assert (loaded.cert_pem, loaded.key_pem) == (
        dated.controller_cert_pem,
        dated.controller_key_pem,
    )


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"tls.key": None}, "lacks tls.key"),
        ({"tls.key": "other.controller_key_pem"}, "tls.key is not the key of tls.crt"),
        ({"ca.key": "other.ca_key_pem"}, "ca.key is not the key of ca.crt"),
        (
            {"tls.crt": "other.controller_cert_pem", "tls.key": "other.controller_key_pem"},
            "tls.crt was not issued by ca.crt",
        ),
        (
            {"tls.crt": "dated.agent_cert_pem", "tls.key": "dated.agent_key_pem"},
            "not a job's controller",
        ),
        ({"ca.crt": b"garbage"}, "ca.crt is not a PEM certificate"),
    ],
    ids=[
        "a missing key file",
        "another job's key",
        "another CA key",
        "another CA's certificate",
        "the agents' certificate",
        "a file that is no PEM",
    ],
)
def test_bad_controller_material_is_named(
    dated: tls.JobCredentials, change: dict[str, object], said: str
) -> None:
    other = tls.issue("other")
    files = tls.controller_files(dated)
    for name, value in change.items():
        if value is None:
            del files[name]
        elif isinstance(value, bytes):
            files[name] = value
        else:
            source, field = str(value).split(".")
            files[name] = getattr({"other": other, "dated": dated}[source], field)
    with pytest.raises(tls.TlsError, match=said):
        tls.from_controller_files(files)


def test_reading_a_missing_directory_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(tls.TlsError, match=r"ca\.crt"):
        tls.read_controller_dir(tmp_path / "nowhere")


@pytest.mark.parametrize("job", ["Upper", "under_score", "-dash", "a" * 240, ""])
def test_a_job_name_that_is_no_dns_name_is_refused(job: str) -> None:
    with pytest.raises(tls.TlsError, match="RFC 1123"):
        tls.issue(job)
