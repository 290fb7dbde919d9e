"""Keep the layering of docs/architecture honest: a module imports only from its own layer or below."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "src" / "torchrepro"

# The units of the package -- its subpackages and the few modules left at the top -- by layer. A unit imports only
# itself and units of a lower layer: two units never import each other, and units of one layer are independent.
LAYERS = {
    0: {"_core", "_version"},  # the private foundation: errors, atomic io, safe readers, fingerprints, compat
    1: {"control", "nn", "lint"},  # make a run reproducible; deterministic ops; static checks (stdlib only)
    2: {"resume", "distributed", "env"},  # resume bit for bit; ranks; the environment's fingerprint and checklist
    3: {"record"},  # observe a run: launcher, recorder, op tracer, run directories
    4: {"analysis"},  # explain runs: compare, locate, scan, env diff, plots
    5: {"measure"},  # measure nondeterminism and its cost
    6: {"cli", "integrations", "__init__"},  # interfaces: the command line, other tools, the public API
    7: {"__main__", "examples"},  # programs: `python -m torchrepro`; the example scripts shipped in the wheel
}
LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}
TOP_LEVEL_MODULES = {"__init__", "__main__", "_version"}


def _module_parts(path: Path) -> list[str]:
    """``src/torchrepro/record/store.py`` -> ["torchrepro", "record", "store"] (a package's __init__: the package)."""
    parts = ["torchrepro", *path.relative_to(PKG).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" and len(parts) > 2 else parts


def _unit(parts: list[str]) -> str:
    return parts[1] if len(parts) > 1 else "__init__"


def _imported_modules(path: Path, parts: list[str] | None = None) -> set[str]:
    """Dotted names of the torchrepro modules (or packages) that ``path`` imports, at any place in the file."""
    parts = parts or _module_parts(path)
    package = parts if path.name == "__init__.py" else parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):  # import torchrepro.x / import torchrepro.x.y as z
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "torchrepro")
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:  # from .x import y, from ..x.y import z, from . import x: resolved against the file's package
                base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            if base.split(".")[0] == "torchrepro":
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def _imports(path: Path, parts: list[str] | None = None) -> set[str]:
    """The units ``path`` imports."""
    return {_unit(name.split(".")) for name in _imported_modules(path, parts)}


def test_every_unit_has_a_layer():
    units = {_unit(_module_parts(p)) for p in PKG.rglob("*.py")}
    assert units <= set(LAYER_OF), f"add these to LAYERS: {sorted(units - set(LAYER_OF))}"


def test_the_top_level_holds_only_the_package_entry_points():
    top = {p.stem for p in PKG.glob("*.py")}
    assert top == TOP_LEVEL_MODULES, f"move these into a subpackage: {sorted(top - TOP_LEVEL_MODULES)}"


def test_units_import_only_lower_layers():
    problems = []
    for path in PKG.rglob("*.py"):
        me = _unit(_module_parts(path))
        for dep in _imports(path):
            if dep in LAYER_OF and dep != me and LAYER_OF[dep] >= LAYER_OF[me]:
                problems.append(f"{path.relative_to(PKG)} ({me}, L{LAYER_OF[me]}) imports {dep} (L{LAYER_OF[dep]})")
    assert not problems, "\n".join(problems)


def test_plain_and_relative_import_statements_are_seen(tmp_path):
    """`import torchrepro.x.y` and relative imports at any depth count as dependencies on unit x."""
    src = tmp_path / "m.py"
    src.write_text("import torchrepro.analysis.compare\nimport torchrepro.cli.check_cmd as c\nimport os\n"
                   "import torchrepro\nfrom ..record.store import load_run\nfrom . import _checkrun\n"
                   "from .. import _version\n")
    parts = ["torchrepro", "cli", "m"]
    assert _imports(src, parts) == {"analysis", "cli", "__init__", "record", "_version"}
    assert "torchrepro.cli._checkrun" in _imported_modules(src, parts)


def _module_graph() -> dict[str, set[str]]:
    """Module -> the torchrepro modules it imports (a package's own ``__init__`` and its parents are left out: a
    submodule importing its package is how a package exposes its modules, not a cycle)."""
    modules = {".".join(_module_parts(p)): p for p in PKG.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = {m for m in _imported_modules(path) if m in modules and m != name and m not in parents}
    return graph


def test_no_import_cycles_between_modules():
    graph = _module_graph()
    cycles = []
    for start in graph:  # a cycle through `start`: a path from one of its imports back to it
        seen, todo = set(), [(dep, [start, dep]) for dep in graph[start]]
        while todo:
            node, path = todo.pop()
            if node == start:
                cycles.append(" -> ".join(path))
                break
            if node in seen:
                continue
            seen.add(node)
            todo.extend((dep, [*path, dep]) for dep in graph[node])
    assert not cycles, "\n".join(sorted(cycles))


# Modules outside torchrepro/lint that the linter may import: torch-free data (standard library only, checked below).
LINT_MAY_IMPORT = {"torchrepro._core", "torchrepro._core.nondet_ops"}


def _non_stdlib_imports(path: Path) -> list[str]:
    """What ``path`` imports beyond the standard library, itself and :data:`LINT_MAY_IMPORT`, as problems."""
    import sys

    problems = []
    parts = _module_parts(path)
    package = parts if path.name == "__init__.py" else parts[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.ImportFrom):  # relative: resolved against the file's package
            base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            inside = base == "torchrepro.lint" or base.startswith("torchrepro.lint.")
            if not inside and base not in LINT_MAY_IMPORT:
                problems.append(f"{path.relative_to(PKG)}: from {'.' * node.level}{node.module or ''} leaves lint/")
            continue
        else:
            continue
        for name in names:
            top = name.partition(".")[0]
            if top not in sys.stdlib_module_names and top not in ("tomli",) and name not in LINT_MAY_IMPORT:
                problems.append(f"{path.relative_to(PKG)}: import {name}")
    return problems


def test_lint_imports_only_the_standard_library_and_itself():
    """torchrepro/lint runs without torch: its modules import the standard library, each other and the torch-free
    data of the registry (``_core/nondet_ops``), nothing else (no torch, numpy, or other torchrepro modules, which
    import torch); that data module and ``_core/__init__`` import only the standard library."""
    problems = [p for path in sorted((PKG / "lint").rglob("*.py")) for p in _non_stdlib_imports(path)]
    for name in sorted(LINT_MAY_IMPORT):
        path = PKG.parent / (name.replace(".", "/") + ".py")
        path = path if path.exists() else path.with_suffix("") / "__init__.py"
        tree = ast.parse(path.read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        problems += [f"{name}: imports {ast.unparse(n)}" for n in imports
                     if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("torchrepro"))
                     and n.module != "__future__"]
        problems += [p for p in _non_stdlib_imports(path) if "leaves lint/" not in p]
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

    code = ("import sys, torchrepro, torchrepro.integrations.pytest_plugin; from torchrepro.cli import main; "
            "rc = main(['lint', 'examples/demo.py']); rc2 = main(['rule', 'TR101']); "
            "print(rc, rc2, 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent.parent)
    assert p.stdout.strip().splitlines()[-1] == "0 0 False", p.stderr
