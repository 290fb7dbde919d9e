"""Starting the op tracer with ~1M live Python objects in the process, side by side in one run: the old way (each
``start()`` finds the models by a scan of the heap, ``gc.get_objects()``) against the new one (the process's
registry of modules, ``_core/livemodules``: one scan at its first use, then none).

Target (issue 41, target 2): ``start()`` <= 2 ms with a million live objects, names unchanged.
The tracer is started and stopped as the recorder drives it at each traced step, with no model given (as
``torchrepro.trace_ops()`` and the recorder of an unmodified script do), a small CNN alive. Also timed: discovery
alone, both ways; and, once, the registry's own scan at its first use. Each figure is the median over rounds in
which the variants alternate (machine noise hits all of them alike); the round-by-round ratio's quartiles show
the noise.
Run: python benchmarks/bench_tracer_start.py [--quick] [--rounds N] [--objects N]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved_samples, paired_ratio  # noqa: E402
from cnn_train import SmallCNN  # noqa: E402

from torchrepro._core import modules  # noqa: E402
from torchrepro._core.livemodules import ModuleRegistry  # noqa: E402
from torchrepro.record import optrace  # noqa: E402
from torchrepro.record.optrace import OpTracer  # noqa: E402

TARGET_MS = 2.0


def heap(objects: int) -> list[dict[str, list[int]]]:
    """``objects`` live objects the garbage collector tracks: half dicts, half the lists they hold (a dict of
    only numbers or strings is not tracked, so would not count)."""
    return [{"x": [i]} for i in range(objects // 2)]


def tracer_start(scan: bool) -> Callable[[], None]:
    """Start and stop a tracer with no model given; ``scan``: its discovery scans the heap (the old way)."""
    tracer = OpTracer(path=Path(tempfile.mkdtemp(prefix="torchrepro-bench-")) / "ops.jsonl", keep=False)

    def discover() -> dict[str, object]:
        return dict(modules.discover_models(scan=scan))

    def start_stop() -> None:
        optrace.discover_models = discover  # type: ignore[assignment]  # the tracer's discovery, this variant's way
        try:
            tracer.start()
            tracer.stop()
        finally:
            optrace.discover_models = modules.discover_models

    return start_stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (5), for a loaded machine")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 15, --quick 5)")
    parser.add_argument("--objects", type=int, default=1_000_000, help="live objects to add (default 1,000,000)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 15)
    model = SmallCNN()  # the model the tracer names
    modules.discover_models()  # the process's registry, installed as a script's first discovery installs it
    kept = heap(args.objects)
    tracked = len(gc.get_objects())
    print(f"{tracked:,} objects tracked by the garbage collector ({len(kept) * 2:,} added), median of {rounds} "
          "rounds")

    t0 = time.perf_counter()
    with ModuleRegistry():  # what the first discovery of a process pays once, with this heap
        first = time.perf_counter() - t0
    print(f"the registry's one scan at its first use: {first * 1e3:.1f} ms (once per process)")

    variants: dict[str, Callable[[], object]] = {
        "discovery, heap scan (old)": lambda: modules.discover_models(scan=True),
        "discovery, registry (new)": modules.discover_models,
        "tracer start+stop, heap scan (old)": tracer_start(scan=True),
        "tracer start+stop, registry (new)": tracer_start(scan=False),
    }
    samples = interleaved_samples(variants, rounds=rounds, inner=3)
    times = {k: statistics.median(v) for k, v in samples.items()}
    for name, t in times.items():
        print(f"  {name:<36} {t * 1e3:9.3f} ms")
    for what in ("discovery", "tracer start+stop"):
        med, q1, q3 = paired_ratio(samples, f"{what}, heap scan (old)", f"{what}, registry (new)")
        print(f"  {what}: old / new, round by round: median {med:.0f}x, quartiles {q1:.0f}-{q3:.0f}x")
    new = times["tracer start+stop, registry (new)"] * 1e3
    print(f"tracer start+stop with {tracked:,} objects: {new:.3f} ms (target start() <= {TARGET_MS} ms) "
          f"{'OK' if new <= TARGET_MS else 'MISSED'}; the old way: "
          f"{times['tracer start+stop, heap scan (old)'] * 1e3:.1f} ms")
    del kept, model
    return 0


if __name__ == "__main__":
    sys.exit(main())
