"""End to end: `torchrepro check` starts run 2's interpreter while run 1 trains (its script waits until run 1 has
ended), `--no-prestart` does not, and a waiting run never outlives a check that ends early (a failed run 1, a
signal), and a check stopped while it imports its analysis modules in the background exits with its own code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.inprocess import torchrepro

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "startlog.py"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process start times in /proc")


def check(tmp_path: Path, *flags: str, script: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, Path]:
    """The check run by this process (tests/inprocess.py): its runs, the prestarted one included, are processes of
    their own as always. The tests of a signal to the check start it as a process of its own."""
    log = tmp_path / "log.jsonl"
    p = torchrepro("check", "--out", str(tmp_path / "out"), *flags, "--", sys.executable, str(SCRIPT), str(log),
                   *script, timeout=300, cwd=tmp_path)
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
    p = torchrepro("check", "--fresh-cwd", "--out", str(tmp_path / "out"), "--", sys.executable, str(SCRIPT),
                   str(log), "--fail", timeout=300, cwd=work)
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


def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 600  # a cap only, for a loaded machine: the loop waits on the condition
    while not condition():
        assert time.monotonic() < deadline, what
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_check_stopped_during_its_background_import_exits_with_its_own_code(tmp_path, sig):
    """The import failed half-way once the interpreter began shutting down ("can't register atexit after
    shutdown"); the next module imported torch again, half-initialised, and check died of SIGSEGV at exit."""
    log = tmp_path / "log.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "torchrepro", "check", "--out", str(tmp_path / "out"), "--",
                             sys.executable, str(SCRIPT), str(log), "--sleep", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        # check has started both runs' interpreters (run 2's waits): its background import of torch goes on
        wait_for(lambda: len(processes_naming(str(log))) >= 3, proc, "check did not start runs 1 and 2")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=600)  # a cap only: it waits for at most the one module being imported
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err  # not -11 (SIGSEGV)
    assert "interrupted" in err


def test_a_check_ending_early_imports_no_further_analysis_module(monkeypatch):
    """The check that ends early waits for the module being imported in the background, and for no other: on a
    loaded machine importing all of them took minutes, and the stopped check's exit waited for every one."""
    from torchrepro.cli import _checkrun

    imported: list[str] = []

    def import_module(name: str) -> None:
        imported.append(name)
        _checkrun._stop_prefetch.set()  # the check ends while this module is imported

    monkeypatch.setattr(_checkrun.importlib, "import_module", import_module)
    monkeypatch.setattr(_checkrun, "_stop_prefetch", threading.Event())
    _checkrun._import_quietly(("first.module", "second.module", "third.module"))
    assert imported == ["first.module"]
