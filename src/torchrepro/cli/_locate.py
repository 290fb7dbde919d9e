"""``--locate`` of ``check`` (one process or torchrun): two more runs trace the first divergent step(s), and the op
streams are compared (:mod:`torchrepro.analysis.locate`), or the graphs inductor compiled are measured
(:mod:`torchrepro.analysis.compilelocate`); a failure of the traced re-runs keeps the verdict already found."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.errors import Interrupted, ReproError
from ..record.launcher import LaunchOptions
from ..record.settings import TraceSettings
from ..record.store import OPS, load_run
from ._checkrun import Isolation, WriteErrors, execute_runs
from ._options import check_words
from ._output import locate_failed, save_locate

if TYPE_CHECKING:
    from ..analysis.compare import CheckResult


LOCATED_NEXT = "See Locate below: what the traced re-runs found, and what to change."
def run_locate(command: list[str], out: Path, result: CheckResult, opts: LaunchOptions, steps: int,
               errors: WriteErrors | None = None, isolation: Isolation | None = None, *,
               prestart: bool = True, rank: int | None = None) -> dict[str, Any]:
    """Re-run twice with the op tracer on the first divergent step(s); compare the two op streams (under torchrun,
    those of ``rank``: every rank traces, the rank that diverged first is compared)."""
    from ..analysis.causes import untraced_note
    from ..analysis.locate import VERDICTS, locate_ops
    from ..record.optrace import read_ops
    from ._render import render_op_table

    if result.verdict == "identical":
        return {"verdict": "nothing-to-locate", "title": VERDICTS["nothing-to-locate"]}
    untraced = untraced_note(result.cause)
    if untraced:
        return {"verdict": "skipped", "title": untraced}
    errors = [] if errors is None else errors
    if result.compiled and result.compiled.get("in_compiled_code") is not False:  # the op tracer cannot see it
        return run_compiled_locate(command, out, result, opts, errors, isolation, prestart=prestart, rank=rank)
    first = int(result.first_step or 0)
    last = first + steps - 1
    # In optimizer mode the traced runs stop right after the traced steps (step 0 = construction: stop at 1).
    stop_at = max(last, 1) if result.step_mode == "optimizer" else opts.max_steps
    trace_opts = dataclasses.replace(opts.with_values(keep=False), trace=TraceSettings(steps=(first, last),
                                     mode=result.step_mode), max_steps=stop_at)
    print(f"torchrepro: --locate: tracing every operation of step {first}" +
          (f"..{last}" if last > first else "") + " in two more runs", file=sys.stderr, flush=True)
    dirs = execute_runs(command, out / "locate", 2, trace_opts, _fresh_only(isolation), prestart=prestart)
    if rank is not None:
        dirs = [d / f"rank{rank}" for d in dirs]
    ops = [list(read_ops(d / OPS)) if (d / OPS).exists() else [] for d in dirs]
    device = (load_run(dirs[0]).manifest.get("device") or "cpu").split(":")[0]
    loc = locate_ops(ops[0], ops[1], device=device)
    return save_locate(out, loc.to_json(), render_op_table(loc.context), errors)


def locate_keeping_verdict(args: argparse.Namespace, command: list[str], out: Path, result: CheckResult,
                           opts: LaunchOptions, errors: WriteErrors, isolation: Isolation | None, *,
                           rank: int | None = None) -> dict[str, Any]:
    """``--locate`` after a verdict: :func:`run_locate`, or, when its traced re-runs fail, a document that says so
    (the verdict is known: it is kept)."""
    from ..analysis.causes import check_command

    try:
        return run_locate(command, out, result, opts, args.locate_steps, errors, isolation,
                          prestart=not args.no_prestart, rank=rank)
    except Interrupted:
        raise
    except ReproError as exc:  # the verdict is known: keep it, and say why nothing was located
        steps = ["--locate-steps", str(args.locate_steps)] if args.locate_steps != 1 else []
        return locate_failed(exc, check_command(check_words(args), args.user_command, ["--locate", *steps]))


def _fresh_only(isolation: Isolation | None) -> Isolation | None:
    """The --locate re-runs get copies of the cwd as the compared runs did (they are not watched)."""
    return Isolation(fresh=True) if isolation is not None and isolation.fresh else None


def run_compiled_locate(command: list[str], out: Path, result: CheckResult, opts: LaunchOptions,
                        errors: WriteErrors, isolation: Isolation | None = None, *, prestart: bool = True,
                        rank: int | None = None) -> dict[str, Any]:
    """Re-run twice capturing the graphs inductor compiled; measure them at the first divergent step (see
    :mod:`torchrepro.analysis.compilelocate`)."""
    from ..analysis.compilelocate import locate_compiled
    from ..record.compiled import CAPTURE_ENV, DEFAULT_REPEATS, GRAPHS_FILE
    from ._render import render_op_table

    first = max(int(result.first_step or 1), 1)
    stop_at = first if result.step_mode == "optimizer" else opts.max_steps
    capture_opts = dataclasses.replace(opts.with_values(keep=False), max_steps=stop_at, extra_env={
        **opts.extra_env, CAPTURE_ENV: json.dumps({"repeats": DEFAULT_REPEATS})})
    print(f"torchrepro: --locate: the divergence lies in torch.compile'd code; capturing the graphs inductor "
          f"compiled and measuring them at step {first} in two more runs", file=sys.stderr, flush=True)
    dirs = execute_runs(command, out / "locate", 2, capture_opts, _fresh_only(isolation), prestart=prestart)
    if rank is not None:
        dirs = [d / f"rank{rank}" for d in dirs]
    docs = [json.loads((d / GRAPHS_FILE).read_text()) if (d / GRAPHS_FILE).exists() else {} for d in dirs]
    device = (load_run(dirs[0]).manifest.get("device") or "cpu").split(":")[0]
    doc = locate_compiled(docs, step=first, device=device).to_json()
    table = render_op_table([{**r, "op_other_run": None, "phase": doc["op"] and doc["op"]["phase"]}
                             for r in doc["context"]])
    return save_locate(out, doc, table, errors)
