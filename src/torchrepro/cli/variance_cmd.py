"""``torchrepro variance``: same-seed nondeterminism vs seed-to-seed spread of a script's final loss or metric.

N runs with one seed measure the implementation's nondeterminism; M runs with different seeds measure the
spread due to the seed (which includes the former). The report compares them and says how small a difference
between two configurations this noise lets one detect, and with which test (see :mod:`torchrepro.measure.variance`).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

from .._core.errors import ScriptError
from .._core.io import atomic_write_json
from .._core.table import render_table
from ..control.seeding import derive_seed
from ..measure.variance import GroupStats, VarianceReport, analyze_variance
from ..record.launcher import LaunchOptions, parse_python_command
from ..record.outdir import lock_dir
from ._options import add_json_option, positive_int, seed_arg
from ._series import Launched, output_dir, pyplot, run_series, save_figure
from ._usage import COMMAND_TAIL, SUMMARIES, set_usage

OWN_FILES = {"variance.json", "variance.png", "variance.txt"}


def two_or_more(text: str) -> int:
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected at least 2 (a spread needs two values), got {text!r}")
    return value


EXAMPLES = """\
Examples:
  torchrepro variance -- python train.py
  torchrepro variance --runs 5 --seeds 5 --max-steps 100 -- python train.py
  torchrepro variance --metric val_acc --deterministic -- python train.py"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("variance", help=SUMMARIES["variance"],
                       description="Run the script N times with one seed and M times with different seeds: how much "
                                   "its final metric moves from nondeterminism alone and from the seed, and the "
                                   "smallest difference between two configurations that such runs can show.",
                       epilog=EXAMPLES)
    p.add_argument("--runs", type=two_or_more, default=5, metavar="N", help="runs with one seed (default 5)")
    p.add_argument("--seeds", type=two_or_more, default=5, metavar="M", help="runs with different seeds (default 5)")
    p.add_argument("--seed", type=seed_arg, default=0, help="the seed of the same-seed runs; the others are derived "
                                                             "from it (default 0)")
    p.add_argument("--metric", metavar="NAME", help="compare the last value the script logs with "
                   "torchrepro.log_metric(NAME, value) (default: the loss of the last step)")
    p.add_argument("--deterministic", action="store_true", help="run every run in deterministic mode")
    p.add_argument("--max-steps", type=positive_int, metavar="K", help="end each run cleanly after K steps")
    add_json_option(p)
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default: a new torchrepro-runs/variance-TIMESTAMP-PID)")
    p.add_argument("user_command", nargs=argparse.REMAINDER, metavar="-- python train.py [ARGS]",
                   help="the training command; everything from the script on belongs to the script")
    set_usage(p, "torchrepro variance", COMMAND_TAIL)
    p.set_defaults(handler=run, accepts_command=True)


def _final_loss(run: Launched) -> float | None:
    for event in reversed(run.events):
        if event.get("kind") == "step":
            values = [entry.get("value") for entry in event.get("losses") or [] if entry.get("value")]
            if values:
                return float.fromhex(values[-1])
        elif event.get("kind") == "backward" and (event.get("loss") or {}).get("value"):
            return float.fromhex(event["loss"]["value"])
    return None


def _value(i: int, total: int, run: Launched, metric: str | None) -> float:
    if metric is None:
        value = _final_loss(run)
        if value is None:
            raise ScriptError(f"run {i} of {total} ({run.label}) recorded no loss value: backward() was never called "
                              "on a one-element loss. Log the value to compare with torchrepro.log_metric(NAME, "
                              "value) and pass --metric NAME.")
        return value
    logged = [e for e in run.events if e.get("kind") == "metric"]
    mine = [e for e in logged if e.get("name") == metric]
    if not mine:
        names = sorted({str(e.get("name")) for e in logged})
        raise ScriptError(f"run {i} of {total} ({run.label}) never logged metric {metric!r} (it logged "
                          f"{', '.join(map(repr, names)) if names else 'no metric at all'}). Call "
                          f"torchrepro.log_metric({metric!r}, value) in the script, or leave out --metric to use "
                          "the final loss.")
    return float.fromhex(mine[-1]["value"])


def _params(run: Launched, kind: str) -> str | None:
    """The parameter fingerprints of the run's ``init`` or ``final`` event (a key to compare runs), or None."""
    found = [e.get("params") for e in run.events if e.get("kind") == kind]
    return json.dumps(found[-1], sort_keys=True) if found and found[-1] else None


def _all_same(keys: list[str | None]) -> bool | None:
    return None if None in keys else len(set(keys)) == 1


def render_variance(doc: dict[str, Any]) -> str:
    def fmt(x: float) -> str:
        return "0" if x == 0 else f"{x:.6g}"

    rows = []
    for key, label in (("same_seed", f"same seed ({doc['same_seed']['seeds'][0]})"), ("seeds", "different seeds")):
        g = doc[key]
        note = "bit-identical" if g["identical"] else ""
        rows.append([label, str(len(g["values"])), fmt(g["mean"]), fmt(g["std"]), fmt(g["range"]), note])
    table = render_table(["group", "runs", "mean", "std", "range", ""], rows, right={1, 2, 3, 4})
    ratio = "n/a (no seed-to-seed spread)" if doc["ratio"] is None else f"{doc['ratio']:.3g}"
    det = doc["detectable"]
    same = doc["detectable_same_seed"]
    same_text = (f"{fmt(same['difference'])}" + (" - any difference is real, for that seed only"
                                                  if same["difference"] == 0 else " (valid for that seed only)"))
    lines = [f"torchrepro variance: `{' '.join(doc['command'])}`, {doc['value']}"
             + (" (deterministic mode)" if doc["deterministic"] else ""), "", table, "",
             f"same-seed std / seed-to-seed std: {ratio}; seed-only std {fmt(doc['seed_only_std'])}",
             f"Verdict: {doc['verdict']} - {doc['title']}.",
             "Smallest difference between two configurations that this noise lets one detect:",
             f"  test: {doc['test']}",
             "  n seeds per configuration (sigma = seed-to-seed std): "
             + "   ".join(f"{d['n']}: {fmt(d['difference'])}" for d in det),
             f"  one fixed seed, {same['n']} runs per configuration (sigma = same-seed std): {same_text}",
             f"Next: {doc['action']}"]
    if doc["final_params_identical"] is not None:
        lines.insert(4, "final parameters of the same-seed runs: " +
                     ("bitwise identical" if doc["final_params_identical"] else "differ"))
    if doc["initial_params_same_across_seeds"]:
        lines.insert(-1, "Note: the initial weights are bitwise identical for every seed: the script seeds its model "
                         "with a constant (or loads fixed weights), so the seed reaches at most the data order.")
    if doc.get("plot"):
        lines.append(f"Plot: {doc['plot']}")
    return "\n".join(lines)


def plot_variance(report: VarianceReport, path: Path) -> Path | None:
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for x, group in enumerate((report.same_seed, report.seeds)):
        n = len(group.values)
        offsets = [(k - (n - 1) / 2) * 0.3 / max(n - 1, 1) for k in range(n)]  # spread the points, no randomness
        ax.scatter([x + o for o in offsets], group.values, s=24, zorder=3)
        ax.hlines(group.mean, x - 0.25, x + 0.25, color="black", linewidth=1, label="mean" if x == 0 else None)
        if group.std > 0:
            ax.vlines(x + 0.3, group.mean - group.std, group.mean + group.std, color="gray", linewidth=2,
                      label="± 1 std" if x == 1 or report.seeds.std == 0 else None)
    ax.legend(fontsize=8, loc="best")
    ax.set_xticks([0, 1], [f"same seed\n({len(report.same_seed.values)} runs)",
                           f"different seeds\n({len(report.seeds.values)} runs)"])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylabel(report.value)
    ax.set_title(f"torchrepro variance: {report.verdict}")
    return save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    command = args.user_command
    parse_python_command(command)  # a bad command is refused before any directory is made
    out = output_dir(args.out, "variance", OWN_FILES)
    seeds = [derive_seed(args.seed, "variance", i) for i in range(1, args.seeds + 1)]
    same = [(f"seed {args.seed}, run {i}", args.seed) for i in range(1, args.runs + 1)]
    other = [(f"seed {s}", s) for s in seeds]
    order = [x for pair in itertools.zip_longest(same, other) for x in pair if x is not None]  # alternate the groups
    plan = [(label, command, LaunchOptions(seed=seed, deterministic=args.deterministic, max_steps=args.max_steps))
            for label, seed in order]
    values: dict[str, float] = {}

    def after(i: int, launched: Launched) -> None:
        values[launched.label] = _value(i, len(plan), launched, args.metric)

    with lock_dir(out):
        launched = run_series(out, plan, what="variance", after=after)
        by_label = {r.label: r for r in launched}
        try:
            same_stats = GroupStats.of("same seed", [values[lbl] for lbl, _ in same], [s for _, s in same])
            seed_stats = GroupStats.of("different seeds", [values[lbl] for lbl, _ in other], seeds)
        except ValueError as exc:
            raise ScriptError(f"{exc}; a spread needs finite values. Look at that run's output in {out}.") from None
        report = analyze_variance(same_stats, seed_stats,
                                  value=f"metric {args.metric!r}" if args.metric else "final loss")
        doc: dict[str, Any] = {
            "command": command, **report.to_json(), "deterministic": args.deterministic,
            "final_params_identical": _all_same([_params(by_label[lbl], "final") for lbl, _ in same]),
            "initial_params_same_across_seeds": _all_same([_params(by_label[lbl], "init") for lbl, _ in other]),
            "runs": {r.label: r.run_dir.name for r in launched}}
        plot = plot_variance(report, out / "variance.png")
        doc.update(plot=str(plot) if plot else None, out=str(out), exit_code=0)
        atomic_write_json(out / "variance.json", doc)
        text = render_variance(doc)
        (out / "variance.txt").write_text(text + "\n")
    print(json.dumps(doc, indent=2, allow_nan=False) if args.json else text)
    return 0

