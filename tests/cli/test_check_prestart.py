"""End to end: `torchrepro check` starts run 2's interpreter while run 1 trains (its script waits until run 1 has
ended), `--no-prestart` does not, and a waiting run never outlives a check that ends early (a failed run 1, a
signal)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "startlog.py"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process start times in /proc")


def check(tmp_path: Path, *flags: str, script: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, Path]:
    log = tmp_path / "log.jsonl"
    p = subprocess.run([sys.executable, "-m", "torchrepro", "check", "--out", str(tmp_path / "out"), *flags, "--",
                        sys.executable, str(SCRIPT), str(log), *script], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    return p, log


def events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def processes_naming(text: str) -> list[int]:
    """The pids of the live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and int(entry.name) != os.getpid():
                found.append(int(entry.name))
    return found


def test_run_2_starts_while_run_1_trains_but_its_script_only_after_run_1_ended(tmp_path):
    p, log = check(tmp_path, "--json", script=("--sleep", "3"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["verdict"] == "identical"
    start1, end1, start2, end2 = events(log)
    assert [e["event"] for e in (start1, end1, start2, end2)] == ["start", "end", "start", "end"]
    assert start2["process_started"] - start1["process_started"] < 2.5  # started beside run 1 (which sleeps 3 s)
    assert start2["script_started"] >= end1["t"]  # ... but its script ran only after run 1's had ended
    for run in ("run1", "run2"):
        manifest = json.loads((tmp_path / "out" / run / "manifest.json").read_text())
        assert manifest["status"] == "ok" and manifest["steps"] == 4
    run2 = json.loads((tmp_path / "out" / "run2" / "manifest.json").read_text())
    assert run2["started"] >= end1["t"] - 0.01  # its duration counts from the release, not from the prestart


def test_no_prestart_starts_run_2_after_run_1(tmp_path):
    p, log = check(tmp_path, "--no-prestart", script=("--sleep", "3"))
    assert p.returncode == 0, p.stderr
    start1, end1, start2, _ = events(log)
    assert start2["process_started"] - start1["process_started"] > 3  # not before run 1 (3 s of sleep) ended


def test_a_failed_run_1_ends_the_waiting_run_2_and_removes_its_directory(tmp_path):
    p, log = check(tmp_path, script=("--fail",))
    assert p.returncode == 2, p.stderr
    assert "run 1 of 2 failed with exit code 3" in p.stderr
    assert [e["event"] for e in events(log)] == ["start"]  # run 2's script never ran
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == ["run1"]
    assert processes_naming(str(log)) == []


def test_with_fresh_cwd_a_failed_run_1_also_removes_the_copy_made_for_run_2(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("kept")
    log = tmp_path / "log.jsonl"
    p = subprocess.run([sys.executable, "-m", "torchrepro", "check", "--fresh-cwd", "--out", str(tmp_path / "out"),
                        "--", sys.executable, str(SCRIPT), str(log), "--fail"], capture_output=True, text=True,
                       timeout=300, cwd=work)
    assert p.returncode == 2, p.stderr
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == ["run1", "run1-cwd"]
    assert (work / "data.txt").read_text() == "kept" and (tmp_path / "out" / "run1-cwd" / "data.txt").exists()


def test_sigterm_while_run_1_trains_ends_the_waiting_run_2_too(tmp_path):
    log = tmp_path / "log.jsonl"
    check_proc = subprocess.Popen([sys.executable, "-m", "torchrepro", "check", "--out", str(tmp_path / "out"), "--",
                                   sys.executable, str(SCRIPT), str(log), "--sleep", "60"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and log.read_text()) or len(processes_naming(str(log))) < 2:
            assert time.monotonic() < deadline, "run 1 did not start, or run 2 was not prestarted beside it"
            assert check_proc.poll() is None, check_proc.communicate()
            time.sleep(0.1)
        check_proc.send_signal(signal.SIGTERM)
        _, err = check_proc.communicate(timeout=60)
    finally:
        if check_proc.poll() is None:
            check_proc.kill()
    assert check_proc.returncode == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM" in err
    deadline = time.monotonic() + 10
    while processes_naming(str(log)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(str(log)) == []
    assert [e["event"] for e in events(log)] == ["start"]
    assert not (tmp_path / "out" / "run2").exists()


def niced_threads(pid: int) -> set[int]:
    """The threads of process ``pid`` (not its main thread) whose nice value is 19 now."""
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(task.name) != pid and int(fields[16]) == 19:  # field 19 of stat: the nice value
            found.add(int(task.name))
    return found


def test_the_waiting_run_imports_at_the_lowest_priority_and_its_script_runs_at_the_normal_one(tmp_path):
    """Run 2 imports torch while run 1 trains, in a thread at nice 19 (it takes no CPU time run 1 wants), as check
    itself imports its analysis modules; run 2's script, and the threads that script starts, run at the priority
    run 1's have."""
    log = tmp_path / "log.jsonl"
    check_proc = subprocess.Popen([sys.executable, "-m", "torchrepro", "check", "--json", "--out",
                                   str(tmp_path / "out"), "--", sys.executable, str(SCRIPT), str(log), "--sleep", "4"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    niced: dict[int, set[int]] = {}
    try:
        while check_proc.poll() is None:
            for pid in (check_proc.pid, *processes_naming(str(log))):
                niced.setdefault(pid, set()).update(niced_threads(pid))
            time.sleep(0.01)
        out, err = check_proc.communicate(timeout=60)
    finally:
        if check_proc.poll() is None:
            check_proc.kill()
    assert check_proc.returncode == 0, err
    assert json.loads(out)["verdict"] == "identical"
    start1, _, start2, _ = events(log)
    assert niced.get(start2["pid"]), niced  # run 2's import thread was seen at nice 19 ...
    assert not niced.get(start1["pid"])  # ... and run 1, which nothing waits for, imports at its own priority
    assert niced.get(check_proc.pid)  # check's import of the analysis modules
    normal = os.getpriority(os.PRIO_PROCESS, 0)
    assert start1["nice"] == start2["nice"] == [normal, normal]
    # ... and so do the threads of the libraries it imported (numpy's OpenBLAS workers start at import)
    assert set(start1["threads"].values()) == set(start2["threads"].values()) == {normal}, (start1, start2)
    assert len(start1["threads"]) == len(start2["threads"])
