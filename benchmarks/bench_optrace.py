"""Op-tracer overhead on the example CNN's training step (CPU), side by side in one run.

Targets: the traced step costs <= 1.3x the untraced step, and the time torchrepro's tracer adds is <= half
of what PyTorch's own DebugMode with log_tensor_hashes(hash_inputs=True) adds on the same model.
Run: python benchmarks/bench_optrace.py
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved_samples, paired_ratio  # noqa: E402
from cnn_train import SmallCNN, synthetic_images  # noqa: E402

from torchrepro.record.optrace import OpTracer  # noqa: E402


def main() -> int:
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = synthetic_images(32).tensors

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    ops_file = Path(tempfile.mkdtemp(prefix="torchrepro-bench-")) / "ops.jsonl"
    counts = {}

    def traced() -> None:
        tracer = OpTracer(models={"": model}, path=ops_file, keep=False)
        tracer.start()
        try:
            step()
        finally:
            tracer.stop()
        counts["ops"] = tracer.count

    variants = {"untraced": step, "torchrepro tracer": traced}
    try:
        from torch.utils._debug_mode import DebugMode

        def debug_mode() -> None:
            with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_inputs=True):
                step()
            counts["debugmode_calls"] = len(dm.operators) if hasattr(dm, "operators") else None

        variants["DebugMode+log_tensor_hashes"] = debug_mode
    except ImportError:
        print("torch.utils._debug_mode.DebugMode is not in this torch: skipping that comparison")
    with contextlib.redirect_stderr(sys.stderr):
        samples = interleaved_samples(variants, rounds=40, inner=2)
    times = {k: statistics.median(v) for k, v in samples.items()}
    base = times["untraced"]
    print(f"example CNN step (batch 32, 3x32x32), {torch.get_num_threads()} threads, torch {torch.__version__}")
    for name, t in times.items():
        print(f"  {name:<30} {t * 1e3:8.2f} ms   {t / base:5.2f}x")
    ratio = times["torchrepro tracer"] / base
    print(f"traced / untraced step = {ratio:.2f}x  (target <= 1.3x) {'OK' if ratio <= 1.3 else 'MISSED'}"
          f"   [{counts.get('ops')} ops traced]")
    med, q1, q3 = paired_ratio(samples, "torchrepro tracer", "untraced")
    print(f"  round by round: median {med:.2f}x, quartiles {q1:.2f}-{q3:.2f}x (spread = machine noise)")
    if "DebugMode+log_tensor_hashes" in times:
        ours = times["torchrepro tracer"] - base
        theirs = times["DebugMode+log_tensor_hashes"] - base
        share = ours / theirs if theirs > 0 else float("inf")
        print(f"added time: torchrepro {ours * 1e3:.2f} ms vs DebugMode {theirs * 1e3:.2f} ms = {share:.2f} "
              f"(target <= 0.5) {'OK' if share <= 0.5 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
