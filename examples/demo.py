"""`make demo`: torchrepro check --locate on the nondeterministic example, then again in deterministic mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = ["python", os.path.relpath(HERE / "scatter_gnn.py")]


def check(*flags: str) -> int:
    out = "demo-out/check" + "".join(flags).replace("--", "-")
    cmd = [sys.executable, "-m", "torchrepro", "check", *flags, "--out", out, "--", *SCRIPT]
    print(f"\n$ torchrepro check {' '.join(flags)} -- {' '.join(SCRIPT)}", flush=True)
    # `python` in the command is looked up on PATH, as in an activated virtual environment.
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    return subprocess.call(cmd, env=env)


def main() -> int:
    Path("demo-out").mkdir(exist_ok=True)
    first = check("--locate")
    second = check("--deterministic")
    verdict = {0: "identical", 1: "diverged"}
    print(f"\nWithout deterministic mode: {verdict.get(first, f'error {first}')}; "
          f"with --deterministic: {verdict.get(second, f'error {second}')}.")
    return 0 if (first, second) == (1, 0) else 1


if __name__ == "__main__":
    sys.exit(main())
