"""A thread count the script exports before its own `import torch` reaches torch under torchrepro as it does in a
plain run (the launcher imports torch before the script: record.child.ThreadEnvAtImport)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inprocess import torchrepro

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "threads_at_top.py")


def threads(*command: str, cwd: Path) -> int:
    p = subprocess.run(list(command), capture_output=True, text=True, timeout=300, cwd=cwd)
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("threads "))
    return int(line.split()[1])


@pytest.mark.parametrize("setting", ["OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1", "OMP_NUM_THREADS=1,1"])
def test_a_count_set_before_import_torch_is_the_plain_runs(tmp_path, setting):
    plain = threads(sys.executable, SCRIPT, setting, cwd=tmp_path)
    recorded = threads(sys.executable, "-m", "torchrepro", "run", "--record", str(tmp_path / "r"), "--",
                       sys.executable, SCRIPT, setting, cwd=tmp_path)
    assert plain == recorded == 1


def test_a_count_set_after_import_torch_changes_nothing_as_in_a_plain_run(tmp_path):
    plain = threads(sys.executable, SCRIPT, "OMP_NUM_THREADS=1", "--after", cwd=tmp_path)
    recorded = threads(sys.executable, "-m", "torchrepro", "run", "--", sys.executable, SCRIPT, "OMP_NUM_THREADS=1",
                       "--after", cwd=tmp_path)
    assert plain == recorded  # torch's default, whatever it is here (its later imports, in scatter_gnn, too)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the scatter-add varies only with 2+ threads")
def test_check_of_a_script_that_asks_for_one_thread_is_identical(tmp_path):
    """With the launch's 2 threads the scatter-add would make the runs differ; the script asked for one."""
    p = torchrepro("check", "--json", "--out", str(tmp_path / "out"), "--", sys.executable, SCRIPT, "OMP_NUM_THREADS=1",
                   timeout=600, cwd=tmp_path)  # in this process (tests/inprocess.py): the runs are processes
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["verdict"] == "identical", p.stderr
    for run in ("run1", "run2"):
        assert (tmp_path / "out" / run / "stdout.txt").read_text().startswith("threads 1 ")
