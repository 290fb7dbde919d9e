"""Every Next names a command that reproduces the same situation when pasted (issue 40: after
`compare --seed 0 --rtol 1e-4 A B`, Next said `compare --locate 'A' 'B'`, which, run verbatim, gave another cause;
check's said `torchrepro check --deterministic -- ...`)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

import torchrepro as torchrepro_package
from tests.inprocess import torchrepro
from torchrepro.analysis.causes import check_command, with_commands
from torchrepro.analysis.compare import CheckResult
from torchrepro.analysis.crossrun import CompareResult
from torchrepro.analysis.resumeat import ResumeResult
from torchrepro.analysis.tolerance import Tolerance
from torchrepro.cli import build_parser
from torchrepro.cli._options import check_words, compare_words
from torchrepro.cli.diff_cmd import recorded_rerun

SRC = str(Path(torchrepro_package.__file__).resolve().parents[1])


def _check(cause: str, **kw) -> CheckResult:
    return CheckResult(verdict="diverged", runs=["r1", "r2"], step_mode="optimizer", steps=[3, 3], first_step=1,
                       cause=cause, **kw)


def test_check_next_names_this_checks_options_and_command():
    result = _check("compute")
    result.set_rerun(["--runs", "4", "--seed", "0", "--max-steps", "3"], ["python", "train.py", "--lr", "0.1"])
    assert result.action == (
        "Rerun with `torchrepro check --runs 4 --seed 0 --max-steps 3 --deterministic -- python train.py --lr 0.1` "
        "to confirm it is a kernel; `torchrepro check --runs 4 --seed 0 --max-steps 3 --locate -- python train.py "
        "--lr 0.1` names the operation and its source line.")
    assert result.to_json()["action"] == result.action


def test_an_option_the_next_sets_replaces_the_users():
    result = _check("initial-weights")
    result.set_rerun(["--seed", "7", "--fresh-cwd"], ["python", "my script.py"])
    assert result.action.endswith("or rerun with `torchrepro check --fresh-cwd --seed 0 -- python 'my script.py'` to "
                                  "confirm.")
    assert check_command(["--deterministic-except", "cudnn"], ["python", "t.py"], ["--deterministic"]) == \
        "torchrepro check --deterministic -- python t.py"


def test_without_a_command_the_wording_is_left_as_it_is():
    assert _check("compute").action.startswith("Rerun with `torchrepro check --deterministic -- ...`")
    assert with_commands("`torchrepro check -- ...`", ["--seed", "0"], None) == "`torchrepro check -- ...`"


def test_the_shared_working_directory_warning_names_the_check_too():
    result = _check("shared-working-directory", working_directory={"warning": "Rerun with `torchrepro check "
                                                                             "--fresh-cwd -- ...` (each run ...)"})
    result.set_rerun(["--seed", "0"], ["python", "train.py"])
    assert result.working_directory["warning"] == ("Rerun with `torchrepro check --seed 0 --fresh-cwd -- python "
                                                   "train.py` (each run ...)")
    assert "`torchrepro check --seed 0 --fresh-cwd -- python train.py`" in result.action


def test_compare_next_keeps_the_comparisons_options():
    result = CompareResult(_check("compute"), Tolerance(rtol=1e-4), ["python c.py", "python c.py --alt"],
                           verdict="equivalent", options=["--seed", "0", "--rtol", "0.0001"])
    assert result.action == ("`torchrepro compare --seed 0 --rtol 0.0001 --locate 'python c.py' 'python c.py --alt'` "
                             "names the first op that computes differently, with its module and source line on both "
                             "sides.")


def test_resume_fix_names_this_check_with_its_checkpoint_step():
    comparison = _check("compute")
    result = ResumeResult(k=3, comparison=comparison, trainer="script", checkpoint=None, runs={}, steps={},
                          cause="shared-working-directory")
    result.rerun = (["--seed", "0"], ["python", "train.py"])
    assert result.fix.startswith("Rerun with `torchrepro check --seed 0 --resume-at 3 --fresh-cwd -- python "
                                 "train.py` (each run in its own copy of the working directory)")
    result.cause = "compute"
    assert result.fix.startswith("Run `torchrepro check --seed 0 -- python train.py` (without --resume-at)")


def test_diff_of_recorded_runs_names_their_command():
    class Run:
        def __init__(self, manifest):
            self.manifest = manifest

    m = {"command": ["python", "train.py"], "seed": 1, "deterministic": False, "max_steps": None}
    assert recorded_rerun([Run(m), Run(m)]) == (["--seed", "1"], ["python", "train.py"])
    assert recorded_rerun([Run(m), Run(m | {"command": ["python", "other.py"]})]) is None
    assert recorded_rerun([Run(m | {"command": "python train.py"}), Run(m)]) is None


PARSER = build_parser()
SHAPING = ("seed", "deterministic", "deterministic_except", "max_steps", "values_budget")


@pytest.mark.parametrize("argv", [
    ["--seed", "0", "--rtol", "1e-4"],
    ["--deterministic-except", "cudnn-benchmark", "--atol", "dtype", "--max-steps", "3", "--values-budget", "512M"],
    ["--deterministic", "--rtol", "2e-05", "--atol", "1e-06"],
])
def test_a_pasted_compare_next_parses_to_the_same_comparison(argv):
    args = PARSER.parse_args(["compare", *argv, "python c.py", "python c.py --alt"])
    result = CompareResult(_check("compute"), Tolerance(), ["python c.py", "python c.py --alt"], verdict="diverged",
                           options=compare_words(args))
    pasted = shlex.split(result.action.split("`")[1])
    assert pasted[:2] == ["torchrepro", "compare"]
    again = PARSER.parse_args(pasted[1:])
    assert again.locate and (again.command_a, again.command_b) == (args.command_a, args.command_b)
    for name in (*SHAPING, "rtol", "atol"):
        assert getattr(again, name) == getattr(args, name), name


@pytest.mark.parametrize("argv", [
    ["--runs", "4", "--seed", "3", "--parallel"],
    ["--deterministic", "--max-steps", "2", "--fresh-cwd", "--values-budget", "1G", "--nproc-per-node", "2"],
])
def test_a_pasted_check_next_parses_to_the_same_check(argv):
    args = PARSER.parse_args(["check", *argv, "--", "python", "train.py", "--lr", "0.1"])
    user_command = args.user_command[1:] if args.user_command[:1] == ["--"] else args.user_command
    result = _check("compute")
    result.set_rerun(check_words(args), user_command)
    for span in result.action.split("`")[1::2]:
        pasted = shlex.split(span)
        again = PARSER.parse_args(pasted[1:])
        assert again.user_command[1:] == user_command
        for name in (*SHAPING, "runs", "nproc_per_node", "parallel", "fresh_cwd"):
            if name == "deterministic" and "--deterministic" in pasted:
                continue  # the Next that adds it
            assert getattr(again, name) == getattr(args, name), (name, span)


# updated by hand, not by torch.optim (whose first use imports torch._dynamo: about 1 s of CPU in each of the six runs)
SCRIPT = """\
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
x, y = torch.randn(32, 8), torch.randn(32, 1)
for _ in range(3):
    h = model[0](x)
    if "--alt" in sys.argv:
        h = (h * 3.0) / 3.0
    ((model[2](model[1](h)) - y) ** 2).mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
"""


def test_compares_next_pasted_verbatim_reproduces_the_same_verdict_and_cause(tmp_path):
    """Each compare runs in this process (tests/inprocess.py), as the pasted command's words would: the command's
    process is not what is tested; its training runs are processes of their own."""
    (tmp_path / "c.py").write_text(SCRIPT)
    env = {"PYTHONPATH": SRC, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}

    def compare(*args: str) -> tuple[dict, str]:
        p = torchrepro("compare", "--json", *args, cwd=tmp_path, env=env, timeout=600)
        assert p.returncode in (0, 1), p.stderr
        return json.loads(p.stdout), p.stderr

    first, _ = compare("--seed", "0", "--rtol", "1e-4", "--out", "one", "python c.py", "python c.py --alt")
    assert (first["verdict"], first["cause"]) == ("equivalent", "compute")
    assert first["action"] == ("`torchrepro compare --seed 0 --rtol 0.0001 --locate 'python c.py' 'python c.py "
                               "--alt'` names the first op that computes differently, with its module and source "
                               "line on both sides.")
    pasted = shlex.split(first["action"].split("`")[1])
    again, _ = compare(*pasted[2:], "--out", "two")
    assert (again["verdict"], again["cause"]) == (first["verdict"], first["cause"])
    assert again["locate"] is not None and again["tolerance"] == first["tolerance"]
