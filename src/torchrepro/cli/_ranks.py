"""``torchrepro check --nproc-per-node P`` (or ``check -- torchrun ...``): runs of several ranks, checked rank by rank
and for desynchronisation between ranks. See docs/distributed.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._io import atomic_write_json
from ..compare import note_shared_workdir
from ..errors import ScriptError
from ..launcher import CommandError, LaunchOptions, RunResult, parse_python_command
from ..outdir import lock_dir
from ..rankcompare import DESYNC_CAUSE, RanksCheck, compare_rank_runs
from ..report import plot_check
from ..store import load_ranks
from ._render import render
from .check_cmd import (
    EnvironmentDifferences,
    Isolation,
    WriteErrors,
    environment_differences,
    execute_runs,
    output_dir,
    print_verdict,
    saved,
    tail_lines,
)

_FIX_SCRIPT = ("Fix the script so that it runs under torchrun on its own (`torchrun --nproc-per-node N train.py`), "
               "then check again.")
_FIX_EARLY = ("A rank that ends before the others leaves them waiting in collectives: make every rank run the same "
              "number of steps (the same loop bounds and number of batches on every rank), then check again.")
_FIX_NO_STEPS = ("torchrepro check compares training steps: make sure the script calls loss.backward() "
                 "(and optimizer.step()).")


def rank_failure(i: int, total: int, result: RunResult, run_dir: Path) -> ScriptError:
    """The error for a failed run of several ranks: the rank that ended early or failed first, how, what the
    others did, and the last lines of the stderr of the rank that failed first."""
    m = result.manifest or {}
    statuses = m.get("rank_status") if isinstance(m.get("rank_status"), dict) else {}
    failed = m.get("failed_rank")
    early = [r for r in m.get("ended_early") or [] if f"rank{r}" in statuses]
    hint = _FIX_SCRIPT if result.returncode != 0 else _FIX_NO_STEPS
    if early:
        what, named, hint = _early_what(early, statuses), early, _FIX_EARLY
    elif failed is None:
        named = []
        what = ("finished but recorded no optimizer step and no backward() call on rank 0" if result.returncode == 0
                else f"failed (torchrun exited with status {result.returncode} before any rank failed: see its "
                     "own output)")
    else:
        code = (statuses.get(f"rank{failed}") or {}).get("exit_code")
        how = f"was killed by signal {-code}" if isinstance(code, int) and code < 0 else f"exited with code {code}"
        what, named = f"failed: rank {failed} {how} first", [failed]
    path = run_dir / f"rank{failed}" if failed is not None else (run_dir / "rank0" if result.returncode == 0
                                                                 else run_dir)
    others = [_other(name, info, run_dir) for name, info in statuses.items() if int(name[4:]) not in named]
    stderr, whose = path / "stderr.txt", f"rank {failed}'s" if early else "its"
    error = ScriptError(f"run {i} of {total} {what}" + (f"; then {', '.join(others)}" if others else "")
                        + f". The runs cannot be compared. {hint}\nLast lines of {whose} stderr ({stderr}):\n"
                        f"{tail_lines(stderr)}")
    error.stderr_path = str(stderr)  # type: ignore[attr-defined]
    return error


def _early_what(early: list[int], statuses: dict[str, dict[str, object]]) -> str:
    """``failed: rank 1 ended early (exit code 0 after 1 step) while rank 0 was still running``."""
    ended = ", ".join(f"rank {r} ended early (exit code 0 after {_steps(statuses[f'rank{r}'])})" for r in early)
    running = [f"rank {name[4:]}" for name in statuses if int(name[4:]) not in early]
    return f"failed: {ended} while {' and '.join(running)} {'was' if len(running) == 1 else 'were'} still running"


def _steps(info: dict[str, object]) -> str:
    steps = info.get("steps")
    return f"{steps} step" + ("" if steps == 1 else "s")


def _other(name: str, info: dict[str, object], run_dir: Path) -> str:
    """``rank 0 failed (1) after 1 step: <last line of its stderr>``: what another rank did."""
    code = f" ({info['exit_code']})" if info.get("exit_code") else ""
    return (f"rank {name[4:]} {info.get('status')}{code} after {_steps(info)}"
            + _last_line(run_dir / name / "stderr.txt", info.get("status")))


def _last_line(path: Path, status: object) -> str:
    """``: <last line of a failed rank's stderr>`` (what the other ranks saw), or nothing."""
    if status not in ("failed", "killed"):
        return ""
    last = tail_lines(path, 1).strip()
    return f": {last[:240]}" if last and not last.startswith("(") else ""


def run_ranks_check(args: argparse.Namespace, command: list[str], nproc: int) -> int:
    """``check`` of a command on ``nproc`` ranks: N torchrun launches, each rank recorded apart, then compared."""
    parse_python_command(command)  # a bad command is refused before any directory is made
    if args.locate:
        raise CommandError("--locate does not trace runs of several ranks yet. Record two runs with `torchrepro run "
                           "--record DIR --nproc-per-node N --trace-steps K -- ...` and compare one rank's "
                           "directories with `torchrepro diff --locate DIR_A/rank0 DIR_B/rank0`.")
    out = output_dir(args.out, "check")
    opts = LaunchOptions(seed=args.seed, deterministic=args.deterministic, max_steps=args.max_steps,
                         keep_values=True, values_budget=args.values_budget, value_schedule="sampled",
                         nproc_per_node=nproc, rank_output=True)
    what = f"`{' '.join(args.user_command)}`"
    with lock_dir(out):
        isolation = Isolation.for_check(args.fresh_cwd, out)
        dirs = execute_runs(command, out, args.runs, opts, isolation)
        runs = [load_ranks(d)[1] for d in dirs]
        counts = {len(r) for r in runs}
        if counts != {nproc}:
            raise ScriptError(f"the runs recorded {sorted(counts)} ranks, expected {nproc}: the runs cannot be "
                              f"compared rank by rank. Runs: {', '.join(map(str, dirs))}.")
        check = compare_rank_runs(runs)
        for result in check.per_rank:  # every rank read what it read in the shared working directory
            note_shared_workdir(result, dict(isolation.to_json() or {}))
        env = environment_differences([r[0] for r in runs], quiet_if_same=True)
        return finish_ranks(check, out, what=what, as_json=args.json, environment=env)


def finish_ranks(check: RanksCheck, out: Path, *, what: str, as_json: bool,
                 environment: EnvironmentDifferences | None = None) -> int:
    """Plot (the lead rank), write check.json, print the summary or JSON; return the exit code."""
    rank, lead = check.lead
    errors: WriteErrors = []
    plot = saved(out / "check.png", lambda: plot_check(lead, out / "check.png"), errors)
    doc = check.to_json() | {"plot": str(plot) if plot else None, "command": what, "exit_code": check.exit_code}
    if environment is not None:
        doc["environment_diff"] = environment.to_json(lead.verdict)
    saved(out / "check.json", lambda: atomic_write_json(out / "check.json", doc), errors)
    env_text = environment.render(lead.verdict) if environment is not None and not as_json else None
    text = "" if as_json else "\n\n".join(
        t for t in (render_ranks(check, what=what, plot=str(plot) if plot else None), env_text) if t)
    return print_verdict(doc, text, as_json, errors)


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
    elif check.verdict == "diverged":
        rank, lead = check.lead
        lines.append(f"torchrepro: DIVERGED at step {lead.first_step} on rank {rank} ({where})")
    else:
        assert first_desync is not None
        lines.append(f"torchrepro: DESYNCHRONISED - {where}: every rank repeats itself across runs, but the ranks' "
                     f"replicas part at step {first_desync.step}.")
    warning = (check.lead[1].working_directory or {}).get("warning")
    if warning:
        lines.append(f"Warning: {warning}")
    lines.append("")
    lines.append("Across runs, rank by rank:")
    for r, result in enumerate(check.per_rank):
        if result.verdict == "identical":
            lines.append(f"  rank {r}: identical ({result.steps[0]} steps)")
        else:
            first = "; ".join(f"{d.label} {', '.join(d.names[:2])}" for d in result.first[:2])
            lines.append(f"  rank {r}: DIVERGED at step {result.first_step} ({first}); cause: {result.cause}")
    lines.append("Between the ranks of each run (replicas: initial parameters, gradients, parameters, optimizer "
                 "state):")
    for i, d in enumerate(check.desync, start=1):
        lines.append(f"  {d.describe()}" if d is not None else f"  run {i}: in sync at every step")
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
