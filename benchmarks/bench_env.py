"""How long the environment fingerprint takes (target: under 1 s without CUDA), and its parts.

Prints the median time of `torchrepro.environment()` in a warm process (what `run`/`check` children pay once
per run), of each section, and of a fresh `torchrepro env --json` process against a bare `import torch`.
Run: python benchmarks/bench_env.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

from torchrepro.env.info import SECTIONS, _env, _git, _scrubber, environment  # noqa: E402

TARGET_S = 1.0


def _process(args: list[str], repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, *args], check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    whole = interleaved({"environment()": environment}, rounds=11, inner=3)["environment()"]
    parts = {name: collect for name, collect in SECTIONS}
    parts["env"] = lambda: _env(_scrubber(False))
    parts[f"git ({os.getcwd()})"] = lambda: _git(Path.cwd(), False)
    parts = interleaved(parts, rounds=7, inner=3)
    print(f"torchrepro.environment(), warm process: {whole * 1000:.1f} ms (target < {TARGET_S * 1000:.0f} ms: "
          f"{'met' if whole < TARGET_S else 'MISSED'})")
    for name, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<24} {seconds * 1000:7.2f} ms")
    bare = _process(["-c", "import torch"])
    cli = _process(["-m", "torchrepro", "env", "--json"])
    print(f"fresh process: `import torch` {bare:.2f} s, `torchrepro env --json` {cli:.2f} s "
          f"(fingerprint and CLI add {cli - bare:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
