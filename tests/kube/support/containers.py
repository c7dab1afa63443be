"""How the kubelet harness turns a pod's container into a local process: argv, env, volumes.

- `$(VAR)` expansion as Kubernetes does it: from the container's env entries defined earlier
  (and, for command and args, all of them); `$$(VAR)` is a literal `$(VAR)`; an undefined
  `$(VAR)` stays as written.
- env: `value`, `valueFrom.fieldRef` (metadata.name, metadata.namespace, metadata.uid,
  metadata.labels['k'], metadata.annotations['k'], spec.nodeName, status.podIP, status.hostIP),
  `secretKeyRef` and `configMapKeyRef` (from objects the caller fetched). The process inherits
  the harness's own environment underneath (PATH, the virtual environment), unlike a container.
- volumes: `emptyDir` is a fresh directory per pod (a pod recreated under the same name gets an
  empty one, as its own node memory; a container restart keeps it), `secret` and `configMap`
  directories hold one file per key (or per `items` entry, at its `path`), with
  `defaultMode`/`mode`.
- mounts: there are no mount namespaces, so every container's `mountPath` (with `subPath`) is
  rewritten to its volume's directory wherever an argument, a command word or an env value
  equals it or starts with it followed by `/`; `workingDir` likewise. This is the harness's
  stand-in for mounts, and the one place where a process sees different paths than in a pod.
- executables: `planaria` runs as `[sys.executable, "-m", "planaria"]`, `python`/`python3` as
  `sys.executable`; a container without `command` uses `entrypoints[image]` (the image's
  ENTRYPOINT, which the harness cannot read), else it cannot start.

Errors: `ContainerError` (a ValueError) for a container the harness cannot run; its message
says what to add (a command, an entrypoint, a missing secret key).
"""

import base64
import os
import pathlib
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

Json = dict[str, Any]
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_EXECUTABLES: dict[str, list[str]] = {
    "planaria": [sys.executable, "-m", "planaria"],
    "python": [sys.executable],
    "python3": [sys.executable],
}


class ContainerError(ValueError):
    """A container the harness cannot run; the message says what is missing."""


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion (see the module doc)."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return variables.get(name, match.group(0))

    # `$$(X)` must come out as `$(X)`: the `$$` alternative consumes the first `$`.
    return _REFERENCE.sub(replace, text)


def field_value(pod: Json, path: str) -> str:
    """A downward-API field of the pod, as `fieldRef.fieldPath` names it."""
    meta = pod.get("metadata", {})
    if match := re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path):
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    value: Any = pod
    for part in path.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return str(value)


def _key_ref(ref: Json, sources: Mapping[str, Mapping[str, str]], what: str) -> str | None:
    data = sources.get(ref.get("name", ""))
    if data is None or ref.get("key") not in data:
        if ref.get("optional"):
            return None
        raise ContainerError(f"{what} {ref.get('name')!r} has no key {ref.get('key')!r}: create it")
    return data[ref["key"]]


def environment(
    pod: Json,
    container: Json,
    secrets: Mapping[str, Mapping[str, str]],
    config_maps: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    """The container's own variables, in order, each expanded against the earlier ones.
    `secrets` and `config_maps` map object names to their decoded data."""
    variables: dict[str, str] = {}
    for entry in container.get("env") or []:
        source = entry.get("valueFrom") or {}
        value: str | None
        if "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            value = _key_ref(source["secretKeyRef"], secrets, "secret")
        elif "configMapKeyRef" in source:
            value = _key_ref(source["configMapKeyRef"], config_maps, "configMap")
        else:
            value = expand(str(entry.get("value", "")), variables)
        if value is not None:
            variables[entry["name"]] = value
    return variables


def decoded(secret: Json) -> dict[str, str]:
    """A Secret's data, base64-decoded (text)."""
    return {
        key: base64.b64decode(value).decode() for key, value in (secret.get("data") or {}).items()
    }


def _write_files(directory: pathlib.Path, data: Mapping[str, bytes], volume: Json) -> None:
    items = volume.get("items")
    chosen = (
        [(item["key"], item["path"], item.get("mode")) for item in items]
        if items
        else [(key, key, None) for key in data]
    )
    default_mode = volume.get("defaultMode", 0o644)
    for key, relative, mode in chosen:
        if key not in data:
            raise ContainerError(f"volume source has no key {key!r}: fix the volume's items")
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[key])
        path.chmod(mode if mode is not None else default_mode)


def materialize(
    pod: Json, root: pathlib.Path, secrets: Mapping[str, Json], config_maps: Mapping[str, Json]
) -> dict[str, pathlib.Path]:
    """Create each volume's directory under `root`; returns volume name -> directory."""
    directories = {}
    for volume in pod["spec"].get("volumes") or []:
        directory = root / volume["name"]
        if "emptyDir" in volume:  # a new pod's is empty, even under a gone pod's name: its
            shutil.rmtree(directory, ignore_errors=True)  # node memory went with that pod
        directory.mkdir(parents=True, exist_ok=True)
        if "secret" in volume:
            source = secrets[volume["secret"]["secretName"]]
            raw = {k: base64.b64decode(v) for k, v in (source.get("data") or {}).items()}
            _write_files(directory, raw, volume["secret"])
        elif "configMap" in volume:
            source = config_maps[volume["configMap"]["name"]]
            raw = {k: str(v).encode() for k, v in (source.get("data") or {}).items()}
            _write_files(directory, raw, volume["configMap"])
        elif "emptyDir" not in volume:
            raise ContainerError(f"volume {volume['name']!r}: only emptyDir, secret and configMap")
        directories[volume["name"]] = directory
    return directories


def mount_table(container: Json, volumes: Mapping[str, pathlib.Path]) -> list[tuple[str, str]]:
    """(mountPath, local directory) pairs, longest mountPath first (so nested mounts win)."""
    table = []
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in volumes:
            raise ContainerError(f"mount {mount['mountPath']!r} names no volume {mount['name']!r}")
        local = volumes[mount["name"]] / mount.get("subPath", "")
        table.append((mount["mountPath"].rstrip("/") or "/", str(local)))
    return sorted(table, key=lambda pair: -len(pair[0]))


def remount(text: str, table: Sequence[tuple[str, str]]) -> str:
    """Rewrite a value that is, or starts with, a mountPath (see the module doc)."""
    for mount_path, local in table:
        if text == mount_path or text.startswith(mount_path + "/"):
            return local + text[len(mount_path) :]
    return text


def argv(
    container: Json,
    variables: Mapping[str, str],
    entrypoints: Mapping[str, Sequence[str]],
    table: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """command + args, expanded and remounted, then our executables mapped. The mapped
    executables are this machine's paths: never remounted (a checkout under /tmp would
    otherwise be rewritten into the pod's /tmp emptyDir)."""
    image = str(container.get("image", ""))
    command = (
        container.get("command")
        or entrypoints.get(image)
        or entrypoints.get(image.rsplit(":", 1)[0])
    )
    if not command:
        raise ContainerError(
            f"container {container['name']!r} has no command and image {image!r} no known "
            "entrypoint: set command, or pass entrypoints={image: [...]} to the kubelet"
        )
    spec_words = [*command, *(container.get("args") or [])]
    words = [remount(expand(str(word), variables), table) for word in spec_words]
    return [*_EXECUTABLES.get(words[0], [words[0]]), *words[1:]]


def process_env(variables: Mapping[str, str], table: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The process's environment: ours underneath, the container's (remounted) on top."""
    return {**os.environ, **{name: remount(value, table) for name, value in variables.items()}}
