"""``torchrepro lint`` and ``torchrepro rule`` on the command line: exit codes, selection, suppression,
configuration, file discovery, unreadable files, and running without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchrepro.cli import main
from torchrepro.lint import ConfigError, LintConfig, lint_paths, lint_source, load_config

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
    assert len(listing) == 22 and listing[0].startswith("TR001  syntax-error")
    assert main(["rule", "--json", "TR501"]) == 0
    assert json.loads(capsys.readouterr().out)["rules"][0]["name"] == "checkpoint-without-rng-state"
    assert main(["rule", "TR999"]) == 2
    assert "unknown rule 'TR999'" in capsys.readouterr().err


def test_lint_package_runs_without_torch(tmp_path: Path) -> None:
    """The lint subpackage imports only the standard library: loaded without torchrepro/__init__.py (which
    imports torch), it lints a file and torch, numpy and the rest of torchrepro stay unimported."""
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
    assert out.splitlines()[-1] == "LOADED ['torchrepro']"
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
