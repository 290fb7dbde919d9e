"""`make package-check`: build the sdist and wheel, check them, install the wheel into a fresh venv and use it.

1. `python -m build` (isolated, as pip would: the sdist, then the wheel built from the sdist), `twine check --strict`.
2. The wheel holds exactly the modules of src/torchrepro plus py.typed and the license: no tests, benchmarks,
   tools, caches or compiled files; its version is torchrepro/_version.py's. The sdist has the files a source
   release needs and no caches either.
3. A fresh venv (no system site-packages, no editable install, no dev extra) gets the wheel and the pinned torch
   (``TORCH_PIN``, default torch==2.13.0: pip finds the local CPU wheel) and nothing else: the wheel's declared
   dependencies are what make it work. There `torchrepro --version`, `import torchrepro;
   torchrepro.seed_everything(0)` and `torchrepro check --deterministic` on the example shipped in the wheel
   (`python -m torchrepro.examples.scatter_gnn`) must work, before any optional dependency is installed.
4. Each optional extra but `dev` is installed in turn (``torchrepro[EXTRA]``) and its probe must pass: the import
   it enables, and a use of it. A new extra needs a probe in EXTRA_PROBES.

Exit 0 when all passes, 1 with the failures listed. ``--keep`` keeps the temporary directory; ``--skip-extras``
skips step 4.
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "src" / "torchrepro"

# What `pip install torchrepro[EXTRA]` must make work, checked in a fresh interpreter of the smoke venv.
EXTRA_PROBES = {
    "numpy": (
        "import numpy, torchrepro\n"
        "torchrepro.seed_everything(0); a = numpy.random.random(3)\n"
        "torchrepro.seed_everything(0); b = numpy.random.random(3)\n"
        "assert (a == b).all(), 'seed_everything does not seed numpy'\n"
    ),
    "plot": (
        "import io\n"
        "from matplotlib.backends.backend_agg import FigureCanvasAgg\n"
        "from matplotlib.figure import Figure\n"
        "fig = Figure(); FigureCanvasAgg(fig); fig.subplots().plot([1, 2], [3, 4])\n"
        "buf = io.BytesIO(); fig.savefig(buf, format='png'); assert buf.getvalue().startswith(b'\\x89PNG')\n"
    ),
    "rich": (
        "from rich.console import Console\n"
        "from rich.table import Table\n"
        "t = Table('a'); t.add_row('1'); c = Console(record=True, width=40); c.print(t)\n"
        "assert '1' in c.export_text()\n"
    ),
    # trainer integrations (extras named after the trainer): the callback module imports
    "lightning": "import torchrepro.integrations.lightning\n",
    "transformers": "import torchrepro.integrations.transformers\n",
}
# The third-party modules of the extras above: absent from the venv until their extra is installed.
EXTRA_MODULES = {"numpy": "numpy", "plot": "matplotlib", "rich": "rich"}

FORBIDDEN_PARTS = {"tests", "benchmarks", "tools", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                   ".hypothesis", "build", "dist"}
FORBIDDEN_SUFFIXES = {".pyc", ".pyo", ".so", ".orig", ".rej"}
SDIST_REQUIRED = ["pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "SECURITY.md", "MANIFEST.in",
                  "src/torchrepro/py.typed", "src/torchrepro/examples/scatter_gnn.py", "examples/scatter_gnn.py",
                  "tests/conftest.py", "docs/formats.md"]
EXAMPLE_COMMAND = ["python", "-m", "torchrepro.examples.scatter_gnn", "--steps", "2", "--nodes", "200",
                   "--edges", "2000"]

failures: list[str] = []
timings: list[tuple[str, float]] = []


def fail(message: str) -> None:
    failures.append(message)
    print(f"package-check: FAIL {message}", flush=True)


def step(name: str, cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; its output is shown only when it fails."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    timings.append((name, time.perf_counter() - start))
    if proc.returncode != 0:
        fail(f"{name}: exit {proc.returncode}: {' '.join(map(str, cmd))}\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
    return proc


def version() -> str:
    tree = ast.parse((PKG / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise SystemExit("package-check: no __version__ in src/torchrepro/_version.py")


def source_modules() -> set[str]:
    return {p.relative_to(PKG.parent).as_posix() for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}


def bad_member(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(FORBIDDEN_PARTS & set(path.parts)) or path.suffix in FORBIDDEN_SUFFIXES or ".egg-info" in name


def check_wheel(wheel: Path, want_version: str) -> dict[str, list[str]]:
    """Check the wheel's files and metadata; return its extras and their requirements."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        dist_info = f"torchrepro-{want_version}.dist-info"
        meta = email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    for name in names:
        if bad_member(name):
            fail(f"wheel holds {name} (no tests, benchmarks, tools, caches or compiled files belong in it)")
        elif not (name.startswith("torchrepro/") or name.startswith(f"{dist_info}/")):
            fail(f"wheel holds {name}, outside torchrepro/ and {dist_info}/")
    modules = {n for n in names if n.startswith("torchrepro/") and n.endswith(".py")}
    want = source_modules()
    if modules != want:
        fail(f"wheel modules differ from src/torchrepro: missing {sorted(want - modules)}, "
             f"extra {sorted(modules - want)}")
    others = sorted(n for n in names if n.startswith("torchrepro/") and not n.endswith(".py"))
    if others != ["torchrepro/py.typed"]:
        fail(f"wheel data files are {others}, expected only torchrepro/py.typed")
    if f"{dist_info}/licenses/LICENSE" not in names:
        fail("wheel has no licenses/LICENSE")
    if meta["Version"] != want_version:
        fail(f"wheel version {meta['Version']} != _version.py's {want_version}")
    if meta["Requires-Python"] != ">=3.10":
        fail(f"Requires-Python is {meta['Requires-Python']!r}")
    if "torchrepro = torchrepro.cli:console_main" not in entry_points:
        fail("console script torchrepro missing from entry_points.txt")
    if "torchrepro = torchrepro.integrations.pytest_plugin" not in entry_points:
        fail("pytest11 entry point torchrepro missing from entry_points.txt")
    extras: dict[str, list[str]] = {name: [] for name in meta.get_all("Provides-Extra") or []}
    for req in meta.get_all("Requires-Dist") or []:
        found = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        if found:
            extras.setdefault(found.group(1), []).append(req.split(";")[0].strip())
    print(f"package-check: wheel {wheel.name}: {len(names)} files, {wheel.stat().st_size / 1024:.0f} KiB, "
          f"extras {sorted(extras)}", flush=True)
    return extras


def check_sdist(sdist: Path, want_version: str) -> None:
    top = f"torchrepro-{want_version}/"
    with tarfile.open(sdist) as tf:
        names = [m.name for m in tf.getmembers() if m.isfile()]
    rel = {n[len(top):] for n in names if n.startswith(top)}
    if len(rel) != len(names):
        fail(f"sdist members outside {top}")
    for name in SDIST_REQUIRED:
        if name not in rel:
            fail(f"sdist lacks {name}")
    for name in sorted(rel):
        path = PurePosixPath(name)
        if ({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis"} & set(path.parts)
                or path.suffix in FORBIDDEN_SUFFIXES):
            fail(f"sdist holds {name}")
    want = {f"src/{m}" for m in source_modules()}
    if not want <= rel:
        fail(f"sdist lacks {sorted(want - rel)}")
    print(f"package-check: sdist {sdist.name}: {len(names)} files, {sdist.stat().st_size / 1024:.0f} KiB", flush=True)


def pip(venv: Path) -> list[str]:
    """This interpreter's pip, installing into ``venv`` (no byte-compiling: torch has thousands of modules)."""
    return [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "--quiet", "--no-input"]


def clean_env(venv: Path, home: Path) -> dict[str, str]:
    """The environment of a user who activated the venv: none of the dev tree's Python settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "TORCHREPRO", "PYTEST"))}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONNOUSERSITE"] = "1"
    env["MPLCONFIGDIR"] = str(home / "mpl")
    return env


def smoke(venv: Path, work: Path, env: dict[str, str], want_version: str) -> None:
    py, exe = str(venv / "bin" / "python"), str(venv / "bin" / "torchrepro")
    proc = step("torchrepro --version", [exe, "--version"], cwd=work, env=env)
    if proc.returncode == 0 and proc.stdout.strip() != f"torchrepro {want_version}":
        fail(f"torchrepro --version printed {proc.stdout.strip()!r}")
    code = ("import os, sys, torchrepro\n"
            f"assert torchrepro.__file__.startswith({str(venv)!r}), torchrepro.__file__\n"
            "assert torchrepro.seed_everything(0) == 0\n"
            "import torch; a = torch.rand(3); torchrepro.seed_everything(0); assert torch.equal(a, torch.rand(3))\n"
            "missing = [m for m in sys.argv[1:] if __import__('importlib.util').util.find_spec(m) is not None]\n"
            "assert not missing, f'optional dependencies already installed: {missing}'\n")
    step("import torchrepro; seed_everything(0)", [py, "-c", code, *EXTRA_MODULES.values()], cwd=work, env=env)
    step("pip check", [*pip(venv), "check"], cwd=work, env=env)
    out = work / "check-out"
    proc = step("torchrepro check (shipped example)",
                [exe, "check", "--deterministic", "--out", str(out), "--", *EXAMPLE_COMMAND], cwd=work, env=env)
    if proc.returncode == 0:
        if "IDENTICAL" not in proc.stdout:
            fail(f"torchrepro check did not say IDENTICAL:\n{proc.stdout[-2000:]}")
        if not (out / "check.json").is_file():
            fail("torchrepro check wrote no check.json")


def extras_check(venv: Path, wheel: Path, work: Path, env: dict[str, str], extras: dict[str, list[str]],
                 torch_pin: str) -> None:
    py = str(venv / "bin" / "python")
    # into one venv, one after the other: the small extras first (the trainer extras pull numpy in too)
    for extra in sorted(set(extras) - {"dev"}, key=lambda e: (e not in EXTRA_MODULES, e)):
        probe = EXTRA_PROBES.get(extra)
        if probe is None:
            fail(f"extra [{extra}] has no probe: add one to EXTRA_PROBES in tools/package_check.py")
            continue
        if step(f"pip install [{extra}]", [*pip(venv), "install", "--no-compile", f"{wheel}[{extra}]", torch_pin],
                cwd=work, env=env).returncode == 0:
            step(f"probe [{extra}]", [py, "-c", probe], cwd=work, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--skip-extras", action="store_true", help="do not install and probe the extras")
    parser.add_argument("--torch-pin", default=os.environ.get("TORCH_PIN", "torch==2.13.0"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    want_version = version()
    tmp = Path(tempfile.mkdtemp(prefix="torchrepro-package-"))
    try:
        dist, venv, work = tmp / "dist", tmp / "venv", tmp / "work"
        work.mkdir()
        if step("python -m build", [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)]).returncode:
            return 1
        wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1:
            fail(f"build made {[p.name for p in dist.iterdir()]}, expected one wheel and one sdist")
            return 1
        step("twine check --strict", [sys.executable, "-m", "twine", "check", "--strict", str(wheels[0]),
                                      str(sdists[0])])
        extras = check_wheel(wheels[0], want_version)
        check_sdist(sdists[0], want_version)
        env = clean_env(venv, tmp)
        # From the dev venv's python, venv makes a venv of its base interpreter: nothing of the dev venv is seen.
        # No pip inside (faster): this pip installs into it (`pip --python`), which changes nothing it gets.
        if step("python -m venv", [sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env).returncode:
            return 1
        install = [*pip(venv), "install", "--no-compile", str(wheels[0]), args.torch_pin]
        if step("pip install wheel + torch pin", install, cwd=work, env=env).returncode == 0:
            smoke(venv, work, env, want_version)
            if not args.skip_extras:
                extras_check(venv, wheels[0], work, env, extras, args.torch_pin)
    finally:
        if args.keep:
            print(f"package-check: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        for name, seconds in timings:
            print(f"package-check: {seconds:6.1f}s  {name}")
        print(f"package-check: {time.perf_counter() - start:.1f}s in all", flush=True)
    if failures:
        print(f"package-check: {len(failures)} failure(s)", file=sys.stderr)
        return 1
    print("package-check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
