"""Cost of torchrepro.distributed.ranks.check_consistency next to a DDP training step, measured side by side.

Two ranks (gloo, CPU, one thread each) train the bundled example CNN (examples/cnn_train.py, batch 32 per rank)
with DistributedDataParallel. Target: checking every replicated tensor (parameters, buffers, gradients,
optimizer state) after every step (N = 1) costs <= 2% of the DDP step. Also printed: the cost at N = 10, the
fingerprinting alone, and the check of parameters only.
Run: python benchmarks/bench_consistency.py
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402
from cnn_train import SmallCNN, synthetic_images  # noqa: E402

from torchrepro.distributed.ranks import _collect, _fingerprints, check_consistency  # noqa: E402

WORLD = 2


def _rank_main(rank: int, rendezvous: str, results: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = SmallCNN()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images, labels = synthetic_images(1024, seed=rank).tensors  # this rank's shard of the data
    batches = list(zip(images.split(32), labels.split(32)))
    done = 0

    def step() -> None:
        nonlocal done
        x, y = batches[done % len(batches)]
        done += 1
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    calls: list[float] = []

    def step_checked() -> None:
        step()
        t0 = time.perf_counter()
        assert check_consistency(ddp, opt, timeout=60).ok
        calls.append(time.perf_counter() - t0)

    def step_checked_params() -> None:
        step()
        assert check_consistency(ddp, what=("params",), timeout=60).ok

    def step_fingerprints() -> None:  # the local half of the check, without the exchange
        step()
        _fingerprints([v for v in _collect(ddp, [opt], ("params", "buffers", "grads", "optimizer"), rank)[1]
                       if v is not None])

    times = interleaved({"ddp step": step, "step + check": step_checked, "step + check params": step_checked_params,
                         "step + fingerprints": step_fingerprints}, rounds=15, inner=4)
    n_tensors = len(_collect(ddp, [opt], ("params", "buffers", "grads", "optimizer"), rank)[0])
    times["check call"] = statistics.median(calls)
    Path(results, f"rank{rank}.json").write_text(json.dumps([times, n_tensors]))
    dist.destroy_process_group()


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="torchrepro-bench-"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.multiprocessing.spawn(_rank_main, args=(str(tmp / "rendezvous"), str(tmp)), nprocs=WORLD)
    print(f"DDP on {WORLD} ranks (gloo, CPU, 1 thread each), example CNN, batch 32 per rank, torch {torch.__version__}")
    for rank in range(WORLD):
        times, n_tensors = json.loads((tmp / f"rank{rank}.json").read_text())
        base = times["ddp step"]
        check = times["step + check"] - base
        fps = times["step + fingerprints"] - base
        params = times["step + check params"] - base
        call = times["check call"]
        ok = "OK" if call / base <= 0.02 else "MISSED"
        print(f"rank {rank}: DDP step {base * 1e3:.2f} ms; one check_consistency call on {n_tensors} tensors "
              f"(median, incl. waiting for the other rank) {call * 1e3:.3f} ms = {call / base * 100:.2f}% of a step "
              f"at N=1 (target <= 2%: {ok}), {call / base * 10:.2f}% at N=10")
        print(f"        step time with the check minus without (noisier): {check * 1e3:+.3f} ms "
              f"({check / base * 100:+.2f}%); fingerprints only {fps * 1e3:+.3f} ms; params-only check "
              f"{params * 1e3:+.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
