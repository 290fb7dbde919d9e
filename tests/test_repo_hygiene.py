"""The repository itself: no file committed in the middle of a merge."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_MARKER = re.compile(rb"^(<{7}|>{7}) |^={7}\r?$", re.M)


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc})")
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_holds_merge_conflict_markers() -> None:
    hits = []
    for path in _tracked():
        if not path.is_file() or path.stat().st_size > 5_000_000:
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        for m in _MARKER.finditer(data):
            line = data.count(b"\n", 0, m.start()) + 1
            hits.append(f"{path.relative_to(ROOT)}:{line}")
    assert hits == [], f"merge-conflict markers left in: {', '.join(hits)}"
