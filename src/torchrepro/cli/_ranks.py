"""``torchrepro check --nproc-per-node P`` (or ``check -- torchrun ...``): runs of several ranks, checked rank by rank
and for desynchronisation between ranks. See docs/distributed.md."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._core.errors import ScriptError
from .._core.table import printable
from ..analysis.compare import note_shared_workdir
from ..analysis.rankcompare import DESYNC_CAUSE, RanksCheck, compare_rank_runs
from ..analysis.report import plot_check
from ..record.launcher import LaunchOptions, parse_python_command
from ..record.options import RankOptions
from ..record.outdir import lock_dir
from ..record.store import GRAD_VALUE_STEPS, GRAD_VALUES_ENV, load_ranks
from ._checkrun import (
    EnvironmentDifferences,
    Isolation,
    WriteErrors,
    environment_differences,
    execute_runs,
    isolation_for,
    output_dir,
)
from ._options import check_words, determinism_options, kept_values
from ._render import NOT_TRACED, render, render_locate, sure_line


def run_ranks_check(args: argparse.Namespace, command: list[str], nproc: int) -> int:
    """``check`` of a command on ``nproc`` ranks: N torchrun launches, each rank recorded apart, then compared."""
    parse_python_command(command)  # a bad command is refused before any directory is made
    Isolation.refuse_uncopyable(args.fresh_cwd, args.out)
    out = output_dir(args.out, "check")
    opts = LaunchOptions(seed=args.seed, **determinism_options(args), max_steps=args.max_steps,
                         values=kept_values(args), ranks=RankOptions(nproc_per_node=nproc, output=True),
                         extra_env={GRAD_VALUES_ENV: str(GRAD_VALUE_STEPS)})  # gradient |Δ| of the first steps
    what = f"`{' '.join(args.user_command)}`"
    with lock_dir(out):
        isolation = isolation_for(args.fresh_cwd, out)
        dirs = execute_runs(command, out, args.runs, opts, isolation)
        runs = [load_ranks(d)[1] for d in dirs]
        counts = {len(r) for r in runs}
        if counts != {nproc}:
            raise ScriptError(f"the runs recorded {sorted(counts)} ranks, expected {nproc}: the runs cannot be "
                              f"compared rank by rank. Runs: {', '.join(map(str, dirs))}.")
        check = compare_rank_runs(runs)
        for result in check.per_rank:  # every rank read what it read in the shared working directory
            note_shared_workdir(result, dict(isolation.to_json() or {}))
            result.set_rerun(check_words(args), args.user_command)  # Next's commands: this check's own
        env = environment_differences([r[0] for r in runs], quiet_if_same=True)
        errors: WriteErrors = []
        located = _locate(args, command, out, check, opts, errors, isolation) if args.locate else None
        return finish_ranks(check, out, what=what, as_json=args.json, environment=env, located=located,
                            errors=errors)


def _locate(args: argparse.Namespace, command: list[str], out: Path, check: RanksCheck, opts: LaunchOptions,
            errors: WriteErrors, isolation: Isolation) -> dict[str, Any]:
    """``--locate`` under torchrun: two more launches trace the first divergent step on every rank, and the op
    streams of the rank that diverged first (the lead rank) are compared; the others follow it through the
    collectives (a collective is named as such on them)."""
    from ._locate import LOCATED_NEXT, locate_keeping_verdict

    if check.verdict == "desynchronised":  # desynchronised: every rank repeats itself; nothing differs between runs
        return {"verdict": "skipped", "title": "not traced: every rank repeats itself across runs, so the op "
                "streams of two runs would agree; the ranks' replicas part (above), which --locate does not trace"}
    rank, lead = check.lead
    located = locate_keeping_verdict(args, command, out, lead, opts, errors, isolation, rank=rank)
    located["rank"] = rank
    if located.get("verdict") not in NOT_TRACED:
        lead.next_action = LOCATED_NEXT
    return located


def finish_ranks(check: RanksCheck, out: Path, *, what: str, as_json: bool,
                 environment: EnvironmentDifferences | None = None, located: dict[str, Any] | None = None,
                 errors: WriteErrors | None = None) -> int:
    """Plot (the lead rank), write report.html and check.json, print the summary or JSON; return the exit code."""
    from ._html.reports import ranks_report
    from ._output import Verdict, emit

    rank, lead = check.lead
    doc = check.to_json() | {"plot": None, "command": what, "exit_code": None}
    if environment is not None:
        doc["environment_diff"] = environment.to_json(lead.verdict)
    if located is not None:
        doc["locate"] = located

    def text(summary: str, plot: str | None, report: Path | None) -> str:
        env_text = environment.render(lead.verdict) if environment is not None else None
        where = render_locate(located).replace("\nLocate: ", f"\nLocate (rank {rank}): ", 1) if located else None
        return "\n\n".join(t for t in (summary + (f"\nReport: {report}" if report else ""), env_text,
                                       where.strip() if where else None) if t)

    return emit(Verdict(doc, check.exit_code, "check.json", plot=lambda path: plot_check(lead, path),
                        summary=lambda plot: render_ranks(check, what=what, plot=plot), text=text,
                        report=lambda d, summary: ranks_report(check, d, out, command=what, text=summary)),
                out, as_json=as_json, errors=errors)


def render_ranks(check: RanksCheck, *, what: str, plot: str | None = None) -> str:
    runs = len(check.per_rank[0].runs)
    steps = check.per_rank[0].steps
    where = f"{runs} runs of {what} on {check.nproc} ranks"
    first_desync = next((d for d in check.desync if d is not None), None)
    lines: list[str] = []
    if check.verdict == "identical":
        lines.append(f"torchrepro: IDENTICAL - {where}, {steps[0]} steps each; on every rank every recorded loss, "
                     "batch, parameter, gradient and optimizer-state tensor is bitwise equal across runs, and the "
                     "ranks' replicas agree at every step.")
        lines.append(sure_line(runs))
    elif check.verdict == "diverged":
        rank, lead = check.lead
        mesh = check.mesh_text(rank)
        lines.append(f"torchrepro: DIVERGED at step {lead.first_step} on rank {rank}"
                     + (f" ({mesh})" if mesh else "") + f" ({where})")
    else:
        assert first_desync is not None
        lines.append(f"torchrepro: DESYNCHRONISED - {where}: every rank repeats itself across runs, but the ranks' "
                     f"replicas part at step {first_desync.step}.")
    problems = [p for found, _ in check.placement for p in found]
    if problems:
        kinds = list(dict.fromkeys(p.label for p in problems))
        in_runs = sorted({p.run for p in problems})
        lines.append(f"Warning: {' and '.join(kinds)} in run{'s' if len(in_runs) > 1 else ''} "
                     f"{', '.join(map(str, in_runs))} (below): the ranks compute something else than their placements "
                     "say, whether or not the runs repeat each other.")
    warning = (check.lead[1].working_directory or {}).get("warning")
    if warning:
        lines.append(f"Warning: {warning}")
    lines.append("")
    lines.append("Across runs, rank by rank:")
    for r, result in enumerate(check.per_rank):
        if result.verdict == "identical":
            counts = check.counts_text(r)
            lines.append(f"  rank {r}: identical ({result.steps[0]} steps" + (f"; {counts})" if counts else ")"))
        else:
            first = "; ".join(f"{d.label} {', '.join(printable(n) for n in d.names[:2])}" for d in result.first[:2])
            lines.append(f"  rank {r}: DIVERGED at step {result.first_step} ({first}); cause: {result.cause}")
    lines.append("Between the ranks of each run (replicas: initial parameters, gradients, parameters, optimizer "
                 "state):")
    for i, d in enumerate(check.desync, start=1):
        lines.append(f"  {d.describe()}" if d is not None else f"  run {i}: in sync at every step")
    lines += _placement_lines(check)
    if first_desync is not None:
        lines.append("")
        lines.append(f"Cause: desynchronised - {DESYNC_CAUSE[0]}")
        lines.append(f"Next:  {DESYNC_CAUSE[1]}")
    if check.verdict == "diverged":
        rank, lead = check.lead
        lines.append("")
        lines.append(f"Rank {rank} in detail:")
        lines.append(render(lead, what=f"{what} (rank {rank})"))
    if plot:
        lines.append(f"Plot:  {plot} (rank {check.lead[0]})")
    return "\n".join(lines)


def _placement_lines(check: RanksCheck) -> list[str]:
    """The shards and random draws of each run against their placements (analysis.shardcheck), and the cause and
    what to do for each kind found."""
    from ..analysis.shardcheck import CAUSES, KINDS

    if not check.placement:
        return []
    lines = ["Between the shards of each run (sharded parameters; random draws of the first steps):"]
    for i, (problems, compared) in enumerate(check.placement, start=1):
        lines += [f"  {p.describe()}" for p in problems]
        if not problems:
            lines.append(f"  run {i}: no broken shard; {compared} random draws compared, none correlated across "
                         "shards or parted between replicas")
    for kind in dict.fromkeys(p.kind for found, _ in check.placement for p in found):
        lines.append("")
        lines.append(f"Cause: {KINDS[kind]} - {CAUSES[kind][0]}")
        lines.append(f"Next:  {CAUSES[kind][1]}")
    return lines
