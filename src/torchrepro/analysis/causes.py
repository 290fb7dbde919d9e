"""Every cause a verdict can name, defined once (layer L4).

A :class:`Cause` holds what the cause means and what to do about it in each setting it can be found in:

- ``check``: runs of *one* command, where any difference is nondeterminism (``check``, ``diff``, ranks);
- ``compare``: two *different* commands (``compare``, ``bisect``); when a cause has no wording of its own here,
  ``check``'s is used;
- ``resume``: what ``check --resume-at`` found was not restored (a short label and the fix);
- ``untraced``: why ``--locate`` does not trace it (``None``: ``check --locate`` and ``compare --locate`` trace
  the first divergent step).

Adding a cause is one :func:`register` call here; check, compare, bisect, resume-at and the HTML report read
it from :data:`REGISTRY`.

Example:
    >>> cause("compute").untraced is None, cause("data").untraced is not None
    (True, True)
    >>> cause("steps").wording("compare").explanation.startswith("Every recorded value matches")
    True
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

SHARED_CWD = "shared-working-directory"
SETTINGS = ("check", "compare")


@dataclass(frozen=True)
class Wording:
    """What a cause means, and what to do. Placeholders: ``{files}`` (shared working directory), and in compare's
    actions ``{compare}`` (``torchrepro compare`` with the options of the comparison), ``{a}``, ``{b}`` (the two
    commands, quoted) and ``{tolerance}``. A check action names a command as ```torchrepro check OPTS -- ...```:
    :func:`with_commands` makes it the command that reproduces the check (its options and the user's command)."""

    explanation: str
    action: str


@dataclass(frozen=True)
class ResumeWording:
    """What ``check --resume-at`` found was not restored (``what``), and the fix (placeholders ``{k}``: the
    checkpoint's step, ``{callback}``: the trainer's callback, or empty)."""

    what: str
    fix: str


@dataclass(frozen=True)
class Cause:
    """One cause, in every setting it can be found in (see the module docs)."""

    name: str
    check: Wording | None = None
    compare: Wording | None = None
    resume: ResumeWording | None = None
    untraced: str | None = None  # why --locate does not trace it; None: it does

    def wording(self, setting: str) -> Wording:
        """The wording for ``setting`` (``check`` or ``compare``): compare falls back to check's."""
        found = self.compare if setting == "compare" else None
        found = found or self.check
        if found is None:
            raise KeyError(f"cause {self.name!r} has no wording for {setting}")
        return found

    @property
    def traced(self) -> bool:
        return self.untraced is None


REGISTRY: dict[str, Cause] = {}


def register(c: Cause) -> Cause:
    """Add ``c`` to the registry (replacing a cause of the same name) and return it."""
    REGISTRY[c.name] = c
    return c


def cause(name: str) -> Cause:
    """The registered cause ``name``; an unknown name is an error that names the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown cause {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


# `torchrepro check OPTS -- ...` in a wording: a command that :func:`with_commands` completes
_CHECK_COMMAND = re.compile(r"`torchrepro check(?P<opts>(?: [^`]*?)?) -- \.\.\.`")
# check's options that take a value (the rest are flags); --deterministic and --deterministic-except replace each other
VALUE_OPTIONS = frozenset({"--runs", "--seed", "--deterministic-except", "--max-steps", "--values-budget",
                           "--nproc-per-node", "--resume-at", "--locate-steps", "--steps-after-divergence", "--out"})
_SAME_OPTION = {"--deterministic-except": "--deterministic"}


def _option_groups(words: Sequence[str]) -> list[list[str]]:
    """``["--seed", "0", "--locate"]`` -> ``[["--seed", "0"], ["--locate"]]``."""
    groups: list[list[str]] = []
    for word in words:
        if groups and groups[-1][0] in VALUE_OPTIONS and len(groups[-1]) == 1 and "=" not in groups[-1][0]:
            groups[-1].append(word)
        else:
            groups.append([word])
    return groups


def _option_name(group: list[str]) -> str:
    name = group[0].split("=", 1)[0]
    return _SAME_OPTION.get(name, name)


def check_command(options: Sequence[str], command: Sequence[str], add: Sequence[str] = ()) -> str:
    """``torchrepro check OPTIONS ADD -- COMMAND``: the user's check with the options ``add`` (each replacing the
    user's option of the same name), quoted for a POSIX shell.

    >>> check_command(["--seed", "1", "--runs", "3"], ["python", "train.py", "--lr", "0.1"], ["--seed", "0"])
    'torchrepro check --runs 3 --seed 0 -- python train.py --lr 0.1'
    """
    added = _option_groups(add)
    names = {_option_name(g) for g in added}
    kept = [g for g in _option_groups(options) if _option_name(g) not in names]
    return shlex.join(["torchrepro", "check", *(w for g in kept + added for w in g), "--", *command])


def with_commands(text: str, options: Sequence[str] | None, command: Sequence[str] | None) -> str:
    """``text`` with each ```torchrepro check OPTS -- ...``` made the command that reproduces this check with OPTS
    (:func:`check_command`); unchanged without a command (runs recorded apart, the Python API).

    >>> with_commands("Rerun with `torchrepro check --deterministic -- ...` to confirm.", ["--seed", "0"],
    ...               ["python", "train.py"])
    'Rerun with `torchrepro check --seed 0 --deterministic -- python train.py` to confirm.'
    """
    if not command:
        return text
    return _CHECK_COMMAND.sub(
        lambda m: f"`{check_command(options or [], command, shlex.split(m.group('opts')))}`", text)


def untraced_note(name: str | None) -> str | None:
    """Why ``--locate`` does not trace a verdict with this cause (None: it does)."""
    reason = cause(name).untraced if name else None
    return f"not traced: {reason} (the summary above says what differs and what to do)" if reason else None


_CALLBACK = "{callback}"

register(Cause(
    "initial-weights",
    check=Wording(
        "The initial parameters differ between runs: the model is initialised from unseeded random numbers.",
        "Seed before building the model: call torchrepro.seed_everything(SEED) (or torch.manual_seed) at the "
        "top of the script, or rerun with `torchrepro check --seed 0 -- ...` to confirm."),
    compare=Wording(
        "The two commands start from different initial parameters: they build or initialise the model "
        "differently (another seed, initialisation, dtype or architecture).",
        "Give both the same seed (`--seed 0`) and the same initialisation, or compare from a common checkpoint."),
))
register(Cause(
    "data",
    check=Wording(
        "The runs saw different data batches while the parameters were still identical: DataLoader shuffling "
        "or data augmentation draws unseeded random numbers.",
        "Seed the data path: pass generator=torchrepro.make_generator(SEED) and "
        "worker_init_fn=torchrepro.seed_worker to the DataLoader, and draw augmentation randomness from "
        "seeded generators (random, numpy, torch) rather than os.urandom or fresh unseeded generators."),
    compare=Wording(
        "The two commands fed different data batches while the parameters were still the same: another data "
        "order, augmentation, batch size or preprocessing.",
        "Make the data path the same in both (seeded DataLoader generator, same transforms), or accept that "
        "the runs cannot agree."),
    resume=ResumeWording(
        "data",
        "Restore the data position and the augmentation's randomness: torchrepro.ResumableLoader does both "
        "(save it with torchrepro.save_checkpoint(..., loader=loader))" + _CALLBACK + "."),
    untraced="the runs fed different data: the op tracer would only show that the batches differ",
))
register(Cause(
    "compute",
    check=Wording(
        "Identical inputs and parameters produced different results: a nondeterministic kernel (e.g. a "
        "scatter/index_put_ accumulation, atomicAdd on GPU, cuDNN autotuning) or an unseeded random op "
        "(dropout with its own generator).",
        "Rerun with `torchrepro check --deterministic -- ...` to confirm it is a kernel; "
        "`torchrepro check --locate -- ...` names the operation and its source line."),
    compare=Wording(
        "The same parameters and data gave different results: the two commands compute differently: another op "
        "or order of operations, precision (dtype, autocast, TF32), kernels (threads, deterministic mode, "
        "device) or torch.compile's generated code.",
        "`{compare} --locate {a} {b}` names the first op that computes differently, with its module and "
        "source line on both sides{tolerance}."),
    resume=ResumeWording(
        "nothing recorded (the step's computation differs)",
        "Run `torchrepro check -- ...` (without --resume-at) to see whether the script is reproducible at "
        "all (`--locate` names a nondeterministic op); otherwise save and restore the state that is missing "
        "(buffers are restored with the model's state_dict; a GradScaler's with its own)."),
))
register(Cause(
    "steps",
    check=Wording(
        "Every recorded value matches, but the runs took different numbers of steps: control flow depends on "
        "something unseeded or on timing (early stopping on wall-clock, data-dependent loops).",
        "Look for branches or loop bounds that depend on time, unseeded randomness or the environment."),
    compare=Wording(
        "Every recorded value matches, but the commands ran different numbers of steps.",
        "Give both the same number of steps (`--max-steps K`), or look for loop bounds that differ."),
    resume=ResumeWording(
        "step counter",
        "Restore the step counter (and the epoch) from the checkpoint, so that the resumed run ends where the "
        "uninterrupted one does" + _CALLBACK + "."),
    untraced="the runs took different numbers of steps, with equal values until then",
))
register(Cause(
    SHARED_CWD,
    check=Wording(
        "The runs shared the working directory and a later run read what an earlier one wrote there: {files}. The "
        "runs did not start from the same state, so this comparison does not show whether the script is "
        "reproducible.",
        "Delete those files before each run, point the script's output elsewhere, or rerun with "
        "`torchrepro check --fresh-cwd -- ...` (each run in its own copy of the working directory)."),
    compare=Wording(
        "B read what A wrote in the working directory both commands ran in: {files}. The commands did not start "
        "from the same state, so this comparison does not show what the change does to the numerics.",
        "Delete those files before each command, or point the script's output elsewhere, then compare again."),
    resume=ResumeWording(
        "shared working directory",
        "Rerun with `torchrepro check --resume-at {k} --fresh-cwd -- ...` (each run in its own copy of the "
        "working directory), or point the script's output elsewhere."),
    untraced="the runs did not start from the same state (a later run read what an earlier one wrote)",
))

# What a resume did not restore (check --resume-at only)
for _name, _what, _fix in (
    ("parameters", "parameters",
     "Load the model's weights from the checkpoint before training on (model.load_state_dict(...), or "
     "torchrepro.load_checkpoint(path, model=model, ...)) in the process that resumes; check that the "
     "checkpoint holds them after step {k} (not an older or a newer save)."),
    ("optimizer-state", "optimizer state",
     "Save optimizer.state_dict() in the checkpoint and load it into the rebuilt optimizer "
     "(torchrepro.save_checkpoint(..., optimizer=opt) / load_checkpoint(..., optimizer=opt))."),
    ("scheduler-state", "LR scheduler state",
     "Save the LR scheduler's state_dict() and load it when resuming "
     "(torchrepro.save_checkpoint(..., scheduler=sched) / load_checkpoint(..., scheduler=sched))."),
    ("data-position", "data position",
     "Restore the data position: wrap the data in torchrepro.ResumableLoader and save its state with "
     "the checkpoint (torchrepro.save_checkpoint(..., loader=loader)): it continues mid-epoch with "
     "the batches the uninterrupted run saw" + _CALLBACK + "."),
    ("data-values", "augmentation/worker RNG",
     "Seed the augmentation per sample rather than per worker or process: torchrepro.ResumableLoader "
     "seeds each sample's random/NumPy/torch randomness from (seed, epoch, position in epoch), so a "
     "resumed run draws the same" + _CALLBACK + "."),
    ("rng-state", "RNG state",
     "Save every RNG state in the checkpoint and restore it last, just before training on: "
     "torchrepro.save_checkpoint/load_checkpoint do (or torchrepro.save_rng_state/load_rng_state). A "
     "DataLoader iterator created after the restore draws its seed from torch's global generator too: "
     "give the DataLoader its own generator=, or use torchrepro.ResumableLoader" + _CALLBACK + "."),
    ("before-checkpoint", "not reproducible before the checkpoint",
     "Make the script reproducible first: `torchrepro check -- ...` says why the runs diverge "
     "before any checkpoint; then check the resume again."),
):
    register(Cause(_name, resume=ResumeWording(_what, _fix)))
