"""What to tell when a launched run fails: which run (or rank), how it ended, what to do, and the last lines of
its stderr. One wording for every command that runs a script (check, compare, bench, variance, check --resume-at).

>>> from torchrepro.record.launcher import RunResult
>>> err = run_failure(2, 3, RunResult(1, "failed", None, {}), Path("/nonexistent/run2"))
>>> str(err).splitlines()[0][:64]
'run 2 of 3 failed with exit code 1; the runs cannot be compared.'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._core.errors import ScriptError
from .launcher import RunResult

STDERR_TAIL_LINES = 25

BUNDLED_HINT = ("That is torchrepro's bundled script (`{script}`), not yours: if its stderr below names a resource "
                "(memory, a device), change the arguments after `--`; otherwise it is a bug in torchrepro: please "
                "report it with these lines.")


@dataclass(frozen=True)
class FailureWords:
    """How a command words a failed run: ``check`` (the default) or a series (``FailureWords.series("bench")``).

    ``consequence`` follows what happened (``; the runs cannot be compared``), ``again`` ends the fix
    (``then check again``), ``no_steps`` is the hint for a run that recorded no step, ``killed`` the one for a
    run killed by a signal (None: as for a failed run), ``bundled`` names the script when it is torchrepro's own
    (a failure then never asks the user to fix it)."""

    consequence: str = "; the runs cannot be compared"
    again: str = "check again"
    no_steps: str = ("torchrepro check compares training steps: make sure the script calls loss.backward() "
                     "(and optimizer.step()).")
    killed: str | None = None
    bundled: str | None = None

    @classmethod
    def series(cls, command: str, bundled: str | None = None) -> FailureWords:
        """The wording of ``bench``/``variance``: no comparison to void, and a killed run is not the script's fault."""
        return cls("", "run again", f"torchrepro {command} needs training steps: make sure the script calls "
                   "loss.backward() (and optimizer.step()).",
                   "Find out what stopped it (memory? a time limit?), then run again.", bundled)


CHECK = FailureWords()


def tail_lines(path: Path, n: int = STDERR_TAIL_LINES) -> str:
    """The last ``n`` lines of a captured output, ``(empty)`` or ``(no output captured)``."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no output captured)"
    return "\n".join(lines[-n:]) if lines else "(empty)"


def failed(result: RunResult) -> bool:
    """Whether a run failed for every command: a non-zero exit, or no step recorded."""
    return result.returncode != 0 or not (result.manifest or {}).get("steps")


def run_failure(i: int, total: int, result: RunResult, run_dir: Path, shared: str | None = None, label: str = "",
                words: FailureWords = CHECK) -> ScriptError:
    """The ScriptError (exit 2) for run ``i`` of ``total`` that failed or recorded no step. ``shared``: the
    warning that it read what an earlier run wrote in the shared working directory; ``label``: `` (uninterrupted)``."""
    m = result.manifest or {}
    if m.get("ranks"):  # a torchrun launch: name the rank that failed first
        error = rank_failure(i, total, result, run_dir, label)
        return error if shared is None else ScriptError(f"{error}\n{shared}", stderr_path=error.stderr_path)
    if result.status == "killed":
        what = f"was killed by {m.get('signal') or f'signal {-result.returncode}'}"
        hint = words.killed or ""
    elif result.returncode != 0:
        what = f"failed with exit code {result.returncode}"
        hint = ""
    else:
        what, hint = "finished but recorded no optimizer step and no backward() call", words.no_steps
    if not hint:
        hint = (BUNDLED_HINT.format(script=words.bundled) if words.bundled is not None else
                f"Fix the script so that it runs on its own (`python ...`), then {words.again}.")
    if shared is not None:
        hint = f"{shared}\n{hint}"
    stderr = run_dir / "stderr.txt"
    return ScriptError(f"run {i} of {total}{label} {what}{words.consequence}. {hint}\n"
                       f"Last lines of its stderr ({stderr}):\n{tail_lines(stderr)}", stderr_path=stderr)


_FIX_SCRIPT = ("Fix the script so that it runs under torchrun on its own (`torchrun --nproc-per-node N train.py`), "
               "then check again.")
_FIX_EARLY = ("A rank that ends before the others leaves them waiting in collectives: make every rank run the same "
              "number of steps (the same loop bounds and number of batches on every rank), then check again.")


def rank_failure(i: int, total: int, result: RunResult, run_dir: Path, label: str = "") -> ScriptError:
    """The error for a failed run of several ranks: the rank that ended early or failed first, how, what the
    others did, and the last lines of the stderr of the rank that failed first."""
    m = result.manifest or {}
    statuses: dict[str, Any] = m.get("rank_status") if isinstance(m.get("rank_status"), dict) else {}  # type: ignore[assignment]
    failed_rank = m.get("failed_rank")
    early = [r for r in m.get("ended_early") or [] if f"rank{r}" in statuses]
    hint = _FIX_SCRIPT if result.returncode != 0 else CHECK.no_steps
    if early:
        what, named, hint = _early_what(early, statuses), early, _FIX_EARLY
    elif failed_rank is None:
        named = []
        what = ("finished but recorded no optimizer step and no backward() call on rank 0" if result.returncode == 0
                else f"failed (torchrun exited with status {result.returncode} before any rank failed: see its "
                     "own output)")
    else:
        code = (statuses.get(f"rank{failed_rank}") or {}).get("exit_code")
        how = f"was killed by signal {-code}" if isinstance(code, int) and code < 0 else f"exited with code {code}"
        what, named = f"failed: rank {failed_rank} {how} first", [failed_rank]
    path = run_dir / f"rank{failed_rank}" if failed_rank is not None else (
        run_dir / "rank0" if result.returncode == 0 else run_dir)
    others = [_other(name, info, run_dir) for name, info in statuses.items() if int(name[4:]) not in named]
    stderr, whose = path / "stderr.txt", f"rank {failed_rank}'s" if early else "its"
    return ScriptError(f"run {i} of {total}{label} {what}" + (f"; then {', '.join(others)}" if others else "")
                       + f". The runs cannot be compared. {hint}\nLast lines of {whose} stderr ({stderr}):\n"
                       f"{tail_lines(stderr)}", stderr_path=stderr)


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
