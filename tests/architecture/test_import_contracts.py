"""Import contracts (.importlinter) hold: planner pure, controller core free of Kubernetes/gRPC/
torch, agent free of the control plane, layers respected (between the top-level packages and
between the agent's subpackages, every one of which is placed). Runs lint-imports as CI does."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None, "lint-imports is not installed (it comes with the test extras)"
    result = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout, result.stdout


def _contracts() -> dict[str, dict[str, list[str]]]:
    import configparser

    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    contracts = {}
    for section in parser.sections():
        if section.startswith("importlinter:contract:"):
            fields = {
                key: [line.strip() for line in value.splitlines() if line.strip()]
                for key, value in parser[section].items()
            }
            contracts[section.removeprefix("importlinter:contract:")] = fields
    return contracts


def _top_level_packages() -> set[str]:
    packages = set()
    for component in ("operator", "agent", "protos"):
        for init in (ROOT / component / "planaria").glob("*/__init__.py"):
            packages.add(f"planaria.{init.parent.name}")
    return packages


def test_every_package_is_placed_in_the_contracts() -> None:
    contracts = _contracts()
    mentioned = {
        name.strip("()")
        for fields in contracts.values()
        for key in ("source_modules", "forbidden_modules", "layers")
        for line in fields.get(key, [])
        for name in line.split("|")
    }
    mentioned = {name.strip().strip("()") for name in mentioned}
    missing = _top_level_packages() - mentioned
    assert not missing, f"add {sorted(missing)} to .importlinter"


def test_the_planner_may_import_only_the_shared_types_of_ours() -> None:
    forbidden = set(_contracts()["planner-pure"]["forbidden_modules"])
    others = _top_level_packages() - {"planaria.planner", "planaria.contract"}
    assert others <= forbidden, f"forbid {sorted(others - forbidden)} in planner-pure"


def test_the_shared_types_may_import_no_other_package_of_ours() -> None:
    forbidden = set(_contracts()["contract-pure"]["forbidden_modules"])
    others = _top_level_packages() - {"planaria.contract"}
    assert others <= forbidden, f"forbid {sorted(others - forbidden)} in contract-pure"


def test_the_agent_may_import_no_control_plane_package() -> None:
    forbidden = set(_contracts()["agent-data-plane"]["forbidden_modules"])
    names = ("control", "kube", "local", "rpc", "cli", "sim", "planner")
    control_plane = {f"planaria.{n}" for n in names}
    required = control_plane & _top_level_packages()
    assert required <= forbidden, f"forbid {sorted(required - forbidden)} in agent-data-plane"


def _agent_subpackages() -> set[str]:
    agent = ROOT / "agent" / "planaria" / "agent"
    return {f"planaria.agent.{init.parent.name}" for init in agent.glob("*/__init__.py")}


def test_every_agent_subpackage_is_a_layer() -> None:
    layers = _contracts()["agent-layers"]
    placed = {
        f"{container}.{name.strip()}"
        for container in layers["containers"]
        for line in layers["layers"]
        for name in line.split("|")
    }
    assert _agent_subpackages() == placed, "place every agent subpackage in agent-layers"


def test_the_agent_has_no_module_outside_its_subpackages() -> None:
    agent = ROOT / "agent" / "planaria" / "agent"
    assert sorted(p.name for p in agent.glob("*.py")) == ["__init__.py"]
