"""End to end: `torchrepro check` stops a later run K steps after its first divergence (as its steps are written),
`--full-runs` runs every step, `--parallel` runs them all at once with the same verdicts and thread counts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.inprocess import torchrepro

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "diverges_at_step1.py"
SAME_UP_TO_STOP = ("verdict", "first_divergent_step", "cause", "diverged_first", "first_step_by_kind", "step_mode",
                   "value_deltas", "value_delta_text", "parameters_identical")


def check(tmp_path: Path, name: str, *flags: str, script_args: tuple[str, ...] = ()) -> tuple[int, dict, str, str]:
    """Run check from tmp_path/work (the counter file, if any, lies outside it), in this process
    (tests/inprocess.py); its JSON, stdout, stderr."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    out = tmp_path / name
    p = torchrepro("check", "--out", str(out), *flags, "--", "python", str(SCRIPT), *script_args, timeout=600,
                   cwd=work)
    doc = json.loads((out / "check.json").read_text()) if (out / "check.json").exists() else {}
    return p.returncode, doc, p.stdout, p.stderr


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> tuple[Path, tuple[int, dict, str, str]]:
    """One sequential check of the script that diverges at step 1 (seeded by --counter, its thread counts appended
    to threads-seq), read by the test of the stop and by the test of --parallel: its directory and its check."""
    tmp = tmp_path_factory.mktemp("stopped")
    return tmp, check(tmp, "stop", script_args=("--counter", str(tmp / "counter-a"),
                                                "--threads-file", str(tmp / "threads-seq")))


# 1. --manual: the script updates its parameters by hand (no torch.optim, whose first optimizer imports
#    torch._dynamo: about 1 CPU second a run), where the optimizer is not what the test is about; the stop in
#    optimizer-step mode is the shared check's (``stopped``), in backward mode test_manual_updates_stop_...'s.


def recorded_steps(run_dir: Path) -> int:
    return sum(line.startswith('{"kind":"step"') for line in (run_dir / "trace.jsonl").read_text().splitlines())


def test_diverged_run_stops_five_steps_after_and_reports_what_full_runs_does(stopped):
    tmp_path, (rc, doc, text, err) = stopped
    assert rc == 1, err
    # the noise is added to the model's input (no DataLoader): data, fingerprinted where the model receives it
    assert doc["verdict"] == "diverged" and doc["first_divergent_step"] == 1 and doc["cause"] == "data"
    assert doc["steps"] == [40, 6] and recorded_steps(tmp_path / "stop" / "run2") == 6
    assert doc["stopped"][0] is None
    assert doc["stopped"][1] == {"after_step": 6, "first_divergent_step": 1, "steps_after": 5, "diverged_runs": [2],
                                 "reason": "it diverged from run 1 at step 1; it was stopped 5 steps later",
                                 "waited_s": doc["stopped"][1]["waited_s"]}
    manifest = json.loads((tmp_path / "stop" / "run2" / "manifest.json").read_text())
    assert manifest["status"] == "stopped-after-divergence" and manifest["exit_code"] == 0
    assert manifest["stopped_at_max_steps"] is False and manifest["stopped"]["after_step"] == 6
    assert ("Stopped: run 2 stopped 5 steps after its first divergence (step 1), after step 6; --full-runs runs "
            "every step") in text
    assert "run 2/2 stopped-after-divergence: 6 steps" in err
    assert "Stopped: run 2 stopped 5 steps after its first divergence (step 1)" in (tmp_path / "stop" /
                                                                                   "report.html").read_text()
    assert doc["final_max_abs_delta_weight"] is None and "final max |Δ weight|" not in text

    rc, full, text, err = check(tmp_path, "full", "--full-runs", script_args=("--counter", str(tmp_path / "counter-b")))
    assert rc == 1, err
    assert full["steps"] == [40, 40] and full["stopped"] == [None, None] and "Stopped:" not in text
    assert recorded_steps(tmp_path / "full" / "run2") == 40 and full["final_max_abs_delta_weight"] > 0
    # the same runs (the counter seeds them alike): everything up to the stop is what the full runs give
    assert {k: doc[k] for k in SAME_UP_TO_STOP} == {k: full[k] for k in SAME_UP_TO_STOP}
    assert doc["loss_max_abs_delta"] == full["loss_max_abs_delta"][:6]
    assert doc["param_max_abs_delta"] == {k: v for k, v in full["param_max_abs_delta"].items() if int(k) <= 6}
    assert doc["losses"][0] == full["losses"][0] and doc["losses"][1] == full["losses"][1][:6]


def test_identical_runs_are_not_stopped(tmp_path):
    rc, doc, text, err = check(tmp_path, "same", script_args=("--noise-runs", "", "--steps", "12"))
    assert rc == 0, err
    assert doc["verdict"] == "identical" and doc["steps"] == [12, 12] and doc["stopped"] == [None, None]
    assert recorded_steps(tmp_path / "same" / "run2") == 12 and "Stopped:" not in text


def test_three_runs_each_stopped_after_its_own_divergence(tmp_path):
    """Run 2 is identical to run 1 and runs to its end; run 3 diverges and is stopped."""
    rc, doc, text, err = check(tmp_path, "three", "--runs", "3", "--steps-after-divergence", "2",
                               script_args=("--counter", str(tmp_path / "counter"), "--noise-runs", "3",
                                            "--steps", "20", "--manual"))  # --manual: note 1
    assert rc == 1, err
    assert doc["verdict"] == "diverged" and doc["first_divergent_step"] == 1 and doc["steps"] == [20, 20, 3]
    assert doc["stopped"][:2] == [None, None] and doc["stopped"][2]["after_step"] == 3
    assert doc["stopped"][2]["diverged_runs"] == [3] and doc["diverged_first"][0]["runs"] == [0, 2]
    assert "Stopped: run 3 stopped 2 steps after its first divergence (step 1), after step 3" in text
    # run 2 ran to its end: its final parameters are compared (equal), run 3's are not
    assert doc["final_max_abs_delta_weight"] == 0
    assert "final parameters of the runs that ran to their end (not run 3: stopped early): bitwise equal" in text


def test_manual_updates_stop_after_the_hand_update_of_the_last_step(tmp_path):
    rc, doc, _, err = check(tmp_path, "manual", "--steps-after-divergence", "3", script_args=("--manual",))
    assert rc == 1, err
    assert doc["step_mode"] == "backward" and doc["first_divergent_step"] == 1 and doc["steps"] == [40, 4]
    assert doc["stopped"][1]["after_step"] == 4


def test_parallel_gives_the_sequential_verdicts_and_thread_counts(tmp_path, stopped):
    """The sequential check is the shared one (``stopped``: its noise seeded by --counter, not os.urandom)."""
    threads = {name: tmp_path / f"threads-{name}" for name in ("par", "par-same")}
    threads["seq"] = stopped[0] / "threads-seq"
    rc, seq, _, err = stopped[1]
    assert rc == 1, err
    rc, par, text, err = check(tmp_path, "par", "--parallel", script_args=("--threads-file", str(threads["par"])))
    assert rc == 1, err
    for key in ("verdict", "first_divergent_step", "cause", "step_mode"):
        assert par[key] == seq[key], key
    assert [d["kind"] for d in par["diverged_first"]] == [d["kind"] for d in seq["diverged_first"]]
    assert seq["steps"] == [40, 6] and par["steps"] == [6, 6]  # with --parallel run 1 is stopped too
    assert [s["after_step"] for s in par["stopped"]] == [6, 6]
    assert par["stopped"][0]["reason"] == "run 2 diverged from run 1 at step 1; every run was stopped 5 steps later"
    assert "Stopped: run 1 stopped 5 steps after the first divergence (step 1), after step 6" in text
    rc, same, _, err = check(tmp_path, "par-same", "--parallel",  # --manual: note 1
                             script_args=("--noise-runs", "", "--threads-file", str(threads["par-same"]), "--manual"))
    assert rc == 0, err
    assert same["verdict"] == "identical" and same["steps"] == [40, 40] and same["stopped"] == [None, None]
    counts = {name: path.read_text().split() for name, path in threads.items()}
    assert len(counts["seq"]) == 2 and counts["par"] == counts["seq"] and counts["par-same"] == counts["seq"]


def test_parallel_refused_with_resume_at(tmp_path):
    p = torchrepro("check", "--parallel", "--resume-at", "2", "--", "python", str(SCRIPT), timeout=120, cwd=tmp_path)
    assert p.returncode == 2
    assert ("--parallel runs the runs of one process at once; it does not go with --resume-at (those checks run "
            "one run after the other): remove --parallel.") in p.stderr


FOREVER = """
import os, sys, time
import torch
w = torch.nn.Parameter(torch.ones(4))
for step in range(1, 10**9):  # updated by hand: no torch.optim, whose first optimizer imports torch._dynamo
    (w ** 2).sum().backward()
    with torch.no_grad():
        w.add_(w.grad, alpha=-0.01)
        w.grad = None
    if step == 1:
        open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    time.sleep(0.05)
"""


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_stops_every_parallel_run(tmp_path):
    script, pids, out = tmp_path / "forever.py", tmp_path / "pids", tmp_path / "out"
    script.write_text(FOREVER)
    pids.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "torchrepro", "check", "--parallel", "--out", str(out), "--",
                             "python", str(script), str(pids)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 300
        while len(list(pids.iterdir())) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        children = [int(p.name) for p in pids.iterdir()]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:  # never leave the endless scripts behind
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert all(_gone(pid) for pid in children), "a training script outlived torchrepro"
    assert "interrupted by SIGTERM" in stderr
    for run in ("run1", "run2"):
        manifest = json.loads((out / run / "manifest.json").read_text())
        assert manifest["status"] == "interrupted" and manifest["interrupted_by"] == "SIGTERM"
