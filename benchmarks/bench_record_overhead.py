"""Overhead of step-level recording on the bundled example CNN (CPU), measured side by side in one run.

Target: recording (fingerprints of loss, batch, parameters, gradients, optimizer state) adds <= 3% to the
step time. Also printed: recording with parameter values saved each step (what `check` uses).
Run: python benchmarks/bench_record_overhead.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402
from cnn_train import SmallCNN, synthetic_images  # noqa: E402

from torchrepro.record import Recorder  # noqa: E402


def main() -> int:
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(synthetic_images(2048), batch_size=32, shuffle=True)
    batches = iter(())

    def step() -> None:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    tmp = Path(tempfile.mkdtemp(prefix="torchrepro-bench-"))
    recorders = {
        "recorded": Recorder(tmp / "fp", models={"": model}),
        "recorded+values": Recorder(tmp / "values", models={"": model}, keep_values=True, values_budget=1 << 40),
    }

    def with_recorder(rec: Recorder):
        def run() -> None:
            rec.install()
            try:
                for _ in range(4):
                    step()
            finally:
                rec.uninstall()
        return run

    def plain() -> None:
        for _ in range(4):
            step()

    times = interleaved({"plain": plain, **{k: with_recorder(r) for k, r in recorders.items()}}, rounds=25, inner=2)
    for r in recorders.values():
        r.finish()
    base = times["plain"] / 4
    print(f"example CNN (batch 32, 3x32x32), {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"  plain step           {base * 1e3:8.2f} ms")
    for name in recorders:
        t = times[name] / 4
        over = t / base - 1
        target = "  (target <= 3%) " + ("OK" if over <= 0.03 else "MISSED") if name == "recorded" else ""
        print(f"  {name:<20} {t * 1e3:8.2f} ms   overhead {over * 100:+.1f}%{target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
