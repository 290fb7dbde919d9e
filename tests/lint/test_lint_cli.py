"""``torchrepro lint`` and ``torchrepro rule`` on the command line: exit codes, selection, suppression,
configuration, file discovery, unreadable files, and running without torch."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

from torchrepro.cli import main
from torchrepro.lint import ConfigError, LintConfig, lint_paths, lint_source, load_config
from torchrepro.lint.rules import RULES

ROOT = Path(__file__).resolve().parents[2]
UNSEEDED = "import torch\n\nif __name__ == '__main__':\n    model = torch.nn.Linear(2, 2)\n"
LOADER = "from torch.utils.data import DataLoader\n\n\ndef make(ds):\n    return DataLoader(ds, shuffle=True)\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project directory (with pyproject.toml) as the current directory."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if not line.startswith("  help:")]


def test_exit_codes_and_text_output(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "clean.py").write_text("import os\nprint(sorted(os.listdir('.')))\n")
    assert main(["lint", "clean.py"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "All checks passed (1 file checked)." in captured.err

    (project / "train.py").write_text(UNSEEDED)
    assert main(["lint", "train.py"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "train.py:4:13: TR101 `torch` draws random numbers here (nn.Linear), but no generator is seeded on the path "
        "from the entry point",
        "  help: seed every library at the start of the entry point: torchrepro.seed_everything(seed)",
    ]
    assert "Found 1 finding in 1 file (1 file checked)." in captured.err
    assert main(["lint", "--exit-zero", "-q", "train.py"]) == 0
    assert capsys.readouterr().err == ""


def test_usage_errors_exit_2_with_one_json_document(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "missing.py"]) == 2
    assert "missing.py: no such file or directory" in capsys.readouterr().err
    for argv in (["lint", "--format", "json", "--select", "TR9", "."], ["lint", "--json", "missing.py"]):
        assert main(argv) == 2
        doc = json.loads(capsys.readouterr().out)
        assert doc["verdict"] == "error" and doc["exit_code"] == 2 and doc["schema"] == "torchrepro.lint/1"
    assert "unknown rule code or prefix 'TR9'" in doc["error"] or "missing.py" in doc["error"]


def test_select_and_ignore_by_code_and_prefix(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "train.py").write_text(UNSEEDED + "    torch.backends.cudnn.benchmark = True\n")
    codes = {}
    for name, args in {"all": [], "seeding": ["--select", "TR1"], "not-seeding": ["--ignore", "TR1"],
                       "family-minus-one": ["--select", "TR1,TR2", "--ignore", "TR101"],
                       "code-beats-prefix": ["--select", "TR101", "--ignore", "TR1"]}.items():
        main(["lint", "-q", *args, "train.py"])
        codes[name] = [line.split()[1] for line in _lines(capsys.readouterr().out)]
    assert codes == {"all": ["TR101", "TR201"], "seeding": ["TR101"], "not-seeding": ["TR201"],
                     "family-minus-one": ["TR201"], "code-beats-prefix": ["TR101"]}


def test_noqa_comments() -> None:
    source = ("from torch.utils.data import DataLoader\n"
              "a = DataLoader(ds, shuffle=True)  # torchrepro: noqa: TR301\n"
              "b = DataLoader(ds, shuffle=True)  # torchrepro: noqa\n"
              "c = DataLoader(ds, shuffle=True)  # torchrepro: noqa: TR302\n"
              "d = DataLoader(ds, shuffle=True)  # noqa: TR301\n"
              "e = DataLoader(ds,\n"
              "               shuffle=True)  # TORCHREPRO: NOQA: tr301, TR302\n"
              "f = DataLoader(ds, shuffle=True, text='# torchrepro: noqa')\n")
    found = lint_source(source, "m.py", LintConfig(select=("TR301",)))
    assert [(d.line, d.code) for d in found] == [(4, "TR301"), (5, "TR301"), (8, "TR301")]


def test_pyproject_configuration(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "pyproject.toml").write_text(
        "[project]\nname = 'p'\n\n[tool.torchrepro.lint]\nignore = ['TR301']\nextend-exclude = ['generated/']\n"
        "per-file-ignores = { 'scripts/*' = ['TR1'] }\n")
    (project / "train.py").write_text(UNSEEDED + LOADER)
    (project / "generated").mkdir()
    (project / "generated" / "x.py").write_text(UNSEEDED)
    (project / "scripts").mkdir()
    (project / "scripts" / "run.py").write_text(UNSEEDED)
    assert main(["lint", "-q", "."]) == 1
    assert [line.split(":")[0] + " " + line.split()[1] for line in _lines(capsys.readouterr().out)] == [
        "train.py TR101"]
    assert main(["lint", "-q", "--isolated", "."]) == 1
    assert [line.split(":")[0] + " " + line.split()[1] for line in _lines(capsys.readouterr().out)] == [
        "generated/x.py TR101", "scripts/run.py TR101", "train.py TR101", "train.py TR301"]
    assert main(["lint", "-q", "--select", "TR301", "train.py"]) == 1  # the command line replaces select
    assert [line.split()[1] for line in _lines(capsys.readouterr().out)] == ["TR301"]


@pytest.mark.parametrize(("section", "error"), [
    ("select = ['XX1']", "unknown rule code or prefix 'XX1'"),
    ("colour = true", "unknown key(s) colour"),
    ("ignore = 'TR1'", "ignore must be a list of strings"),
    ("select = [", "invalid TOML"),
])
def test_bad_configuration_is_exit_2(project: Path, capsys: pytest.CaptureFixture[str], section: str,
                                     error: str) -> None:
    (project / "pyproject.toml").write_text(f"[tool.torchrepro.lint]\n{section}\n")
    (project / "train.py").write_text("x = 1\n")
    assert main(["lint", "train.py"]) == 2
    assert error in capsys.readouterr().err


def test_python_310_without_tomli(project: Path) -> None:
    """Without a TOML reader, a pyproject without the section is fine; with it, a clear error names the fix."""
    assert load_config(toml=None).select == ("TR",)
    (project / "pyproject.toml").write_text("[tool.torchrepro.lint]\nignore = ['TR3']\n")
    with pytest.raises(ConfigError, match="needs the 'tomli' package .* pass --isolated"):
        load_config(toml=None)
    assert load_config().ignore == ("TR3",)


def test_gitignore_and_excludes(project: Path) -> None:
    (project / ".git").mkdir()
    (project / ".gitignore").write_text("outputs/\n*_generated.py\n!keep_generated.py\n")
    for name in ("train.py", "outputs/old.py", "a_generated.py", "keep_generated.py", ".venv/lib/x.py",
                 "sub/build/y.py", "sub/z.py", "notes.txt"):
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n")
    (project / "sub" / ".gitignore").write_text("z.py\n")
    assert lint_paths(["."], LintConfig(base=project)).files == ["keep_generated.py", "train.py"]
    assert lint_paths(["a_generated.py"], LintConfig(base=project)).files == ["a_generated.py"]
    forced = LintConfig(base=project, force_exclude=True)
    assert lint_paths(["a_generated.py", "train.py"], forced).files == ["train.py"]
    assert lint_paths(["."], LintConfig(base=project, respect_gitignore=False)).files == [
        "a_generated.py", "keep_generated.py", "outputs/old.py", "sub/z.py", "train.py"]


def test_unreadable_files_are_reported_and_the_run_goes_on(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "a_syntax.py").write_text("def f(:\n    pass\n")
    (project / "b_latin1.py").write_bytes(b"x = 'caf\xe9'\n")
    (project / "c_null.py").write_bytes(b"x = 1\x00\n")
    (project / "d_train.py").write_text(UNSEEDED)
    assert main(["lint", "-q", "."]) == 1
    assert [" ".join(line.split()[:2]) for line in _lines(capsys.readouterr().out)] == [
        "a_syntax.py:1:7: TR001", "b_latin1.py:1:9: TR002", "c_null.py:1:6: TR003", "d_train.py:4:13: TR101"]
    assert main(["lint", "-q", "--ignore", "TR0", "."]) == 1
    assert len(_lines(capsys.readouterr().out)) == 1


def test_rule_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rule", "TR103"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("TR103 seed-after-draw (seeding)") and "Use instead" in out and "Trainer" in out
    assert main(["rule", "unseeded-rng"]) == 0 and capsys.readouterr().out.startswith("TR101 unseeded-rng")
    assert main(["rule"]) == 0
    listing = capsys.readouterr().out.splitlines()
    # one line per registered rule, in code order
    assert [line.split()[0] for line in listing] == sorted(RULES)
    assert listing[0].startswith("TR001  syntax-error")
    assert main(["rule", "--json", "TR501"]) == 0
    assert json.loads(capsys.readouterr().out)["rules"][0]["name"] == "checkpoint-without-rng-state"
    assert main(["rule", "TR999"]) == 2
    assert "unknown rule 'TR999'" in capsys.readouterr().err


def test_lint_package_runs_without_torch(tmp_path: Path) -> None:
    """The lint subpackage imports only the standard library and the registry's torch-free data: loaded without
    torchrepro/__init__.py (which imports torch), it lints a file and torch, numpy and the rest of torchrepro stay
    unimported."""
    target = tmp_path / "train.py"
    target.write_text(UNSEEDED)
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('torchrepro'); pkg.__path__ = [{str(ROOT / 'src' / 'torchrepro')!r}]\n"
        "sys.modules['torchrepro'] = pkg\n"
        "from torchrepro.lint import lint_paths, render\n"
        f"print(render(lint_paths([{str(target)!r}]), 'json'))\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'torchrepro'))\n"
        "print('LOADED', [m for m in loaded if not m.startswith('torchrepro.lint')])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.splitlines()[-1] == "LOADED ['torchrepro', 'torchrepro._core', 'torchrepro._core.nondet_ops']"
    assert json.loads(out[:out.rindex("LOADED")])["summary"]["by_code"] == {"TR101": 1}


def test_console_script_end_to_end(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(UNSEEDED)
    exe = Path(sys.executable).parent / "torchrepro"
    done = subprocess.run([str(exe), "lint", "--format", "github", "train.py"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 1
    assert done.stdout.startswith("::error title=torchrepro (TR101),file=train.py,line=4,col=13,")


def test_pre_commit_hooks_file() -> None:
    """The hooks run `torchrepro lint --force-exclude` on Python files, all in one process."""
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    hooks = [block for block in text.split("\n- ")[1:]]
    assert [h.splitlines()[0] for h in hooks] == ["id: torchrepro-lint", "id: torchrepro-lint-system"]
    for hook in hooks:
        assert "entry: torchrepro lint --force-exclude\n" in hook and "types: [python]" in hook
        assert "require_serial: true" in hook


def test_one_file_of_a_large_package_reads_only_what_its_calls_reach(project: Path) -> None:
    """Imports alone are not followed: linting one module of a 300-module package reads that module, plus at
    most the files its calls lead to (capped), so pre-commit stays fast on large repositories."""
    from torchrepro.lint.engine import Engine

    pkg = project / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("".join(f"from .m{i} import f{i}\n" for i in range(300)))
    for i in range(300):
        (pkg / f"m{i}.py").write_text(f"from . import m{i + 1}\n\n\ndef f{i}():\n    return m{i + 1}.f{i + 1}()\n"
                                      if i < 299 else "def f299():\n    return 0\n")
    engine = Engine(LintConfig(base=project))
    engine.run([(pkg / "m0.py", "pkg/m0.py")])
    assert len(engine.project._modules) == 1
    (project / "main.py").write_text("from pkg.m0 import f0\n\nif __name__ == '__main__':\n    f0()\n")
    engine = Engine(LintConfig(base=project))
    assert engine.run([(project / "main.py", "main.py")]).diagnostics == []
    assert 10 < len(engine.project._modules) <= 1 + 200


# -- what is read: only regular files, never more than the size limit, never blocking --------------------------------
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"),
                                reason="needs FIFOs and /dev/zero (POSIX)")
TR004_HELP = ("  help: lint only regular files of at most 20,000,000 bytes that you can read: exclude this path "
              "(extend-exclude), or fix its permissions")


def _lint_child(args: list[str], cwd: Path, memory: int | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m torchrepro lint ARGS`` in a child process, killed after 60 s (a hang fails the test instead of
    hanging it) and, with ``memory``, with its address space capped (reading a huge file fails instead of
    exhausting the machine's memory)."""
    def cap() -> None:
        if memory is not None and resource is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    return subprocess.run([sys.executable, "-m", "torchrepro", "lint", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, preexec_fn=cap if memory is not None else None)


@needs_fifo
def test_a_fifo_or_a_device_named_py_is_reported_and_never_read(project: Path) -> None:
    """A FIFO ``x.py`` (which hung pre-commit) and a symlink ``y.py`` to /dev/zero (which exhausted memory) are
    reported as TR004, found by the directory search or named on the command line; a symlink to a regular file
    is linted, a symlink to a directory is not a file, an editor's lock file (a dangling symlink) is skipped. The
    scan of the project for programs importing a module (TR203) skips them too."""
    os.mkfifo(project / "x.py")
    os.symlink("/dev/zero", project / "y.py")
    (project / "real.txt").write_text(UNSEEDED)
    os.symlink("real.txt", project / "z.py")
    (project / "pkg").mkdir()
    os.symlink("pkg", project / "d.py")
    os.symlink("user@host.1234:1700000000", project / ".#train.py")
    (project / "lib.py").write_text("import torch\n\n\ndef f(out, i, s):\n    out.index_add_(0, i, s)\n")
    fifo = "x.py:1:1: TR004 it is a FIFO (named pipe), not a regular file; it was not read"
    device = "y.py:1:1: TR004 it is a character device, not a regular file; it was not read"
    done = _lint_child(["."], project)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[2:6] == [fifo, TR004_HELP, device, TR004_HELP]
    assert [" ".join(line.split()[:2]) for line in _lines(done.stdout)] == [
        "lib.py:5:5: TR203", "x.py:1:1: TR004", "y.py:1:1: TR004", "z.py:4:13: TR101"]
    assert done.stderr == "Found 4 findings in 4 files (4 files checked). `torchrepro rule CODE` explains a rule.\n"
    done = _lint_child(["x.py", "y.py", "z.py"], project)
    assert done.returncode == 1 and _lines(done.stdout)[:2] == [fifo, device]
    done = _lint_child(["lib.py"], project)
    assert done.returncode == 1 and [line.split()[1] for line in _lines(done.stdout)] == ["TR203"]


@pytest.mark.skipif(resource is None or sys.platform != "linux", reason="needs RLIMIT_AS (Linux)")
def test_a_file_over_the_size_limit_is_reported_without_being_read(project: Path) -> None:
    """A 4 GiB file (sparse: no disk used) is measured before it is read: with the child's address space capped
    at 1 GiB, reading it would fail; it is reported at once."""
    with open(project / "big.py", "wb") as f:
        f.truncate(4 * 2**30)
    (project / "small.py").write_text("x = 1\n")
    message = "big.py:1:1: TR004 the file is 4,294,967,296 bytes, over the limit of 20,000,000 bytes; it was not read"
    for args in (["."], ["big.py", "small.py"]):
        done = _lint_child(args, project, memory=2**30)
        assert (done.returncode, done.stdout.splitlines()) == (1, [message, TR004_HELP]), done.stderr


def _deny(real: Callable[..., object], denied: Callable[[str], bool]) -> Callable[..., object]:
    """``real`` (os.stat, os.open, os.scandir), raising PermissionError for the absolute paths ``denied`` accepts."""
    def call(path: object, *args: object, **kwargs: object) -> object:
        if isinstance(path, (str, os.PathLike)) and denied(os.path.abspath(path)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real(path, *args, **kwargs)
    return call


def test_files_and_directories_without_permission_are_reported(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A file that cannot be read and a directory that cannot be listed (simulated, as for a directory of mode
    000: the tests may run as root) are reported as TR004, whether found by the directory search or named on
    the command line. Nothing crashes: Path.exists and Path.is_file raised PermissionError on Python 3.11, for a
    path named on the command line and for an import resolved into the directory."""
    (project / "secret.py").write_text(UNSEEDED)
    (project / "locked").mkdir()
    (project / "locked" / "a.py").write_text(UNSEEDED)
    (project / "main.py").write_text("from locked.a import f\n\nif __name__ == '__main__':\n    f()\n")
    secret, locked = str(project / "secret.py"), str(project / "locked")
    monkeypatch.setattr(os, "stat", _deny(os.stat, lambda p: p == secret or p.startswith(locked + os.sep)))
    monkeypatch.setattr(os, "open", _deny(os.open, lambda p: p == secret or p.startswith(locked + os.sep)))
    monkeypatch.setattr(os, "scandir", _deny(os.scandir, lambda p: p == locked))
    expected = ["locked:1:1: TR004 cannot list the directory: Permission denied; the files in it were not checked",
                "secret.py:1:1: TR004 cannot read the file: Permission denied"]
    for argv in (["."], ["secret.py", "locked", "main.py"]):
        assert main(["lint", "-q", *argv]) == 1
        assert _lines(capsys.readouterr().out) == expected


# -- patterns: .gitignore as git reads it; invalid patterns in the configuration are errors -------------------------
GITIGNORE = ["[z-a].py", "[!z-a]1.py", "[a.py", "x.py\\", "[[:alpha:]]2.py", "[[:foo:]]3.py", "[a\\]b]4.py",
             "[a-c-e]5.py", "[]x]6.py", "d/s[!a]7.py", "[[:]8.py"]
TREE = ["z.py", "a.py", "y.py", "z1.py", "a1.py", "[a.py", "x.py", "a2.py", "92.py", "a3.py", "]4.py", "b4.py",
        "\\4.py", "-5.py", "e5.py", "b5.py", "d5.py", "]6.py", "x6.py", "a6.py", "d/sb7.py", "d/sa7.py", "d/s/7.py",
        "[8.py", ":8.py", "a8.py"]
# What `git ls-files --others --exclude-standard` keeps (git 2.39): a reversed range [z-a] matches only "z"; an
# unclosed "[", an unknown class [:foo:] and a trailing backslash make a pattern match nothing; a bracket never
# matches "/".
KEPT_BY_GIT = ["92.py", "[a.py", "\\4.py", "a.py", "a3.py", "a6.py", "a8.py", "d/s/7.py", "d/sa7.py", "d5.py", "x.py",
               "y.py", "z1.py"]


def test_gitignore_patterns_match_what_git_matches(project: Path) -> None:
    (project / ".git").mkdir()
    (project / ".gitignore").write_text("\n".join(GITIGNORE) + "\n")
    for name in TREE:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("x = 1\n")
    assert sorted(lint_paths(["."], LintConfig(base=project)).files) == KEPT_BY_GIT


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_gitignore_expectations_are_what_git_does(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("\n".join(GITIGNORE) + "\n")
    for name in TREE:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    done = subprocess.run(["git", "-c", "core.ignorecase=false", "ls-files", "--others", "--exclude-standard", "-z"],
                          cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60)
    assert sorted(name for name in done.stdout.split("\0") if name.endswith(".py")) == KEPT_BY_GIT


REVERSED = "the range z-a is reversed ('z' sorts after 'a'), so it matches only 'z'; write the range low to high: [a-z]"
UNCLOSED = ("the '[' is never closed, so the pattern matches nothing; close it with ']', or write '\\[' for a literal "
            "'['")
NO_CLASS = ("[:word:] is not a character class, so the pattern matches nothing; the classes are [:alnum:], [:alpha:], "
            "[:blank:], [:cntrl:], [:digit:], [:graph:], [:lower:], [:print:], [:punct:], [:space:], [:upper:], "
            "[:xdigit:]")
BACKSLASH = "it ends with a lone '\\', so it matches nothing; remove it, or write '\\\\' for a literal backslash"


@pytest.mark.parametrize(("section", "argv", "error"), [
    ("extend-exclude = ['[z-a]']", [], f"invalid pattern '[z-a]' in extend-exclude (PYPROJECT): {REVERSED}"),
    ("exclude = ['src/[abc']", [], f"invalid pattern 'src/[abc' in exclude (PYPROJECT): {UNCLOSED}"),
    ("per-file-ignores = { 'tests/[[:word:]]*' = ['TR1'] }", [],
     f"invalid pattern 'tests/[[:word:]]*' in per-file-ignores (PYPROJECT): {NO_CLASS}"),
    ("", ["--exclude", "ok,[z-a]"], f"invalid pattern '[z-a]' in --exclude (command line): {REVERSED}"),
    ("", ["--extend-exclude", "gen\\"], f"invalid pattern 'gen\\' in --extend-exclude (command line): {BACKSLASH}"),
])
def test_an_invalid_pattern_in_the_configuration_is_exit_2(project: Path, capsys: pytest.CaptureFixture[str],
                                                           section: str, argv: list[str], error: str) -> None:
    (project / "pyproject.toml").write_text(f"[tool.torchrepro.lint]\n{section}\n")
    (project / "train.py").write_text("x = 1\n")
    error = error.replace("PYPROJECT", f"{project / 'pyproject.toml'} [tool.torchrepro.lint]")
    assert main(["lint", *argv, "."]) == 2
    assert capsys.readouterr() == ("", f"torchrepro: error: {error}\n")
    assert main(["lint", "--json", *argv, "."]) == 2
    assert json.loads(capsys.readouterr().out) == {"schema": "torchrepro.lint/1", "verdict": "error", "error": error,
                                                   "exit_code": 2, "stderr": None}  # like every ReproError


# -- positions: lines as Python counts them, columns in characters -------------------------------------------------
def test_positions_and_noqa_follow_pythons_line_breaks(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Lines end at \\n, \\r\\n and a lone \\r (not at U+2028, a form feed or NEL): a noqa comment in a file with
    old Mac line ends suppresses its own line, and positions of unreadable bytes count characters."""
    (project / "cr.py").write_bytes(
        b"from torch.utils.data import DataLoader\r\ra = DataLoader(ds, shuffle=True)  # torchrepro: noqa: TR301\r"
        b"b = '\xc3\xa9'; c = DataLoader(ds, shuffle=True)\r")
    (project / "nul.py").write_bytes(b"s = '\xe2\x80\xa8'\rx = '\xc3\xa9'; y = 1\x00\n")
    (project / "latin.py").write_bytes(b"s = '\xc3\xa9\xe9'\n")
    assert main(["lint", "-q", "--select", "TR0,TR301", "."]) == 1
    assert [" ".join(line.split()[:2]) for line in _lines(capsys.readouterr().out)] == [
        "cr.py:4:14: TR301", "latin.py:1:7: TR002", "nul.py:2:15: TR003"]


# -- the shape of [tool.torchrepro.lint] ---------------------------------------------------------------------------
SETTINGS = "write the settings under a [tool.torchrepro.lint] header, one `key = value` per line"


@pytest.mark.parametrize(("text", "error"), [
    ("[[tool.torchrepro.lint]]\nselect = ['TR1']\n",
     "[tool.torchrepro.lint] must be a table, got an array of tables ([[tool.torchrepro.lint]]); write the header "
     "with single brackets: [tool.torchrepro.lint]"),
    ("[[tool.torchrepro]]\nlint = {}\n",
     "[tool.torchrepro] must be a table, got an array of tables ([[tool.torchrepro]]); write the header with single "
     "brackets: [tool.torchrepro]"),
    ("[tool.torchrepro]\nlint = 'x'\n", f"[tool.torchrepro.lint] must be a table, got a string ('x'); {SETTINGS}"),
    ("[tool]\ntorchrepro.lint = [1, 2]\n",
     f"[tool.torchrepro.lint] must be a table, got an array ([1, 2]); {SETTINGS}"),
    ("tool.torchrepro = 1\n", f"[tool.torchrepro] must be a table, got an integer (1); {SETTINGS}"),
    ("[tool]\nblack = true\ntorchrepro = 1.5\n", f"[tool.torchrepro] must be a table, got a float (1.5); {SETTINGS}"),
    ("[tool.torchrepro]\nselect = ['TR1']\n",
     "[tool.torchrepro] has select, a setting of [tool.torchrepro.lint]; move it under a [tool.torchrepro.lint] "
     "header"),
])
def test_a_lint_section_of_the_wrong_shape_is_exit_2(project: Path, capsys: pytest.CaptureFixture[str], text: str,
                                                     error: str) -> None:
    (project / "pyproject.toml").write_text(f"{text}\n[project]\nname = 'p'\n")
    (project / "train.py").write_text("x = 1\n")
    assert main(["lint", "train.py"]) == 2
    assert capsys.readouterr().err == f"torchrepro: error: {project / 'pyproject.toml'}: {error}\n"


def test_a_script_named_torchrepro_is_not_a_configuration(project: Path) -> None:
    """Without a TOML reader (Python 3.10 without tomli), a pyproject whose only mention of torchrepro is a
    script or a dependency is not parsed."""
    (project / "pyproject.toml").write_text("[project]\nname = 'p'\ndependencies = ['torchrepro']\n\n[tool]\n"
                                            "black = true\n\n[project.scripts]\ntorchrepro = 'torchrepro.cli:main'\n")
    assert load_config(toml=None).select == ("TR",)
