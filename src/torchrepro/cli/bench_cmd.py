"""``torchrepro bench``: what deterministic mode (and other settings) costs per training step of your own script.

Each variant runs the script ``--rounds`` times, ``--warmup`` + ``--steps`` steps each, in alternating order
(A B B A ...) so that drift of the machine (clocks, temperature, other load) hits every variant alike. Steps are
timed at the recorder's step boundaries (after each ``optimizer.step()``, or each ``backward()`` without an
optimizer), after synchronising CUDA; warm-up steps are left out. ``--builtin resnet18`` times the bundled ResNet-18
on synthetic images in fp32 and in bf16 autocast on the best available device.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._core.compat import best_device_name, device_problem
from .._core.errors import ScriptError
from .._core.io import atomic_write_json
from .._core.table import render_table
from ..measure import detcost
from ..measure.models import BUILTINS, PRECISIONS
from ..measure.variance import TimeStats, overhead_ci
from ..record.launcher import CommandError, LaunchOptions, parse_python_command
from ..record.outdir import lock_dir
from ._explain import overhead_text, significance_notes, verify_left_out
from ._options import add_json_option, positive_int, seed_arg
from ._series import Launched, output_dir, pyplot, run_series, save_figure
from ._usage import COMMAND_TAIL, SUMMARIES, set_usage

SCHEMA = "torchrepro.bench/1"
OWN_FILES = {"bench.json", "bench.png", "bench.txt"}


@dataclass(frozen=True)
class Variant:
    description: str
    deterministic: bool = False
    torch_flags: dict[str, bool] = field(default_factory=dict)
    cuda_only: bool = False
    determinism: dict[str, Any] = field(default_factory=dict)  # keyword arguments of torchrepro.deterministic()


VARIANTS = {
    "default": Variant("the script's own settings"),
    "deterministic": Variant("torchrepro.deterministic(): deterministic algorithms, cuDNN deterministic, no "
                             "cudnn.benchmark, CUBLAS_WORKSPACE_CONFIG", deterministic=True),
    "cudnn-benchmark": Variant("torch.backends.cudnn.benchmark = True (cuDNN picks the fastest algorithm)",
                               torch_flags={"cudnn_benchmark": True}, cuda_only=True),
    "no-tf32": Variant("TF32 off in cuBLAS matmuls and cuDNN convolutions (full fp32)", torch_flags={"tf32": False},
                       cuda_only=True),
}


def warmup_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}: the first step of a run has no "
                                         "start boundary to time it from, so it is always a warm-up step")
    return value


def _list_arg(known: Any, what: str) -> Any:
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown) or '(empty list)'}; known: "
                                             f"{', '.join(known)}")
        return list(dict.fromkeys(names))

    return parse


EXAMPLES = """\
Examples:
  torchrepro bench -- python train.py
  torchrepro bench --explain --steps 10 -- python train.py   # the cost of each setting; the cheapest bitwise one
  torchrepro bench --builtin resnet18 --precisions fp32"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help=SUMMARIES["bench"],
                       description="Time a training script's steps under default and deterministic settings, in "
                                   "alternating rounds, and report what determinism costs per step with its confidence"
                                   " interval.",
                       epilog=EXAMPLES)
    p.add_argument("--steps", type=positive_int, default=20, metavar="K", help="timed steps per run (default 20)")
    p.add_argument("--warmup", type=warmup_arg, default=5, metavar="W",
                   help="steps before timing starts in each run (default 5, at least 1)")
    p.add_argument("--rounds", type=positive_int, default=2, metavar="R",
                   help="runs per variant, in alternating order (default 2)")
    p.add_argument("--variants", metavar="LIST", type=_list_arg(VARIANTS, "variant"),
                   help=f"comma-separated, the first is the baseline; known: {', '.join(VARIANTS)} (default: "
                        "default,deterministic, plus cudnn-benchmark,no-tf32 when CUDA is available)")
    p.add_argument("--builtin", choices=sorted(BUILTINS),
                   help="time the bundled model on synthetic data in fp32 and bf16 autocast (arguments after -- go "
                        "to it: --batch-size N --image-size N --device D)")
    p.add_argument("--precisions", metavar="LIST", type=_list_arg(PRECISIONS, "precision"),
                   help="with --builtin: fp32,bf16 (default both)")
    p.add_argument("--device", metavar="D",
                   help="with --builtin: the device to train the bundled model on (default: the best available: "
                        "cuda, mps, cpu); your own script picks its device itself")
    p.add_argument("--explain", action="store_true",
                   help="time each setting of deterministic mode apart (toggled alone, in paired runs; settings that "
                        "do nothing on the device are listed as not applicable), then find the cheapest "
                        "configuration that is still bitwise reproducible, verified by a check of 2 runs")
    p.add_argument("--seed", type=seed_arg, help="seed every RNG with this seed before the script starts")
    add_json_option(p)
    p.add_argument("--out", metavar="DIR", help="output directory (default: a new torchrepro-runs/bench-TIMESTAMP-PID)")
    p.add_argument("user_command", nargs=argparse.REMAINDER, metavar="-- python train.py [ARGS]",
                   help="the training command (with --builtin: extra arguments for the bundled script)")
    set_usage(p, "torchrepro bench", f"({COMMAND_TAIL} | --builtin resnet18 [--precisions LIST] [--device D] "
              "[-- ARGS])", leave_out=("--builtin", "--precisions", "--device"))
    p.set_defaults(handler=run)


@dataclass
class _Config:
    label: str
    precision: str | None
    variant: str
    command: list[str]
    durations: list[float] = field(default_factory=list)  # ms
    runs: list[str] = field(default_factory=list)
    peaks: list[dict[str, Any]] = field(default_factory=list)


def _configs(args: argparse.Namespace, command: list[str], variants: list[str]) -> list[_Config]:
    if args.builtin is None:
        for flag, value, what in (("--precisions", args.precisions, "precision"), ("--device", args.device, "device")):
            if value is not None:
                raise CommandError(f"{flag} needs --builtin (your own script sets its {what} itself).")
        if not command:
            raise CommandError("no command given. Usage: torchrepro bench [OPTIONS] -- python train.py [ARGS], or "
                               "torchrepro bench --builtin resnet18")
        parse_python_command(command)  # a bad command is refused before any directory is made
        return [_Config(v, None, v, command) for v in variants]
    precisions = args.precisions or list(PRECISIONS)
    total = args.warmup + args.steps
    device = ["--device", args.device] if args.device else []
    _check_builtin_device(args.device, command)
    return [_Config(f"{p} {v}", p, v, [sys.executable, "-m", "torchrepro.measure.models", "--model", args.builtin,
                                       "--precision", p, "--steps", str(total), *device, *command])
            for p in precisions for v in variants]


def _check_builtin_device(option: str | None, extra: list[str]) -> None:
    """Refuse, before anything runs, a device for the bundled model that this machine does not have."""
    given = [("--device", option)] if option else []
    for i, word in enumerate(extra):
        if word == "--device" and i + 1 < len(extra):
            given.append(("-- --device", extra[i + 1]))
        elif word.startswith("--device="):
            given.append(("-- --device", word.split("=", 1)[1]))
    for flag, name in given:
        problem = device_problem(name)
        if problem is not None:
            raise CommandError(f"{flag} {name}: {problem}. Leave it out to time the bundled model on the best "
                               f"available device ({best_device_name()}), or pass a device this machine has.")


def _plan(configs: list[_Config], args: argparse.Namespace,
          table: dict[str, Variant] | None = None) -> list[tuple[_Config, LaunchOptions]]:
    """Every config ``rounds`` times, the order reversed every other round (A B, B A, A B, ...)."""
    plan = []
    table = table or VARIANTS
    for r in range(args.rounds):
        for c in configs if r % 2 == 0 else reversed(configs):
            v = table[c.variant]
            opts = LaunchOptions(seed=args.seed, deterministic=v.deterministic, torch_flags=dict(v.torch_flags),
                                 determinism=dict(v.determinism), max_steps=args.warmup + args.steps, timing=True)
            plan.append((c, opts))
    return plan


def _durations(run: Launched, index: int, total: int, warmup: int, steps: int) -> list[float]:
    t = run.step_times
    if len(t) < warmup + steps:
        raise ScriptError(f"run {index} of {total} ({run.label}) made only {len(t)} steps; bench needs {warmup} "
                          f"warm-up + {steps} timed steps per run. Lower --warmup/--steps, or let the script train "
                          f"longer. Its output: {run.run_dir / 'stdout.txt'}")
    return [(t[k] - t[k - 1]) * 1e3 for k in range(warmup, warmup + steps)]


def _memory(peaks: list[dict[str, Any]]) -> dict[str, Any]:
    known = [p for p in peaks if p and p.get("bytes") is not None]
    if not known:
        return {"bytes": None, "kind": None}
    return {"bytes": max(p["bytes"] for p in known), "kind": known[0]["kind"]}


def _results(configs: list[_Config]) -> list[dict[str, Any]]:
    baselines: dict[str | None, _Config] = {}
    for c in configs:
        baselines.setdefault(c.precision, c)
    out = []
    for c in configs:
        stats = TimeStats.of(c.durations)
        base = baselines[c.precision]
        overhead, lo, hi = (None, None, None) if base is c else overhead_ci(base.durations, c.durations)
        out.append({"config": c.label, "precision": c.precision, "variant": c.variant, "baseline": base.label,
                    "steps": stats.steps, "median_ms": stats.median, "q1_ms": stats.q1, "q3_ms": stats.q3,
                    "iqr_ms": stats.iqr, "overhead": overhead, "overhead_ci": None if lo is None else [lo, hi],
                    "peak_memory": _memory(c.peaks), "runs": c.runs, "step_ms": c.durations})
    return out


def _bytes(n: int | None, kind: str | None) -> str:
    if n is None:
        return "-"
    size = f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
    return f"{size} {'CUDA' if kind == 'cuda-max-allocated' else 'RSS'}"


def render_bench(doc: dict[str, Any]) -> str:
    rows = []
    for r in doc["results"]:
        over = "baseline" if r["overhead"] is None else overhead_text(r["overhead"], r["overhead_ci"], short=True)
        rows.append([r["config"], f"{r['median_ms']:.2f}", f"{r['q1_ms']:.2f}-{r['q3_ms']:.2f}", over,
                     _bytes(r["peak_memory"]["bytes"], r["peak_memory"]["kind"])])
    baseline = doc["results"][0]["variant"]
    table = render_table(["variant", "ms/step (median)", "IQR (q1-q3)", f"overhead vs {baseline} (95% CI)",
                          "peak memory"], rows, right={1, 2})
    what = f"builtin {doc['builtin']}" if doc["builtin"] else f"`{' '.join(doc['command'])}`"
    lines = [f"torchrepro bench: {what} on {doc['device']} ({doc['threads']} CPU threads, torch {doc['torch']})",
             f"{doc['rounds']} run(s) per variant, each {doc['warmup']} warm-up + {doc['steps']} timed steps; "
             f"run order: {', '.join(doc['order'][:8])}{' ...' if len(doc['order']) > 8 else ''}", "", table,
             *significance_notes([row[3] for row in rows])]
    lines += [f"note: {n}" for n in doc["notes"]]
    if doc.get("explain"):
        from ._explain import render_explain

        lines += ["", render_explain(doc)]
    if doc.get("plot"):
        lines.append(f"Plot: {doc['plot']}")
    return "\n".join(lines)


def plot_bench(doc: dict[str, Any], path: Path) -> Path | None:
    plt = pyplot()
    if plt is None:
        return None
    results = doc["results"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.boxplot([r["step_ms"] for r in results], showfliers=True)
    ax1.set_xticks(range(1, len(results) + 1), [r["config"] for r in results], rotation=20, ha="right")
    ax1.set_ylabel("ms per step")
    ax1.set_title("Step times (warm-up excluded)")
    others = [r for r in results if r["overhead"] is not None]
    if others:
        xs = range(len(others))
        mids = [r["overhead"] * 100 for r in others]
        err = [[m - r["overhead_ci"][0] * 100 for m, r in zip(mids, others)],
               [r["overhead_ci"][1] * 100 - m for m, r in zip(mids, others)]]
        ax2.bar(xs, mids, yerr=err, capsize=4, width=0.5, color="tab:orange")
        ax2.set_xlim(-0.75, len(others) - 0.25)
        ax2.set_xticks(list(xs), [r["config"] for r in others], rotation=20, ha="right")
        ax2.axhline(0, color="black", linewidth=0.8)
    ax2.set_ylabel("overhead vs baseline (%), 95% CI")
    ax2.set_title("What each setting costs")
    fig.suptitle(f"torchrepro bench on {doc['device']}")
    return save_figure(fig, path)


@dataclass
class _Explained:
    launched: list[Launched]
    configs: list[_Config]
    plan: list[tuple[_Config, LaunchOptions]]
    doc: list[dict[str, Any]]


class _Runs:
    """Numbers the runs of one bench as they are added (timed series and checks alike)."""

    def __init__(self, out: Path, after: Any, by_index: dict[int, _Config], bundled: str | None) -> None:
        self.out, self.after, self.by_index, self.bundled = out, after, by_index, bundled
        self.next = 1

    def time(self, plan: list[tuple[_Config, LaunchOptions]]) -> list[Launched]:
        """Time ``plan`` (``after`` adds each run to its config)."""
        first = self.next
        self.by_index.update({i: c for i, (c, _) in enumerate(plan, start=first)})
        self.next += len(plan)
        return run_series(self.out, [(c.label, c.command, o) for c, o in plan], what="bench", after=self.after,
                          bundled=self.bundled, first=first, total=self.next - 1)

    def check(self, command: list[str], left_out: list[str], applicable: list[str],
              args: argparse.Namespace) -> detcost.Candidate:
        candidate = verify_left_out(self.out, command, left_out, applicable, args, self.next, self.bundled)
        self.next += len(candidate.runs)
        return candidate


def _explain(args: argparse.Namespace, command: list[str], out: Path, firsts: list[_Config],
             table: dict[str, Variant], after: Any, by_index: dict[int, _Config], bundled: str | None) -> _Explained:
    """``--explain``: run 1 (the first default run) tells the device and whether the script compiles; then every
    setting of deterministic mode is timed alone, and the cheapest bitwise configuration searched and checked."""
    runs = _Runs(out, after, by_index, bundled)
    head = _plan(firsts, args)[:1]
    launched = runs.time(head)
    manifest = launched[0].result.manifest or {}
    parts = detcost.plan(str(manifest.get("device") or "cpu"), compiled=bool(manifest.get("compiled")))
    kinds = detcost.variants(parts)
    for name, kwargs in kinds.items():
        table[name] = Variant(detcost.describe(kwargs), deterministic=True, determinism=kwargs)
    configs = _configs(args, command, ["default", *kinds])
    configs[0] = head[0][0]  # run 1 was the first round's first default run
    plan = _plan(configs, args, table)
    launched += runs.time(plan[1:])
    applicable = [p.name for p in parts if p.reason is None]
    docs = []
    for precision in dict.fromkeys(c.precision for c in configs):
        group = [c for c in configs if c.precision == precision]
        found = detcost.costs(parts, {c.variant: c.durations for c in group})
        cmd = group[0].command

        def verify(names: list[str], cmd: list[str] = cmd) -> detcost.Candidate:
            return runs.check(cmd, names, applicable, args)

        left, tried = detcost.cheapest(detcost.ranking(found), applicable, verify)
        doc: dict[str, Any] = {"precision": precision, "default": group[0].label,
                               "full": next(c.label for c in group if c.variant == detcost.FULL),
                               "settings": [c.to_json() for c in found], "checks": [c.to_json() for c in tried],
                               "recommended": None}
        if left is not None:
            rec = detcost.recommendation(left, applicable)
            timed = next((c for c in group if c.variant == rec["variant"]), None)
            if timed is None:  # a combination not timed yet: time it now, against the default runs above
                table[rec["variant"]] = Variant(detcost.describe(rec["kwargs"]), deterministic=True,
                                                determinism=rec["kwargs"])
                timed = next(c for c in _configs(args, command, [rec["variant"]]) if c.precision == precision)
                extra = _plan([timed], args, table)
                configs.append(timed)
                plan += extra
                launched += runs.time(extra)
            rec["config"] = timed.label
            doc["recommended"] = rec
        docs.append(doc)
    return _Explained(launched, configs, plan, docs)


def run(args: argparse.Namespace) -> int:
    command = list(args.user_command)
    if command[:1] == ["--"]:
        command = command[1:]
    cuda = torch.cuda.is_available()
    if args.explain and args.variants:
        raise CommandError("--explain times its own variants (deterministic mode with and without each setting); "
                           "leave out --variants.")
    default = ["default", "deterministic", *(["cudnn-benchmark", "no-tf32"] if cuda else [])]
    variants = ["default"] if args.explain else args.variants or default
    configs = _configs(args, command, variants)
    notes = [f"{v} has no effect without CUDA" for v in variants if VARIANTS[v].cuda_only and not cuda]
    out = output_dir(args.out, "bench", OWN_FILES)
    table = dict(VARIANTS)
    plan = _plan(configs, args)
    by_index: dict[int, _Config] = {}

    def after(i: int, run: Launched) -> None:  # check each run as it ends: a script that stops early fails fast
        config = by_index[i]
        config.durations += _durations(run, i, len(by_index), args.warmup, args.steps)
        config.runs.append(run.run_dir.name)
        config.peaks.append((run.result.manifest or {}).get("peak_memory") or {})

    with lock_dir(out):
        bundled = None if args.builtin is None else f"python -m torchrepro.measure.models --model {args.builtin}"
        explained = None
        if args.explain:
            explained = _explain(args, command, out, configs, table, after, by_index, bundled)
            launched, configs, plan = explained.launched, explained.configs, explained.plan
        else:
            by_index.update({i: c for i, (c, _) in enumerate(plan, start=1)})
            launched = run_series(out, [(c.label, c.command, o) for c, o in plan], what="bench", after=after,
                                  bundled=bundled)
        manifest = launched[0].result.manifest or {}
        doc = {"schema": SCHEMA, "command": command if args.builtin is None else configs[0].command,
               "builtin": args.builtin, "device": manifest.get("device") or "cpu", "threads": torch.get_num_threads(),
               "torch": torch.__version__, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
               "variants": {v: table[v].description for v in dict.fromkeys(c.variant for c in configs)},
               "order": [c.label for c, _ in plan], "results": _results(configs), "notes": notes, "exit_code": 0}
        if explained is not None:
            doc["explain"] = explained.doc
        if str(doc["device"]).startswith("cpu") and cuda:
            doc["notes"].append("CUDA is available but the script's parameters were on the CPU")
        plot = plot_bench(doc, out / "bench.png")
        doc["plot"] = str(plot) if plot else None
        doc["out"] = str(out)
        atomic_write_json(out / "bench.json", doc)
        text = render_bench(doc)
        (out / "bench.txt").write_text(text + "\n")
    print(json.dumps(doc, indent=2) if args.json else text)
    return 0
