"""What `check` shows while its runs run (steps, time, the script's last line; `--show-output`; `--parallel`'s
lines) and `check --runs auto` (how many runs, why it stopped adding), end to end."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.inprocess import torchrepro

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
WAITS = str(SCRIPTS / "prints_and_waits.py")  # parameters updated by hand: --runs auto makes 10 runs
EVERY_POLL = {"TORCHREPRO_PROGRESS_INTERVAL": "0"}  # a plain line whenever a run's steps or last line change
STEP_LINE = r"torchrepro: run (\d)/2: (\d+ steps?), \d+ (?:s|min \d\d s)(?:; last output: (.*))?"


def _file_lines(run_dir: Path) -> Counter[str]:
    """Every line of a run's stdout.txt and stderr.txt (the last one also without its newline)."""
    return Counter(line for name in ("stdout.txt", "stderr.txt")
                   for line in (run_dir / name).read_text().splitlines())


def _shown(stderr: str, run: int) -> Counter[str]:
    """The script's lines --show-output showed for ``run``, without their ``[run N] ``."""
    prefix = f"[run {run}] "
    return Counter(line[len(prefix):] for line in stderr.splitlines() if line.startswith(prefix))


def without_unbuffered() -> dict[str, str]:
    """This environment without PYTHONUNBUFFERED: the script's stdout is then buffered unless torchrepro makes it
    line-buffered (a line printed before a long wait must reach stdout.txt, to be shown)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def test_the_plain_progress_line_shows_steps_and_the_last_output_of_a_script_that_waits(tmp_path):
    """Not on a terminal (a pipe): while run 1 waits for a file, its line says 1 step and the line it printed last;
    the test creates the file only once it has seen that line, so nothing here depends on timing."""
    go = tmp_path / "go"
    p = subprocess.Popen([sys.executable, "-m", "torchrepro", "check", "--out", str(tmp_path / "o"), "--", "python",
                          WAITS, "--until", str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**without_unbuffered(), **EVERY_POLL}, cwd=tmp_path)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in p.stderr:  # type: ignore[union-attr]
            lines.put(line.rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        while True:
            try:
                line = lines.get(timeout=280)  # the script gives up after 300 s: fail, not hang
            except queue.Empty:
                pytest.fail("no progress line for 280 s after these:\n" + "\n".join(seen))
            if line is None:
                break
            seen.append(line)
            m = re.fullmatch(STEP_LINE, line)
            if m and m.group(1) == "1" and m.group(2) == "1 step" and m.group(3):
                go.touch()
        stdout = p.stdout.read()  # type: ignore[union-attr]
        assert p.wait(timeout=60) == 0, "\n".join(seen)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    waiting = [m.group(3) for line in seen if (m := re.fullmatch(STEP_LINE, line)) and m.group(1) == "1"
               and m.group(2) == "1 step" and m.group(3)]
    printed = (tmp_path / "o" / "run1" / "stdout.txt").read_text().splitlines()[0]
    assert re.fullmatch(r"epoch 1 loss \d\.\d\d", printed) and waiting[0] == printed, seen
    assert go.exists() and "torchrepro: IDENTICAL - 2 runs" in stdout
    assert any(line.startswith("torchrepro: run 1/2 ok: 2 steps in ") for line in seen), seen


def test_show_output_shows_every_line_of_every_run_once_and_the_files_keep_them(tmp_path):
    p = torchrepro("check", "--show-output", "--out", str(tmp_path / "o"), "--", "python", WAITS, "--lines", "6",
                   cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    for run in (1, 2):
        files = _file_lines(tmp_path / "o" / f"run{run}")
        assert {f"line {k}" for k in range(1, 7)} | {"warning: went on", "no newline at the end"} <= set(files)
        assert _shown(p.stderr, run) == files  # none lost, none doubled, the last one without its newline too
    # each run's lines come between its start and its end
    err = p.stderr.splitlines()
    assert err.index("[run 1] line 1") < err.index("[run 1] no newline at the end") < next(
        k for k, line in enumerate(err) if line.startswith("torchrepro: run 1/2 ok: 2 steps in ")) < err.index(
        "torchrepro: run 2/2 ...") < err.index("[run 2] line 1")


# every line check --parallel --show-output writes: each names its run, and is one of these, whole
PARALLEL_LINES = [
    r"torchrepro: run ([12])/2 \.\.\.",
    STEP_LINE.replace("(\\d)", "([12])"),
    r"torchrepro: run ([12])/2 ok: 2 steps in \d+\.\ds",
    r"\[run ([12])\] (?:line \d+|epoch [12] loss \d\.\d\d|warning: went on|no newline at the end)",
]


def test_parallel_lines_are_whole_lines_each_naming_its_run(tmp_path):
    p = torchrepro("check", "--parallel", "--show-output", "--out", str(tmp_path / "o"), "--", "python", WAITS,
                   "--lines", "60", cwd=tmp_path, env=EVERY_POLL)
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith(("torchrepro: run", "[run"))]
    odd = [line for line in lines if not any(re.fullmatch(pattern, line) for pattern in PARALLEL_LINES)]
    assert not odd, p.stderr
    for run in (1, 2):
        assert _shown(p.stderr, run) == _file_lines(tmp_path / "o" / f"run{run}")
        assert f"torchrepro: run {run}/2 ..." in lines


def _auto(tmp_path: Path, *args: str, script: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "o"
    p = torchrepro("check", "--runs", "auto", *args, "--out", str(out), "--", "python", *script, cwd=tmp_path)
    return p, json.loads((out / "check.json").read_text())


def test_runs_auto_makes_ten_runs_of_a_deterministic_script(tmp_path):
    p, doc = _auto(tmp_path, "--max-steps", "1", script=(WAITS,))
    assert p.returncode == 0, p.stderr
    assert doc["runs_auto"] == {"runs": 10, "stopped": "cap", "cap": 10, "budget_s": 600.0}
    assert len(doc["runs"]) == 10 and doc["verdict"] == "identical"
    assert p.stdout.splitlines()[1] == (
        "Sure:  --runs auto made 10 runs and stopped at its cap of 10 runs: 10 runs rule out a difference in every "
        "run, not a rare one: a race that makes 1 run in 4 differ passes 10 runs 8% of the time (1 in 10: 39%).")
    assert "torchrepro: run 10 of up to 10 ..." in p.stderr


def test_runs_auto_starts_no_run_after_the_budget(tmp_path):
    """Two runs always; then the budget (1 ms, spent by then) stops it: run 3, prestarted, never ran its script."""
    p, doc = _auto(tmp_path, "--budget", "1ms", "--max-steps", "1", script=(WAITS,))
    assert p.returncode == 0, p.stderr
    assert doc["runs_auto"] == {"runs": 2, "stopped": "budget", "cap": 10, "budget_s": 0.001}
    assert p.stdout.splitlines()[1] == (
        "Sure:  --runs auto made 2 runs and stopped adding runs once its 0.001s budget was spent (--budget): 2 runs "
        "rule out a difference in every run, not a rare one: a race that makes 1 run in 4 differ passes 2 runs 75% "
        "of the time (1 in 10: 90%). A larger --budget adds runs (10 runs: a 1-in-4 race passes 8% of the time).")
    assert sorted(x.name for x in (tmp_path / "o").iterdir() if x.name.startswith("run")) == ["run1", "run2"]
    assert "run 3" not in p.stderr


@pytest.mark.parametrize("noise_runs, runs", [(None, 2), ("3", 3)])
def test_runs_auto_stops_adding_at_the_first_divergence(tmp_path, noise_runs, runs):
    """Noise in every run: run 2 diverges; noise in the third launch only: runs 1-2 agree, run 3 diverges."""
    noise = ["--counter", str(tmp_path / "counter"), "--noise-runs", noise_runs] if noise_runs else []
    p, doc = _auto(tmp_path, script=(str(SCRIPTS / "diverges_at_step1.py"), "--steps", "3", "--manual",
                                     *noise))  # --manual: SGD by hand (no torch.optim)
    assert p.returncode == 1, p.stderr
    assert doc["verdict"] == "diverged" and doc["first_divergent_step"] == 1
    assert doc["runs_auto"] == {"runs": runs, "stopped": "diverged", "cap": 10, "budget_s": 600.0}
    assert len(doc["runs"]) == runs and not (tmp_path / "o" / f"run{runs + 1}").exists()
    assert p.stdout.startswith(f"torchrepro: DIVERGED at step 1 ({runs} runs of ")
    assert (f"Note:  --runs auto made {runs} runs and stopped adding runs at run {runs}, which diverged."
            in p.stdout.splitlines())


@pytest.mark.parametrize("value", ["abc", "0", "-5m", "10x", "1h30", "m", ""])
def test_a_bad_budget_is_refused(tmp_path, value):
    p = torchrepro("check", "--runs", "auto", f"--budget={value}", "--", "python", WAITS, cwd=tmp_path)
    assert p.returncode == 2
    assert (f"argument --budget: expected a duration above 0 such as 90s, 10m or 1h30m (a bare number is seconds), "
            f"got {value!r}") in p.stderr
    assert not (tmp_path / "torchrepro-runs").exists()


@pytest.mark.parametrize("args, message", [
    (["--runs", "3", "--budget", "10m"], "--budget 10m limits --runs auto, but the runs were given as --runs 3: add "
                                         "--runs auto, or remove --budget."),
    (["--runs", "auto", "--parallel"], "--runs auto adds runs one after the other while they agree; it does not go "
                                       "with --parallel: it starts every run at once, so their number is fixed "
                                       "before any has ended. Give a number of runs instead (--runs 10), or remove "
                                       "--parallel."),
    (["--runs", "auto", "--resume-at", "1"], "it does not go with --resume-at: it compares one uninterrupted run "
                                             "with one resumed run."),
    (["--runs", "auto", "--nproc-per-node", "2"], "it does not go with --nproc-per-node (torchrun): runs of several "
                                                  "ranks are compared in a number of runs fixed in advance."),
    (["--runs", "many"], "argument --runs: expected a number of runs (2 or more) or auto, got 'many'"),
])
def test_runs_auto_is_refused_where_it_cannot_apply(tmp_path, args, message):
    p = torchrepro("check", *args, "--", "python", WAITS, cwd=tmp_path)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert not (tmp_path / "torchrepro-runs").exists()


def test_a_bad_progress_interval_is_refused_before_anything_runs(tmp_path):
    p = torchrepro("check", "--", "python", WAITS, cwd=tmp_path, env={"TORCHREPRO_PROGRESS_INTERVAL": "soon"})
    assert p.returncode == 2
    assert ("torchrepro: error: TORCHREPRO_PROGRESS_INTERVAL='soon': expected the seconds between two progress "
            "lines of a run (0 or more, e.g. 30); unset it for the default of 10.") in p.stderr
    assert not (tmp_path / "torchrepro-runs").exists()
