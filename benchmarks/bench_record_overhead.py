"""Overhead of step-level recording on the bundled example CNN (CPU), measured side by side in one run.

Target: recording (fingerprints of loss, batch, parameters, gradients, optimizer state) adds <= 3% to the
step time, both for plain recording and as `check` records (plus value snapshots of the steps chosen by
`record.sampled_step`: steps 1-16, then 8 per doubling, over the ~200 steps this benchmark runs). Also printed:
value snapshots at every step (`torchrepro run --keep-values`).
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

from torchrepro.record.recorder import Recorder  # noqa: E402


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
        "recorded+values (every step)": Recorder(tmp / "values", models={"": model}, keep_values=True,
                                                 values_budget=1 << 40),
        "as in check (sampled values)": Recorder(tmp / "check", models={"": model}, keep_values=True,
                                                 values_budget=1 << 40, value_schedule="sampled"),
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
    summaries = {k: r.finish() for k, r in recorders.items()}
    base = times["plain"] / 4
    print(f"example CNN (batch 32, 3x32x32), {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"  {'plain step':<30} {base * 1e3:8.2f} ms")
    for name in recorders:
        t = times[name] / 4
        over = t / base - 1
        every = name == "recorded+values (every step)"
        target = "" if every else "  (target <= 3%) " + ("OK" if over <= 0.03 else "MISSED")
        print(f"  {name:<30} {t * 1e3:8.2f} ms   overhead {over * 100:+.1f}%{target}")
    s = summaries["as in check (sampled values)"]
    print(f"  ({s['steps']} steps recorded per variant; value snapshots as in check: {len(s['values_saved'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
