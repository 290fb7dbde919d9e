"""One verdict writer: check, the ranks' check, resume-at, diff and compare save and print a verdict the same way,
including when a file cannot be written (the verdict printed all the same, ``exit_code`` 2 on stdout and on disk)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from torchrepro.analysis.compare import CheckResult, Difference
from torchrepro.analysis.crossrun import CompareResult
from torchrepro.analysis.rankcompare import RanksCheck
from torchrepro.analysis.resumeat import ResumeResult
from torchrepro.analysis.tolerance import Tolerance
from torchrepro.record.store import Run


def _diverged() -> CheckResult:
    return CheckResult(verdict="diverged", runs=["a", "b"], step_mode="optimizer", steps=[3, 3], first_step=1,
                       first=[Difference("grads", 1, ["fc.weight"])], kind_first_steps={"grads": 1}, cause="compute",
                       losses=[[1.0, 0.5, 0.25], [1.0, 0.6, 0.3]], loss_delta=[0.0, 0.1, 0.05])


def _check(out: Path, as_json: bool) -> int:
    from torchrepro.cli.check_cmd import finish

    return finish(_diverged(), out, what="`python t.py`", as_json=as_json, runs=[])


def _ranks(out: Path, as_json: bool) -> int:
    from torchrepro.cli._ranks import finish_ranks

    return finish_ranks(RanksCheck(nproc=2, per_rank=[_diverged(), _diverged()], desync=[None, None]), out,
                        what="`python t.py`", as_json=as_json)


def _resume(out: Path, as_json: bool) -> int:
    from torchrepro.cli._resumecheck import finish_resume

    result = ResumeResult(k=1, comparison=_diverged(), trainer="script", checkpoint=None, runs={},
                          steps={"uninterrupted": 3, "before_checkpoint": 1, "after_resume": 2},
                          cause="compute", step=2)
    return finish_resume(result, out, what="`python t.py`", as_json=as_json)


def _compare(out: Path, as_json: bool) -> int:
    from torchrepro.cli.compare_cmd import finish

    result = CompareResult(check=_diverged(), tolerance=Tolerance(bitwise=True),
                           commands=["python a.py", "python b.py"], verdict="diverged")
    return finish(result, out, [Run(path=out / s, manifest={}, events=[]) for s in "ab"], as_json=as_json)


PATHS: dict[str, tuple[Callable[[Path, bool], int], str, str]] = {
    "check": (_check, "check.json", "torchrepro: DIVERGED at step 1"),
    "ranks": (_ranks, "check.json", "torchrepro: DIVERGED at step 1 on rank 0"),
    "resume-at": (_resume, "check.json", "diverged"),
    "compare": (_compare, "compare.json", "torchrepro: DIVERGED"),
}


@pytest.mark.parametrize("name", sorted(PATHS))
def test_every_verdict_goes_out_the_same_way(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    finish, json_name, headline = PATHS[name]
    assert finish(tmp_path, False) == 1
    printed = capsys.readouterr().out
    assert headline.lower() in printed.lower() and f"Report: {tmp_path / 'report.html'}" in printed
    doc: dict[str, Any] = json.loads((tmp_path / json_name).read_text())
    assert doc["exit_code"] == 1 and doc["report"] == str(tmp_path / "report.html") and "error" not in doc
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("name", sorted(PATHS))
def test_a_file_that_cannot_be_written_is_exit_2_on_stdout_and_on_disk(name: str, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    finish, json_name, _ = PATHS[name]
    (tmp_path / "plain").write_text("a file, not a folder")
    (tmp_path / "report.html").symlink_to(tmp_path / "plain" / "report.html")  # under a file: cannot be written
    assert finish(tmp_path, True) == 2
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    saved = json.loads((tmp_path / json_name).read_text())
    for doc in (printed, saved):
        assert doc["exit_code"] == 2 and doc["report"] is None, name
        assert doc["error"].startswith(f"could not write {tmp_path / 'report.html'} (Not a directory, ENOTDIR); the "
                                       "verdict above is complete"), doc["error"]
    assert f"torchrepro: error: could not write {tmp_path / 'report.html'}" in captured.err


LAUNCHING = ("run", "check", "compare", "bisect")
SHARED = ("--seed", "--deterministic", "--deterministic-except", "--max-steps", "--values-budget", "--json")


@pytest.mark.parametrize("command", LAUNCHING)
def test_every_command_that_runs_a_script_takes_the_same_launch_options(command: str) -> None:
    from torchrepro.cli import build_parser

    parser = build_parser([f"{command}_cmd"])
    sub = next(a for a in parser._actions if a.dest == "command" or getattr(a, "choices", None))
    options = {o for a in sub.choices[command]._actions for o in a.option_strings}  # type: ignore[union-attr]
    assert set(SHARED) <= options, set(SHARED) - options


def test_compare_and_bisect_honour_deterministic_except() -> None:
    import argparse

    from torchrepro.cli._options import add_run_options
    from torchrepro.cli.compare_cmd import launch_options

    p = argparse.ArgumentParser()
    add_run_options(p)
    opts = launch_options(p.parse_args(["--deterministic-except", "cudnn-benchmark,fill-uninitialized-memory"]))
    assert opts.deterministic is True
    assert opts.determinism == {"fill_uninitialized_memory": False, "cudnn_benchmark": True}


SPOOF = "fc\x1b[2K\r\x1b[32mtorchrepro: IDENTICAL\x1b[0m\u202e.weight"


@pytest.mark.parametrize("name", ["check", "ranks", "compare"])
def test_names_from_a_run_directory_cannot_spoof_the_terminal(name: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A parameter named with ESC, CR or U+202E (a crafted run directory) is printed escaped: no cursor move, no
    colour, no reversed text, and no line of its own."""
    spoofed = _diverged()
    spoofed.first = [Difference("grads", 1, [SPOOF, "fc.bias\ntorchrepro: IDENTICAL - forged line"])]
    spoofed.final_max_abs_delta, spoofed.final_max_abs_delta_tensor = 0.5, SPOOF
    spoofed.runs = ["out/run1\x1b[8m", "out/run2\u202e"]  # a run directory's path is printed too
    monkeypatch.setattr(sys.modules[__name__], "_diverged", lambda: spoofed)
    finish, _, _ = PATHS[name]
    assert finish(tmp_path, False) == 1
    out = capsys.readouterr().out
    assert not any(ch in out for ch in "\x1b\r\u202e"), repr(out)
    assert "fc\\x1b[2K\\r\\x1b[32mtorchrepro: IDENTICAL\\x1b[0m\\u202e.weight" in out
    assert not any(line.startswith("torchrepro: IDENTICAL") for line in out.splitlines())
