"""Check every CUDA row of torchrepro's registry of nondeterministic ops on this machine's GPU, and print a table.

For each row it runs an example call (below, keyed by op and condition) and observes:
  * that the example really dispatches the row's op with the row's condition;
  * with deterministic mode off: how many distinct results RUNS calls give (does it vary?);
  * with deterministic mode on: whether it raises PyTorch's "does not have a deterministic implementation" error,
    and if not, whether its results are stable.
A row's claim holds when "raises" rows raise, "switches kernel" rows do not raise and are stable, and "nothing"
rows still vary under deterministic mode; a "nothing" row that does not vary even with deterministic mode off is
"not observed" here (its nondeterminism depends on versions: cuDNN RNNs), which is not a failure. Exit status: 0
when every claim holds (or when there is no GPU, with a message), 1 when a claim failed or a row has no example.
Run it without CUBLAS_WORKSPACE_CONFIG in the environment to observe the cuDNN RNN rows.

    python tools/verify_cuda_registry.py            # the table
    python tools/verify_cuda_registry.py --json     # one JSON document
    python tools/verify_cuda_registry.py --device cpu --smoke   # run each example once on CPU (no claims)

After a run on a GPU, copy the verdicts into the rows' ``verified_on`` field
(e.g. "cuda, NVIDIA H100, torch 2.13.0, tools/verify_cuda_registry.py").
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils._python_dispatch import TorchDispatchMode

from torchrepro._core.nondet_ops import ROWS
from torchrepro.control.registry import OpEntry, match, nondeterministic_ops, normalize_op

ALERT = "does not have a deterministic implementation"
RUNS = 8
Example = Callable[[str], Any]  # device -> a tensor or a tuple of tensors (compared bitwise)
# (op, condition) of rows whose op runs only in a CUDA build with cuDNN: on CPU their example cannot dispatch it.
CUDNN_ONLY = frozenset((op, row.condition) for row in ROWS if row.cudnn_only for op in row.ops)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, device: str, seed: int = 0, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(device).requires_grad_(grad)


@functools.cache  # inputs only: examples never write to them
def _many(device: str, n: int = 1_000_000, slots: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, slots, (n,), generator=_gen(1)).to(device)
    return idx, _randn(n, device=device, seed=2)


@functools.cache
def _cross(device: str, m: int = 500_000) -> tuple[torch.Tensor, torch.Tensor]:
    perm = torch.randperm(m, generator=_gen(3))
    return torch.cat([perm, perm.flip(0)]).to(device), torch.cat([torch.zeros(m), torch.ones(m)]).to(device)


def _grad(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, seed: int = 9) -> torch.Tensor:
    y = fn(x)
    y.backward(torch.randn(y.shape, generator=_gen(seed)).to(y.device))
    return x.grad


def _conv_grads(module: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out = module(x)
    out.backward(torch.randn(out.shape, generator=_gen(5)).to(out.device))
    return x.grad, module.weight.grad


def _conv(transposed: bool, device: str, backward: bool = True) -> Any:
    torch.manual_seed(0)
    cls = torch.nn.ConvTranspose2d if transposed else torch.nn.Conv2d
    module = cls(16, 16, 3, stride=2 if transposed else 1).to(device)
    x = _randn(8, 16, 32, 32, device=device, grad=backward)
    return _conv_grads(module, x) if backward else module(x)


def _emb_bag_max(device: str) -> torch.Tensor:
    weight = _randn(1000, 8, device=device, grad=True)
    idx = torch.randint(0, 1000, (20_000, 8), generator=_gen(4)).to(device)
    F.embedding_bag(idx, weight, mode="max").sum().backward()
    return weight.grad


def _ctc(device: str) -> torch.Tensor:
    log_probs = _randn(50, 16, 20, device=device).log_softmax(2).detach().requires_grad_(True)
    targets = torch.randint(1, 20, (16, 30), generator=_gen(6)).to(device)
    lengths = torch.full((16,), 50, dtype=torch.long, device=device)
    F.ctc_loss(log_probs, targets, lengths, torch.full((16,), 30, dtype=torch.long, device=device)).backward()
    return log_probs.grad


def _fractional(dims: int, device: str) -> torch.Tensor:
    shape = (4, 8) + (16,) * dims
    samples = torch.rand(4, 8, dims, generator=_gen(7)).to(device)
    pool = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d
    return _grad(lambda x: pool(x, 2, output_size=(12,) * dims, _random_samples=samples),
                 _randn(*shape, device=device, grad=True))


def _unpool(dims: int, device: str) -> torch.Tensor:
    x = torch.arange(float(4 ** dims)).reshape((1, 1) + (4,) * dims).to(device)
    pool, unpool = (F.max_pool2d, F.max_unpool2d) if dims == 2 else (F.max_pool3d, F.max_unpool3d)
    y, i = pool(x, 2, return_indices=True)
    return unpool(y, i, 2)


def _sparse_bmm(device: str) -> torch.Tensor:
    dense = _randn(4, 64, 64, device="cpu", seed=8)
    dense[dense.abs() < 1.0] = 0
    return torch.bmm(dense.to_sparse().to(device), _randn(4, 64, 32, device=device, seed=9))


@contextlib.contextmanager
def _without_env(name: str) -> Any:
    """``name`` removed from os.environ inside (the registry reads it at match time; cuBLAS read it at start-up)."""
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def _rnn(backward: bool) -> Example:
    def run(device: str) -> Any:
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(64, 128, num_layers=2).to(device)
        x = _randn(50, 32, 64, device=device, grad=backward)
        with _without_env("CUBLAS_WORKSPACE_CONFIG"):
            out, _ = lstm(x)
            if not backward:
                return out
            out.backward(torch.randn(out.shape, generator=_gen(5)).to(device))
        return x.grad, lstm.weight_hh_l0.grad

    return run


def _interp(mode: str, dims: int) -> Example:
    return lambda d: _grad(lambda x: F.interpolate(x, scale_factor=2, mode=mode, align_corners=False),
                           _randn(*((4, 8) + (32,) * dims), device=d, grad=True))


def _pad(mode: str, dims: int) -> Example:
    return lambda d: _grad(lambda x: F.pad(x, (2,) * (2 * dims), mode=mode),
                           _randn(*((4, 8) + (32,) * dims), device=d, grad=True))


EXAMPLES: dict[tuple[str, str | None], Example] = {
    ("aten.index_add_", None): lambda d: torch.zeros(1000, device=d).index_add_(0, *_many(d)),
    ("aten.index_add", None): lambda d: torch.index_add(torch.zeros(1000, device=d), 0, *_many(d)),
    ("aten.scatter_add_", None): lambda d: torch.zeros(1000, device=d).scatter_add_(0, *_many(d)),
    ("aten.scatter_add", None): lambda d: torch.scatter_add(torch.zeros(1000, device=d), 0, *_many(d)),
    ("aten.scatter_reduce_", "reduce_sum_mean"): lambda d: torch.zeros(1000, device=d).scatter_reduce_(
        0, *_many(d), "sum"),
    ("aten.scatter_reduce", "reduce_sum_mean"): lambda d: torch.scatter_reduce(
        torch.zeros(1000, device=d), 0, *_many(d), "mean"),
    ("aten.scatter_reduce_", "reduce_prod"): lambda d: torch.ones(1000, device=d).scatter_reduce_(
        0, _many(d)[0], 1 + _many(d)[1] * 1e-3, "prod"),
    ("aten.scatter_reduce", "reduce_prod"): lambda d: torch.scatter_reduce(
        torch.ones(1000, device=d), 0, _many(d)[0], 1 + _many(d)[1] * 1e-3, "prod"),
    ("aten.scatter_", "src_tensor"): lambda d: torch.zeros(500_000, device=d).scatter_(0, *_cross(d)),
    ("aten.scatter", "src_tensor"): lambda d: torch.scatter(torch.zeros(500_000, device=d), 0, *_cross(d)),
    ("aten.index_put_", "no_accumulate"): lambda d: torch.zeros(500_000, device=d).index_put_(
        (_cross(d)[0],), _cross(d)[1]),
    ("aten.index_put", "no_accumulate"): lambda d: torch.index_put(torch.zeros(500_000, device=d),
                                                                   (_cross(d)[0],), _cross(d)[1]),
    ("aten._index_put_impl_", "no_accumulate"): lambda d: torch.ops.aten._index_put_impl_(
        torch.zeros(500_000, device=d), (_cross(d)[0],), _cross(d)[1]),
    ("aten.index_copy_", None): lambda d: torch.zeros(500_000, device=d).index_copy_(0, *_cross(d)),
    ("aten.index_copy", None): lambda d: torch.index_copy(torch.zeros(500_000, device=d), 0, *_cross(d)),
    ("aten.convolution_backward", "transposed"): lambda d: _conv(True, d),
    ("aten.convolution_backward", "not_transposed"): lambda d: _conv(False, d),
    ("aten.convolution", None): lambda d: _conv(False, d, backward=False),
    ("aten.replication_pad1d_backward", None): _pad("replicate", 1),
    ("aten.replication_pad2d_backward", None): _pad("replicate", 2),
    ("aten.replication_pad3d_backward", None): _pad("replicate", 3),
    ("aten.max_pool3d_with_indices_backward", None): lambda d: _grad(
        lambda x: F.max_pool3d(x, 3, stride=1), _randn(2, 4, 16, 16, 16, device=d, grad=True)),
    ("aten.bmm", "sparse_input"): _sparse_bmm,
    ("aten.put_", "accumulate"): lambda d: torch.zeros(1000, device=d).put_(*_many(d), accumulate=True),
    ("aten.put", "accumulate"): lambda d: _grad(lambda x: torch.take(x, _many(d)[0]),
                                                torch.zeros(1000, device=d, requires_grad=True)),
    ("aten.put_", "no_accumulate"): lambda d: torch.zeros(500_000, device=d).put_(*_cross(d)),
    ("aten.put", "no_accumulate"): lambda d: torch.put(torch.zeros(500_000, device=d), *_cross(d)),
    ("aten.upsample_linear1d_backward", None): _interp("linear", 1),
    ("aten.upsample_bilinear2d_backward", None): _interp("bilinear", 2),
    ("aten.upsample_bicubic2d_backward", None): _interp("bicubic", 2),
    ("aten.upsample_trilinear3d_backward", None): _interp("trilinear", 3),
    ("aten.grid_sampler_2d_backward", None): lambda d: _grad(
        lambda x: F.grid_sample(x, _randn(4, 64, 64, 2, device=d, seed=3).tanh(), align_corners=False),
        _randn(4, 8, 16, 16, device=d, grad=True)),
    ("aten.grid_sampler_3d_backward", None): lambda d: _grad(
        lambda x: F.grid_sample(x, _randn(2, 16, 16, 16, 3, device=d, seed=3).tanh(), align_corners=False),
        _randn(2, 4, 8, 8, 8, device=d, grad=True)),
    ("aten._embedding_bag_backward", "mode_max"): _emb_bag_max,
    ("aten.bincount", "weights"): lambda d: torch.bincount(*_many(d)),
    ("aten.histc", None): lambda d: torch.histc(_many(d)[1], 100),
    ("aten._ctc_loss_backward", None): _ctc,
    ("aten._adaptive_avg_pool2d_backward", None): lambda d: _grad(
        lambda x: F.adaptive_avg_pool2d(x, 7), _randn(8, 16, 30, 30, device=d, grad=True)),
    ("aten._adaptive_avg_pool3d_backward", None): lambda d: _grad(
        lambda x: F.adaptive_avg_pool3d(x, 5), _randn(2, 8, 14, 14, 14, device=d, grad=True)),
    ("aten.adaptive_max_pool2d_backward", None): lambda d: _grad(
        lambda x: F.adaptive_max_pool2d(x, 7), _randn(8, 16, 30, 30, device=d, grad=True)),
    ("aten.avg_pool3d_backward", None): lambda d: _grad(
        lambda x: F.avg_pool3d(x, 3, stride=1), _randn(2, 4, 16, 16, 16, device=d, grad=True)),
    ("aten.fractional_max_pool2d_backward", None): lambda d: _fractional(2, d),
    ("aten.fractional_max_pool3d_backward", None): lambda d: _fractional(3, d),
    ("aten.reflection_pad1d_backward", None): _pad("reflect", 1),
    ("aten.reflection_pad2d_backward", None): _pad("reflect", 2),
    ("aten.reflection_pad3d_backward", None): _pad("reflect", 3),
    ("aten.nll_loss2d_forward", "reduced"): lambda d: F.nll_loss(
        _randn(16, 10, 64, 64, device=d).log_softmax(1),
        torch.randint(0, 10, (16, 64, 64), generator=_gen(4)).to(d)),
    ("aten.median", "with_indices"): lambda d: torch.median(torch.randint(0, 4, (64, 1001), generator=_gen(5))
                                                            .float().to(d), 1),
    ("aten.nanmedian", "with_indices"): lambda d: torch.nanmedian(
        torch.randint(0, 4, (64, 1001), generator=_gen(5)).float().to(d), 1),
    ("aten.kthvalue", None): lambda d: torch.kthvalue(torch.randint(0, 4, (64, 1001), generator=_gen(5))
                                                      .float().to(d), 500, 1),
    ("aten.cumsum", "float_or_complex"): lambda d: torch.cumsum(_many(d)[1], 0),
    ("aten.cumsum_", "float_or_complex"): lambda d: _many(d)[1].clone().cumsum_(0),
    ("aten.max_unpool2d", None): lambda d: _unpool(2, d),
    ("aten.max_unpool3d", None): lambda d: _unpool(3, d),
    ("aten.index_reduce_", None): lambda d: torch.zeros(1000, device=d).index_reduce_(0, *_many(d), "mean"),
    ("aten.index_reduce", None): lambda d: torch.index_reduce(torch.zeros(1000, device=d), 0, *_many(d), "mean"),
    ("aten._cudnn_rnn", "cublas_workspace_unset"): _rnn(backward=False),
    ("aten._cudnn_rnn_backward", "cublas_workspace_unset"): _rnn(backward=True),
}

# Ops PyTorch treats as deterministic on CUDA, which users often suspect: observed for information only.
CONTROLS: dict[str, Example] = {
    "aten.index_put_ accumulate=True": lambda d: torch.zeros(1000, device=d).index_put_(
        (_many(d)[0],), _many(d)[1], accumulate=True),
    "aten.embedding_dense_backward": lambda d: _grad(
        lambda w: F.embedding(_many(d, 200_000)[0], w), _randn(1000, 16, device=d, grad=True)),
    "aten.upsample_nearest2d_backward": _interp("nearest", 2),
}


class _Calls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.calls.append((normalize_op(func), args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _bytes(result: Any) -> bytes:
    parts = result if isinstance(result, tuple) else (result,)
    return b"".join(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes() for p in parts
                    if isinstance(p, torch.Tensor))


def _distinct(call: Callable[[], Any], runs: int) -> int:
    return len({_bytes(call()) for _ in range(runs)})


def calls_its_op(entry: OpEntry, example: Example, device: str) -> bool:
    """Whether ``example`` dispatches ``entry.op`` with arguments for which the registry picks ``entry``."""
    with _Calls() as seen:
        example(device)
    return any(match(name, args, kwargs, entry.device) == entry for name, args, kwargs in seen.calls)


def check(entry: OpEntry, device: str, runs: int = RUNS) -> dict[str, Any]:
    """Observe one row's claim on ``device``; returns a row of the report."""
    row: dict[str, Any] = {"op": entry.op, "condition": entry.condition, "claim": entry.deterministic_mode,
                           "calls_op": None, "distinct_off": None, "det_mode": None, "distinct_on": None,
                           "verdict": "no example"}
    example = EXAMPLES.get((entry.op, entry.condition))
    if example is None:
        return row
    try:
        row["calls_op"] = calls_its_op(entry, example, device)
        torch.use_deterministic_algorithms(False)
        row["distinct_off"] = _distinct(lambda: example(device), runs)
        torch.use_deterministic_algorithms(True)
        try:
            row["distinct_on"] = _distinct(lambda: example(device), runs)
            row["det_mode"] = "runs"
        except RuntimeError as exc:
            if ALERT not in str(exc):
                raise
            row["det_mode"] = "raises"
    except Exception as exc:  # a broken example is a finding, not a crash of the whole check
        row["verdict"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        return row
    finally:
        torch.use_deterministic_algorithms(False)
    if entry.deterministic_mode == "nothing" and row["distinct_off"] == 1:
        row["verdict"] = "not observed" if row["calls_op"] else "example misses op"
        return row
    holds = {
        "raises": row["det_mode"] == "raises",
        "switches kernel": row["det_mode"] == "runs" and row["distinct_on"] == 1,
        "nothing": row["det_mode"] == "runs" and (row["distinct_on"] or 0) > 1,
        "warns": row["det_mode"] == "runs",
    }[entry.deterministic_mode]
    row["verdict"] = "ok" if holds and row["calls_op"] else ("example misses op" if not row["calls_op"] else
                                                               "CLAIM FAILS")
    return row


def smoke(device: str) -> list[str]:
    """Run each example once on ``device`` and check it dispatches its row's op (no claims); returns problems."""
    problems = []
    for entry in nondeterministic_ops("cuda"):
        example = EXAMPLES.get((entry.op, entry.condition))
        if example is None:
            problems.append(f"{entry.op} [{entry.condition}]: no example")
            continue
        try:
            if (entry.op, entry.condition) in CUDNN_ONLY and not device.startswith("cuda"):
                example(device)  # it runs, but dispatches the op only on CUDA with cuDNN
                continue
            if not calls_its_op(entry, example, device):
                problems.append(f"{entry.op} [{entry.condition}]: the example does not call it with its condition")
        except Exception as exc:  # report every broken example, not just the first
            problems.append(f"{entry.op} [{entry.condition}]: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    return problems


def _table(rows: list[dict[str, Any]]) -> str:
    cols = ["op", "condition", "claim", "calls_op", "distinct_off", "det_mode", "distinct_on", "verdict"]
    cells = [[str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(cell, widths)) for cell in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--device", default="cuda", help="device to run on (default: cuda)")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"calls per observation (default {RUNS})")
    parser.add_argument("--smoke", action="store_true", help="only check each example calls its op (any device)")
    args = parser.parse_args(argv)
    if args.smoke:
        problems = smoke(args.device)
        print("\n".join(problems) if problems else f"all {len(nondeterministic_ops('cuda'))} CUDA rows have an "
              f"example that calls their op (on {args.device})")
        return 1 if problems else 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        msg = ("no CUDA GPU here: nothing to verify. Run this script on a machine with a GPU "
               "(python tools/verify_cuda_registry.py); --smoke --device cpu checks the examples without one.")
        print(json.dumps({"gpu": None, "message": msg}) if args.json else msg)
        return 0
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    rows = [check(e, args.device, args.runs) for e in nondeterministic_ops("cuda")]
    controls = {}
    for name, example in CONTROLS.items():
        try:
            controls[name] = _distinct(lambda ex=example: ex(args.device), args.runs)
        except Exception as exc:  # informational only
            controls[name] = f"error: {type(exc).__name__}"
    failed = [r for r in rows if r["verdict"] not in ("ok", "not observed")]
    if args.json:
        print(json.dumps({"gpu": gpu, "torch": torch.__version__, "runs": args.runs, "rows": rows,
                          "controls_distinct_results": controls, "failed": len(failed)}, indent=1))
    else:
        print(f"{gpu}, torch {torch.__version__}, {args.runs} calls per observation")
        print(_table(rows))
        print("\ncontrols (distinct results, deterministic mode off):",
              ", ".join(f"{k}: {v}" for k, v in controls.items()))
        print(f"\n{len(rows) - len(failed)} of {len(rows)} CUDA rows hold" + (f"; {len(failed)} do not" if failed
                                                                              else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
