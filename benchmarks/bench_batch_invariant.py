"""What torchrepro.batch_invariant() costs: forward passes, default kernels against batch-invariant ones (CPU).

Two models at batch 1, 8 and 32, side by side: a tiny GPT-2 built from a config (2 layers, 256 wide, 4 heads,
random weights; 16 tokens per row) and a 4096-wide MLP (Linear 4096->4096, GELU, Linear 4096->4096). Each line
prints the median time of the default forward, of the same forward inside ``torchrepro.batch_invariant()``, and
their ratio (median of round-by-round ratios, with its quartiles: variants alternate within each round, so load
that drifts hits both alike). It also says whether the batch-invariant forward gave row 0 the same bits as the row
alone (it must) and whether the default one did.
Run: python benchmarks/bench_batch_invariant.py [--quick] [--cpu-time]
(--cpu-time: one thread, process CPU time instead of wall time -- steadier on a machine shared with other jobs)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch

import torchrepro
from torchrepro.nn.invariant import ROW_TILE

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _timing import paired_ratio  # noqa: E402

BATCHES = (1, 8, 32)
TOKENS = 16


def tiny_gpt2() -> torch.nn.Module:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=1000, n_positions=64, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)).eval()


def cases() -> dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[int], torch.Tensor]]]:
    """name -> (forward of a batch returning a tensor with rows in dim 0, batch maker)."""
    gpt, net = tiny_gpt2(), mlp()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (max(BATCHES), TOKENS), generator=g)
    x = torch.randn(max(BATCHES), 4096, generator=g)
    return {f"tiny GPT-2 ({TOKENS} tokens/row)": (lambda b: gpt(input_ids=b).logits, lambda n: ids[:n]),
            "4096-wide MLP": (net, lambda n: x[:n])}


def _samples(variants: dict[str, Callable[[], object]], rounds: int, inner: int,
             clock: Callable[[], float]) -> dict[str, list[float]]:
    for fn in variants.values():
        fn()  # warm-up
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = clock()
            for _ in range(inner):
                fn()
            samples[name].append((clock() - t0) / inner)
    return samples


def _row0_alone_equal(forward: Callable[[torch.Tensor], torch.Tensor], batch: torch.Tensor) -> bool:
    return bool(torch.equal(forward(batch[:1])[0], forward(batch)[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_batch_invariant.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--cpu-time", action="store_true", help="one thread, process CPU time instead of wall time")
    args = parser.parse_args(argv)
    if args.cpu_time:
        torch.set_num_threads(1)
    clock = time.process_time if args.cpu_time else time.perf_counter
    rounds, inner = (3, 1) if args.quick else (9, 3)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {'CPU' if args.cpu_time else 'wall'} time; "
          f"batch_invariant() computes {ROW_TILE}-row tiles")
    print("ratio = batch_invariant() / default (median of round-by-round ratios [quartiles]); 'row 0 = alone': "
          "the row's output in the batch is bitwise its output alone")
    invariant = torchrepro.batch_invariant()
    with torch.no_grad():
        for name, (forward, make) in cases().items():
            for n in BATCHES:
                batch = make(n)

                def fixed(b: torch.Tensor = batch, f: Callable[[torch.Tensor], torch.Tensor] = forward) -> object:
                    with invariant:
                        return f(b)

                samples = _samples({"default": lambda b=batch, f=forward: f(b), "invariant": fixed}, rounds, inner,
                                   clock)
                med, q1, q3 = paired_ratio(samples, "invariant", "default")
                base = sorted(samples["default"])[len(samples["default"]) // 2]
                fast = sorted(samples["invariant"])[len(samples["invariant"]) // 2]
                same = "-" if n == 1 else "yes" if _row0_alone_equal(forward, batch) else "no"
                with invariant:
                    same_fixed = "-" if n == 1 else "yes" if _row0_alone_equal(forward, batch) else "NO"
                print(f"{name:28s} batch {n:2d}  default {base * 1e3:8.2f} ms  batch_invariant {fast * 1e3:8.2f} ms  "
                      f"ratio {med:5.2f}x [{q1:4.2f}-{q3:4.2f}]  row 0 = alone: default {same:3s} "
                      f"batch_invariant {same_fixed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
