from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchrepro.control.determinism import apply_config, current_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# `python` in the commands that tests pass to `torchrepro check -- python ...` is looked up on PATH: make it
# this interpreter, as an activated virtual environment would.
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Every test leaves env vars, RNGs, determinism flags and torch's thread count as it found them."""
    env = dict(os.environ)
    threads = torch.get_num_threads()
    config = current_config()
    py, npy, tc = random.getstate(), np.random.get_state(), torch.get_rng_state()
    yield
    os.environ.clear()
    os.environ.update(env)
    apply_config(config)
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(tc)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def run_python(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300):
    """Run ``code`` in a fresh interpreter; return CompletedProcess (text)."""
    import subprocess

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=str(ROOT))
