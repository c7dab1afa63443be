"""Layout guards: the namespace package stays intact and `operator` stays the stdlib.

Covers: no `__init__.py` at the namespace root in any component folder; `planaria` spans the
three component folders; `import operator` is the standard library even from the repo root;
the `planaria` console script and `python -m planaria` both run; no two test modules share a
file name (test folders have no `__init__.py`, so pytest could not collect both in one run);
each agent subpackage's `__init__.py` is its one-line purpose and nothing else.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("operator", "agent", "protos")


@pytest.mark.parametrize("component", COMPONENTS)
def test_no_init_at_the_namespace_root_of(component: str) -> None:
    assert (ROOT / component / "planaria").is_dir()
    assert not (ROOT / component / "planaria" / "__init__.py").exists()
    assert not (ROOT / component / "__init__.py").exists()


def test_planaria_spans_all_component_folders() -> None:
    import planaria

    portions = {Path(p).resolve() for p in planaria.__path__}
    assert portions == {(ROOT / c / "planaria").resolve() for c in COMPONENTS}


def test_import_operator_is_the_standard_library_even_from_the_repo_root() -> None:
    code = "import operator, sys; print(operator.__file__); print(operator.add(2, 3))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert Path(out[0]).name == "operator.py"
    assert ROOT not in Path(out[0]).resolve().parents
    assert out[1] == "5"


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "planaria", "version"],
        [str(Path(sys.executable).parent / "planaria"), "version"],
    ],
    ids=["python -m planaria", "the planaria console script"],
)
def test_the_command_runs_as(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    assert result.stdout.strip().count(".") == 2


def test_no_importable_package_is_named_operator() -> None:
    offenders = [p for p in ROOT.glob("**/operator/__init__.py") if ".venv" not in p.parts]
    assert offenders == []


def test_no_two_test_modules_share_a_file_name() -> None:
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]}: rename one"
        seen[path.name] = path


def test_agent_subpackage_inits_hold_only_a_one_line_docstring() -> None:
    inits = sorted((ROOT / "agent" / "planaria" / "agent").glob("*/__init__.py"))
    assert inits
    for init in inits:
        body = ast.parse(init.read_text(encoding="utf-8")).body
        assert len(body) == 1, f"{init}: only the docstring, no imports or re-exports"
        assert ast.get_docstring(ast.Module(body=body, type_ignores=[])) is not None, init
        assert "\n" not in init.read_text(encoding="utf-8").strip(), f"{init}: one line"
