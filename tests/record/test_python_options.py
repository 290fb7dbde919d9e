"""Interpreter options in the command (`python -u`, `python -W ignore`, `python -X dev`): passed on to the
interpreter that runs the script, with their values; the ones that would undo what torchrepro sets are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchrepro.record.launcher import CommandError, parse_python_command

SEES = """import json, sys
import torch
w = torch.nn.Parameter(torch.ones(2))
(w * 2).sum().backward()
with open(sys.argv[1], "w") as f:
    json.dump({"warnoptions": sys.warnoptions, "xoptions": sys._xoptions,
               "no_bytecode": sys.flags.dont_write_bytecode}, f)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SEES)
    return path


@pytest.mark.parametrize(("options", "flags"), [
    (["-W", "ignore"], ("-W", "ignore")),
    (["-Wignore"], ("-Wignore",)),
    (["-u", "-W", "error::UserWarning", "-X", "dev"], ("-u", "-W", "error::UserWarning", "-X", "dev")),
    (["-Xfaulthandler", "-B"], ("-Xfaulthandler", "-B")),
])
def test_options_with_a_value_are_passed_on_with_it(script: Path, options: list[str], flags: tuple) -> None:
    target = parse_python_command([sys.executable, *options, str(script), "--lr", "1"])
    assert (target.kind, target.target, target.argv) == ("path", str(script), [str(script), "--lr", "1"])
    assert target.python_flags == flags
    assert target.child_command()[:len(flags) + 3] == [target.interpreter, *flags, "-m",
                                                        "torchrepro.record.child"]
    module = parse_python_command([sys.executable, *options, "-m", "pkg.train"])
    assert (module.kind, module.target, module.python_flags) == ("module", "pkg.train", flags)


@pytest.mark.parametrize(("options", "message"), [
    (["-W"], "python option -W needs a value"),
    (["-X"], "python option -X needs a value"),
    (["-v"], "python option '-v' is not supported by torchrepro (supported: -B -O -OO -W ARG -X OPT -q -s -u)"),
    (["-E"], "python option -E ignores PYTHONHASHSEED"),
])
def test_other_options_are_refused_by_name(script: Path, options: list[str], message: str) -> None:
    with pytest.raises(CommandError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_python_command([sys.executable, *options] + ([] if options in (["-W"], ["-X"]) else [str(script)]))


def test_check_runs_the_script_with_the_options(script: Path, tmp_path: Path) -> None:
    """`torchrepro check -- python -W ignore -Xfaulthandler -B train.py`: both runs see the options (before the
    fix: "python option '-W' is not supported", exit 2)."""
    seen = tmp_path / "seen.json"
    p = subprocess.run([sys.executable, "-m", "torchrepro", "check", "--json", "--out", str(tmp_path / "out"), "--",
                        "python", "-W", "ignore", "-Xfaulthandler", "-B", str(script), str(seen)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["verdict"] == "identical", p.stderr
    assert json.loads(seen.read_text()) == {"warnoptions": ["ignore"], "xoptions": {"faulthandler": True},
                                            "no_bytecode": 1}
