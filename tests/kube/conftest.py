"""Fixtures for operator tests: `kube_api`, a Kubernetes API emulator on a loopback port.

`kube_api` (function scope) yields a `tests.kube.support.serving.KubeApi`: `.url`, `.kubeconfig`
(also exported as KUBECONFIG for the test, so kopf's login and
`kubernetes.config.load_kube_config()` find it), `.requests` (the log of `ApiCall`s), and
`.apply(obj)`, `.get(api_version, kind, name, namespace)`, `.list(api_version, kind, namespace,
label_selector)`, `.delete(...)`, `.load_crd(path_or_dict)`. The emulator runs in its own
thread, so blocking clients work from async tests and kopf can run in the test's loop.

`kubelet` (async, function scope) yields a started `tests.kube.support.kubelet.Kubelet` on
`kube_api`: every new pod runs as local processes (see that module); it kills them all at the
end. Tests needing options (a label selector, image entrypoints) construct `Kubelet` directly.
"""

import pathlib
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from planaria.agent.training import data
from tests.kube.support import kubelet as harness
from tests.kube.support import serving


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A small corpus file for the operator e2e jobs (`operating.e2e_spec`)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_bytes(data.load_default_corpus(max_bytes=100_000).tobytes())
    return path


@pytest.fixture
def kube_api(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[serving.KubeApi]:
    with serving.serve(tmp_path) as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
        yield api


@pytest_asyncio.fixture
async def kubelet(
    kube_api: serving.KubeApi, tmp_path: pathlib.Path
) -> AsyncIterator[harness.Kubelet]:
    """A kubelet harness running every new pod of `kube_api` as local processes."""
    async with harness.Kubelet(kube_api.url, tmp_path / "kubelet") as running:
        yield running
    assert not running.errors, f"the kubelet harness failed: {running.errors!r}"
