"""The Dockerfile, checked statically (no Docker in CI): what the chart and the CLI rely on.

Covers: the stages (requirements: the dependency list from pyproject; deps: the virtual
environment with torch and those dependencies; build: Planaria alone on top; runtime: the deps'
environment and the build's app folder, nothing else); the TORCH build argument (cpu by default)
with torch pinned to the version the install script puts in place (within pyproject's range) in
both the cpu and the cuda branch, the cpu branch from the CPU wheel index; all three source
folders of the namespace package copied; a numeric non-root USER equal to the chart's runAsUser
(pod and container) and to the user the image creates; `ENTRYPOINT ["planaria"]` naming the
console script pyproject declares; HOME, TMPDIR, the caches and matplotlib's config under /tmp
(the chart's only writable mount) and no bytecode written at run time; .dockerignore keeps
.venv, runs, tests and .git out of the build context.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from planaria.kube import constants

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    lines = [line for line in TEXT.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def _stages() -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for word, rest in _instructions():
        if word == "FROM":
            current = stages.setdefault(rest.split(" AS ")[1], [])
        current.append((word, rest))
    return stages


def _args(stage: str, word: str) -> list[str]:
    return [rest for w, rest in _stages()[stage] if w == word]


def _torch_pin() -> str:
    """The torch version the install script puts in place (what CI tests), checked to lie in
    the range pyproject declares."""
    script = (ROOT / "scripts" / "setup.sh").read_text()
    (pin,) = {str(found) for found in re.findall(r"torch==([\w.+]+)", script)}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (wanted,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("torch")]
    assert Version(pin) in SpecifierSet(wanted.removeprefix("torch")), (pin, wanted)
    return pin


def test_the_runtime_copies_the_dependencies_environment_and_the_built_app_only() -> None:
    assert list(_stages()) == ["requirements", "deps", "build", "runtime"]
    assert _args("runtime", "COPY") == [
        "--from=deps /opt/planaria /opt/planaria",
        "--from=build /opt/planaria/app /opt/planaria/app",
    ]
    (base,) = _args("build", "FROM")
    assert base == "deps AS build"  # Planaria is installed on top of the dependencies


def test_torch_is_pinned_to_pyprojects_version_in_both_builds() -> None:
    assert "TORCH=cpu" in _args("deps", "ARG")
    (install,) = [run for run in _args("deps", "RUN") if "torch==" in run]
    cpu, cuda = install.split("elif")[0], install.split("elif")[1].split("else")[0]
    assert "download.pytorch.org/whl/cpu" in cpu and '"cpu"' in cpu
    assert '"cuda"' in cuda and "download.pytorch.org/whl/cpu" not in cuda
    # The CPU build names the local version (2.13.0+cpu) so that no index can hand it a CUDA
    # wheel; the public version is pyproject's in both.
    assert re.findall(r"torch==([\w.+]+)", cpu) == [f"{_torch_pin()}+cpu"]
    assert re.findall(r"torch==([\w.+]+)", cuda) == [_torch_pin()]


def test_the_three_source_folders_of_the_namespace_package_are_copied() -> None:
    copied = {rest.split()[0] for rest in _args("build", "COPY") if not rest.startswith("--")}
    assert {"operator", "agent", "protos"} <= copied


def test_the_user_is_numeric_non_root_and_the_charts_run_as_user() -> None:
    (user,) = _args("runtime", "USER")
    uid, gid = (int(part) for part in user.split(":"))
    assert uid != 0 and gid != 0
    (create,) = [run for run in _args("runtime", "RUN") if "useradd" in run]
    assert f"--uid {uid}" in create and f"--gid {gid}" in create
    values = yaml.safe_load((ROOT / "charts" / "planaria" / "values.yaml").read_text())
    for context in (values["podSecurityContext"], values["securityContext"]):
        assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid)


def test_the_entrypoint_is_the_planaria_console_script() -> None:
    (entrypoint,) = _args("runtime", "ENTRYPOINT")
    assert json.loads(entrypoint) == ["planaria"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "planaria" in pyproject["project"]["scripts"]


def test_everything_written_at_run_time_goes_under_tmp() -> None:
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(_args("runtime", "ENV"))))
    for name in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        assert env[name].startswith(constants.TMP_MOUNT), name
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert _args("runtime", "WORKDIR") == [constants.TMP_MOUNT]
    assert any("compileall" in run for run in _args("deps", "RUN"))  # torch and the rest
    assert any("compileall -q /opt/planaria/app" in run for run in _args("build", "RUN"))


def test_the_build_context_leaves_out_environments_runs_tests_and_history() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "runs", "tests", ".git"} <= ignored


def test_the_image_installs_the_hf_extra_for_bring_your_own_models_and_data() -> None:
    (listed,) = _args("requirements", "RUN")
    assert 'p["dependencies"] + p["optional-dependencies"]["hf"]' in listed
    assert any("pip install -r /src/requirements.txt" in run for run in _args("deps", "RUN"))
    (install,) = [run for run in _args("build", "RUN") if "import planaria.cli.main" in run]
    assert "pip install --no-deps" in install and "pip check" in install
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = " ".join(pyproject["project"]["optional-dependencies"]["hf"])
    assert all(name in extra for name in ("tokenizers", "pyarrow", "transformers", "safetensors"))
