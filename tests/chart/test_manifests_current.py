"""The committed generated files are what scripts/render_manifests.py produces now.

Covers: the script, run into a temporary folder, writes byte for byte the committed
charts/planaria/crds/resilientjobs.yaml, manifests/crd.yaml and manifests/operator.yaml (a change
to planaria.kube.crd, the pydantic models or the chart templates that was not re-rendered
fails here, with the command that fixes it); operator.yaml holds a Namespace first and no Helm
release labels.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GENERATED = (
    "charts/planaria/crds/resilientjobs.yaml",
    "manifests/crd.yaml",
    "manifests/operator.yaml",
)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rendered")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_manifests.py"), str(out)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.mark.parametrize("path", GENERATED)
def test_a_generated_file_is_current(rendered: Path, path: str) -> None:
    fresh, committed = (rendered / path).read_text(), (ROOT / path).read_text()
    assert fresh == committed, f"{path} is stale: run .venv/bin/python scripts/render_manifests.py"


def test_the_plain_manifests_create_their_namespace_first_and_carry_no_helm_labels() -> None:
    text = (ROOT / "manifests" / "operator.yaml").read_text()
    documents = list(yaml.safe_load_all(text))
    assert documents[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "planaria-system"},
    }
    assert "helm.sh/chart" not in text and "managed-by: Helm" not in text
