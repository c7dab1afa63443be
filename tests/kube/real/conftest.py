"""Fixtures for the operator against a real Kubernetes control plane (docs/testing-kubernetes.md).

`control_plane` (session) starts etcd, kube-apiserver (RBAC) and kube-controller-manager with
scripts/kube-control-plane.sh once per test session, applies the chart's CRDs as shipped and the
chart's ServiceAccount, Role and RoleBinding (rendered for namespace `default`), and stops them
at the end. When the binaries are not built, every test here is skipped with the command that
builds them (`scripts/kube-control-plane.sh build`; `bash scripts/test.sh` builds them unless
`PLANARIA_KUBE=skip`).

`admin` is a client with the cluster admin's token; `operator_kubeconfig` is a kubeconfig
holding a token of the chart's ServiceAccount, issued by the API server, so the operator runs
with exactly the chart's RBAC; `as_operator` exports it as KUBECONFIG for the test (kopf's login
and `planaria.kube.api` read it). `real_kubelet` is the kubelet harness on the real server (it
binds pods through `pods/binding` and authenticates as the admin). `refusals` keeps the
operator's warnings (and `planaria.kube`'s debug lines) and returns what lists the calls among
them that the server refused (HTTP 403), for tests that run the operator under the chart's Role.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import AsyncIterator, Callable, Generator, Iterator

import pytest
import pytest_asyncio

from tests.kube.real import cluster
from tests.kube.support import kubelet as harness

NAMESPACE = "default"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.ControlPlane]:
    if cluster.binaries() is None:
        pytest.skip(
            "the Kubernetes control plane is not built: run `scripts/kube-control-plane.sh "
            "build` once (`bash scripts/test.sh` does unless PLANARIA_KUBE=skip); it is cached"
        )
    plane = cluster.ControlPlane.start(tmp_path_factory.mktemp("control-plane"))
    try:
        admin = plane.admin()
        cluster.install_chart(admin, NAMESPACE)
        # Pods need their namespace's default ServiceAccount and its token Secret (the
        # ServiceAccount admission plugin answers "No API token found" with HTTP 500 until the
        # controller manager's token controller has added one; a CI run met that window).
        cluster.wait_until(
            lambda: _token_secret(admin, "default"),
            60,
            "the default ServiceAccount and its token Secret, created by the controller manager",
        )
        yield plane
    finally:
        plane.stop()


def _token_secret(admin: cluster.Client, account: str) -> bool:
    """The ServiceAccount exists and its token Secret is referenced and created."""
    found = admin.get("v1", "ServiceAccount", account, NAMESPACE)
    names = [ref["name"] for ref in (found or {}).get("secrets") or []]
    return any(admin.get("v1", "Secret", name, NAMESPACE) for name in names)


@pytest.fixture(scope="session")
def admin(control_plane: cluster.ControlPlane) -> cluster.Client:
    return control_plane.admin()


def operator_account() -> str:
    (account,) = [o for o in cluster.rendered_rbac(NAMESPACE) if o["kind"] == "ServiceAccount"]
    name: str = account["metadata"]["name"]
    return name


@pytest.fixture(scope="session")
def operator_token(control_plane: cluster.ControlPlane, admin: cluster.Client) -> str:
    return cluster.service_account_token(admin, NAMESPACE, operator_account())


@pytest.fixture(scope="session")
def operator_kubeconfig(
    control_plane: cluster.ControlPlane,
    operator_token: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> pathlib.Path:
    path = tmp_path_factory.mktemp("operator") / "kubeconfig"
    return control_plane.kubeconfig(path, operator_token, NAMESPACE)


@pytest.fixture
def as_operator(operator_kubeconfig: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(operator_kubeconfig))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each phase's report kept on the test (`failed_call`)."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def failed_call(item: pytest.Item) -> bool:
    report = getattr(item, "report_call", None)
    return report is not None and report.failed


LOG_TAIL = 40  # lines of each container's log printed after a failed test


@pytest_asyncio.fixture
async def real_kubelet(
    control_plane: cluster.ControlPlane, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> AsyncIterator[harness.Kubelet]:
    """The kubelet harness running every new pod of the namespace as local processes. After a
    failed test it prints the end of every container's log (what the agents said, in CI)."""
    async with harness.Kubelet(
        control_plane.server,
        tmp_path / "kubelet",
        namespace=NAMESPACE,
        token=control_plane.admin_token,
        ca_file=control_plane.ca_file,
    ) as running:
        yield running
        if failed_call(request.node):
            for process in running.processes():
                lines = process.log.read_text(errors="replace").splitlines()[-LOG_TAIL:]
                print(f"--- {process.pod} (exit {process.returncode}), {process.log}:")
                print("\n".join(line[:500] for line in lines))
    assert not running.errors, f"the kubelet harness failed: {running.errors!r}"


@pytest.fixture
def refusals(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The log lines so far that report a call refused by the server (`cluster.refused_calls`).
    Where the operator only logs a refusal (an Event not posted; a pod read, at debug level),
    this is what says that it stepped outside the chart's Role."""
    caplog.set_level(logging.WARNING)
    caplog.set_level(logging.DEBUG, logger="planaria.kube")
    return lambda: cluster.refused_calls(caplog.records)
