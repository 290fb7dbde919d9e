"""``torchrepro check --resume-at K``: prove (or disprove) that a script resumes bit for bit.

Run 1 trains straight through. Run 2 trains to step K, checkpoints and stops (``OUT/run2``); a fresh process
resumes from that checkpoint and trains on (``OUT/run2-resumed``). The two are compared step by step, run 2's
processes spliced at step K (:mod:`torchrepro.analysis.resumeat`), and a divergence gets a resume verdict: what
was not restored. The checkpoint of Lightning and transformers trainers is their own, triggered at step K with no
code change; scripts with their own loop read :func:`torchrepro.resume_point` (see
:mod:`torchrepro.record.resumeat`).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.errors import OutputDirError, ScriptError
from .._core.io import atomic_write_bytes
from ..record.launcher import CommandError, LaunchOptions, RunResult, parse_python_command
from ..record.outdir import lock_dir, make_dir
from ..record.resumeat import CHECKPOINT_ENV, FACTS_KEY
from ..record.store import GRAD_VALUE_STEPS, GRAD_VALUES_ENV, load_run
from ._checkrun import (
    EnvironmentDifferences,
    Isolation,
    _failure,
    _Progress,
    environment_differences,
    launch_run,
    output_dir,
    prepare_run,
    tail_lines,
)
from ._options import determinism_options

if TYPE_CHECKING:
    from ..analysis.resumeat import ResumeResult

SCHEMA = "torchrepro.check-resume/1"  # analysis.resumeat.SCHEMA (not imported: it imports torch)
PROTOCOL = ("A script with its own loop saves its checkpoint where torchrepro says once step K is done "
            "(`rp = torchrepro.resume_point()`, then `if rp.due(): save(rp.checkpoint)` after each optimizer step, "
            f"or the environment variables TORCHREPRO_RESUME_AT and {CHECKPOINT_ENV}) and loads `rp.resume_from` "
            "(TORCHREPRO_RESUME_FROM) when it is set; Lightning and transformers Trainer scripts need no change "
            "(see docs/resume-at.md)")


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
    process. A script that fails, never reaches step K+1 or never checkpoints is a ScriptError (exit 2)."""
    parse_python_command(command)
    straight, stopped, resumed = out / "run1", out / "run2", out / "run2-resumed"
    checkpoints = out / "run2-checkpoint"
    clear_checkpoints(checkpoints)
    make_dir(checkpoints, flag="--out")
    atomic_write_bytes(checkpoints / CHECKPOINTS_MARK, b"torchrepro check --resume-at: the checkpoint of run 2\n")
    checkpoint = str((checkpoints / f"checkpoint-{k}").resolve())

    def plan(phase: str, path: str = "") -> dict[str, Any]:
        return {"phase": phase, "step": k, "checkpoint": path}

    with _Progress(2) as progress:
        label = " (uninterrupted)"
        prepare_run(straight)
        opts = isolation.options(1, out, straight, dataclasses.replace(base, resume_at=plan("straight")))
        result = launch_run(command, straight, opts, progress, isolation, 1, label)
        shared = isolation.run_done(1, straight)
        if result.returncode != 0 or not _steps(result):
            raise _failure(1, 2, result, straight, shared, label)
        if _steps(result) <= k:
            raise _too_short(1, label, _steps(result), k, straight, result)

        label = f" (to step {k}, checkpoint, stop)"
        prepare_run(stopped)
        opts = isolation.options(2, out, stopped, dataclasses.replace(base, resume_at=plan("stop", checkpoint)))
        result = launch_run(command, stopped, opts, progress, isolation, 2, label)
        shared = isolation.run_done(2, stopped)
        if result.returncode != 0 or not _steps(result):
            raise _failure(2, 2, result, stopped, shared, label)
        facts = (result.manifest or {}).get(FACTS_KEY) or {}
        if _steps(result) < k:
            raise _too_short(2, label, _steps(result), k, stopped, result)
        if not facts.get("checkpoint_written") or not facts.get("checkpoint"):
            raise _no_checkpoint(k, facts, checkpoint, stopped)

        label = f" (resumed from step {k})"
        after = dataclasses.replace(base, max_steps=base.max_steps - k if base.max_steps else None,
                                    resume_at=plan("resume", str(facts["checkpoint"])))
        prepare_run(resumed)
        opts = isolation.options_again(resumed, after)
        result = launch_run(command, resumed, opts, progress, isolation, 2, label)
        shared = isolation.restart_done(2, resumed)
        if result.returncode != 0:
            raise _failure(2, 2, result, resumed, shared, label)
        if not _steps(result):
            raise _error(f"run 2{label} trained no step after the restart: it did not resume training (the script "
                         f"may think it is done, e.g. a step counter restored past the end). {PROTOCOL}.", resumed)
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


def _error(message: str, run_dir: Path) -> ScriptError:
    """The error, with the last lines of the run's stderr when it wrote any (the script ran fine: they may say why
    it stopped where it did)."""
    tail = tail_lines(run_dir / "stderr.txt")
    if tail not in ("(empty)", "(no output captured)"):
        message = f"{message}\nLast lines of its stderr ({run_dir / 'stderr.txt'}):\n{tail}"
    return ScriptError(message, stderr_path=run_dir / "stderr.txt")


def _too_short(i: int, label: str, steps: int, k: int, run_dir: Path, result: RunResult) -> ScriptError:
    unit = "optimizer steps" if (result.manifest or {}).get("step_mode", "optimizer") == "optimizer" else \
        "backward() calls"
    if steps < k:
        what = f"never reaches step {k}: it ended after {steps} {unit}"
    else:
        what = f"ends at step {k}: nothing is left to train after the checkpoint"
    return _error(f"run {i}{label} {what}. Give --resume-at a step the script trains past (below {steps}), or "
                  "let it train longer.", run_dir)


def _no_checkpoint(k: int, facts: dict[str, Any], checkpoint: str, run_dir: Path) -> ScriptError:
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
        what = (f"the script trained past step {k} without writing its checkpoint at {checkpoint} "
                f"(${CHECKPOINT_ENV}), so there is nothing to resume from. {PROTOCOL}")
    return _error(f"run 2 (to step {k}, checkpoint, stop) never checkpointed: {what}.", run_dir)


def run_resume_check(args: argparse.Namespace, command: list[str]) -> int:
    refuse_options(args)
    parse_python_command(command)
    Isolation.refuse_uncopyable(args.fresh_cwd, args.out)
    out = output_dir(args.out, "check")
    k = args.resume_at
    base = LaunchOptions(seed=args.seed, **determinism_options(args), max_steps=args.max_steps,
                         keep_values=True, values_budget=args.values_budget, value_schedule="sampled",
                         extra_env={GRAD_VALUES_ENV: str(GRAD_VALUE_STEPS)})
    with lock_dir(out):
        isolation = Isolation.for_check(args.fresh_cwd, out)
        runs = execute_resume_runs(command, out, k, base, isolation)
        from ..analysis.compare import compare_runs, note_shared_workdir
        from ..analysis.resumeat import diagnose, splice

        straight, stopped, resumed = (load_run(d) for d in (runs.straight, runs.stopped, runs.resumed))
        comparison = compare_runs([straight, splice(stopped, resumed, k, straight)])
        note_shared_workdir(comparison, isolation.to_json() or {})
        result = diagnose(straight, stopped, resumed, comparison, k, trainer=runs.facts.get("trainer") or "script",
                          checkpoint=runs.facts.get("checkpoint"),
                          runs={"uninterrupted": str(runs.straight), "stopped": str(runs.stopped),
                                "resumed": str(runs.resumed)})
        return finish_resume(result, out, what=f"`{' '.join(command)}`", as_json=args.json,
                             environment=environment_differences([straight, stopped, resumed], quiet_if_same=True))


def finish_resume(result: ResumeResult, out: Path, *, what: str, as_json: bool,
                  environment: EnvironmentDifferences | None = None) -> int:
    """Plot, write check.json (schema torchrepro.check-resume/1), print; exit 0 identical, 1 diverged, 2 unsaved."""
    from ..analysis.report import plot_check
    from ._html.reports import resume_report
    from ._output import Verdict, emit
    from ._render import render_resume

    doc = result.to_json() | {"plot": None, "command": what, "exit_code": None}
    if environment is not None:
        doc["environment_diff"] = environment.to_json(result.verdict)

    def text(summary: str, plot: str | None, report: Path | None) -> str:
        env_text = environment.render(result.verdict) if environment is not None else None
        return summary + (f"\nReport: {report}" if report else "") + ("\n\n" + env_text if env_text else "")

    return emit(Verdict(doc, 0 if result.verdict == "identical" else 1, "check.json",
                        plot=lambda path: plot_check(result.comparison, path),
                        summary=lambda plot: render_resume(result, what=what, plot=plot), text=text,
                        report=lambda d, summary: resume_report(result, d, out, command=what, text=summary)),
                out, as_json=as_json)
