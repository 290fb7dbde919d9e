"""Text rendering of comparison results, shared by ``check`` and ``diff``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.table import printable
from ..analysis.compare import LABELS, CheckResult
from ._options import duration_text

if TYPE_CHECKING:
    from ..analysis.resumeat import ResumeResult


NOT_TRACED = ("nothing-to-locate", "skipped", "failed")  # locate verdicts with no op to show

def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(printable(n) for n in names[:limit])  # a name from a run directory is untrusted
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def _fmt(x: float | None) -> str:
    return "-" if x is None else ("0" if x == 0 else f"{x:.3e}")


def _final_line(result: CheckResult) -> str:
    stopped = ", ".join(str(i) for i, stop in enumerate(result.stopped, start=1) if stop)
    among = f" of the runs that ran to their end (not run {stopped}: stopped early)" if stopped else ""
    if result.final_max_abs_delta_tensor is None:
        return f"  final parameters{among}: bitwise equal" if stopped else \
            "  final parameters: bitwise equal in every run"
    line = (f"  final max |Δ weight|{among} = {result.final_max_abs_delta:.6g} "
            f"({printable(result.final_max_abs_delta_tensor)})")
    if result.final_max_abs_delta == 0:
        line += " - finite values equal; the tensors differ in NaN/Inf positions, sign of zero or NaN bits"
    if result.max_ulp:
        line += f"; largest ULP distance = {result.max_ulp} ({printable(result.max_ulp_tensor or '')})"
    return line


def headline(result: CheckResult, *, what: str) -> str:
    """The verdict line of ``check`` and ``diff`` (the terminal's first line, the HTML report's headline)."""
    if result.verdict == "identical":
        unit = "steps" if result.step_mode == "optimizer" else "backward() calls"
        return (f"torchrepro: IDENTICAL - {len(result.runs)} runs of {what}, {result.steps[0]} {unit} each; every "
                "recorded loss, batch, parameter, gradient and optimizer-state tensor is bitwise equal.")
    line = (f"torchrepro: DIVERGED at step {result.first_step} ({len(result.runs)} runs of {what}; steps per run: "
            f"{result.steps})")
    if result.first_step == 0:
        line += " - step 0 means the initial parameters, before the first update"
    return line


def missed(runs: int, one_in: int) -> float:
    """The chance that ``runs`` runs all agree although each later run differs from run 1 with chance 1/``one_in``.

    >>> round(missed(2, 4), 2), round(missed(5, 4), 2), round(missed(10, 4), 3)
    (0.75, 0.32, 0.075)
    """
    return (1 - 1 / one_in) ** (runs - 1)


AUTO_STOPPED = {  # check --runs auto: why it stopped adding runs (check.json's runs_auto.stopped)
    "cap": "stopped at its cap of {runs} runs",
    "budget": "stopped adding runs once its {budget} budget was spent (--budget)",
    "diverged": "stopped adding runs at run {runs}, which diverged",
}


def auto_words(auto: dict[str, Any]) -> str:
    """``--runs auto made 4 runs and stopped ...``: how many runs ``check --runs auto`` made and why no more.

    >>> auto_words({"runs": 3, "stopped": "diverged"})
    '--runs auto made 3 runs and stopped adding runs at run 3, which diverged'
    """
    why = AUTO_STOPPED[auto["stopped"]].format(runs=auto["runs"], budget=duration_text(auto.get("budget_s") or 0))
    return f"--runs auto made {auto['runs']} runs and {why}"


def sure_line(runs: int, auto: dict[str, Any] | None = None) -> str:
    """What an IDENTICAL of ``runs`` runs rules out, and what it does not (``check``'s second line); ``auto``:
    check.json's ``runs_auto`` (``--runs auto``), said first, with what would add runs.

    >>> line = sure_line(2)
    >>> line[:66]
    'Sure:  2 runs rule out a difference in every run, not a rare one: '
    >>> line[66:]  # doctest: +NORMALIZE_WHITESPACE
    'a race that makes 1 run in 4 differ passes 2 runs 75% of the time (1 in 10: 90%).
     Use --runs 10 (a 1-in-4 race passes 8% of the time) before relying on it.'
    >>> sure_line(4, {"runs": 4, "stopped": "budget", "budget_s": 60})  # doctest: +NORMALIZE_WHITESPACE
    'Sure:  --runs auto made 4 runs and stopped adding runs once its 1m budget was spent (--budget): 4 runs rule
     out a difference in every run, not a rare one: a race that makes 1 run in 4 differ passes 4 runs 42% of the
     time (1 in 10: 73%). A larger --budget adds runs (10 runs: a 1-in-4 race passes 8% of the time).'
    """
    line = (f"Sure:  {auto_words(auto) + ': ' if auto else ''}{runs} runs rule out a difference in every run, not a "
            f"rare one: a race that makes 1 run in 4 differ passes {runs} runs {missed(runs, 4):.0%} of the time (1 in "
            f"10: {missed(runs, 10):.0%}).")
    if runs < 10 and auto:
        line += f" A larger --budget adds runs (10 runs: a 1-in-4 race passes {missed(10, 4):.0%} of the time)."
    elif runs < 10:
        line += f" Use --runs 10 (a 1-in-4 race passes {missed(10, 4):.0%} of the time) before relying on it."
    return line


def render(result: CheckResult, *, what: str, plot: str | None = None, detail_only: bool = False,
           report: str | Path | None = None, sure: bool = False, auto: dict[str, Any] | None = None) -> str:
    """The summary of a comparison; ``detail_only``: what diverged, how it grew and the notes, without the verdict
    line, cause, next action, plot and runs (``check --resume-at`` gives its own); ``sure``: under an identical
    verdict, say what the number of runs rules out (:func:`sure_line`: ``check``, whose runs the user chose; ``auto``:
    how many ``--runs auto`` made, and why no more)."""
    lines: list[str] = []
    if detail_only:
        if result.verdict != "identical":
            _divergence(result, lines)
    elif result.verdict == "identical":
        lines.append(headline(result, what=what))
        if sure:
            lines.append(sure_line(len(result.runs), auto))
        warning = (result.working_directory or {}).get("warning")
        if warning:
            lines.append(f"Warning: {warning}")
    else:
        lines.append(headline(result, what=what))
        lines.append("")
        _divergence(result, lines)
        lines.append("")
        lines += stop_lines(result)
        if result.compiled and result.compiled.get("text"):
            lines.append(f"Compiled: {result.compiled['text']}")
        lines.append(f"Cause: {result.cause} - {result.explanation}")
        lines.append(f"Next:  {result.action}")
    for note in result.notes:
        lines.append(f"Note:  {note}")
    if detail_only:
        return "\n".join(lines)
    if report:
        lines.append(f"Report: {report}")
    if plot:
        lines.append(f"Plot:  {plot}")
    lines.append("Runs:  " + ", ".join(result.runs))
    return "\n".join(lines)


def stop_lines(result: CheckResult) -> list[str]:
    """``Stopped: run 2 stopped 5 steps after its first divergence (step 1) ...``, one line per stopped run."""
    lines = []
    for i, stop in enumerate(result.stopped, start=1):
        if not stop:
            continue
        first, after = stop.get("first_divergent_step"), stop.get("steps_after")
        own = stop.get("diverged_runs") == [i]
        whose = "its first divergence" if own else "the first divergence"
        lines.append(f"Stopped: run {i} stopped {after} steps after {whose} (step {first}), after step "
                     f"{stop.get('after_step')}; --full-runs runs every step")
    return lines


def _divergence(result: CheckResult, lines: list[str]) -> None:
    """What diverged first (causal order) and how the difference grew."""
    lines.append("What diverged first (causal order):")
    for i, d in enumerate(result.first, start=1):
        lines.append(f"  {i}. {d.label:<18} step {d.step:<5} {_names(d.names)}")
    later = {k: s for k, s in result.kind_first_steps.items() if s != result.first_step}
    if later:
        lines.append("  then: " + ", ".join(f"{LABELS[k]} at step {s}" for k, s in later.items()))
    lines.append("")
    lines.append("How the difference grew:")
    lines.append(f"  {'step':>6}  {'max |Δ loss|':>12}  {'max |Δ param|':>13}")
    rows = sorted(set(range(1, len(result.loss_delta) + 1)) | set(result.param_delta))
    if len(rows) > 12:
        start = max(0, rows.index(result.first_step) if result.first_step in rows else 0)
        rows = rows[start:start + 8] + rows[-3:]
        rows = sorted(set(rows))
    for k in rows:
        ld = result.loss_delta[k - 1] if 1 <= k <= len(result.loss_delta) else None
        lines.append(f"  {k:>6}  {_fmt(ld):>12}  {_fmt(result.param_delta.get(k)):>13}")
    if result.final_max_abs_delta is not None:
        lines.append(_final_line(result))
    for entry in result.nonfinite:
        when = "final" if entry.get("step") is None else f"step {entry['step']}"
        lines.append(f"  {when}: {entry['text']}")
    if result.value_delta_text:
        lines.append(f"  {result.value_delta_text}")


def _src(op: dict[str, Any] | None) -> str:
    if not op:
        return "(no op: the run ended here)"
    where = f"{op.get('file')}:{op.get('line')}" if op.get("file") else "(no user source line)"
    return f"{op['op']} [{op.get('phase')}, module {op.get('module') or '-'}] at {where}"


def failure_lines(doc: dict[str, Any]) -> list[str]:
    """The lines under a ``failed`` locate: where its stderr is, and what to do."""
    if doc.get("verdict") != "failed":
        return []
    return ([f"  its stderr: {doc['stderr']}"] if doc.get("stderr") else []) + [f"  {doc['note']}"]


def render_compiled_locate(doc: dict[str, Any]) -> str:
    """Text for --locate on torch.compile'd code (see :mod:`torchrepro.analysis.compilelocate`)."""
    lines = ["", f"Locate: {doc['title']}"]
    region, op, measured = doc.get("region"), doc.get("op"), doc.get("measured") or {}
    if region:
        where = f"{region.get('file')}:{region.get('line')}" if region.get("file") else "(call site unknown)"
        path = region.get("module_path")
        what = "the root model" if path == "" else (f"module {path}" if path else "a function")
        lines.append(f"  region  {region.get('target')} ({what}), compiled at {where}"
                     + (f": {region['code']}" if region.get("code") else ""))
        lines.append(f"          backend {region.get('backend')}, mode {region.get('mode') or 'default'}")
    if op:
        lowered = f" (lowered from {op['original_aten']})" if op.get("original_aten") not in (None, op["op"]) else ""
        lines.append(f"  op      {op['op']}{lowered}, {op.get('phase')} graph, node {op.get('node')}")
        lines.append(f"  module  {op.get('module') or '-'}")
        where = f"{op.get('file')}:{op.get('line')}" if op.get("file") else "(no user source line)"
        lines.append(f"  source  {where}")
        if op.get("code"):
            lines.append(f"          {op['code']}")
    if measured:
        eager = {True: "identical every time", False: "varies too",
                 None: "not measured"}[doc.get("eager_deterministic")]
        lines.append(f"  measured  compiled kernel: {measured.get('node_variants')} different results for identical "
                     f"inputs; compiled graph: {measured.get('program_variants')}; eager: {eager}")
    if doc.get("verdict") == "compiled-kernel" and doc.get("eager_deterministic"):
        lines.append("  Verdict: compiled kernel - eager is deterministic here; the compiled kernel is not.")
    lines.append(f"  Why: {doc['explanation']}")
    lines.append(f"  Fix: {doc['fix']}")
    if doc.get("op_table"):
        lines.append(f"  Nodes around it: {doc['op_table']}")
    return "\n".join(lines)


def render_locate(doc: dict[str, Any]) -> str:
    """Text for the --locate section of check."""
    verdict = doc["verdict"]
    if doc.get("compiled"):
        return render_compiled_locate(doc)
    lines = ["", f"Locate: {doc['title']}"]
    if verdict in NOT_TRACED:
        return "\n".join(lines + failure_lines(doc))
    traced = doc.get("traced_steps") or []
    lines[-1] += (f" (traced step(s) {', '.join(map(str, traced)) or '-'} in {doc.get('traced_in', 'two re-runs')}: "
                  f"{doc['ops_traced'][0]} and {doc['ops_traced'][1]} ops)")
    op, other = doc.get("op"), doc.get("op_other_run")
    if verdict == "not-reproduced":
        lines.append("  Every traced op had identical inputs and outputs in both runs.")
    elif verdict == "control-flow":
        lines.append(f"  run A: op #{doc['op_index']}: {_src(op)}")
        if op and op.get("code"):
            lines.append(f"         {op['code']}")
        lines.append(f"  run B: op #{doc['op_index']}: {_src(other)}")
        if other and other.get("code"):
            lines.append(f"         {other['code']}")
    elif op:
        lines.append(f"  op      {op['op']}  ({op.get('phase')}, op #{doc['op_index']} of step {doc.get('step')})")
        lines.append(f"  module  {op.get('module') or '-'}")
        where = f"{op.get('file')}:{op.get('line')}" if op.get("file") else "(no user source line)"
        label = "created at" if op.get("phase") == "backward" else "source"
        lines.append(f"  {label:<7} {where}")
        if op.get("code"):
            lines.append(f"          {op['code']}")
        same_in = "identical" if verdict in ("origin", "rng") else "DIFFERENT"
        lines.append(f"  inputs {same_in} in both runs; outputs differ")
        if doc.get("deterministic_kernel"):
            lines.append(f"  deterministic kernel on {doc['device']}: {doc['deterministic_kernel']}")
    if doc.get("explanation"):
        lines.append(f"  Why: {doc['explanation']}")
    if doc.get("note"):
        lines.append(f"  Note: {doc['note']}")
    lines.append(f"  Fix: {doc['fix']}")
    if doc.get("op_table"):
        lines.append(f"  Ops around it: {doc['op_table']}")
    return "\n".join(lines)


def render_op_table(rows: list[dict[str, Any]]) -> str:
    """The ops around the origin as a fixed-width table."""
    head = f"{'':2}{'#':>6}  {'op':<34} {'phase':<9} {'module':<24} {'line':>5}  in  out  code"
    out = [head]
    for r in rows:
        mark = "=>" if r["origin"] else ""
        op = r["op"] or "-"
        if r.get("op_other_run") and r["op_other_run"] != r["op"]:
            op = f"{op} | {r['op_other_run']}"
        same_in, same_out = ("=" if r["inputs_equal"] else "≠"), ("=" if r["outputs_equal"] else "≠")
        out.append(f"{mark:<2}{r['i']:>6}  {op:<34} {r.get('phase') or '-':<9} {(r.get('module') or '-')[:24]:<24} "
                   f"{r.get('line') or '-':>5}  {same_in:^2}  {same_out:^3}  {(r.get('code') or '')[:60]}")
    return "\n".join(out)


# --- environment differences (env diff, diff, check) -----------------------------------------------------
ENV_TEXT_LIMIT = {"breaks-bitwise": 40, "may-change-numerics": 20, "benign": 8}


def render_env_diff(diff: Any, *, title: str | None = None, verdict: str | None = None) -> str:
    """An :class:`~torchrepro.analysis.envdiff.EnvDiff` as text grouped by rank, each change with its reason;
    ``verdict``: what the compared runs showed (``identical``: these settings did not break them)."""
    from ..analysis.envdiff import BREAKS, RANK_TITLES, RANKS

    counts = ", ".join(f"{RANK_TITLES[r]} {len(diff.of_rank(r))}" for r in RANKS if diff.of_rank(r))
    head = title or f"Environment differences ({printable(diff.a)} → {printable(diff.b)})"
    if not diff.changes:
        return f"{head}: none (versions, hardware, threads, flags, seeds, variables and packages are the same)"
    lines = [f"{head}: {counts}"]
    for rank in RANKS:
        changes = diff.of_rank(rank)
        if not changes:
            continue
        shown = RANK_TITLES[rank].capitalize()
        if rank == BREAKS and verdict == "identical":
            shown += " (not in these runs: they are bitwise identical)"
        lines.append(f"  {shown}:")
        width = min(34, max(len(printable(c.key)) for c in changes))
        limit = ENV_TEXT_LIMIT[rank]
        for c in changes[:limit]:
            lines.append(f"    {printable(c.key):<{width}}  {c.values():<24}  {c.reason}")
        if len(changes) > limit:
            lines.append(f"    ... {len(changes) - limit} more (--json lists every difference)")
    return "\n".join(lines)


def print_env_diff(diff: Any, *, title: str | None = None) -> None:
    """Print :func:`render_env_diff`, as rich tables (one per rank) when rich is installed and stdout is a terminal."""
    import sys

    try:
        if not sys.stdout.isatty():
            raise ImportError
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        print(render_env_diff(diff, title=title))
        return
    from ..analysis.envdiff import RANK_TITLES, RANKS

    console = Console()
    console.print(render_env_diff(diff, title=title).splitlines()[0], highlight=False, markup=False)
    for rank, style in zip(RANKS, ("bold red", "yellow", "dim")):
        changes = diff.of_rank(rank)
        if changes:
            more = len(changes) - ENV_TEXT_LIMIT[rank]
            table = Table(title=RANK_TITLES[rank].capitalize(), title_style=style, title_justify="left",
                          caption=f"... {more} more (--json lists every difference)" if more > 0 else None)
            for column in ("setting", "A → B", "why"):
                table.add_column(column)
            for c in changes[:ENV_TEXT_LIMIT[rank]]:  # Text: recorded strings are not read as rich markup
                table.add_row(Text(printable(c.key)), Text(c.values()), c.reason)
            console.print(table)


_TRAINERS = {"lightning": "Lightning's trainer.save_checkpoint", "transformers": "the transformers Trainer's own save",
             "script": "the script's own save"}


def render_resume(result: ResumeResult, *, what: str, plot: str | None = None) -> str:
    """Text for ``check --resume-at K``: the resume verdict, what was restored (causal order), the comparison."""
    k, steps = result.k, result.steps
    saver = _TRAINERS.get(result.trainer, result.trainer)
    story = (f"run 1 trained {steps['uninterrupted']} steps straight through; run 2 trained "
             f"{steps['before_checkpoint']}, checkpointed ({saver}) and stopped, and a fresh process resumed from "
             f"the checkpoint and trained {steps['after_resume']} more")
    lines: list[str] = []
    if result.verdict == "identical":
        lines.append(f"torchrepro: RESUME IDENTICAL - {what} resumed at step {k} continues bit for bit as the "
                     f"uninterrupted run ({story}); every recorded loss, batch, parameter, gradient and "
                     "optimizer-state tensor is bitwise equal.")
    else:
        lines.append(f"torchrepro: RESUME DIVERGED at step {result.step} - {what} resumed at step {k} does not "
                     f"continue as the uninterrupted run ({story}).")
        lines.append("")
        first = result.first_divergent
        lines.append(f"Not restored: {result.what} (first divergent step {result.step}"
                     + (f": {first['label']} {_names(first['names'])}" if first else "") + ")")
        lines.append(f"  {printable(result.explanation or '')}")
    lines.append("")
    lines.append(f"What the resume restored, in causal order (checkpoint after step {k}):")
    marks = {True: "yes", False: "NO", None: "-"}
    for i, r in enumerate(result.restored, start=1):
        lines.append(f"  {i}. {r.label:<16} {r.where:<19} {marks[r.restored]:<4} {printable(r.text)}")
    if result.verdict != "identical":
        lines.append("")
        lines.append(f"Fix:   {result.fix}")
        detail = render(result.comparison, what=what, detail_only=True)
        if detail:
            lines.append("")
            lines.append(f"Step by step (run 1 against run 2, its two processes joined at step {k}):")
            lines += ["  " + line if line else "" for line in detail.splitlines()]
    elif result.comparison.notes:
        lines += [f"Note:  {note}" for note in result.comparison.notes]
    lines += [f"Note:  {note}" for note in result.notes]
    warning = (result.comparison.working_directory or {}).get("warning")
    if warning and result.cause != "shared-working-directory":
        lines.append(f"Warning: {warning}")
    if result.checkpoint:
        lines.append(f"Checkpoint: {printable(result.checkpoint)}")
    if plot:
        lines.append(f"Plot:  {plot}")
    lines.append("Runs:  " + ", ".join(f"{v} ({k_})" for k_, v in result.runs.items()))
    return "\n".join(lines)
