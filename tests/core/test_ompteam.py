"""Python work on torch's own OpenMP threads (used to hash large tensors on every core)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from torchrepro._core import ompteam as _ompteam

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or "parallel backend: OpenMP" not in torch.__config__.parallel_info(),
    reason="torch's OpenMP team is used on Linux builds whose ATen backend is OpenMP")


def test_each_index_runs_once_on_its_own_thread():
    assert _ompteam.available()
    seen: dict[int, int] = {}

    def work(i: int) -> None:
        seen[i] = threading.get_native_id()

    assert _ompteam.run(work, 2)
    assert sorted(seen) == [0, 1]
    assert seen[0] != seen[1]  # two OS threads: the work really ran in parallel on the team
    assert seen[0] == threading.get_native_id()  # the team's thread 0 is the caller


def test_a_failure_on_a_team_thread_is_raised_in_the_caller():
    def work(i: int) -> None:
        if i == 1:
            raise ValueError("share 1 failed")

    with pytest.raises(ValueError, match="share 1 failed"):
        _ompteam.run(work, 2)
    assert _ompteam.run(lambda i: None, 2)  # usable again afterwards


def test_other_threads_are_refused_and_nothing_runs():
    called: list[int] = []
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(_ompteam.run(called.append, 2)))
    t.start()
    t.join(timeout=60)
    assert result == [False] and called == []
    assert not _ompteam.run(called.append, 1) and called == []  # one thread: nothing to share


SMALL_TEAM = """
from torchrepro._core import ompteam as _ompteam
done = []
assert _ompteam.run(done.append, 4)
print(sorted(done))
"""


def test_indices_a_smaller_team_did_not_run_are_run_by_the_caller():
    env = {"OMP_THREAD_LIMIT": "2", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", SMALL_TEAM], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[0, 1, 2, 3]"


FORKED = """
import os, sys, importlib, torch
from torchrepro._core import ompteam as _ompteam
fp = importlib.import_module("torchrepro._core.fingerprint")
t = torch.randn(5 * fp.CHUNK)
torch.set_num_threads(1)
expected = fp.fingerprint(t)
torch.set_num_threads(2)
if sys.argv[1] == "team-used":
    fp.fingerprint(t)                  # the parent's team is in use now
else:
    (t.view(-1, 1024) @ t.view(1024, -1)[:, :64]).sum()   # only torch's own parallel work before the fork
pid = os.fork()
if pid == 0:
    ok = (not _ompteam.available()) and fp.fingerprint(t) == expected
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("parent", ["team-used", "torch-only"])
def test_a_forked_child_never_uses_the_parents_team(parent):
    p = subprocess.run([sys.executable, "-c", FORKED, parent], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "child 0"  # libgomp's team does not survive fork: a child that used it would hang


def test_a_signal_during_the_region_is_handled_once_the_team_is_done():
    """A Python signal handler must not run inside the team callback (at its first bytecode ctypes would drop
    the exception, and the region could hang): it runs after the region, and its exception is raised."""
    finished: list[int] = []
    seen_at: list[int] = []

    def handler(signum: int, frame: object) -> None:
        seen_at.append(len(finished))
        raise KeyboardInterrupt

    def work(i: int) -> None:
        if i == 0:
            signal.raise_signal(signal.SIGUSR1)
        time.sleep(0.05)
        finished.append(i)

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            _ompteam.run(work, 2)
        assert signal.getsignal(signal.SIGUSR1) is handler  # the user's handler is back
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert seen_at == [2]


INTERRUPTED = """
import importlib, signal, torch
fp = importlib.import_module("torchrepro._core.fingerprint")
t = torch.randn(32 * fp.CHUNK // 4)
torch.set_num_threads(1)
expected = fp.fingerprint(t)
torch.set_num_threads(2)

def handler(signum, frame):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, handler)
for trial in range(25):
    signal.setitimer(signal.ITIMER_REAL, 0.003 + 0.0031 * trial)
    try:
        while True:
            assert fp.fingerprint(t) == expected
    except KeyboardInterrupt:
        pass
print("interrupted 25 times, digest", fp.fingerprint(t) == expected)
"""


def test_ctrl_c_while_hashing_on_the_team_always_interrupts():
    p = subprocess.run([sys.executable, "-c", INTERRUPTED], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "interrupted 25 times, digest True"
    assert "Exception ignored" not in p.stderr


def test_large_fingerprints_use_the_team(monkeypatch):
    import importlib

    fp = importlib.import_module("torchrepro._core.fingerprint")
    calls: list[int] = []
    real = _ompteam.run
    monkeypatch.setattr(_ompteam, "run", lambda fn, threads: calls.append(threads) or real(fn, threads))
    t = torch.randn(5 * fp.CHUNK)  # 20 chunks
    digest = fp.fingerprint(t)
    assert calls == [min(2, torch.get_num_threads())] or torch.get_num_threads() == 1
    monkeypatch.setattr(_ompteam, "run", lambda fn, threads: False)
    assert fp.fingerprint(t) == digest  # the helper-thread path gives the same digest


POOL_BEFORE_IMPORT = """
import multiprocessing as mp, torch

T = None


def work(_):
    import importlib
    fp = importlib.import_module("torchrepro._core.fingerprint")   # first imported here, after the fork
    got = fp.fingerprint(T)          # no torch op of its own: contiguous, inherited from the parent
    torch.set_num_threads(1)
    return got == fp.fingerprint(T)


if __name__ == "__main__":
    torch.set_num_threads(2)
    T = torch.ones(512, 512) @ torch.ones(512, 512)      # torch's OpenMP team exists in the parent now
    T = T.repeat(20, 1)                                  # 20 MiB: large enough for the team
    with mp.get_context("fork").Pool(1) as pool:
        print(pool.apply_async(work, (0,)).get(timeout=100))
"""


def test_a_pool_forked_before_torchrepro_was_imported_never_uses_the_team(tmp_path):
    script = tmp_path / "pool_before_import.py"
    script.write_text(POOL_BEFORE_IMPORT)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "True"  # the worker would hang in GOMP_parallel with the parent's dead threads


def test_every_signal_noted_during_the_region_is_handled_even_if_one_raises():
    handled: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        handled.append(signum)
        raise KeyboardInterrupt

    def record(signum: int, frame: object) -> None:
        handled.append(signum)

    def work(i: int) -> None:
        if i == 0:  # the one that raises is noted first
            signal.raise_signal(signal.SIGUSR1)
            signal.raise_signal(signal.SIGUSR2)

    old = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    signal.signal(signal.SIGUSR1, interrupt)
    signal.signal(signal.SIGUSR2, record)
    try:
        with pytest.raises(KeyboardInterrupt):
            _ompteam.run(work, 2)
        for _ in range(3):  # a handler left pending runs at the next check
            time.sleep(0.01)
        assert sorted(handled) == [signal.SIGUSR1, signal.SIGUSR2]
        assert signal.getsignal(signal.SIGUSR1) is interrupt and signal.getsignal(signal.SIGUSR2) is record
    finally:
        for s, h in old.items():
            signal.signal(s, h)
