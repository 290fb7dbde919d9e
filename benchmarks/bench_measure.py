"""What measuring costs, measured side by side in one run (CPU).

Target: ``measure_nondeterminism(..., runs=R)`` costs at most 1.15x the time of R plain forward+backward passes
(state restore before each run, copies of the gradients, and the comparison at the end included). What measuring
adds is proportional to the model's size (restoring parameters, reading gradients), what it repeats to the
compute per pass: a large model with a tiny batch is the worst case, printed last and not held to the target.
Also printed: the timing-only recorder that ``torchrepro bench`` runs scripts with, against plain training steps
(it should add next to nothing, or bench would measure itself).
Run: python benchmarks/bench_measure.py
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
from cnn_train import SmallCNN  # noqa: E402

from torchrepro import measure_nondeterminism  # noqa: E402
from torchrepro.measure.models import resnet18  # noqa: E402
from torchrepro.record.recorder import Recorder  # noqa: E402

RUNS = 10


def measure_cost(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, rounds: int,
                 target: bool = True) -> float:
    def plain() -> None:
        for _ in range(RUNS):
            model.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()

    def measured() -> None:
        measure_nondeterminism(model, x, target=y, runs=RUNS)

    times = interleaved({"plain": plain, "measure": measured}, rounds=rounds, inner=1)
    ratio = times["measure"] / times["plain"]
    verdict = ("(target <= 1.15) " + ("OK" if ratio <= 1.15 else "MISSED")) if target else "(worst case, no target)"
    print(f"  {name:<44} {RUNS} plain fwd+bwd {times['plain'] * 1e3:8.1f} ms   measure(runs={RUNS}) "
          f"{times['measure'] * 1e3:8.1f} ms   ratio {ratio:.3f}  {verdict}")
    return ratio


def timing_recorder_cost() -> float:
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def steps() -> None:
        for _ in range(4):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    rec = Recorder(Path(tempfile.mkdtemp(prefix="torchrepro-bench-")) / "timing", models={"": model}, timing=True)

    def recorded() -> None:
        rec.install()
        try:
            steps()
        finally:
            rec.uninstall()

    times = interleaved({"plain": steps, "timing recorder": recorded}, rounds=15, inner=2)
    rec.finish()
    over = times["timing recorder"] / times["plain"] - 1
    print(f"  timing-only recorder (bench)                 step {times['plain'] / 4 * 1e3:.2f} ms plain, "
          f"{times['timing recorder'] / 4 * 1e3:.2f} ms recorded: overhead {over * 100:+.1f}%")
    return over


def main() -> int:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    torch.manual_seed(0)
    measure_cost("example CNN, batch 32, 3x32x32", SmallCNN(), torch.randn(32, 3, 32, 32),
                 torch.randint(0, 10, (32,)), rounds=7)
    torch.manual_seed(0)
    model = resnet18(10)
    measure_cost("ResNet-18 (11.7M params), batch 16, 64x64", model, torch.randn(16, 3, 64, 64),
                 torch.randint(0, 10, (16,)), rounds=3)
    measure_cost("ResNet-18 (11.7M params), batch 2, 64x64", model, torch.randn(2, 3, 64, 64),
                 torch.randint(0, 10, (2,)), rounds=3, target=False)
    timing_recorder_cost()
    return 0


if __name__ == "__main__":
    sys.exit(main())
