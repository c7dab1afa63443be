"""No code path unpickles bytes (issue #10, bad input): snapshots, checkpoints, job files and
messages are raw bytes, JSON, YAML and protobuf, all parsed by code that cannot execute them.

Covers: every .py under agent/, operator/ and protos/, read as an AST (so a comment or a string
that mentions pickle does not count, and an alias does not hide a call): no import of pickle,
cPickle, _pickle, dill, cloudpickle, joblib, shelve or marshal; no `torch.load` without
`weights_only=True`; no `numpy.load` with `allow_pickle` other than False; no `yaml.load` /
`yaml.load_all` without a SafeLoader and no `yaml.unsafe_load` / `full_load`. The checker itself
is shown each forbidden form (through aliases and from-imports) and the allowed ones.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("agent", "operator", "protos")
PICKLING_MODULES = frozenset(
    {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
)
SAFE_LOADERS = frozenset({"SafeLoader", "CSafeLoader"})


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it stands for (`np` -> numpy, `load` -> torch.load)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, names: dict[str, str]) -> str | None:
    """The dotted name an expression like `np.load` or `yaml.load` refers to, if any."""
    if isinstance(node, ast.Name):
        return names.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, names)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_constant(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _call_problem(call: ast.Call, names: dict[str, str]) -> str | None:
    target = _dotted(call.func, names)
    if target == "torch.load" and not _is_constant(_keyword(call, "weights_only"), True):
        return "torch.load without weights_only=True"
    if target == "numpy.load":
        allow = _keyword(call, "allow_pickle")
        if allow is not None and not _is_constant(allow, False):
            return "numpy.load with allow_pickle"
    if target in ("yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all"):
        return f"{target}"
    if target in ("yaml.load", "yaml.load_all"):
        loader = _keyword(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
        name = None if loader is None else _dotted(loader, names)
        if name is None or name.rsplit(".", 1)[-1] not in SAFE_LOADERS:
            return f"{target} without a SafeLoader"
    return None


def problems(source: str, where: str = "<source>") -> list[str]:
    """Every pickling import and unsafe load call in `source`, as `where:line: what`."""
    tree = ast.parse(source)
    names = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module]
        line = getattr(node, "lineno", 0)
        for module in modules:
            if module.split(".")[0] in PICKLING_MODULES:
                found.append(f"{where}:{line}: imports {module}")
        if isinstance(node, ast.Call):
            problem = _call_problem(node, names)
            if problem:
                found.append(f"{where}:{node.lineno}: {problem}")
    return found


def test_no_source_file_can_unpickle() -> None:
    files = sorted(p for c in COMPONENTS for p in (ROOT / c).rglob("*.py"))
    assert len(files) > 100  # the scan found the sources
    found = []
    for path in files:
        found += problems(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "import pickle",
        "import cPickle as p",
        "from dill import loads",
        "import marshal",
        "from joblib import load",
        "import shelve",
        "import torch\ntorch.load(path)",
        "import torch as t\nt.load(path, weights_only=False)",
        "from torch import load\nload(path)",
        "import numpy as np\nnp.load(path, allow_pickle=True)",
        "import yaml\nyaml.load(text)",
        "import yaml\nyaml.load(text, Loader=yaml.Loader)",
        "import yaml\nyaml.unsafe_load(text)",
        "from yaml import load_all\nload_all(text)",
    ],
)
def test_the_checker_catches(source: str) -> None:
    assert problems(source), source


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ntorch.load(path, weights_only=True)",
        "import numpy as np\nnp.load(path)\nnp.load(path, allow_pickle=False)",
        "import yaml\nyaml.safe_load(text)\nyaml.load(text, Loader=yaml.SafeLoader)",
        "import yaml\nyaml.load(text, yaml.CSafeLoader)",
        "x = 'import pickle'  # pickle.loads in a comment",
        "import json\njson.load(handle)",
    ],
)
def test_the_checker_allows(source: str) -> None:
    assert problems(source) == []
