"""Each deterministic alternative in torchrepro.nn against the PyTorch op it replaces, side by side (CPU).

Target: at most 2x the PyTorch op's time. Variants run in interleaved rounds (medians), same inputs, same
process, torch's default thread count. Forward only for the reductions PyTorch does not differentiate (bincount,
histc) and for scatter/index ops; forward+backward for embedding_bag, ConvTranspose2d and a row-wise index_add
(where the backward is what the alternative changes).
Run: python benchmarks/bench_nn_alternatives.py [--quick] [--cpu-time]
(--cpu-time: one thread, process CPU time instead of wall time -- steadier on a machine shared with other jobs)
On a GPU: python benchmarks/bench_nn_alternatives.py --device cuda  (distinct results over 10 calls, no timing)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

import torchrepro.nn as rnn
import torchrepro.nn.functional as RF
from torchrepro._core.compat import device_problem

TARGET = 2.0


def _backward(fn: Callable[[], torch.Tensor], grad: torch.Tensor, *leaves: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        for leaf in leaves:
            leaf.grad = None
        fn().backward(grad)

    return step


def cases(scale: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """name -> (PyTorch op, alternative)."""
    g = torch.Generator().manual_seed(0)
    n, bins = 1_000_000 // scale, 10_000 // scale
    idx = torch.randint(0, bins, (n,), generator=g)
    vals = torch.randn(n, generator=g)
    zeros = torch.zeros(bins)
    out: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        f"index_add 1-D ({n} -> {bins})": (lambda: torch.index_add(zeros, 0, idx, vals),
                                           lambda: RF.index_add(zeros, 0, idx, vals)),
        f"scatter_add 1-D ({n} -> {bins})": (lambda: torch.scatter_add(zeros, 0, idx, vals),
                                             lambda: RF.scatter_add(zeros, 0, idx, vals)),
        f"index_put accumulate ({n} -> {bins})": (lambda: torch.index_put(zeros, (idx,), vals, accumulate=True),
                                                  lambda: RF.index_put(zeros, (idx,), vals)),
        f"bincount weighted ({n} -> {bins})": (lambda: torch.bincount(idx, vals, minlength=bins),
                                               lambda: RF.bincount(idx, vals, minlength=bins)),
        f"histc ({n} values, 100 bins)": (lambda: torch.histc(vals, 100, -3, 3), lambda: RF.histc(vals, 100, -3, 3)),
    }
    rows, width = 100_000 // scale, 64
    table = torch.zeros(bins, width, requires_grad=True)
    src = torch.randn(rows, width, generator=g, requires_grad=True)
    ridx = torch.randint(0, bins, (rows,), generator=g)
    rgrad = torch.randn(bins, width, generator=g)
    out[f"index_add rows fwd+bwd ({rows}x{width} -> {bins})"] = (
        _backward(lambda: torch.index_add(table, 0, ridx, src), rgrad, table, src),
        _backward(lambda: RF.index_add(table, 0, ridx, src), rgrad, table, src))

    out[f"index_select rows fwd+bwd ({bins}x{width}, {rows} picks)"] = (
        _backward(lambda: torch.index_select(table, 0, ridx), src.detach(), table),
        _backward(lambda: RF.index_select(table, 0, ridx), src.detach(), table))
    weight = torch.randn(10_000 // scale, width, generator=g, requires_grad=True)
    lookups = torch.randint(0, weight.shape[0], (rows,), generator=g)
    offsets = torch.arange(0, rows, 10)
    bgrad = torch.randn(offsets.numel(), width, generator=g)
    out[f"embedding_bag sum fwd+bwd ({rows} lookups)"] = (
        _backward(lambda: torch.nn.functional.embedding_bag(lookups, weight, offsets, mode="sum"), bgrad, weight),
        _backward(lambda: RF.embedding_bag(lookups, weight, offsets, mode="sum"), bgrad, weight))

    batch = max(16 // scale, 1)
    x = torch.randn(batch, 64, 32, 32, generator=g, requires_grad=True)
    ref = torch.nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1)
    mods = {c: rnn.ConvTranspose2d(64, 32, 4, stride=2, padding=1, construction=c)
            for c in ("native", "subpixel", "zero_insertion")}
    for mod in mods.values():
        mod.load_state_dict(ref.state_dict())
    cgrad = torch.randn(batch, 32, 64, 64, generator=g)
    for construction, mod in mods.items():
        out[f"ConvTranspose2d fwd+bwd {construction[:11]} ({batch}x64x32x32, k4 s2)"] = (
            _backward(lambda: ref(x), cgrad, x, *ref.parameters()),
            _backward(lambda m=mod: m(x), cgrad, x, *mod.parameters()))
    return out


def _measure(variants: dict[str, Callable[[], object]], rounds: int, inner: int,
             clock: Callable[[], float]) -> tuple[dict[str, float], dict[str, float]]:
    """Median and fastest seconds per call of each variant, measured in alternating rounds."""
    for fn in variants.values():
        fn()  # warm-up
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = clock()
            for _ in range(inner):
                fn()
            samples[name].append((clock() - t0) / inner)
    return ({k: statistics.median(v) for k, v in samples.items()}, {k: min(v) for k, v in samples.items()})


def _digest(value: object) -> bytes:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return b"".join(_digest(t) for t in value)  # type: ignore[union-attr]


def determinism(device: str, repeats: int = 10) -> None:
    """Distinct results over ``repeats`` calls (fresh allocations) of each PyTorch op and its alternative.

    Meant for a GPU (``--device cuda``), where PyTorch's kernels add with atomics; needs no global flag.
    """
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 1000, (1_000_000,), generator=g).to(dev)
    vals = torch.randn(1_000_000, generator=g).to(dev)
    rows, ridx = torch.randn(100_000, 64, generator=g).to(dev), torch.randint(0, 1000, (100_000,), generator=g).to(dev)
    z1, z2 = torch.zeros(1000, device=dev), torch.zeros(1000, 64, device=dev)
    weight = torch.randn(1000, 64, generator=g).to(dev).requires_grad_(True)
    offsets = torch.arange(0, 100_000, 10, device=dev)
    x = torch.randn(16, 64, 32, 32, generator=g).to(dev).requires_grad_(True)
    ref = torch.nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1).to(dev)
    ours = rnn.ConvTranspose2d(64, 32, 4, stride=2, padding=1).to(dev)
    ours.load_state_dict(ref.state_dict())

    def grads(out: torch.Tensor, *leaves: torch.Tensor) -> list[torch.Tensor]:
        return [out, *torch.autograd.grad(out, leaves, torch.ones_like(out))]

    tf = torch.nn.functional
    pairs = {
        "index_add": (lambda: torch.index_add(z2, 0, ridx, rows), lambda: RF.index_add(z2, 0, ridx, rows)),
        "scatter_add": (lambda: torch.scatter_add(z1, 0, idx, vals), lambda: RF.scatter_add(z1, 0, idx, vals)),
        "index_put": (lambda: torch.index_put(z1, (idx,), vals, accumulate=True),
                      lambda: RF.index_put(z1, (idx,), vals)),
        "bincount": (lambda: torch.bincount(idx, vals), lambda: RF.bincount(idx, vals)),
        "histc": (lambda: torch.histc(vals, 1000, -3, 3), lambda: RF.histc(vals, 1000, -3, 3)),
        "embedding_bag (grad)": (lambda: grads(tf.embedding_bag(ridx, weight, offsets), weight),
                                 lambda: grads(RF.embedding_bag(ridx, weight, offsets), weight)),
        "ConvTranspose2d (grads)": (lambda: grads(ref(x), x, ref.weight), lambda: grads(ours(x), x, ours.weight)),
    }
    print(f"distinct results over {repeats} calls on {dev} (torch / torchrepro):")
    for name, (theirs, mine) in pairs.items():
        counts = [len({_digest(fn()) for _ in range(repeats)}) for fn in (theirs, mine)]
        print(f"  {name:26s} {counts[0]:2d} / {counts[1]:2d}{'' if counts[1] == 1 else '  NOT DETERMINISTIC'}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_nn_alternatives.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--cpu-time", action="store_true", help="one thread, process CPU time instead of wall time")
    parser.add_argument("--device", metavar="D",
                        help="count distinct results over 10 calls on this device (a GPU: cuda) instead of timing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.device is not None:
        problem = device_problem(args.device)
        if problem is not None:
            print(f"bench_nn_alternatives: error: --device {args.device}: {problem}. Run it on a machine with that "
                  "device, or leave --device out to time the ops on this CPU.", file=sys.stderr)
            return 2
        determinism(args.device)
        return 0
    quick, cpu_time = args.quick, args.cpu_time
    if cpu_time:  # one thread, process CPU time: what other jobs on a shared machine disturb least
        torch.set_num_threads(1)
    clock = time.process_time if cpu_time else time.perf_counter
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {'CPU' if cpu_time else 'wall'} time; "
          f"ratio = alternative / PyTorch op (target <= {TARGET}x)")
    print("(medians of interleaved rounds; 'best' = ratio of the fastest rounds)")
    worst = 0.0
    for name, (theirs, ours) in cases(10 if quick else 1).items():
        median, best = _measure({"torch": theirs, "torchrepro": ours}, rounds=3 if quick else 11,
                                inner=1 if quick else 3, clock=clock)
        ratio = median["torchrepro"] / median["torch"]
        optional = "zero_insert" in name  # an opt-in construction, known to cost about stride**2 more
        worst = worst if optional else max(worst, ratio)
        flag = "" if ratio <= TARGET else "  above target (opt-in construction)" if optional else "  ABOVE TARGET"
        print(f"{name:60s} torch {median['torch'] * 1e3:7.2f} ms  torchrepro {median['torchrepro'] * 1e3:7.2f} ms  "
              f"ratio {ratio:5.2f}x (best {best['torchrepro'] / best['torch']:5.2f}x){flag}")
    print(f"worst ratio (defaults and subpixel) {worst:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
