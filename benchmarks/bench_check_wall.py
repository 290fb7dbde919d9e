"""Whole-process wall time of `torchrepro check` (2 runs) vs one plain run of the same script.

Target (issue 41), on a training-dominated script (a wider MLP on a larger batch, 200 steps: its plain run takes
>= 15 s on a 2-core machine): a check of the script that diverges at step 1 <= 1.25x one plain run of it (run 2
stops 5 steps after its divergence). Printed beside it: the plain run's time, both commands' CPU seconds and the
CPU floor they put under the ratio. Its variants are timed in the same interleaved rounds as the others.

Targets (issue 27), on the start-up-dominated 60-step script:
  - a script that diverges at step 1: check <= 1.4x one plain run (run 2 is compared with run 1 as it records and
    stopped 5 steps after its first divergence; `--full-runs` is shown beside it: every step of both runs);
  - the identical script (nothing is stopped): check <= 2.0x, as before;
  - `--parallel` (both runs at once) is measured and reported, for both scripts;
  - `--no-prestart` beside the default: what starting run 2's interpreter during run 1 saves (its last two lines).

The script trains an MLP on a large batch (heavy steps, few parameters), 60 steps; `--diverge` adds noise drawn
from os.urandom to the first batch. Variants are interleaved round by round so that machine noise hits all alike;
the median of each variant's times is printed, and the ratios are taken round by round (both sides of a ratio
saw the same machine). The parent's start-up (`python -m torchrepro check --help`) and a bare `import torch`
explain the floor: a check pays for two interpreters with torch, a plain run for one.

check can come in under 2x on the identical script: its runs freeze the import-time heap before the script starts
(launcher.freeze_heap), so neither the garbage collections during training nor those of interpreter shutdown walk
torch's ~200k import-time objects, which a plain run pays for.
torchrepro is byte-compiled first, as an installed copy is. The CPU seconds of each command (all its
processes) are printed beside its wall time, and with them the floor that the machine's CPUs put under a check:
a check whose processes need C CPU seconds cannot take less than C / N seconds of wall time on N CPUs, however
its work is overlapped.
Run: python benchmarks/bench_check_wall.py [rounds=3] [steps=60] [long-steps=200]   (long-steps 0: no
training-dominated script; steps 0: only the training-dominated script)
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = """
import os, sys
import torch
from torch import nn

steps = int(sys.argv[1])
width, batch = (512, 4096) if "--long" in sys.argv else (256, 2048)  # training-dominated / start-up-dominated
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))
noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little")))
for step in range(steps):
    opt.zero_grad()
    xin = x + 1e-3 * noise if "--diverge" in sys.argv and step == 0 else x
    loss = nn.functional.cross_entropy(model(xin), y)
    loss.backward()
    opt.step()
print(f"final loss {loss.item():.6f}")
"""


def _cpu() -> float:
    """CPU seconds (user + system) of every process this one has waited for, and of theirs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(cmd: list[str], ok: tuple[int, ...] = (0,), cpu: list[float] | None = None) -> float:
    t0, c0 = time.perf_counter(), _cpu()
    p = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if cpu is not None:
        cpu.append(_cpu() - c0)
    if p.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return dt


def _ratio(samples: dict[str, list[float]], name: str, base: str) -> tuple[float, float, float]:
    ratios = [a / b for a, b in zip(samples[name], samples[base])]
    return statistics.median(ratios), min(ratios), max(ratios)


def _byte_compile() -> None:
    """Byte-compile torchrepro as ``pip install`` does: a checkout run with PYTHONDONTWRITEBYTECODE=1 (this
    project's development machine sets it) would otherwise compile its modules from source in every process of a
    check (~0.2 s of CPU each), which no installed copy does."""
    import compileall

    import torchrepro

    compileall.compile_dir(str(Path(torchrepro.__file__).parent), quiet=1)


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    _byte_compile()
    steps = sys.argv[2] if len(sys.argv) > 2 else "60"
    long_steps = sys.argv[3] if len(sys.argv) > 3 else "200"
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "mlp.py"
        script.write_text(SCRIPT)

        def check(name: str, *flags: str, diverge: bool) -> list[str]:
            return [py, "-m", "torchrepro", "check", "--out", str(Path(tmp) / name), *flags, "--", py, str(script),
                    steps, *(["--diverge"] if diverge else [])]

        variants: dict[str, tuple[list[str], tuple[int, ...]]] = {
            "plain run": ([py, str(script), steps], (0,)),
            "plain run --diverge": ([py, str(script), steps, "--diverge"], (0,)),
            "check, identical": (check("same", diverge=False), (0,)),
            "check --no-prestart, identical": (check("same-np", "--no-prestart", diverge=False), (0,)),
            "check --parallel, identical": (check("same-par", "--parallel", diverge=False), (0,)),
            "check, diverged": (check("div", diverge=True), (1,)),
            "check --no-prestart, diverged": (check("div-np", "--no-prestart", diverge=True), (1,)),
            "check --full-runs, diverged": (check("div-full", "--full-runs", diverge=True), (1,)),
            "check --parallel, diverged": (check("div-par", "--parallel", diverge=True), (1,)),
            "parent start-up": ([py, "-m", "torchrepro", "check", "--help"], (0,)),
            "import torch": ([py, "-c", "import torch"], (0,)),
        }
        if not int(steps):  # only the training-dominated script
            variants = {}
        if int(long_steps):  # the training-dominated script: 200 steps of a wider MLP on a larger batch
            long = [py, str(script), long_steps, "--long", "--diverge"]
            variants["long: plain run --diverge"] = (long, (0,))
            variants["long: check, diverged"] = ([py, "-m", "torchrepro", "check", "--out", str(Path(tmp) / "long"),
                                                  "--", *long], (1,))
        _time([py, str(script), "1"])  # warm the file cache
        samples: dict[str, list[float]] = {k: [] for k in variants}
        cpu: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(rounds):
            for name, (cmd, ok) in variants.items():
                samples[name].append(_time(cmd, ok, cpu[name]))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    scripts = (f"{steps}-step script" if int(steps) else "") + (" and " if int(steps) and int(long_steps) else "") + (
        f"training-dominated {long_steps}-step script (long:)" if int(long_steps) else "")
    print(f"{rounds} interleaved rounds, {scripts}, {os.cpu_count()} CPUs, load average {load:.2f}; median wall "
          "seconds (range)")
    for name, v in samples.items():
        print(f"  {name:<32} {statistics.median(v):7.2f} s   ({min(v):.2f} - {max(v):.2f})   "
              f"CPU {statistics.median(cpu[name]):6.2f} s")
    rows = [("check, diverged", "plain run --diverge", 1.4), ("check, identical", "plain run", 2.0),
            ("check --full-runs, diverged", "plain run --diverge", None),
            ("check --parallel, diverged", "plain run --diverge", None),
            ("check --parallel, identical", "plain run", None),
            ("check, identical", "check --no-prestart, identical", None),
            ("check, diverged", "check --no-prestart, diverged", None)]
    if not int(steps):
        rows = []
    if int(long_steps):
        rows.insert(0, ("long: check, diverged", "long: plain run --diverge", 1.25))
    for name, base, target in rows:
        med, lo, hi = _ratio(samples, name, base)
        verdict = "" if target is None else f"; target <= {target}x {'OK' if med <= target else 'MISSED'}"
        print(f"{name} / {base} = {med:.2f}x  (per round {lo:.2f} - {hi:.2f}{verdict})")
    cores = os.cpu_count() or 1
    print(f"The floor of this machine: a check's processes need the CPU seconds above; {cores} CPUs cannot do them "
          f"in less than CPU / {cores} of wall time")
    floors = [("check, diverged", "plain run --diverge"), ("check, identical", "plain run")] if int(steps) else []
    if int(long_steps):
        floors.insert(0, ("long: check, diverged", "long: plain run --diverge"))
    for name, base in floors:
        floor = statistics.median(cpu[name]) / cores / statistics.median(samples[base])
        print(f"  {name}: {statistics.median(cpu[name]):.2f} CPU s / {cores} = at least {floor:.2f}x {base}'s wall "
              f"(its own CPU: {statistics.median(cpu[base]):.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
