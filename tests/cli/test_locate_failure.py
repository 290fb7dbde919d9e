"""``--locate`` whose traced re-runs fail keeps the verdict already found and reports the failure beside it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torchrepro
from tests.inprocess import torchrepro as in_process

SRC = str(Path(torchrepro.__file__).resolve().parents[1])
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "noisy_model.py"  # its third start fails with --starts


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``torchrepro ARGS`` in tmp_path/work, in this process (tests/inprocess.py)."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.py").write_text(SCRIPT.read_text())
    return in_process(*args, cwd=tmp_path / "work", env={"PYTHONPATH": ENV["PYTHONPATH"]}, timeout=600)


def test_check_locate_whose_reruns_fail_keeps_the_verdict(tmp_path: Path) -> None:
    counter = str(tmp_path / "starts")
    p = _run(tmp_path, "check", "--locate", "--json", "--out", str(tmp_path / "out"), "--", "python", "train.py",
             "--starts", counter)
    assert p.returncode == 1, p.stderr  # the verdict's code: diverged
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "diverged" and doc["first_divergent_step"] == 1 and doc["cause"] == "compute"
    located = doc["locate"]
    assert located["verdict"] == "failed"
    assert located["title"].startswith("the traced re-runs failed, so no op could be named: run 1 of 2 failed "
                                       "with exit code 1"), located["title"]
    assert "the data set is gone" in located["error"] and located["stderr"].endswith("stderr.txt")
    assert located["note"] == ("The verdict above stands (it comes from the compared runs). Fix what made the "
                               "re-run fail, then run `torchrepro check --locate -- python train.py "
                               f"--starts {counter}` again.")
    saved = json.loads((tmp_path / "out" / "check.json").read_text())
    assert saved["verdict"] == "diverged" and saved["locate"]["verdict"] == "failed" and saved["exit_code"] == 1
    assert "the traced re-runs failed" in (tmp_path / "out" / "report.html").read_text()


def test_compare_locate_whose_reruns_fail_keeps_the_verdict(tmp_path: Path) -> None:
    counter = str(tmp_path / "starts")
    p = _run(tmp_path, "compare", "--locate", "--out", str(tmp_path / "out"), f"python train.py --starts {counter}",
             f"python train.py --starts {counter}")
    assert p.returncode == 1, p.stderr
    assert "torchrepro: DIVERGED" in p.stdout
    assert "Locate: the traced re-runs failed, so no op could be named: command A" in p.stdout, p.stdout
    assert "then run `torchrepro compare --locate 'python train.py" in p.stdout
    saved = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert saved["verdict"] == "diverged" and saved["locate"]["verdict"] == "failed"


def test_a_check_run_with_deterministic_mode_is_not_told_to_rerun_with_it(tmp_path: Path) -> None:
    """Next after `check --deterministic` names what deterministic mode does not cover, and its command reproduces
    the same runs (the user's options kept) with --locate."""
    counter = str(tmp_path / "starts")
    p = _run(tmp_path, "check", "--seed", "3", "--deterministic", "--json", "--out", str(tmp_path / "out"), "--",
             "python", "train.py", "--starts", counter)
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert doc["cause"] == "compute" and "Rerun with `torchrepro check --deterministic" not in doc["action"]
    assert doc["action"].startswith("Deterministic mode was on, so this is not a kernel that deterministic mode "
                                    "covers: look for an unseeded random op")
    assert (f"`torchrepro check --seed 3 --deterministic --locate -- python train.py --starts {counter}` names the "
            "operation"
            in doc["action"]), doc["action"]
