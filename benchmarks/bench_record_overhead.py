"""Overhead of step-level recording (CPU), measured side by side in one run: the example CNN, and a ~100M-parameter
transformer.

Targets:
  - the example CNN (issue 27): recording (fingerprints of loss, batch, parameters, gradients, optimizer state)
    adds <= 3% to the step time, both for plain recording and as `check` records (plus value snapshots of the
    steps chosen by `record.sampled_step`: steps 1-16, then 8 per doubling, over the ~200 steps this benchmark
    runs). Also printed: value snapshots at every step (`torchrepro run --keep-values`).
  - a GPT-like transformer of ~98M parameters (12 pre-norm layers of width 768, tied 16k-token embedding, AdamW,
    4 sequences of 64 tokens; issue 41): fingerprints of parameters, gradients and Adam state at every step
    (~1.6 GB, what `Recorder` does in `check`) add <= 5% to the step time, as the median of interleaved rounds
    (recorded and plain steps alternate in this process). The profile of the recorded step is printed: the
    hook's time, of which hashing and the trace write.
  - the `splitmix64-sum-128` path (the one devices other than the CPU use), forced on the CPU: its throughput
    on the transformer's tensors, the bytes its ops move per fingerprinted byte (read + written, counted as if
    no cache held them: most of it stays within the slice buffers, whose size is printed) and its peak
    temporary memory per tensor.
Run: python benchmarks/bench_record_overhead.py [cnn|transformer|splitmix|all]   (default: all)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved, interleaved_samples, paired_ratio  # noqa: E402
from cnn_train import SmallCNN, synthetic_images  # noqa: E402

import torchrepro.record.recorder as recorder_mod  # noqa: E402
from torchrepro._core import tensordigest  # noqa: E402
from torchrepro.record.recorder import Recorder  # noqa: E402


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "load average n/a"


def bench_cnn() -> None:
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
    print(f"  ({s['steps']} steps recorded per variant; value snapshots as in check: {len(s['values_saved'])}; "
          f"{_load()})")


# --- a ~100M-parameter transformer -------------------------------------------------------------------------------
GPT = {"width": 768, "layers": 12, "heads": 12, "vocab": 16384, "context": 64, "batch": 4}


class TinyGPT(nn.Module):
    """A GPT-like decoder from ``GPT``: token + position embeddings, pre-norm causal layers, tied output head."""

    def __init__(self, width: int, layers: int, heads: int, vocab: int, context: int, **_: Any) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) + self.positions(torch.arange(x.shape[1]))
        return self.head(self.norm(self.blocks(h, mask=self.mask, is_causal=True)))


def _transformer() -> tuple[nn.Module, torch.optim.Optimizer, Callable[[], None]]:
    torch.manual_seed(0)
    model = TinyGPT(**GPT)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, GPT["vocab"], (GPT["batch"], GPT["context"]))

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        opt.step()

    for _ in range(2):  # Adam's state exists from here on
        step()
    return model, opt, step


def _step_tensors(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    params = list(model.parameters())
    state = [v for p in params for v in opt.state[p].values() if isinstance(v, torch.Tensor) and v.dim()]
    return params + [p.grad for p in params if p.grad is not None] + state


class _Profile:
    """Seconds spent, per recorded step, in the recorder's step hook, and within it in fingerprints and in the trace
    write (each summed over the step: the hook may call them more than once)."""

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = {"step hook": [], "fingerprint_many": [], "trace write": []}
        self._running = {"fingerprint_many": 0.0, "trace write": 0.0}
        self._undo: list[Callable[[], None]] = []

    def _wrap(self, owner: Any, name: str, key: str) -> None:
        orig = getattr(owner, name)
        hook = key == "step hook"

        def timed(*args: Any, **kwargs: Any) -> Any:
            if hook:
                self._running = dict.fromkeys(self._running, 0.0)
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                if hook:
                    self.spent[key].append(dt)
                    for k, v in self._running.items():
                        self.spent[k].append(v)
                else:
                    self._running[key] += dt

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, orig))

    def __enter__(self) -> _Profile:
        self._wrap(Recorder, "_on_step", "step hook")
        self._wrap(recorder_mod, "fingerprint_many", "fingerprint_many")
        self._wrap(recorder_mod.TraceWriter, "write", "trace write")
        return self

    def __exit__(self, *exc: Any) -> None:
        for undo in reversed(self._undo):
            undo()


def bench_transformer(rounds: int = 15) -> None:
    model, opt, step = _transformer()
    n_params = sum(p.numel() for p in model.parameters())
    tensors = _step_tensors(model, opt)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    rec = Recorder(Path(tempfile.mkdtemp(prefix="torchrepro-bench-")) / "gpt", models={"": model})

    def recorded() -> None:
        rec.install()
        try:
            step()
        finally:
            rec.uninstall()

    samples = interleaved_samples({"plain": step, "recorded": recorded}, rounds=rounds, inner=1)
    med, q1, q3 = paired_ratio(samples, "recorded", "plain")
    base = statistics.median(samples["plain"])
    print(f"GPT-like transformer: {n_params / 1e6:.1f}M parameters, AdamW, batch {GPT['batch']}x{GPT['context']} "
          f"tokens, {torch.get_num_threads()} threads; {len(tensors)} tensors ({nbytes / 1e9:.2f} GB) fingerprinted "
          f"per step; {rounds} interleaved rounds, {_load()}")
    print(f"  {'plain step':<30} {base * 1e3:8.1f} ms")
    print(f"  {'recorded (as in check)':<30} {statistics.median(samples['recorded']) * 1e3:8.1f} ms   overhead "
          f"{(med - 1) * 100:+.1f}% (quartiles {(q1 - 1) * 100:+.1f}% .. {(q3 - 1) * 100:+.1f}%)  (target <= 5%) "
          + ("OK" if med - 1 <= 0.05 else "MISSED"))
    with _Profile() as prof:
        recorded_steps = 5
        for _ in range(recorded_steps):
            recorded()
    per_step = prof.spent
    per_step["the rest"] = [h - f - w for h, f, w in zip(per_step["step hook"], per_step["fingerprint_many"],
                                                         per_step["trace write"])]
    spent = {k: statistics.median(v) for k, v in per_step.items()}
    hook, fps = spent["step hook"], spent["fingerprint_many"]
    print(f"  where the recorded step's extra time goes (median of {recorded_steps} steps): step hook "
          f"{hook * 1e3:.1f} ms ({hook / base * 100:.1f}% of a plain step) = fingerprints {fps * 1e3:.1f} ms "
          f"({nbytes / fps / 1e9:.1f} GB/s) + trace write {spent['trace write'] * 1e3:.1f} ms + the rest (names, "
          f"optimizer state, the event) {spent['the rest'] * 1e3:.1f} ms")
    rec.finish()
    one_by_one = lambda: [tensordigest._digest_xxh3(t) for t in tensors]  # noqa: E731 - before issue 41
    times = interleaved({"together": lambda: tensordigest.fingerprint_many(tensors), "one by one": one_by_one},
                        rounds=7, inner=1)
    print(f"  XXH3 over one step's tensors: chunks of all tensors shared among the threads "
          f"{times['together'] * 1e3:.1f} ms, tensor by tensor (only tensors of 16 MiB and more split) "
          f"{times['one by one'] * 1e3:.1f} ms "
          f"({times['one by one'] / times['together']:.2f}x)")


# --- the splitmix64-sum-128 path, forced on the CPU ----------------------------------------------------------------
class _MemoryTraffic(TorchDispatchMode):
    """Bytes each op reads and writes (as if no cache held them) and the peak of the memory the ops allocate."""

    def __init__(self) -> None:
        super().__init__()
        self.moved = 0
        self.peak = 0
        self._alive: dict[int, int] = {}  # data pointer -> bytes, of what the ops allocated and is still alive

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view:
            return out
        ins = [t for t in tree_leaves((args, {k: v for k, v in kwargs.items() if k != "out"}))
               if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.moved += sum(t.numel() * t.element_size() for t in ins + outs)
        read = {t.untyped_storage().data_ptr() for t in ins}
        for t in outs:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in self._alive or ptr in read or not storage.nbytes():  # in place, out=, or nothing
                continue
            self._alive[ptr] = storage.nbytes()
            weakref.finalize(t, self._alive.pop, ptr, None)
        self.peak = max(self.peak, sum(self._alive.values()))
        return out


def _torch_path(tensors: list[torch.Tensor]) -> list[str]:
    return tensordigest._digests_torch(tensors, torch.device("cpu"))


def bench_splitmix() -> None:
    model, opt, _ = _transformer()
    tensors = _step_tensors(model, opt)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    some = tensors[:40]  # a few layers' worth: the torch path is slow on the CPU
    some_bytes = sum(t.numel() * t.element_size() for t in some)
    assert _torch_path(some[:3]) == _torch_path([t.clone() for t in some[:3]])
    times = interleaved({"splitmix64-sum-128": lambda: _torch_path(some),
                         "xxh3": lambda: tensordigest.fingerprint_many(some),
                         "sum()": lambda: [t.sum() for t in some]}, rounds=5, inner=1)
    slice_mib = tensordigest._slice_words(torch.device("cpu")) * 8 / 2**20
    print(f"splitmix64-sum-128 forced on the CPU ({len(some)} of the transformer's tensors, {some_bytes / 1e6:.0f} MB; "
          f"slices of {slice_mib:.0f} MiB on the CPU, {tensordigest.TORCH_SLICE_WORDS * 8 / 2**20:.0f} MiB on "
          f"other devices; {_load()})")
    for name, t in times.items():
        print(f"  {name:<20} {some_bytes / t / 1e9:6.2f} GB/s")
    per_step = nbytes / some_bytes * times["splitmix64-sum-128"]
    print(f"  one step of the transformer ({nbytes / 1e9:.2f} GB) on this path: ~{per_step:.1f} s on this CPU "
          "(devices run it as kernels)")
    for n in (1000, 1 << 20, 1 << 23, (1 << 23) + 1):
        t = torch.randn(n)
        _torch_path([t])  # the position keys are made once per device
        with _MemoryTraffic() as traffic:
            _torch_path([t])
        print(f"  {n:>8} float32 ({t.nbytes / 2**20:6.2f} MiB): ops move {traffic.moved / t.nbytes:5.1f} bytes per "
              f"fingerprinted byte; peak temporary memory {traffic.peak / 2**20:6.2f} MiB "
              f"({traffic.peak / t.nbytes:.2f}x the tensor)")


def main() -> int:
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    for name, bench in (("cnn", bench_cnn), ("transformer", bench_transformer), ("splitmix", bench_splitmix)):
        if which in (name, "all"):
            bench()
    return 0


if __name__ == "__main__":
    sys.exit(main())
