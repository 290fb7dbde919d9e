"""``torchrepro check --resume-at K``: prove (or disprove) that a script resumes bit for bit.

Run 1 trains straight through. Run 2 trains to step K, checkpoints and stops (``OUT/run2``); a fresh process
resumes from that checkpoint and trains on (``OUT/run2-resumed``). The two are compared step by step, run 2's
processes spliced at step K (:mod:`torchrepro.analysis.resumeat`), and a divergence gets a resume verdict: what
was not restored. The checkpoint of Lightning and transformers trainers is their own, triggered at step K with no
code change; scripts with their own loop read :func:`torchrepro.resume_point` (see
:mod:`torchrepro.record.resumeat`).

Under torchrun (``--nproc-per-node P`` or ``-- torchrun ...``) each of the three processes is a torchrun launch
that records every rank into ``RUN/rank{R}``; every rank is told the same checkpoint path and is stopped after step
K; each rank's processes are joined and diagnosed apart, and the verdict is the first rank that did not resume
exactly (:class:`~torchrepro.analysis.resumeat.RanksResume`). Sharded training (FSDP2, DTensor) that checkpoints
with ``torch.distributed.checkpoint`` is checked the same way: the checkpoint is the folder every rank wrote its
shards into, and each rank is compared by its local shards.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.errors import OutputDirError, ScriptError, StateFileError
from .._core.io import atomic_write_bytes
from .._core.readjson import read_json
from .._core.table import printable
from ..record.launcher import CommandError, LaunchOptions, RunResult, parse_python_command
from ..record.options import RankOptions
from ..record.outdir import lock_dir, make_dir
from ..record.resumeat import CHECKPOINT_ENV, FACTS_KEY
from ..record.runfailure import tail_lines
from ..record.runs import Isolation, PlannedRun, RunLoop
from ..record.store import GRAD_VALUE_STEPS, GRAD_VALUES_ENV, load_ranks, load_run
from ._checkrun import EnvironmentDifferences, environment_differences, isolation_for, output_dir
from ._options import check_words, determinism_options, kept_values

if TYPE_CHECKING:
    from ..analysis.resumeat import RanksResume, ResumeResult
    from ..record.store import Run

SCHEMA = "torchrepro.check-resume/1"  # analysis.resumeat.SCHEMA (not imported: it imports torch)
PROTOCOL = ("A script with its own loop saves its checkpoint where torchrepro says once step K is done "
            "(`rp = torchrepro.resume_point()`, then `if rp.due(): save(rp.checkpoint)` after each optimizer step, "
            f"or the environment variables TORCHREPRO_RESUME_AT and {CHECKPOINT_ENV}) and loads `rp.resume_from` "
            "(TORCHREPRO_RESUME_FROM) when it is set; Lightning and transformers Trainer scripts need no change "
            "(see docs/resume-at.md)")
RANKS_PROTOCOL = ("Under torchrun every rank gets the same path: rank 0 saves one file there, or each rank saves its "
                  "own file into that folder (`os.makedirs(rp.checkpoint, exist_ok=True)`, then "
                  "`rp.checkpoint / f\"rank{rank}.pt\"`), and every rank loads what it needs from `rp.resume_from`; "
                  "sharded training (FSDP2, tensor parallel) checkpoints with torch.distributed.checkpoint on every "
                  "rank: `dcp.save(state, checkpoint_id=rp.checkpoint)` after step K and `dcp.load(state, "
                  "checkpoint_id=rp.resume_from)` (docs/distributed.md, \"Checkpoint and resume\")")
SNAPSHOT_PROTOCOL = ("A script that keeps its own snapshot (every rank loads it at start if it exists, one rank saves "
                     "it every N steps or epochs) resumes from it under check --resume-at only where torchrepro says: "
                     "`rp = torchrepro.resume_point()`; load `rp.resume_from` when it is set (instead of your "
                     "snapshot file); after each optimizer step, on every rank, `if rp.due():` save the snapshot to "
                     "`rp.checkpoint` (the step within the epoch and the data position with it, if step K is not the "
                     "end of an epoch). Add --fresh-cwd so that no run loads the snapshot an earlier run wrote into "
                     "the working directory")


def refuse_options(args: argparse.Namespace) -> None:
    """Options that do not go with --resume-at: exit 2 before anything runs."""
    k = args.resume_at
    if args.runs != 2:
        raise CommandError("--resume-at compares one uninterrupted run with one stopped and resumed run; drop "
                           f"--runs {args.runs}.")
    if args.locate:
        raise CommandError("--locate does not go with --resume-at; run `torchrepro check --locate -- ...` on its "
                           "own to trace a nondeterministic op.")
    if args.max_steps is not None and args.max_steps <= k:
        raise CommandError(f"--max-steps {args.max_steps} ends the runs at or before the checkpoint at step {k}: "
                           "nothing would be compared after the resume. Give --max-steps above --resume-at.")


@dataclasses.dataclass
class ResumeRuns:
    straight: Path
    stopped: Path
    resumed: Path
    facts: dict[str, Any]


def _steps(result: RunResult) -> int:
    steps = (result.manifest or {}).get("steps")
    return steps if isinstance(steps, int) else 0


def execute_resume_runs(command: list[str], out: Path, k: int, base: LaunchOptions,
                        isolation: Isolation) -> ResumeRuns:
    """Run 1 straight through; run 2 to step K and a checkpoint; run 2 again from that checkpoint, in a fresh
    process. A script that fails, never reaches step K+1 or never checkpoints is a ScriptError (exit 2).

    With ``base.ranks.nproc_per_node`` each is a torchrun launch of that many ranks (``RUN/rank{R}``); the steps counted
    are rank 0's, the checkpoint is written once its launch has ended (by any rank, as the script does)."""
    nproc = base.ranks.nproc_per_node
    parse_python_command(command)
    straight, stopped, resumed = out / "run1", out / "run2", out / "run2-resumed"
    checkpoints = out / "run2-checkpoint"
    clear_checkpoints(checkpoints)
    make_dir(checkpoints, flag="--out")
    atomic_write_bytes(checkpoints / CHECKPOINTS_MARK, b"torchrepro check --resume-at: the checkpoint of run 2\n")
    checkpoint = str((checkpoints / f"checkpoint-{k}").resolve())

    def plan(phase: str, path: str = "") -> dict[str, Any]:
        return {"phase": phase, "step": k, "checkpoint": path}

    with RunLoop(out, 2, isolation=isolation) as loop:
        run = PlannedRun(command, dataclasses.replace(base, resume_at=plan("straight")), "uninterrupted")
        result, _ = loop.run(1, run, straight)
        if _steps(result) <= k:
            raise _too_short(1, run.shown, _steps(result), k, straight, result)

        run = PlannedRun(command, dataclasses.replace(base, resume_at=plan("stop", checkpoint)),
                         f"to step {k}, checkpoint, stop")
        result, _ = loop.run(2, run, stopped)
        facts = _rank_facts(stopped, nproc) if nproc else (result.manifest or {}).get(FACTS_KEY) or {}
        if _steps(result) < k:
            raise _too_short(2, run.shown, _steps(result), k, stopped, result)
        if not facts.get("checkpoint_written") or not facts.get("checkpoint"):
            raise _no_checkpoint(k, facts, checkpoint, stopped, nproc)

        after = dataclasses.replace(base, max_steps=base.max_steps - k if base.max_steps else None,
                                    resume_at=plan("resume", str(facts["checkpoint"])))
        run = PlannedRun(command, after, f"resumed from step {k}")
        result, shared = loop.run(2, run, resumed, again=True, check=False)
        if result.returncode != 0:
            raise loop.failure(2, resumed, result, run.shown, shared)
        if not _steps(result):
            raise _error(f"run 2{run.shown} trained no step after the restart: it did not resume training (the "
                         f"script may think it is done, e.g. a step counter restored past the end). {PROTOCOL}.",
                         resumed)
    return ResumeRuns(straight, stopped, resumed, facts)


CHECKPOINTS_MARK = ".torchrepro-checkpoints"  # in OUT/run2-checkpoint: torchrepro made that folder


def clear_checkpoints(folder: Path) -> None:
    """Remove an earlier check's ``OUT/run2-checkpoint``, only when torchrepro made it (its mark is inside): a
    folder of that name that torchrepro did not make may hold someone's checkpoint, and is never deleted."""
    if not folder.exists() and not folder.is_symlink():
        return
    if folder.is_dir() and not folder.is_symlink() and (folder / CHECKPOINTS_MARK).is_file():
        shutil.rmtree(folder)
        return
    raise OutputDirError(f"--out {folder.parent}: {folder} exists but torchrepro did not make it (it has no "
                         f"{CHECKPOINTS_MARK}); check --resume-at writes its checkpoint there and would replace it. "
                         "Move it elsewhere if it is yours (or delete it if you no longer need it), or pass another "
                         "--out.")


def _rank_facts(run_dir: Path, nproc: int) -> dict[str, Any]:
    """What the ranks of a torchrun launch say about the stop phase, as one process's facts: the checkpoint asked
    for (written once the launch has ended: rank 0 may write it after rank 1 ended), a trainer if any rank ran one,
    and the files each rank gave torch.save (``rank`` added)."""
    ranks: list[dict[str, Any]] = []
    for r in range(nproc):
        try:
            manifest = read_json(run_dir / f"rank{r}" / "manifest.json")
        except StateFileError:
            manifest = {}
        facts = manifest.get(FACTS_KEY) if isinstance(manifest, dict) else None
        ranks.append(facts if isinstance(facts, dict) else {})
    facts = dict(ranks[0])
    facts["trainer"] = next((f["trainer"] for f in ranks if f.get("trainer") not in (None, "script")),
                            facts.get("trainer") or "script")
    facts["checkpoint"] = next((f["checkpoint"] for f in ranks if f.get("checkpoint_written")),
                               facts.get("checkpoint"))
    path = facts["checkpoint"]
    facts["checkpoint_written"] = isinstance(path, str) and os.path.exists(path)
    facts["script_saves"] = [s | {"rank": r} for r, f in enumerate(ranks) for s in f.get("script_saves") or []
                             if isinstance(s, dict)]
    return facts


def _stderr(run_dir: Path) -> Path:
    """The script's stderr: the run's, or rank 0's of a torchrun launch (each rank writes its own)."""
    rank0 = run_dir / "rank0" / "stderr.txt"
    return rank0 if rank0.is_file() else run_dir / "stderr.txt"


def _error(message: str, run_dir: Path) -> ScriptError:
    """The error, with the last lines of the run's stderr when it wrote any (the script ran fine: they may say why
    it stopped where it did)."""
    stderr = _stderr(run_dir)
    tail = tail_lines(stderr)
    if tail not in ("(empty)", "(no output captured)"):
        message = f"{message}\nLast lines of its stderr ({stderr}):\n{tail}"
    return ScriptError(message, stderr_path=stderr)


def _too_short(i: int, label: str, steps: int, k: int, run_dir: Path, result: RunResult) -> ScriptError:
    unit = "optimizer steps" if (result.manifest or {}).get("step_mode", "optimizer") == "optimizer" else \
        "backward() calls"
    if steps < k:
        what = f"never reaches step {k}: it ended after {steps} {unit}"
    else:
        what = f"ends at step {k}: nothing is left to train after the checkpoint"
    return _error(f"run {i}{label} {what}. Give --resume-at a step the script trains past (below {steps}), or "
                  "let it train longer.", run_dir)


def _no_checkpoint(k: int, facts: dict[str, Any], checkpoint: str, run_dir: Path,
                   nproc: int | None = None) -> ScriptError:
    trainer = facts.get("trainer") or "script"
    if trainer == "transformers":
        what = (f"the transformers Trainer was asked to save at step {k} but no checkpoint folder was found "
                f"({facts.get('checkpoint') or 'output_dir/checkpoint-' + str(k)}). Make sure the Trainer can write "
                "its checkpoints (args.output_dir, its strategy), then check again")
    elif trainer == "lightning":
        what = (f"Lightning's trainer.save_checkpoint was not called or wrote nothing at "
                f"{facts.get('checkpoint') or checkpoint} (the trainer stopped before the end of the batch of step "
                f"{k}, or its strategy cannot save to one file). Check that Trainer.fit reaches step {k + 1}")
    else:
        ranks = " (no rank wrote it)" if nproc else ""
        what = (f"the script trained past step {k} without writing its checkpoint at {checkpoint} "
                f"(${CHECKPOINT_ENV}){ranks}, so there is nothing to resume from. ")
        saves = [s for s in facts.get("script_saves") or [] if isinstance(s, dict) and s.get("path")]
        if saves:
            shown = ", ".join(f"{printable(str(s['path']))} ("
                              + (f"rank {s['rank']}, " if "rank" in s else "") + f"after step {s.get('step')})"
                              for s in saves[:3])
            what += (f"It saved {shown}{' and more' if len(saves) > 3 else ''} with torch.save itself: torchrepro "
                     f"cannot tell a checkpoint of the script's own from another file it writes. {SNAPSHOT_PROTOCOL}")
        else:
            what += PROTOCOL
        if nproc:
            what += f". {RANKS_PROTOCOL}"
    return _error(f"run 2 (to step {k}, checkpoint, stop) never checkpointed: {what}.", run_dir)


def run_resume_check(args: argparse.Namespace, command: list[str], nproc: int | None = None) -> int:
    """``check --resume-at K``; ``nproc``: of a command on that many ranks (``--nproc-per-node`` or torchrun)."""
    refuse_options(args)
    parse_python_command(command)
    Isolation.refuse_uncopyable(args.fresh_cwd, args.out)
    out = output_dir(args.out, "check")
    k = args.resume_at
    base = LaunchOptions(seed=args.seed, **determinism_options(args), max_steps=args.max_steps,
                         values=kept_values(args), extra_env={GRAD_VALUES_ENV: str(GRAD_VALUE_STEPS)},
                         ranks=RankOptions(nproc_per_node=nproc, output=bool(nproc)))
    with lock_dir(out):
        isolation = isolation_for(args.fresh_cwd, out)
        runs = execute_resume_runs(command, out, k, base, isolation)
        rerun = (check_words(args), list(args.user_command))  # the fix's commands: this check's own
        if nproc:
            return _check_ranks(runs, out, k, nproc, isolation, what=f"`{' '.join(args.user_command)}`",
                                as_json=args.json, rerun=rerun)
        straight, stopped, resumed = (load_run(d) for d in (runs.straight, runs.stopped, runs.resumed))
        result = _diagnose(straight, stopped, resumed, k, runs.facts, isolation,
                           {"uninterrupted": runs.straight, "stopped": runs.stopped, "resumed": runs.resumed})
        result.rerun = rerun
        return finish_resume(result, out, what=f"`{' '.join(command)}`", as_json=args.json,
                             environment=environment_differences([straight, stopped, resumed], quiet_if_same=True))


def _diagnose(straight: Run, stopped: Run, resumed: Run, k: int, facts: dict[str, Any], isolation: Isolation,
              dirs: dict[str, Path]) -> ResumeResult:
    """Run 1 against run 2's two processes joined at step K (one process, or one rank of each launch)."""
    from ..analysis.compare import compare_runs, note_shared_workdir
    from ..analysis.resumeat import diagnose, splice

    comparison = compare_runs([straight, splice(stopped, resumed, k, straight)])
    note_shared_workdir(comparison, dict(isolation.to_json() or {}))
    return diagnose(straight, stopped, resumed, comparison, k, trainer=facts.get("trainer") or "script",
                    checkpoint=facts.get("checkpoint"), runs={name: str(d) for name, d in dirs.items()})


_PER_RANK_STATE = ("rng-state", "data-position", "data-values", "data")  # states each rank holds its own of
DCP_METADATA = ".metadata"  # in a folder that torch.distributed.checkpoint wrote (dcp.save)


def _check_ranks(runs: ResumeRuns, out: Path, k: int, nproc: int, isolation: Isolation, *, what: str,
                 as_json: bool, rerun: tuple[list[str], list[str]] | None = None) -> int:
    """Each rank's resume diagnosed apart (its run 1, its two processes of run 2); the verdict: the first rank that
    did not resume exactly."""
    from ..analysis.resumeat import RanksResume

    dirs = (runs.straight, runs.stopped, runs.resumed)
    loaded = [load_ranks(d)[1] for d in dirs]
    counts = {len(r) for r in loaded}
    if counts != {nproc}:
        raise ScriptError(f"the runs recorded {sorted(counts)} ranks, expected {nproc}: the runs cannot be compared "
                          f"rank by rank. Runs: {', '.join(map(str, dirs))}.")
    per_rank = [_diagnose(loaded[0][r], loaded[1][r], loaded[2][r], k, runs.facts, isolation,
                          {"uninterrupted": runs.straight / f"rank{r}", "stopped": runs.stopped / f"rank{r}",
                           "resumed": runs.resumed / f"rank{r}"}) for r in range(nproc)]
    for result in per_rank:
        result.rerun = rerun
    check = RanksResume(nproc, per_rank)
    rank, lead = check.lead
    if rank != 0 and lead.cause in _PER_RANK_STATE and lead.checkpoint and Path(lead.checkpoint).is_file():
        lead.notes.append(f"The checkpoint is one file for {nproc} ranks ({lead.checkpoint}): if every rank loads it, "
                          "rank 0's RNG states and data position are restored on every rank. Each rank's are its "
                          "own: let each rank save its own file into the folder rp.checkpoint (rank{R}.pt) and load "
                          "its own.")
    elif lead.cause in _PER_RANK_STATE and lead.checkpoint and (Path(lead.checkpoint) / DCP_METADATA).is_file():
        lead.notes.append(f"The checkpoint was written with torch.distributed.checkpoint ({lead.checkpoint}): DCP "
                          "keeps one copy of a key that every rank saves (it takes such an entry for a replica), and "
                          "every rank loads that copy. A rank's RNG states and data position are its own: save them "
                          "under a key of its own (`{f\"rank{rank}\": {\"rng\": torch.get_rng_state(), ...}}` in the "
                          "state given to dcp.save and dcp.load) and restore that one.")
    env = environment_differences([ranks[0] for ranks in loaded], quiet_if_same=True)
    return finish_resume(check.lead[1], out, what=what, as_json=as_json, environment=env, ranks=check)


def finish_resume(result: ResumeResult, out: Path, *, what: str, as_json: bool,
                  environment: EnvironmentDifferences | None = None, ranks: RanksResume | None = None) -> int:
    """Plot, write check.json (schema torchrepro.check-resume/1), print; exit 0 identical, 1 diverged, 2 unsaved.
    ``ranks``: a check of several ranks, ``result`` its lead rank's (plotted, and detailed in the report)."""
    from ..analysis.report import plot_check
    from ._html.reports import resume_report
    from ._output import Verdict, emit
    from ._render import render_resume

    doc = (ranks.to_json() if ranks is not None else result.to_json()) | {"plot": None, "command": what,
                                                                          "exit_code": None}
    if environment is not None:
        doc["environment_diff"] = environment.to_json(result.verdict)

    def text(summary: str, plot: str | None, report: Path | None) -> str:
        env_text = environment.render(result.verdict) if environment is not None else None
        return summary + (f"\nReport: {report}" if report else "") + ("\n\n" + env_text if env_text else "")

    return emit(Verdict(doc, 0 if result.verdict == "identical" else 1, "check.json",
                        plot=lambda path: plot_check(result.comparison, path),
                        summary=lambda plot: (render_resume_ranks(ranks, what=what, plot=plot) if ranks is not None
                                              else render_resume(result, what=what, plot=plot)), text=text,
                        report=lambda d, summary: resume_report(result, d, out, command=what, text=summary)),
                out, as_json=as_json)


def render_resume_ranks(check: RanksResume, *, what: str, plot: str | None = None) -> str:
    """The resume verdict of several ranks: the lead rank named in the headline, one line per rank, then the lead
    rank's resume in detail (as for one process)."""
    from ._render import render_resume

    rank, lead = check.lead
    lines = render_resume(lead, what=f"{what} on {check.nproc} ranks", plot=plot).split("\n")
    if lead.verdict == "identical":
        lines[0] = lines[0].replace("; every recorded loss", "; on every rank every recorded loss", 1)
    else:
        lines[0] = lines[0].replace(f"RESUME DIVERGED at step {lead.step} - ",
                                    f"RESUME DIVERGED at step {lead.step} on rank {rank} - ", 1)
    ranks = [f"Rank by rank (run 1 against run 2, its two processes joined at step {check.per_rank[0].k}):"]
    for r, result in enumerate(check.per_rank):
        if result.verdict == "identical":
            ranks.append(f"  rank {r}: identical ({result.steps['uninterrupted']} steps)")
        elif r in check.follows:
            ranks.append(f"  rank {r}: DIVERGED at step {result.step}; everything recorded was restored, but its "
                         f"gradients are averaged with rank {check.follows[r]}'s")
        else:
            ranks.append(f"  rank {r}: DIVERGED at step {result.step}; not restored: {result.what}")
    return "\n".join([lines[0], "", *ranks, "", f"Rank {rank} in detail:", *lines[2:]])
