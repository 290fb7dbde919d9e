"""`.venv/bin/torchrepro` run from a shell whose venv is not activated (issue 40): the documented form works, and the
form that names the shell's `python` is said to need the launcher change described in the issue's notes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCHREPRO = Path(sys.executable).parent / "torchrepro"  # the console script of this environment
SCRIPT = """\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad()
    model(torch.ones(8, 4)).square().mean().backward()
    opt.step()
"""


def _not_activated(tmp_path: Path) -> dict[str, str]:
    """A shell's environment without this venv: PATH leads to a `python` that has no torchrepro."""
    shims = tmp_path / "shell-bin"
    shims.mkdir()
    (shims / "python").symlink_to("/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.base_prefix)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join([str(shims), "/usr/bin", "/bin"])
    return env


@pytest.mark.skipif(not TORCHREPRO.is_file(), reason="needs the torchrepro console script (pip install -e .)")
def test_the_documented_form_works_without_activating_the_venv(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    p = subprocess.run([str(TORCHREPRO), "check", "--max-steps", "1", "--out", "out", "--", "train.py"],
                       capture_output=True, text=True, cwd=tmp_path, env=_not_activated(tmp_path), timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("torchrepro: IDENTICAL - 2 runs of `train.py`")


def test_readme_and_index_document_the_form_that_works():
    for doc in ("README.md", "docs/index.md"):
        text = " ".join((ROOT / doc).read_text(encoding="utf-8").split())
        assert "`.venv/bin/torchrepro check -- train.py`" in text, doc
        assert "(`source .venv/bin/activate`)" in text, doc
        assert not re.search(r"the CLI is at `\.venv/bin/torchrepro`", text), doc


@pytest.mark.skipif(not TORCHREPRO.is_file(), reason="needs the torchrepro console script (pip install -e .)")
def test_the_shells_python_is_replaced_by_torchrepros_and_said_so(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    p = subprocess.run([str(TORCHREPRO), "check", "--max-steps", "1", "--out", "out", "--", "python", "train.py"],
                       capture_output=True, text=True, cwd=tmp_path, env=_not_activated(tmp_path), timeout=600)
    assert p.returncode == 0, p.stderr
    assert (f"torchrepro: `python` on PATH is {tmp_path / 'shell-bin' / 'python'}, which has no torchrepro (or no "
            f"torch); running the script with {sys.executable}, the Python torchrepro runs in") in p.stderr
