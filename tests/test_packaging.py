"""What the wheel ships, checked without building it (`make package-check` builds and installs it)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "src" / "torchrepro"


def _without_docstring(path: Path) -> str:
    tree = ast.parse(path.read_text())
    first = tree.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        tree.body = tree.body[1:]
    return ast.dump(tree)


def test_the_shipped_example_is_the_source_trees_example():
    """`python -m torchrepro.examples.scatter_gnn` runs the code of examples/scatter_gnn.py (docstrings aside)."""
    assert _without_docstring(PKG / "examples" / "scatter_gnn.py") == _without_docstring(
        ROOT / "examples" / "scatter_gnn.py")


def test_the_shipped_examples_import_only_torch_and_the_stdlib():
    for path in (PKG / "examples").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                assert top == "torch" or top in sys.stdlib_module_names, f"{path.name} imports {name}"


def test_py_typed_is_shipped_and_the_version_has_one_source():
    assert (PKG / "py.typed").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "torchrepro._version.__version__"}
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["torchrepro"]


def test_every_extra_has_a_probe_in_the_package_check():
    spec = importlib.util.spec_from_file_location("package_check", ROOT / "tools" / "package_check.py")
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]) - {"dev"}
    assert extras <= set(check.EXTRA_PROBES), f"add probes for {sorted(extras - set(check.EXTRA_PROBES))}"
