"""``compare --locate``: trace the first divergent step of both commands and name where they part.

Eager code on both sides: both commands re-run with the op tracer (and its value copies) on that step, and the two
op streams are aligned (:mod:`torchrepro.analysis.proglocate`). A side that runs ``torch.compile``'d code is re-run
capturing the graphs inductor compiled instead (what ``check --locate`` does), and each graph's compiled kernels are
measured against the same graph run eagerly on identical inputs (:mod:`torchrepro.analysis.compiledvs`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analysis.causes import untraced_note
from ..record.launcher import LaunchOptions
from ..record.opvalues import OP_VALUES, OP_VALUES_ENV
from ..record.settings import TraceSettings
from ..record.store import OPS, Run, load_values
from ._checkrun import WriteErrors
from ._compare_locate_render import render_aligned_table
from ._comparecompiled import locate_compiled_sides
from ._output import save_locate
from ._sides import Side, record_side

if TYPE_CHECKING:
    from ..analysis.crossrun import CompareResult

OP_VALUES_BUDGET = 512 << 20  # bytes of op values each traced re-run keeps (tolerances at op level)


def _note(verdict: str, title: str) -> dict[str, Any]:
    return {"verdict": verdict, "title": title}


def locate_sides(sides: list[Side], runs: list[Run], result: CompareResult, out: Path, opts: LaunchOptions,
                 steps: int, errors: WriteErrors) -> dict[str, Any]:
    """Trace (or capture) the first divergent step of both sides; the ``locate`` document of compare.json."""
    check = result.check
    if result.verdict == "identical":
        return _note("nothing-to-locate", "the commands are identical: nothing to locate")
    untraced = untraced_note(check.cause)
    if untraced:
        return _note("skipped", untraced)
    first = int(check.first_step or 0)
    compiled = [bool(r.manifest.get("compiled")) for r in runs]
    if any(compiled):
        doc = locate_compiled_sides(sides, runs, compiled, result, out, opts, max(first, 1))
    else:
        doc = _locate_eager(sides, result, out, opts, first, first + steps - 1)
    return save_locate(out, doc, render_aligned_table(doc["context"]) if doc.get("context") else None, errors)


def traced_options(opts: LaunchOptions, first: int, last: int, mode: str) -> LaunchOptions:
    """The re-runs trace steps ``first..last`` (0 = model construction), keep op values, stop right after."""
    stop_at = max(last, 1) if mode == "optimizer" else opts.max_steps
    return dataclasses.replace(opts.with_values(keep=False), trace=TraceSettings(steps=(first, last), mode=mode),
                               max_steps=stop_at, extra_env={**opts.extra_env, OP_VALUES_ENV: str(OP_VALUES_BUDGET)})


def _locate_eager(sides: list[Side], result: CompareResult, out: Path, opts: LaunchOptions, first: int,
                  last: int) -> dict[str, Any]:
    from ..analysis.proglocate import locate_programs
    from ..record.optrace import read_ops

    print(f"torchrepro: --locate: tracing every operation of step {first}" + (f"..{last}" if last > first else "")
          + " in both commands", file=sys.stderr, flush=True)
    traced_opts = traced_options(opts, first, last, result.check.step_mode)
    dirs = [_traced_dir(side, out, traced_opts) for side in sides]
    ops = [list(read_ops(d / OPS)) for d in dirs]
    values = [load_values(d / OP_VALUES) if (d / OP_VALUES).exists() else {} for d in dirs]
    found = locate_programs(ops[0], ops[1], values[0], values[1], result.tolerance)
    return found.to_json() | {"step": first, "traced_in": [str(d) for d in dirs], "compiled": False}


def _traced_dir(side: Side, out: Path, opts: LaunchOptions) -> Path:
    """A traced re-run of the side's command; a recorded run directory must hold its own op trace."""
    if side.recorded is None:
        return record_side(side, out / "locate" / side.label.lower(), opts, quiet=True)
    if not (side.recorded / OPS).exists():
        from .._core.errors import RunDirError

        raise RunDirError(side.recorded, "has no op trace (ops.jsonl), so --locate cannot look into it.",
                          "Record it with `torchrepro run --record DIR --trace-steps N -- ...` (N = the first "
                          "divergent step), or give the command itself instead of the run directory.")
    return side.recorded

