"""The exception hierarchy. Every error names what it received, what it expected, and what to do next."""

from __future__ import annotations

from pathlib import Path


class ReproError(Exception):
    """Base class of every error torchrepro raises on purpose.

    ``stderr_path``: the file holding the failed process's stderr, when there is one (the CLI's JSON error document
    names it).

    >>> ScriptError("run 1 of 2 failed", stderr_path="out/run1/stderr.txt").stderr_path
    'out/run1/stderr.txt'
    """

    stderr_path: str | None = None

    def __init__(self, *args: object, stderr_path: str | Path | None = None) -> None:
        super().__init__(*args)
        self.stderr_path = str(stderr_path) if stderr_path is not None else None


class InvalidSeedError(ReproError, ValueError):
    """A seed that is not an integer in [0, 2**32 - 1]."""


class StateFileError(ReproError):
    """A state file (RNG state, run directory, checkpoint) that cannot be used.

    The message always starts with the file's path.
    """

    def __init__(self, path: str | Path, problem: str, action: str = "") -> None:
        self.path = str(path)
        self.problem = problem
        msg = f"{self.path}: {problem}"
        if action:
            msg += f" {action}"
        super().__init__(msg)


class DeviceMismatchError(StateFileError):
    """A saved state needs devices (e.g. CUDA GPUs) this process does not have."""


class MissingGeneratorError(ReproError, KeyError):
    """A saved state names a generator that was not passed or registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class RunDirError(StateFileError):
    """A run directory that is missing, corrupt, truncated or of another format."""


class ScriptError(ReproError):
    """A user script that failed, was killed, or recorded nothing."""


class CheckpointError(StateFileError):
    """A checkpoint that is corrupt, foreign, or lacks a component the caller asked for."""


class InternalError(ReproError):
    """torchrepro's own code failed in a process it launched (a bug in torchrepro, not in the user's script).

    The command exits 3; the message names the exception and where its traceback is.
    """


class ReproWarning(UserWarning):
    """A setting that undermines reproducibility but does not stop the run."""


class OutputDirError(ReproError):
    """An output directory that cannot be used: not ours to replace, a file, unwritable, or in use."""


class Interrupted(ReproError):
    """A command stopped by a signal (SIGINT, SIGTERM, SIGHUP); its child was stopped too.

    The command line exits with ``128 + signum``.
    """

    def __init__(self, signum: int, message: str) -> None:
        self.signum = signum
        super().__init__(message)


class RunsNotComparableError(ReproError):
    """Runs that cannot be compared step by step: different commands, or models with different parameters.

    ``problems`` lists each difference as a sentence; the message says what to do.
    """

    def __init__(self, problems: list[str], action: str) -> None:
        self.problems = list(problems)
        super().__init__("the runs are not comparable:\n" + "\n".join(f"  - {p}" for p in self.problems)
                         + f"\n{action}")


class EnvFileError(StateFileError):
    """An environment to compare that cannot be used: missing, not JSON, of another schema, or truncated.

    The message starts with the file's (or run directory's) path.
    """


class TracesNotComparableError(ReproError):
    """Two op traces that cannot be compared op by op (``diff --locate``): they hold different steps."""


class CollectiveError(ReproError):
    """A collective that torchrepro started (``torchrepro.distributed.ranks``) did not complete within its time limit.

    Another rank exited, crashed or is stuck. ``ranks`` are the group's ranks, ``rank`` this one, ``timeout_s``
    the limit.
    """

    def __init__(self, message: str, *, ranks: list[int], rank: int, timeout_s: float) -> None:
        self.ranks, self.rank, self.timeout_s = list(ranks), rank, timeout_s
        super().__init__(message)


class RankMismatchError(ReproError):
    """Replicas that differ between ranks (``check_consistency(..., raise_on_mismatch=True)``).

    ``report`` is the :class:`~torchrepro.distributed.ranks.ConsistencyReport`, naming each tensor and rank.
    """

    def __init__(self, report: object) -> None:
        self.report = report
        summary = report.summary()  # type: ignore[attr-defined]
        super().__init__(f"{summary}\nReplicated tensors must be bitwise equal on every rank. Look for code that "
                         "runs on some ranks only (`if rank == 0:` updates, per-rank RNG in the model), gradients "
                         "that skip the all-reduce (no_sync, unused parameters), or buffers updated locally "
                         "(BatchNorm running stats without SyncBatchNorm); `torchrepro check --nproc-per-node N` "
                         "names the first step where they part.")


class NondeterministicOpError(ReproError):
    """An op that a :class:`~torchrepro.DeterminismPolicy` (or ``mark_deterministic``) forbids in this scope.

    ``op`` is the ATen op (``aten.put_``), ``rule`` the pattern, tier or level that decided, ``line`` the user's
    ``file:line`` and ``module`` the module path (empty outside any module).
    """

    def __init__(self, message: str, *, op: str, rule: str, line: str, module: str = "") -> None:
        self.op, self.rule, self.line, self.module = op, rule, line, module
        super().__init__(message)


class BatchInvarianceError(ReproError, ValueError):
    """An input that ``check_batch_invariance`` (or ``torchrepro invariance``) cannot check: a batch of one row,
    outputs without a batch dimension, a model that raises at one of the batch sizes, an unusable model directory
    or prompts file. The message names what was received and what to do."""
