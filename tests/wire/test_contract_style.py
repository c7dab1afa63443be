"""agent.proto follows the house contract style (STYLE.md rule 9, Buf's style guide).

Covers, read from protoc's descriptor with source info: package planaria.v1; every RPC takes
its own `XRequest` and returns its own `XResponse`, used by no other RPC; every enum's zero value
is `<ENUM>_UNSPECIFIED` and every value carries the enum's prefix; message, field and enum names
are cased as Buf wants; every service, RPC, message, field, enum and enum value has a comment.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO = "planaria/v1/agent.proto"

# Paths into FileDescriptorProto (descriptor.proto field numbers) that SourceCodeInfo uses.
MESSAGE, FIELD, ENUM, VALUE, SERVICE, METHOD = 4, 2, 5, 2, 6, 2


@pytest.fixture(scope="module")
def proto(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path_factory.mktemp("descriptor") / "set.pb"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={ROOT / 'protos'}",
            f"--proto_path={resources.files('grpc_tools') / '_proto'}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            PROTO,
        ]
    )
    assert status == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (file,) = files.file
    return file


def _upper_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def test_the_package_is_planaria_v1(proto: descriptor_pb2.FileDescriptorProto) -> None:
    assert proto.package == "planaria.v1"
    assert proto.syntax == "proto3"


def test_every_rpc_has_its_own_request_and_response(
    proto: descriptor_pb2.FileDescriptorProto,
) -> None:
    (service,) = proto.service
    used = []
    for method in service.method:
        assert method.input_type == f".planaria.v1.{method.name}Request"
        assert method.output_type == f".planaria.v1.{method.name}Response"
        used += [method.input_type, method.output_type]
    assert len(used) == len(set(used))


def test_enum_values_are_prefixed_and_zero_is_unspecified(
    proto: descriptor_pb2.FileDescriptorProto,
) -> None:
    assert proto.enum_type
    for enum in proto.enum_type:
        prefix = _upper_snake(enum.name) + "_"
        assert enum.value[0].number == 0
        assert enum.value[0].name == prefix + "UNSPECIFIED"
        assert all(value.name.startswith(prefix) for value in enum.value), enum.name


def test_names_are_cased_as_buf_wants(proto: descriptor_pb2.FileDescriptorProto) -> None:
    for message in proto.message_type:
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", message.name), message.name
        for field in message.field:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", field.name), f"{message.name}.{field.name}"
    for enum in proto.enum_type:
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", enum.name), enum.name
        assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*", v.name) for v in enum.value), enum.name


def test_every_element_has_a_comment(proto: descriptor_pb2.FileDescriptorProto) -> None:
    commented = {
        tuple(location.path)
        for location in proto.source_code_info.location
        if location.leading_comments.strip()
    }
    elements: dict[tuple[int, ...], str] = {}
    for i, message in enumerate(proto.message_type):
        elements[(MESSAGE, i)] = message.name
        for j, field in enumerate(message.field):
            elements[(MESSAGE, i, FIELD, j)] = f"{message.name}.{field.name}"
    for i, enum in enumerate(proto.enum_type):
        elements[(ENUM, i)] = enum.name
        for j, value in enumerate(enum.value):
            elements[(ENUM, i, VALUE, j)] = value.name
    for i, service in enumerate(proto.service):
        elements[(SERVICE, i)] = service.name
        for j, method in enumerate(service.method):
            elements[(SERVICE, i, METHOD, j)] = f"{service.name}.{method.name}"
    uncommented = sorted(name for path, name in elements.items() if path not in commented)
    assert not uncommented, f"comment these in {PROTO}: {uncommented}"
