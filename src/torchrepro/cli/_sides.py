"""The two things ``compare`` (and ``bisect``) compare: command lines, parsed and run once each, recorded, or run
directories recorded earlier."""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .._core.errors import ScriptError
from ..record.launcher import CommandError, LaunchOptions, parse_python_command, parse_torchrun_command
from ..record.options import RankOptions
from ..record.store import MANIFEST
from ._checkrun import Isolation, execute_runs

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Side:
    """One of the two things compared: a command line (words, its own environment variables) or a run directory."""

    label: str  # "A" or "B"
    text: str  # as given
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    recorded: Path | None = None  # a run directory given instead of a command
    cwd: str | None = None  # where the command runs (bisect: in a worktree); None: here
    nproc: int | None = None  # a torchrun command (compare): its ranks; argv is then every rank's Python command

    @property
    def shown(self) -> str:
        return str(self.recorded) if self.recorded is not None else self.text.strip()


def parse_side(label: str, text: str, *, torchrun: bool = False) -> Side:
    """``'OMP_NUM_THREADS=1 python train.py --lr 0.1'`` as words and variables, checked before anything runs.

    >>> s = parse_side("A", "OMP_NUM_THREADS=1 python t.py --x 'a b'")  # doctest: +SKIP
    >>> s.env, s.argv                                                    # doctest: +SKIP
    ({'OMP_NUM_THREADS': '1'}, ['python', 't.py', '--x', 'a b'])

    ``torchrun``: a torchrun command on one machine is taken (``nproc`` its ranks, ``argv`` the ranks' command).
    """
    path = Path(text)
    if text.strip() and path.is_dir():
        if (path / MANIFEST).exists():
            return Side(label, text, recorded=path)
        raise CommandError(f"{label} {text!r} is a directory but not a run directory (it holds no {MANIFEST}); "
                           "expected a quoted command line such as 'python train.py' or a directory recorded by "
                           "`torchrepro run --record DIR`.")
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise CommandError(f"command {label} {text!r} cannot be split into words ({exc}); quote it as a shell would, "
                           "e.g. 'python train.py --name \"a b\"'.") from None
    env = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        raise CommandError(f"command {label} {text!r} holds no command; expected a quoted command line such as "
                           "'python train.py --lr 0.1' (or a run directory recorded by `torchrepro run --record`).")
    nproc = None
    try:
        found = parse_torchrun_command(words) if torchrun else None
        if found is not None:
            words, nproc = found
        parse_python_command(words)  # a bad command is refused before any directory is made
    except CommandError as exc:
        raise CommandError(f"command {label} (`{text.strip()}`): {exc}") from None
    return Side(label, text, words, env, nproc=nproc)


def side_error(side: Side, exc: ScriptError) -> ScriptError:
    """A failed run named by its command (``command B (`python t.py --x`): run 1 of 1 failed ...``)."""
    return ScriptError(f"command {side.label} (`{side.shown}`): {exc}".replace("the runs cannot be compared",
                                                                             "the commands cannot be compared"),
                       stderr_path=exc.stderr_path)


def record_side(side: Side, where: Path, opts: LaunchOptions, *, quiet: bool = False,
                isolation: Isolation | None = None, number: int = 1) -> Path:
    """Run ``side``'s command once, recorded into ``where/run1``; a run directory is used as it is.
    ``isolation``: a watch on the working directory shared by both sides, this side being its run ``number``."""
    if side.recorded is not None:
        return side.recorded
    if not quiet:
        print(f"torchrepro: command {side.label}: `{side.shown}`", file=sys.stderr, flush=True)
    opts = dataclasses.replace(opts.in_dir(cwd=side.cwd or opts.workdir.cwd), extra_env={**opts.extra_env, **side.env})
    if side.nproc is not None:  # each rank recorded into its own directory, its output there too
        opts = dataclasses.replace(opts, ranks=RankOptions(nproc_per_node=side.nproc, output=True))
    try:
        return execute_runs(side.argv, where, 1, opts, isolation, number=number)[0]
    except ScriptError as exc:
        raise side_error(side, exc) from None
