"""Python work on torch's own OpenMP threads (used to hash large tensors on every core)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch

from torchrepro import _ompteam

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
from torchrepro import _ompteam
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
import os, importlib, torch
from torchrepro import _ompteam
fp = importlib.import_module("torchrepro.fingerprint")
t = torch.randn(5 * fp.CHUNK)
expected = fp.fingerprint(t)           # the parent's team is in use now
pid = os.fork()
if pid == 0:
    ok = (not _ompteam.available()) and fp.fingerprint(t) == expected
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_never_uses_the_parents_team():
    p = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "child 0"  # libgomp's team does not survive fork: a child that used it would hang


def test_large_fingerprints_use_the_team(monkeypatch):
    import importlib

    fp = importlib.import_module("torchrepro.fingerprint")
    calls: list[int] = []
    real = _ompteam.run
    monkeypatch.setattr(_ompteam, "run", lambda fn, threads: calls.append(threads) or real(fn, threads))
    t = torch.randn(5 * fp.CHUNK)  # 20 chunks
    digest = fp.fingerprint(t)
    assert calls == [min(2, torch.get_num_threads())] or torch.get_num_threads() == 1
    monkeypatch.setattr(_ompteam, "run", lambda fn, threads: False)
    assert fp.fingerprint(t) == digest  # the helper-thread path gives the same digest
