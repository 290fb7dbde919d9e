"""Recording cost at scale: MLPs of about 1M, 10M and 100M parameters, recorded as `check` does (fingerprints
plus value snapshots under the default 1 GiB values budget), on the CPU.

Per size it prints the step-time overhead (recorded vs plain steps, interleaved in one process), the bytes
written per recorded step (trace and values; the initial and final snapshots apart), and the peak extra memory
(growth of the process's peak RSS once recording starts). Goals: cost grows no faster than the parameter
count; disk use stays within the values budget including the initial snapshot; at most one extra host copy
of the parameters.
Run: python benchmarks/bench_scale.py [sizes, e.g. 1M,10M,100M]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = {"1M": (512, 4), "10M": (1024, 10), "100M": (2048, 24)}  # width, layers: about width**2 * layers
BATCH = 16


def _measure(size: str) -> dict:
    import torch
    from torch import nn

    sys.path.insert(0, str(Path(__file__).parent))
    from _timing import interleaved

    from torchrepro.record.recorder import DEFAULT_VALUES_BUDGET, Recorder

    width, layers = SIZES[size]
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())])
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, width)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    for _ in range(2):
        step()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tmp = Path(tempfile.mkdtemp(prefix="torchrepro-scale-"))
    rec = Recorder(tmp / "run", models={"": model}, keep_values=True, value_schedule="sampled")  # as check records
    per_round = 2

    def recorded() -> None:
        rec.install()
        try:
            for _ in range(per_round):
                step()
        finally:
            rec.uninstall()

    def plain() -> None:
        for _ in range(per_round):
            step()

    rounds = 9 if n_params < 50e6 else 4
    times = interleaved({"plain": plain, "recorded": recorded}, rounds=rounds, inner=1)
    summary = rec.finish()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    values = tmp / "run" / "values"
    sizes = {f.stem: f.stat().st_size for f in values.glob("*.pt")}
    step_bytes = sum(v for k, v in sizes.items() if k.startswith("step_"))
    trace = (tmp / "run" / "trace.jsonl").stat().st_size
    steps = summary["steps"]
    return {"size": size, "params": n_params, "param_bytes": n_params * 4, "steps": steps,
            "plain_s": times["plain"] / per_round, "recorded_s": times["recorded"] / per_round,
            "trace_bytes_per_step": trace / max(steps, 1), "values_bytes_per_step": step_bytes / max(steps, 1),
            "init_bytes": sizes.get("init", 0), "final_bytes": sizes.get("final", 0),
            "values_total": sum(sizes.values()), "budget": DEFAULT_VALUES_BUDGET,
            "values_saved": len(summary["values_saved"]), "values_skipped": summary["values_skipped"],
            "peak_extra": max(0, rss1 - rss0)}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(_measure(sys.argv[2])))
        return 0
    sizes = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SIZES)
    print(f"MLPs, batch {BATCH}, CPU, recorded as `check` records (fingerprints + values, default budget)")
    print(f"{'size':>5} {'params':>11} {'plain step':>11} {'overhead':>9} {'trace/step':>11} {'values/step':>12} "
          f"{'init+final':>11} {'values total':>13} {'peak extra':>11}")
    for size in sizes:  # one process per size: peak memory is per process
        out = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{size}: failed\n{out.stderr[-2000:]}")
            return 1
        r = json.loads(out.stdout.strip().splitlines()[-1])
        mb = 1 << 20
        over = r["recorded_s"] / r["plain_s"] - 1
        print(f"{size:>5} {r['params']:>11,} {r['plain_s'] * 1e3:>9.1f}ms {over * 100:>+8.1f}% "
              f"{r['trace_bytes_per_step'] / 1024:>9.1f}KB {r['values_bytes_per_step'] / mb:>10.1f}MB "
              f"{(r['init_bytes'] + r['final_bytes']) / mb:>9.1f}MB {r['values_total'] / mb:>8.1f}MB/"
              f"{r['budget'] // mb}MB {r['peak_extra'] / mb:>8.1f}MB  ({r['peak_extra'] / r['param_bytes']:.2f}x "
              f"params; {r['values_saved']} snapshots, {r['values_skipped']} skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
