"""Keep the layering of docs/architecture honest: a module imports only from its own layer or below."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "src" / "torchrepro"

LAYERS = {
    0: {"errors", "fingerprint", "_compat", "_io", "_version", "_table", "_launchenv", "_seeds", "_ompteam"},
    1: {"seeding", "determinism", "rng", "data", "checkpoint", "models", "distributed", "registry",
        "policy", "nn"},
    2: {"record", "launcher", "envinfo", "store", "optrace", "_modules", "outdir", "metrics", "compiled", "workdir"},
    3: {"compare", "resume", "locate", "_resume_child", "lint", "envdiff", "audit", "measure", "variance",
        "rankcompare", "scan", "compilelocate"},
    4: {"cli", "report", "__init__", "__main__", "pytest_plugin"},
}
LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):  # import torchrepro.x / import torchrepro.x.y as z
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "torchrepro":
                    found.add(parts[1] if len(parts) > 1 else "__init__")
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.startswith("torchrepro"):
                parts = node.module.split(".")
                found.add(parts[1] if len(parts) > 1 else "__init__")
            elif node.level >= 1:
                depth_ok = node.level == 1 or (node.level == 2 and path.parent.name == "cli")
                if depth_ok and node.module:
                    found.add(node.module.split(".")[0])
                elif depth_ok:
                    found.update(alias.name for alias in node.names)
    return found


def test_every_module_has_a_layer():
    names = {_module_name(p) for p in PKG.rglob("*.py")}
    assert names <= set(LAYER_OF), f"add these modules to LAYERS: {sorted(names - set(LAYER_OF))}"


def test_modules_import_only_their_layer_or_below():
    problems = []
    for path in PKG.rglob("*.py"):
        me = _module_name(path)
        if path.parent.name == "cli" and path.name != "__init__.py":
            me = "cli"
        for dep in _imports(path):
            if dep in LAYER_OF and dep != me and LAYER_OF[dep] > LAYER_OF[me]:
                problems.append(f"{path.relative_to(PKG)} (L{LAYER_OF[me]}) imports {dep} (L{LAYER_OF[dep]})")
    assert not problems, "\n".join(problems)


def test_plain_import_statements_are_seen(tmp_path):
    """`import torchrepro.x` must count as a dependency on x, like `from torchrepro.x import y`."""
    src = tmp_path / "m.py"
    src.write_text("import torchrepro.compare\nimport torchrepro.cli.check_cmd as c\nimport os\nimport torchrepro\n")
    assert _imports(src) == {"compare", "cli", "__init__"}


def test_lint_imports_only_the_standard_library_and_itself():
    """torchrepro/lint runs without torch: its modules import the standard library and each other, nothing else
    (no torch, numpy, or other torchrepro modules, which import torch)."""
    import sys

    lint = PKG / "lint"
    problems = []
    for path in sorted(lint.rglob("*.py")):
        depth = len(path.relative_to(lint).parts) - 1  # 0 for lint/x.py, 1 for lint/rules/x.py
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.ImportFrom):
                if node.level > depth + 1:
                    problems.append(f"{path.relative_to(PKG)}: from {'.' * node.level}{node.module or ''} leaves lint/")
                continue
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in ("tomli",):
                    problems.append(f"{path.relative_to(PKG)}: import {name}")
    assert not problems, "\n".join(problems)


def test_lazy_exports_match_all():
    import torchrepro

    assert set(torchrepro._EXPORTS) | {"__version__"} == set(torchrepro.__all__)
    for name in torchrepro.__all__:
        assert getattr(torchrepro, name) is not None


def test_import_and_lint_without_torch():
    """`import torchrepro`, the pytest plugin and `torchrepro lint`/`rule` never import torch (start-up speed)."""
    import subprocess
    import sys

    code = ("import sys, torchrepro, torchrepro.pytest_plugin; from torchrepro.cli import main; "
            "rc = main(['lint', 'examples/demo.py']); rc2 = main(['rule', 'TR101']); "
            "print(rc, rc2, 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent.parent)
    assert p.stdout.strip().splitlines()[-1] == "0 0 False", p.stderr
