"""The documentation says what the code does: usage lines list every option, every command line and dotted name
in the docs exists, and sample outputs are what the current code prints. (The generated references and the API
page are kept complete by tests/test_docs_site.py.)"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import sys
from pathlib import Path

import pytest

import torchrepro
from torchrepro.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted(ROOT.joinpath("docs").rglob("*.md"))]


def _commands(parser: argparse.ArgumentParser, prog: str = "torchrepro") -> dict[str, argparse.ArgumentParser]:
    """``"torchrepro NAME"`` (and ``"torchrepro env diff"``) -> its parser."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[f"{prog} {name}"] = sub
                found |= _commands(sub, f"{prog} {name}")
    return found


COMMANDS = _commands(build_parser())


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_is_in_the_usage_line(name):
    """Hand-written usage lines left out run --keep-values/--trace-steps/--json/--values-budget, check --locate..."""
    usage = COMMANDS[name].format_usage()
    missing = [a.option_strings for a in _options(COMMANDS[name])
               if not any(re.search(rf"[\[(| ]{re.escape(s)}[\] ]", usage) for s in a.option_strings)]
    assert not missing, f"{name}: the usage line leaves out {missing}:\n{usage}"


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


_SPAN = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"(?<![\w./\"'-])torchrepro(?:\.[A-Za-z_]\w*)+(?![\w/\"'(-])")


def test_every_dotted_name_in_the_docs_resolves():
    """e.g. `torchrepro.env.audit.CUBLAS_NOT_NEEDED_FROM` must be that constant, not a function's attribute."""
    bad = []
    for path in DOCS:
        for span in _SPAN.findall(path.read_text(encoding="utf-8")):
            for dotted in _DOTTED.findall(span):
                try:
                    _resolve(dotted)
                except (ImportError, AttributeError) as exc:
                    bad.append(f"{path.name}: {dotted} ({type(exc).__name__})")
    assert not bad, "\n".join(bad)


def _command_lines(text: str) -> list[str]:
    """`torchrepro CMD ...` command lines in inline code and in console/bash blocks (up to a comment); HTML
    comments (notes to whoever merges next) are not documentation."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    found = [span for span in _SPAN.findall(text) if span.startswith("torchrepro ")]
    for block in re.findall(r"```(?:bash|console|sh)\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"^(\S*\$ )", "", line).split("  #")[0].strip()
            if line.startswith("torchrepro "):
                found.append(line)
    return found


def _flags_before_the_script(words: list[str]) -> list[str]:
    flags = []
    for word in words:
        if word == "--" or word in ("python", "...") or word.endswith(".py"):
            break
        if word.startswith("--") and word != "--":
            flags.append(word.split("=")[0])
    return flags


def test_every_documented_command_line_uses_options_that_exist():
    """A doc may not show `diff --locate-steps` when diff has no such option (or a stale option name)."""
    bad = []
    for path in DOCS:
        for line in _command_lines(path.read_text(encoding="utf-8")):
            try:
                words = shlex.split(line.replace("...", " ... "))
            except ValueError:
                continue
            name = " ".join(words[:3]) if " ".join(words[:3]) in COMMANDS else " ".join(words[:2])
            parser = COMMANDS.get(name)
            if parser is None:
                continue
            known = {s for a in _options(parser) for s in a.option_strings} | {"--help", "--version"}
            unknown = [f for f in _flags_before_the_script(words[len(name.split()):]) if f not in known]
            if unknown:
                bad.append(f"{path.name}: `{line}`: {name} has no {', '.join(unknown)}")
    assert not bad, "\n".join(bad)


# --- sample outputs in the docs are what the current code prints -------------------------------------------
def _sample(doc: str, command: str) -> list[str]:
    """The lines a console block shows after ``$ command``, up to the next prompt or the end of the block."""
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.split("  #")[0].strip() == f"$ {command}":
                rest = lines[i + 1:]
                end = next((k for k, x in enumerate(rest) if x.startswith("$ ")), len(rest))
                return rest[:end]
    raise AssertionError(f"docs/{doc} has no console sample of `{command}`")


def _shows(output: str, sample: list[str]) -> None:
    """Every sample line other than ``...`` is an output line, in the same order."""
    lines, at = output.splitlines(), 0
    for want in sample:
        if want.strip() == "...":
            continue
        found = next((k for k in range(at, len(lines)) if lines[k].rstrip() == want.rstrip()), None)
        assert found is not None, f"the sample line is not in the output (after line {at}):\n{want}\n---\n{output}"
        at = found + 1


def _torchrepro(*args: str, cwd: Path = ROOT) -> str:
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "COLUMNS": "200"}
    env.pop("FORCE_COLOR", None)
    p = subprocess.run([sys.executable, "-m", "torchrepro", *args], capture_output=True, text=True, cwd=cwd,
                       env=env, timeout=300)
    return p.stdout + p.stderr


def test_the_lint_sample_is_what_lint_prints():
    _shows(_torchrepro("lint", "examples"), _sample("lint.md", "torchrepro lint examples"))


def test_the_env_diff_sample_is_what_env_diff_prints(tmp_path):
    import copy
    import json

    doc = torchrepro.environment().to_json()
    a, b = copy.deepcopy(doc), copy.deepcopy(doc)
    a["threads"]["intra_op"], a["env"]["OMP_NUM_THREADS"] = 2, None
    b["threads"]["intra_op"], b["env"]["OMP_NUM_THREADS"] = 1, "1"
    (tmp_path / "machine-a.json").write_text(json.dumps(a))
    (tmp_path / "machine-b.json").write_text(json.dumps(b))
    out = _torchrepro("env", "diff", "machine-a.json", "machine-b.json", cwd=tmp_path)
    _shows(out, _sample("env.md", "torchrepro env diff machine-a.json machine-b.json"))
