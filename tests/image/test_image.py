"""The container image: the Dockerfile's pip set-up for mirrors and air-gapped builds, and the
built image's entrypoints as the chart runs them (docs/kubernetes.md, "Building the image").

The Dockerfile tests run its build-stage shell steps as a build would (build arguments in the
environment, `/bin/sh -c`), with a `pip` that only records its arguments. The image test runs
`scripts/build-image.sh check` on the image that script built; when none is built it is skipped
with the command that builds it (`scripts/build-image.sh build`, or
`PLANARIA_IMAGE=build bash scripts/test.sh`).
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
SCRIPT = ROOT / "scripts" / "build-image.sh"
# Markers of the two build-stage steps under test: torch's install and pip's configuration.
TORCH_STEP = 'pip install "$@" "$wheel"'
CONFIG_STEP = 'conf="$PIP_CONFIG_FILE"'


def stage(name: str) -> str:
    """The Dockerfile's stage `name`, continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", "")
    return text.split(f" AS {name}\n", 1)[1].split("\nFROM ", 1)[0]


def build_stage() -> tuple[dict[str, str], list[str]]:
    """The dependencies stage's ARG defaults and its RUN commands (where pip is configured and
    torch installed)."""
    stage_text = stage("deps")
    args = dict(
        (m.group(1), m.group(2)) for m in re.finditer(r"^ARG (\w+)=(.*)$", stage_text, re.M)
    )
    runs = [m.group(1) for m in re.finditer(r"^RUN (.*)$", stage_text, re.M)]
    return args, runs


def run_step(
    marker: str, tmp_path: pathlib.Path, **build_args: str
) -> subprocess.CompletedProcess[str]:
    """Runs the build stage's RUN step containing `marker` with the ARG defaults overridden by
    `build_args`; `pip` on PATH writes its arguments, one a line, to tmp_path/pip-args."""
    args, runs = build_stage()
    (step,) = [run for run in runs if marker in run]
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "pip").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/pip-args\n')
    (shim / "pip").chmod(0o755)
    env = {
        "PATH": f"{shim}:/usr/bin:/bin",
        "PIP_CONFIG_FILE": str(tmp_path / "planaria-build-pip.conf"),
        **args,
        **build_args,
    }
    return subprocess.run(["/bin/sh", "-c", step], env=env, capture_output=True, text=True)


def pip_args(tmp_path: pathlib.Path) -> list[str]:
    return (tmp_path / "pip-args").read_text().splitlines()


def test_default_cpu_torch_comes_from_the_cpu_index_pinned_to_the_cpu_build(
    tmp_path: pathlib.Path,
) -> None:
    done = run_step(TORCH_STEP, tmp_path, TORCH="cpu")
    assert done.returncode == 0, done.stderr
    assert pip_args(tmp_path) == [
        "install",
        "--index-url",
        "https://download.pytorch.org/whl/cpu",
        "torch==2.13.0+cpu",
    ]


def test_cuda_torch_comes_from_the_package_index(tmp_path: pathlib.Path) -> None:
    done = run_step(TORCH_STEP, tmp_path, TORCH="cuda")
    assert done.returncode == 0, done.stderr
    assert pip_args(tmp_path) == ["install", "torch==2.13.0"]


@pytest.mark.parametrize(
    ("torch_index", "expected"),
    [
        ("none", ["--no-index"]),
        ("https://mirror.example/torch-cpu", ["--index-url", "https://mirror.example/torch-cpu"]),
    ],
)
def test_a_torch_mirror_or_find_links_only_replaces_the_cpu_index(
    tmp_path: pathlib.Path, torch_index: str, expected: list[str]
) -> None:
    done = run_step(TORCH_STEP, tmp_path, TORCH="cpu", TORCH_INDEX_URL=torch_index)
    assert done.returncode == 0, done.stderr
    assert pip_args(tmp_path) == ["install", *expected, "torch==2.13.0+cpu"]


def test_an_unknown_torch_flavour_fails_the_build_with_one_line(tmp_path: pathlib.Path) -> None:
    done = run_step(TORCH_STEP, tmp_path, TORCH="rocm")
    assert done.returncode == 2
    assert done.stderr.strip() == "TORCH must be cpu or cuda, got 'rocm'"
    assert not (tmp_path / "pip-args").exists()


def pip_config(tmp_path: pathlib.Path, **build_args: str) -> str:
    done = run_step(CONFIG_STEP, tmp_path, **build_args)
    assert done.returncode == 0, done.stderr
    return (tmp_path / "planaria-build-pip.conf").read_text()


def test_by_default_pip_uses_pypi_and_nothing_else(tmp_path: pathlib.Path) -> None:
    assert pip_config(tmp_path) == "[global]\nindex-url = https://pypi.org/simple\n"
    assert not (tmp_path / "planaria-build-pip-ca.pem").exists()


def test_mirror_find_links_and_ca_bundle_become_the_build_stage_pip_config(
    tmp_path: pathlib.Path,
) -> None:
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    config = pip_config(
        tmp_path,
        INDEX_URL="https://mirror.example/simple",
        EXTRA_INDEX_URL="file:///opt/pypi/simple https://other.example/simple",
        FIND_LINKS="/opt/wheels",
        CA_BUNDLE=ca,
    )
    bundle = tmp_path / "planaria-build-pip-ca.pem"
    assert config == (
        "[global]\n"
        "index-url = https://mirror.example/simple\n"
        "extra-index-url = file:///opt/pypi/simple https://other.example/simple\n"
        "find-links = /opt/wheels\n"
        f"cert = {bundle}\n"
    )
    system = pathlib.Path("/etc/ssl/certs/ca-certificates.crt")
    base = system.read_text() if system.exists() else ""
    assert bundle.read_text() == base + ca + "\n"


def test_an_air_gapped_build_asks_no_index(tmp_path: pathlib.Path) -> None:
    config = pip_config(tmp_path, INDEX_URL="none", FIND_LINKS="/wheels")
    assert config == "[global]\nno-index = true\nfind-links = /wheels\n"


def test_the_runtime_stage_gets_no_build_arguments_and_runs_as_uid_10001() -> None:
    runtime = DOCKERFILE.read_text().split(" AS runtime\n", 1)[1]
    assert "ARG " not in runtime and "pip" not in runtime
    assert "\nUSER 10001:10001\n" in runtime
    assert 'ENTRYPOINT ["planaria"]' in runtime


def test_the_requirements_step_lists_the_dependencies_and_the_hf_extra_only(
    tmp_path: pathlib.Path,
) -> None:
    (step,) = re.findall(r"^RUN (.*)$", stage("requirements"), re.M)
    script = step.replace("python3 ", f"{sys.executable} ", 1)
    script = script.replace("/src/pyproject.toml", str(ROOT / "pyproject.toml"))
    script = script.replace(">/requirements.txt", f">{tmp_path / 'requirements.txt'}")
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = (tmp_path / "requirements.txt").read_text().splitlines()
    assert listed == project["dependencies"] + project["optional-dependencies"]["hf"]
    assert any(line.startswith("torch") for line in listed)
    assert not any(line.startswith("pytest") for line in listed)


def test_a_change_to_the_code_cannot_reach_the_dependencies_layers() -> None:
    """The code is copied only into the build stage, after the dependencies; the dependencies
    stage sees only the dependency list, so its layers (and the runtime's copy of the venv) are
    cache hits after a change to the code."""
    copies = {
        name: re.findall(r"^COPY (.*)$", stage(name), re.M) for name in ("requirements", "deps")
    }
    assert copies == {
        "requirements": ["pyproject.toml /src/"],
        "deps": ["--from=requirements /requirements.txt /src/requirements.txt"],
    }
    assert "\nFROM deps AS build\n" in DOCKERFILE.read_text()
    assert "pip install --no-deps --no-compile --target /opt/planaria/app ." in stage("build")
    runtime = re.findall(r"^COPY (.*)$", DOCKERFILE.read_text().split(" AS runtime\n", 1)[1], re.M)
    assert runtime == [
        "--from=deps /opt/planaria /opt/planaria",
        "--from=build /opt/planaria/app /opt/planaria/app",
    ]


@functools.cache
def built_image() -> str | None:
    """The built image's name, or None (asked once per session: the script hashes the inputs)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    found = subprocess.run(["bash", str(SCRIPT), "name"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def image_or_skip() -> str:
    """The built image's name; the calling test is skipped, saying how to build it, without."""
    image = built_image()
    if image is None:
        pytest.skip(
            "the image is not built (or this is not root): run `scripts/build-image.sh build` "
            "(or `PLANARIA_IMAGE=build bash scripts/test.sh`) once; it is cached"
        )
    return image


def test_the_entrypoints_start_in_the_image_as_uid_10001_on_a_read_only_root() -> None:
    image = image_or_skip()
    done = subprocess.run(["bash", str(SCRIPT), "check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "== uid 10001, read-only root, writable /tmp and /dev/shm: ok" in lines
    for command in ("--help", "operator --help", "agent --help", "version", "reference"):
        assert any(line.startswith(f"== planaria {command}") for line in lines), done.stdout
    assert not [line for line in lines if line.startswith("== ") and ": ok" not in line]
    assert lines[-1] == f"build-image: every entrypoint starts in {image} as uid 10001"
