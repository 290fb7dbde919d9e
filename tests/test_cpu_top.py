"""`pytest --cpu-top N` (tests/conftest.py): the tests that used the most CPU time, their child processes' included."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BUSY = '''
import subprocess, sys

def test_spins_in_a_child_process():
    code = "import time\\nend = time.process_time() + 1.5\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)

def test_does_nothing():
    pass
'''


def test_cpu_top_counts_the_child_processes_cpu_time_and_ranks_the_tests(tmp_path):
    (tmp_path / "test_busy.py").write_text(BUSY)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                        "--rootdir", str(tmp_path), "--cpu-top", "2", str(tmp_path / "test_busy.py")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 tests that used the most CPU time (theirs and their processes')" in p.stdout
    lines = [line for line in p.stdout.splitlines() if "s cpu  (" in line]
    assert [line.rsplit("::", 1)[1] for line in lines] == ["test_spins_in_a_child_process", "test_does_nothing"]
    spent = float(re.match(r"\s*([\d.]+)s cpu  \((setup|call|teardown) [\d.]+s\)", lines[0]).group(1))
    assert spent >= 1.5, lines[0]  # the child's 1.5 s of spinning is the test's
    assert re.search(r"\d+ CPU seconds in all, over 2 tests", p.stdout)


def test_without_the_option_nothing_is_printed(tmp_path):
    (tmp_path / "test_busy.py").write_text(BUSY)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                        "--rootdir", str(tmp_path), "-k", "nothing", str(tmp_path / "test_busy.py")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    assert "most CPU time" not in p.stdout
