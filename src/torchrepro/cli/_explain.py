"""``torchrepro bench --explain``: the check of each candidate configuration, and the explanation as text.

The costs and the search are :mod:`torchrepro.measure.detcost`; this module runs the checks (two recorded runs,
compared bitwise as ``torchrepro check`` compares them) and renders what ``bench`` found.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._core.table import render_table
from ..analysis.compare import compare_runs
from ..control._settings import without
from ..measure import detcost
from ..record.launcher import LaunchOptions
from ..record.store import load_run
from ._series import run_series

CHECK_RUNS = 2


def verify_left_out(out: Path, command: list[str], left_out: list[str], applicable: list[str],
                    args: argparse.Namespace, first: int, bundled: str | None) -> detcost.Candidate:
    """Check deterministic mode without ``left_out`` (the script's own settings when that leaves out every
    applicable setting): :data:`CHECK_RUNS` recorded runs into ``out/run<first>...``, compared bitwise."""
    rec = detcost.recommendation(left_out, applicable)
    opts = LaunchOptions(seed=args.seed, deterministic=rec["deterministic"],
                         determinism=without(left_out) if rec["deterministic"] else {},
                         max_steps=args.warmup + args.steps)
    label = f"check of {rec['summary'] if rec['deterministic'] else 'the script’s own settings'}"
    plan = [(f"{label}, run {k}/{CHECK_RUNS}", command, opts) for k in range(1, CHECK_RUNS + 1)]
    done = run_series(out, plan, what="bench", bundled=bundled, first=first, total=first - 1 + CHECK_RUNS)
    result = compare_runs([load_run(d.run_dir) for d in done])
    detail = f"{CHECK_RUNS} runs of {args.warmup + args.steps} steps bitwise identical"
    if result.verdict != "identical":
        what = "; ".join(f"{d.label} {', '.join(d.names[:2])}" for d in result.first[:2])
        detail = f"diverged at step {result.first_step} ({what}); cause: {result.cause}"
    return detcost.Candidate(left_out, result.verdict, detail, [d.run_dir.name for d in done])


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


NOT_SIGNIFICANT = "n.s."  # beside an overhead in a table: its 95% interval includes 0
NOT_SIGNIFICANT_NOTE = ("n.s.: not significant: the 95% interval includes 0, so this overhead is not told apart from "
                        "noise (more --rounds and --steps narrow it)")


def overhead_text(over: float | None, ci: Any, *, short: bool = False) -> str:
    """An overhead and its 95% interval, said to be not significant when the interval includes zero (``short``:
    marked ``n.s.``, for a table cell, with :data:`NOT_SIGNIFICANT_NOTE` under the table).

    >>> overhead_text(0.052, [0.031, 0.074])
    '+5.2% (+3.1% to +7.4%)'
    >>> overhead_text(7.659, [-0.116, 21.6])
    '+765.9% (-11.6% to +2160.0%; not significant: the interval includes 0)'
    >>> overhead_text(7.659, [-0.116, 21.6], short=True)
    '+765.9% (-11.6% to +2160.0%) n.s.'
    """
    if over is None:
        return "-"
    lo, hi = ci
    text = f"{_pct(over)} ({_pct(lo)} to {_pct(hi)}"
    if not lo <= 0 <= hi:
        return text + ")"
    return text + (f") {NOT_SIGNIFICANT}" if short else "; not significant: the interval includes 0)")


def significance_notes(cells: list[str]) -> list[str]:
    """The note under a table whose cells mark an overhead ``n.s.``; none when no cell does."""
    return [NOT_SIGNIFICANT_NOTE] if any(c.endswith(f" {NOT_SIGNIFICANT}") for c in cells) else []


def render_explain(doc: dict[str, Any]) -> str:
    """The explanation part of bench's text output."""
    results = {r["config"]: r for r in doc["results"]}
    lines: list[str] = []
    for part in doc["explain"]:
        where = f" ({part['precision']})" if part["precision"] else ""
        rows = [[s["setting"], s["title"],
                 s["reason"] if s["overhead"] is None else overhead_text(s["overhead"], s["overhead_ci"], short=True)]
                for s in part["settings"]]
        lines += [f"What each setting of deterministic mode costs{where}: deterministic mode with it vs without "
                  "it, paired runs (95% CI)",
                  render_table(["setting", "what it sets", "cost (95% CI)"], rows),
                  *significance_notes([r[2] for r in rows]), ""]
        lines += [f"Checks ({CHECK_RUNS} runs each, compared bitwise), leaving out the costliest setting first:"]
        for c in part["checks"]:
            name = "the script's own settings" if not detcost.recommendation(
                c["left_out"], [s["setting"] for s in part["settings"] if s["applicable"]])["deterministic"] else \
                detcost.variant_name(c["left_out"])
            lines.append(f"  {name}: {c['verdict'].upper()} - {c['detail']} ({', '.join(c['runs'])})")
        rec = part["recommended"]
        full = results[part["full"]]
        if rec is None:
            lines.append("No configuration is recommended: not even full deterministic mode was bitwise "
                         "reproducible in the check above (seed the script with --seed, or see "
                         "`torchrepro check --locate`).")
            continue
        mine = results[rec["config"]]
        cost = "baseline (no overhead)" if rec["config"] == part["default"] else overhead_text(mine["overhead"],
                                                                                     mine["overhead_ci"])
        lines += ["", f"Cheapest configuration still bitwise reproducible{where} (verified by the check above): "
                      f"{rec['summary']}"]
        if rec["deterministic"]:
            lines += [f"  in Python: {rec['call']}",
                      f"  CLI:       torchrepro run {' '.join(rec['flags'])} -- ..."]
        else:
            lines += ["  in Python: nothing to call", "  CLI:       torchrepro run -- ... (no --deterministic)"]
        lines.append(f"  cost vs {part['default']}: {cost}; full deterministic mode: "
                     f"{overhead_text(full['overhead'], full['overhead_ci'])}")
    return "\n".join(lines).rstrip()
