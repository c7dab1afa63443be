"""The committed generated code of the gRPC contract is exactly what the .proto files produce.

Covers: scripts/generate_protos.py, run into a temporary folder, writes byte-for-byte the
committed `*_pb2.py`, `*_pb2_grpc.py`, `*_pb2.pyi` and `*_pb2_grpc.pyi` of every .proto file,
and no file that is not committed; the committed modules import with the installed protobuf and
grpc runtimes without a warning (version checks of the generated code included).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi")


def _generated_files(root: Path) -> dict[str, bytes]:
    """Generated files under root/planaria, by path relative to root."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted((root / "planaria").rglob("*"))
        if path.name.endswith(GENERATED)
    }


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("protos")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_protos.py"), str(out)],
        check=True,
        capture_output=True,
    )
    return _generated_files(out)


def test_every_proto_file_has_its_four_generated_files(regenerated: dict[str, bytes]) -> None:
    protos = sorted((ROOT / "protos" / "planaria").rglob("*.proto"))
    assert protos, "no .proto files found under protos/planaria"
    expected = {
        str(proto.relative_to(ROOT / "protos")).removesuffix(".proto") + suffix
        for proto in protos
        for suffix in GENERATED
    }
    assert set(regenerated) == expected


def test_the_committed_generated_code_is_current(regenerated: dict[str, bytes]) -> None:
    committed = _generated_files(ROOT / "protos")
    stale = sorted(name for name in regenerated if committed.get(name) != regenerated[name])
    extra = sorted(set(committed) - set(regenerated))
    assert not stale, f"{stale} differ: run .venv/bin/python scripts/generate_protos.py"
    assert not extra, f"{extra} have no .proto file any more: delete them"


def test_the_generated_code_imports_without_warnings() -> None:
    code = "from planaria.v1 import agent_pb2, agent_pb2_grpc; print(agent_pb2.DESCRIPTOR.package)"
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "planaria.v1"
