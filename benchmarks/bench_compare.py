"""What `torchrepro compare` and `bisect` cost, measured side by side.

1. compare's wall time vs the two plain runs it replaces (`python mlp.py` then `OMP_NUM_THREADS=1 python mlp.py`),
   interleaved in rounds so that machine load hits both alike; the median of the per-round ratios is printed.
2. bisect's recordings for n commits vs the bound ceil(log2(n)) + 2: every position of the changing commit,
   simulated with the search itself (no processes), and one real bisect over a generated history of 8 commits.
3. The op-stream alignment behind `compare --locate`: synthetic streams of 10,000 and 50,000 ops with a few or
   hundreds of edits, and 20,000 unrelated ops (the fallback).

Run: python benchmarks/bench_compare.py [rounds=3]
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchrepro.analysis.align import align_ops
from torchrepro.analysis.bisect import Search
from torchrepro.analysis.proglocate import locate_programs
from torchrepro.analysis.tolerance import Tolerance

MLP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))
for step in range(200):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
"""
TINY = """import torch
torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(16))
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(2):
    opt.zero_grad()
    (w * SCALE).sum().backward()
    opt.step()
"""


def _wall(cmd: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd)
    if p.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return time.perf_counter() - t0, p.stdout


def bench_compare_wall(tmp: Path, rounds: int) -> None:
    py = sys.executable
    script = tmp / "mlp.py"
    script.write_text(MLP)
    ratios, plain, cmp = [], [], []
    _wall([py, str(script)])  # warm the file cache
    for r in range(rounds):
        a, _ = _wall([py, str(script)])
        b, _ = _wall([py, str(script)], env={"OMP_NUM_THREADS": "1"})
        c, _ = _wall([py, "-m", "torchrepro", "compare", "--out", str(tmp / f"cmp{r}"), f"{py} {script}",
                      f"OMP_NUM_THREADS=1 {py} {script}"])
        plain.append(a + b)
        cmp.append(c)
        ratios.append(c / (a + b))
    print(f"compare (2 recorded runs + comparison) vs 2 plain runs, {rounds} interleaved rounds:")
    print(f"  two plain runs   {statistics.median(plain):6.2f} s   compare {statistics.median(cmp):6.2f} s")
    print(f"  compare / two plain runs = {statistics.median(ratios):.2f}x (per round {min(ratios):.2f} - "
          f"{max(ratios):.2f})")


def bench_bisect_bound() -> None:
    print("bisect recordings (good + bad + search) vs ceil(log2(n)) + 2, over every position of the bad commit:")
    for n in (2, 4, 8, 16, 32, 64, 128):
        worst = 0
        for first in range(1, n + 1):
            s, tests = Search(n), 0
            while (i := s.next()) is not None:
                tests += 1
                s.record(i, "bad" if i >= first else "good")
            worst = max(worst, tests + 2)
        bound = math.ceil(math.log2(n)) + 2
        print(f"  n = {n:>3}: at most {worst} recordings (bound {bound}) {'OK' if worst <= bound else 'MISSED'}")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=b@b", "-c", "user.name=b", *args], cwd=root, check=True,
                   capture_output=True)


def bench_real_bisect(tmp: Path, n: int = 8, change_at: int = 5) -> None:
    root = tmp / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    for k in range(n + 1):  # commit 0 = good; commit change_at changes the numerics, the others a comment
        scale = "2.0" if k >= change_at else "1.0"
        (root / "train.py").write_text(f"# revision {k}\n" + TINY.replace("SCALE", scale))
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"revision {k}")
    wall, out = _wall([sys.executable, "-m", "torchrepro", "bisect", "--json", "--no-locate", "--good", f"HEAD~{n}",
                       "--out", str(tmp / "bisect"), "--", sys.executable, "train.py"], cwd=str(root))
    doc = json.loads(out)
    bound = math.ceil(math.log2(n)) + 2
    print(f"real bisect over {n} commits (change at {change_at}): found {doc['first_bad_commit']['subject']!r} with "
          f"{doc['recordings']} recordings (bound {bound}) in {wall:.1f} s "
          f"{'OK' if doc['recordings'] <= bound else 'MISSED'}")


def _ops(n: int, rng: random.Random, vocab: int = 300) -> list[dict]:
    return [{"op": f"aten.op{rng.randrange(vocab)}", "phase": "forward", "module": "m", "code": "x", "in": ["i"],
             "out": [f"o{i}"]} for i in range(n)]


def bench_alignment() -> None:
    rng = random.Random(0)
    print("op-stream alignment (align_ops + locate_programs, no values):")
    for n, edits in ((10_000, 10), (50_000, 10), (50_000, 300)):
        a = _ops(n, rng)
        b = [dict(o) for o in a]
        for _ in range(edits):
            k = rng.randrange(len(b))
            if rng.random() < 0.5:
                b.insert(k, {"op": "aten.extra", "phase": "forward", "module": "m", "code": "y", "in": ["i"],
                             "out": ["e"]})
            else:
                del b[k]
        t0 = time.perf_counter()
        rows = align_ops(a, b)
        t1 = time.perf_counter()
        locate_programs(a, b, {}, {}, Tolerance(bitwise=True))
        t2 = time.perf_counter()
        print(f"  {n:>6} ops, {edits:>3} edits: align_ops {1e3 * (t1 - t0):7.1f} ms, locate_programs (aligning "
              f"again) {1e3 * (t2 - t1):7.1f} ms ({len(rows)} rows)")
    a, b = _ops(20_000, rng, 50), _ops(20_000, rng, 50)
    t0 = time.perf_counter()
    align_ops(a, b)
    print(f"  20,000 unrelated ops (fallback after 1,000 edits): {time.perf_counter() - t0:.2f} s")


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    bench_alignment()
    bench_bisect_bound()
    with tempfile.TemporaryDirectory() as tmp:
        bench_real_bisect(Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        bench_compare_wall(Path(tmp), rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
