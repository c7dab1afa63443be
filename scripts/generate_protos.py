"""Regenerate the committed code of the gRPC contract from protos/planaria/v1/*.proto.

    .venv/bin/python scripts/generate_protos.py            # in place, into protos/
    .venv/bin/python scripts/generate_protos.py OUT_DIR    # into OUT_DIR/planaria/v1/

Runs grpcio-tools' bundled protoc with the include root protos/, so generated imports read
`from planaria.v1 import agent_pb2`. Writes, per .proto file, `*_pb2.py` and `*_pb2_grpc.py`
(messages and gRPC stubs) and the typed stubs `*_pb2.pyi` and `*_pb2_grpc.pyi` (mypy-protobuf's
protoc-gen-mypy and protoc-gen-mypy_grpc, taken from the interpreter's bin folder).
tests/architecture/test_protos_current.py runs this into a temporary folder and compares the
result byte for byte with the committed files.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"
PLUGINS = ("protoc-gen-mypy", "protoc-gen-mypy_grpc")


class GenerationError(RuntimeError):
    """protoc or a plugin failed, or a plugin is not installed."""


def proto_files() -> list[Path]:
    """The contract's .proto files, relative to the include root, in a stable order."""
    return sorted(p.relative_to(PROTO_ROOT) for p in (PROTO_ROOT / "planaria").rglob("*.proto"))


def plugin_args() -> list[str]:
    """`--plugin=NAME=PATH` for mypy-protobuf's plugins, installed beside this interpreter."""
    bin_dir = Path(sys.executable).parent
    args = []
    for name in PLUGINS:
        path = bin_dir / name
        if not path.exists():
            raise GenerationError(f"{path} is missing: install the test extras (mypy-protobuf)")
        args.append(f"--plugin={name}={path}")
    return args


def generate(out_dir: Path) -> None:
    """Write the generated code of every .proto file under `out_dir` (its package folders)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    outputs = ("python_out", "grpc_python_out", "mypy_out", "mypy_grpc_out")
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        *plugin_args(),
        *(f"--{flag}={out_dir}" for flag in outputs),
        *(str(path) for path in proto_files()),
    ]
    status = protoc.main(args)
    if status != 0:
        raise GenerationError(f"protoc exited with status {status}: {' '.join(args)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out_dir", nargs="?", type=Path, default=PROTO_ROOT, help="default: protos/ (in place)"
    )
    generate(parser.parse_args().out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
