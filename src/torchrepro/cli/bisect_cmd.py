"""``torchrepro bisect --good REV --bad REV -- python train.py``: the first commit whose run differs from good's.

From inside a git repository: the command runs once at ``good`` (recorded), once at ``bad``, then at the commits
between them chosen by binary search (:mod:`torchrepro.analysis.bisect`), each in a temporary worktree of its own
(:mod:`torchrepro.record.gitrepo`: the user's working tree, index, HEAD and stash are never touched, and the
worktrees are removed on exit, errors, Ctrl-C, SIGTERM and SIGHUP). Each run is compared with good's recording
(bitwise, or within ``--rtol``/``--atol``; parameters renamed since good are compared by position); a commit
where the command fails, or whose run cannot be compared with good's, is skipped. The first bad commit is then
compared with its parent as ``compare --locate`` does, and the op's source line is looked up in its diff.

Exit codes: 0 found, 1 no commit differs, 2 error (not a repository, unknown revision, good == bad, good's or
bad's run fails, bad's run cannot be compared with good's).

Example::

    torchrepro bisect --good v1.2 --bad HEAD --max-steps 5 -- python train.py --lr 0.1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._core.errors import RunsNotComparableError, ScriptError
from ..record.gitrepo import Commit, GitError, Repo, Submodule, Worktrees
from ..record.launcher import (
    FORWARDED,
    PY_OPTIONS_WITH_VALUE,
    CommandError,
    LaunchOptions,
    is_interpreter,
    parse_python_command,
    signals_as_interrupts,
)
from ..record.outdir import lock_dir
from ..record.store import Run, load_run
from ._checkrun import WriteErrors, output_dir
from ._options import add_run_options, positive_int
from ._sides import Side, record_side
from ._usage import COMMAND_TAIL, SUMMARIES, set_usage
from .compare_cmd import add_tolerance_options, launch_options, tolerance

SCHEMA = "torchrepro.bisect/1"
EXIT = {"found": 0, "ambiguous": 0, "none-differs": 1}
VERDICT_OF = {"identical": "good", "equivalent": "good", "diverged": "bad"}  # compare's verdict -> bisect's


EXAMPLES = """\
Examples:
  torchrepro bisect --good v1.2 -- python train.py
  torchrepro bisect --good v1.2 --bad HEAD --max-steps 5 --rtol 1e-6 -- python train.py"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bisect", help=SUMMARIES["bisect"],
                       description="Find the first commit between --good and --bad whose run differs from the good "
                                   "commit's: each commit runs the command in its own git worktree (your checkout is "
                                   "never touched), and the first bad commit and its parent are traced to name the op "
                                   "and source line.",
                       epilog=EXAMPLES)
    p.add_argument("--good", required=True, metavar="REV", help="a commit whose run is the reference")
    p.add_argument("--bad", default="HEAD", metavar="REV", help="a later commit whose run differs (default HEAD)")
    add_tolerance_options(p)
    add_run_options(p)
    p.add_argument("--submodules", action="store_true",
                   help="check out the git submodules in each commit's worktree, at the revisions the commit records "
                        "(cloned from your checkout's submodules: no network); without it they are left empty")
    p.add_argument("--no-locate", action="store_true",
                   help="stop at the first bad commit: do not trace it and its parent to name the op and line")
    p.add_argument("--locate-steps", type=positive_int, default=1, metavar="N",
                   help="trace N steps from the first divergent one (default 1)")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default: a new torchrepro-runs/bisect-TIMESTAMP-PID)")
    p.add_argument("user_command", nargs=argparse.REMAINDER, metavar="-- python train.py [ARGS]",
                   help="the training command, run from the same directory of each checkout")
    set_usage(p, "torchrepro bisect", COMMAND_TAIL)
    p.set_defaults(handler=run, accepts_command=True)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """While cleaning up: a second SIGTERM/SIGHUP/Ctrl-C must not cut the removal of the worktrees short."""
    sigs = (*FORWARDED, signal.SIGINT)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def in_checkout(argv: list[str], repo: Repo, checkout: Path) -> list[str]:
    """``argv`` with a script inside the repository pointed at the checkout's copy (relative paths are read from
    the current directory, as the shell would)."""
    words = list(argv)
    i = 0
    if words and is_interpreter(words[0]):
        i = 1
        while i < len(words) and words[i].startswith("-") and words[i] not in ("-m", "-c"):
            i += 2 if words[i] in PY_OPTIONS_WITH_VALUE else 1  # `-W ignore`, `-X dev`: the value is not the script
    if i < len(words) and words[i] not in ("-m", "-c") and words[i].endswith(".py"):
        rel = repo.relative(Path(words[i]).absolute())
        if rel is not None:
            words[i] = str(checkout / rel)
    return words


class ScriptNotInCommit(CommandError):
    """A script of the repository that a commit lacks; ``hint``: what to do when that commit is good or bad."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def submodules_note(commit: Commit, subs: list[Submodule]) -> str:
    """Why a command that needs the submodules fails in bisect's worktrees, and how to include them."""
    return (f"Commit {commit.short} has git submodule(s) {', '.join(s.path for s in subs)} (from .gitmodules), which "
            "bisect's worktrees do not check out (they are left empty). If the command needs them, run bisect again "
            "with --submodules: each worktree then gets them at the commit's recorded revision, copied from your "
            "checkout's submodules (no network; run `git submodule update --init --recursive` in your checkout "
            "first if they are not there).")


def skip_reason(message: str) -> str:
    """``failed with exit code 1: ModuleNotFoundError: No module named 'x'`` from a failed run's error."""
    m = re.search(r"run 1 of 1 ([^;]*);", message)
    what = m.group(1) if m else message.splitlines()[0]
    tail = [line.strip() for line in message.splitlines()[1:] if line.strip()]
    return f"{what}: {tail[-1][:160]}" if m and tail and not tail[-1].startswith("(") else what[:200]


def one_line(text: str, limit: int) -> str:
    """``text`` on one line (newlines and runs of spaces made one space), cut to ``limit`` characters with '...'."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def speak_of_commits(problem: str, other: str) -> str:
    """A problem of ``check_comparable`` with its runs named: run 1 is good's, run 2 is ``other``'s."""
    return re.sub(r"\brun ([12])\b", lambda m: "good" if m.group(1) == "1" else other, problem)


def renamed_note(renamed: dict[str, str]) -> str:
    """``2 parameter(s) renamed since good, compared by position: proj.weight (good: fc.weight), ...``."""
    pairs = ", ".join(f"{new} (good: {old})" for new, old in list(renamed.items())[:3])
    return (f"{len(renamed)} parameter(s) renamed since good, compared by position: {pairs}"
            + (", ..." if len(renamed) > 3 else ""))


@dataclass
class Tested:
    """One commit's run and what it says."""

    index: int
    commit: Commit
    verdict: str | None = None  # good | bad | skip
    run: Path | None = None
    compare: dict[str, Any] | None = None  # verdict, first_divergent_step, first_out_of_tolerance
    reason: str | None = None  # why skipped (it failed, or its run is not comparable with good's): one line
    error: str | None = None  # a skipped run's whole error (the reason is its first line, shortened)
    problems: list[str] | None = None  # why its run is not comparable with good's (then it is skipped)
    hint: str | None = None  # what to do, when this commit is good or bad and its run failed

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, **self.commit.to_json(), "verdict": self.verdict,
                "run": str(self.run) if self.run else None, "compare": self.compare, "reason": self.reason}


@dataclass
class Bisection:
    """Runs the command at commits of ``chain`` (good first) in worktrees and compares each with good."""

    repo: Repo
    trees: Worktrees
    chain: list[Commit]
    argv: list[str]
    out: Path
    opts: LaunchOptions
    tol: Any
    tested: dict[int, Tested] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # indices in the order they were run
    runs: dict[int, Run] = field(default_factory=dict)
    noted_submodules: bool = False  # the note that worktrees lack the submodules was printed

    def side(self, index: int, checkout: Path, label: str) -> Side:
        """The command as it runs in ``checkout`` (from the same directory there, its code first on sys.path)."""
        rel = self.repo.relative(Path.cwd()) or Path()
        roots = [str(checkout)] + ([str(checkout / "src")] if (checkout / "src").is_dir() else [])
        path = os.pathsep.join(roots + [p for p in [os.environ.get("PYTHONPATH")] if p])
        return Side(label, " ".join(self.argv), in_checkout(self.argv, self.repo, checkout), {"PYTHONPATH": path},
                    cwd=str(checkout / rel))

    def script_in_commit(self, side: Side, commit: Commit, checkout: Path) -> None:
        """Refuse a script of the repository that this commit does not hold (the checkout's path would name a
        file of a temporary worktree that is gone by the time the error is read), saying why: it lies in a
        submodule left empty, a commit deleted or renamed it, it was added later, or it is not committed."""
        for given, used in zip(self.argv, side.argv):
            if given != used and not Path(used).exists():
                raise self._missing(given, commit, checkout)

    def _missing(self, given: str, commit: Commit, checkout: Path) -> ScriptNotInCommit:
        rel = self.repo.relative(Path(given).absolute())
        subs = [] if self.trees.with_submodules else self.trees.submodules.get(checkout, [])
        sub = next((s for s in subs if rel is not None and rel.parts[:len(Path(s.path).parts)] == Path(s.path).parts),
                   None)
        if sub is not None:
            return ScriptNotInCommit(f"{given} is not in commit {commit.short}'s worktree (it lies in the git "
                                     f"submodule {sub.path}, which bisect's worktrees do not check out).",
                                     "Run bisect again with --submodules to check the submodules out in each worktree "
                                     "(copied from your checkout's: no network).")
        removal = self.repo.removal(commit.sha, rel) if rel is not None else None
        if removal is not None:
            by, renamed = removal
            what = f"renamed to {renamed}" if renamed else "deleted"
            message = (f"{given} is not in commit {commit.short} (it was {what} in commit {by.short} "
                       f"{by.subject[:60]!r}).")
            if self.repo.is_ancestor(by.sha, self.chain[0].sha):
                return ScriptNotInCommit(message, "Bisect runs the same command at every commit, so the script must "
                                         "be in each: give a good commit that has it, or run a copy of the script "
                                         "kept outside the repository.")
            after = (f", or bisect the commits from {by.short} on (`--good {by.short}`) with the script's new path, "
                     f"{renamed}") if renamed else ", or run a copy of the script kept outside the repository"
            return ScriptNotInCommit(message, "Bisect runs the same command at every commit, so the script must be "
                                     f"in each: give a bad commit before {by.short} (`--bad {by.short}~1`){after}.")
        tracked = self.repo.tracked(Path(given).absolute())
        state = ("it is not committed in your checkout" if not tracked else "it was added in a later commit")
        return ScriptNotInCommit(f"{given} is not in commit {commit.short} ({state}). Commit it, or run a script "
                                 "from outside the repository.")

    def record(self, index: int) -> Tested:
        """Run the command at ``chain[index]`` (once: recordings are reused)."""
        if index in self.tested:
            return self.tested[index]
        commit = self.chain[index]
        entry = self.tested[index] = Tested(index, commit)
        self.order.append(index)
        print(f"torchrepro: bisect: running at {commit.short} {commit.subject[:60]!r}", file=sys.stderr, flush=True)
        checkout = self.trees.add(commit.sha)
        empty = [] if self.trees.with_submodules else self.trees.submodules.get(checkout, [])
        if empty and not self.noted_submodules:
            self.noted_submodules = True
            print(f"torchrepro: bisect: note: {submodules_note(commit, empty)}", file=sys.stderr, flush=True)
        try:
            side = self.side(index, checkout, commit.short)
            self.script_in_commit(side, commit, checkout)
            parse_python_command(side.argv)
            entry.run = record_side(side, self.out / f"c-{commit.short}", self.opts, quiet=True)
            self.runs[index] = load_run(entry.run)
        except (ScriptError, CommandError) as exc:
            entry.verdict, entry.reason, entry.error = "skip", skip_reason(str(exc)), str(exc)
            entry.hint = exc.hint if isinstance(exc, ScriptNotInCommit) else None
            if empty and entry.hint is None:
                entry.hint = submodules_note(commit, empty)
                entry.reason += f" (submodules not checked out: {', '.join(s.path for s in empty)})"
        finally:
            self.trees.remove(checkout)
        return entry

    def test(self, index: int) -> Tested:
        """Run at ``chain[index]`` and compare with good: good, bad or skip. A run that cannot be compared with
        good's (other parameters; renamed ones are compared by position) is skipped: it says nothing either way."""
        from ..analysis.bisect import compare_commits

        entry = self.record(index)
        if entry.verdict == "skip" or index == 0:
            entry.verdict = entry.verdict or "good"
            return entry
        try:
            result, renamed = compare_commits(self.runs[0], self.runs[index], self.tol)
        except RunsNotComparableError as exc:
            entry.verdict, entry.error = "skip", str(exc)
            entry.problems = [speak_of_commits(p, "this commit") for p in exc.problems]
            entry.reason = one_line("not comparable with good: " + "; ".join(entry.problems), 300)
            print(f"torchrepro: bisect: {self.chain[index].short} is skipped ({entry.reason})", file=sys.stderr,
                  flush=True)
            return entry
        entry.verdict = VERDICT_OF[result.verdict]
        first = result.first_out
        entry.compare = {"verdict": result.verdict, "first_divergent_step": result.check.first_step,
                         "first_out_of_tolerance": first.to_json() if first is not None else None}
        if renamed:
            entry.compare["renamed"] = renamed  # {this commit's name: good's name}, compared by position
        print(f"torchrepro: bisect: {self.chain[index].short} is {entry.verdict} ({result.verdict}"
              + (f" from step {result.check.first_step}" if result.check.first_step is not None else "")
              + (f"; {renamed_note(renamed)}" if renamed else "") + ")", file=sys.stderr, flush=True)
        return entry


def _checked_revisions(repo: Repo, good_rev: str, bad_rev: str) -> tuple[Commit, Commit, list[Commit]]:
    good, bad = repo.commit(good_rev), repo.commit(bad_rev)
    if good.sha == bad.sha:
        raise GitError(f"--good {good_rev} and --bad {bad_rev} are the same commit ({good.short}); give a good "
                       "commit before the bad one.")
    if not repo.is_ancestor(good.sha, bad.sha):
        raise GitError(f"--good {good_rev} ({good.short}) is not an ancestor of --bad {bad_rev} ({bad.short}); bisect "
                       "searches the commits from good to bad, so good must come first in bad's history.")
    between = repo.chain(good, bad)
    if not between or between[-1].sha != bad.sha:  # never expected: bad descends from good
        raise GitError(f"found no commits from --good {good_rev} ({good.short}) to --bad {bad_rev} ({bad.short}) "
                       f"along bad's first-parent history (`git log --first-parent {good.short}..{bad.short}`); "
                       "give a good commit on that history.")
    if repo.first_parent(between[0].sha) != good.sha:
        print(f"torchrepro: bisect: good {good.short} is not on bad's first-parent history; it came in with the "
              f"merge {between[0].short} {between[0].subject[:60]!r}: bisecting the first-parent commits from that "
              "merge to bad", file=sys.stderr, flush=True)
    return good, bad, [good, *between]


def run(args: argparse.Namespace) -> int:
    repo = Repo.find(Path.cwd())
    good, bad, chain = _checked_revisions(repo, args.good, args.bad)
    if not args.user_command or not args.user_command[0]:
        raise CommandError("no command given; usage: torchrepro bisect --good REV --bad REV -- python train.py")
    out = output_dir(args.out, "bisect")
    opts, tol = launch_options(args), tolerance(args)
    print(f"torchrepro: bisect: {len(chain) - 1} commit(s) after good {good.short} up to bad {bad.short}; "
          f"comparing each run with good's ({tol.describe()})", file=sys.stderr, flush=True)
    with lock_dir(out), signals_as_interrupts():
        trees = Worktrees(repo, submodules=args.submodules).open()
        try:
            return _bisect(Bisection(repo, trees, chain, list(args.user_command), out, opts, tol), args)
        finally:
            with signals_ignored():
                trees.close()


def _whole(entry: Tested) -> str:
    """A skipped run's whole error, ending with a full stop (the reason in the table is shortened)."""
    text = (entry.error or entry.reason or "it failed").rstrip()
    return text if text.endswith((".", ")")) else text + "."


def _bisect(b: Bisection, args: argparse.Namespace) -> int:
    from ..analysis.bisect import Search

    n = len(b.chain) - 1
    if b.test(0).verdict == "skip":
        raise ScriptError(f"the command fails at good ({b.chain[0].short}): {_whole(b.tested[0])} "
                          + (b.tested[0].hint or "Give a good commit where it runs."))
    last = b.test(n)
    if last.verdict == "skip" and last.problems is not None:
        raise RunsNotComparableError([p.replace("this commit", "bad") for p in last.problems], (
            f"Bisect compares each commit's run with good's ({b.chain[0].short}): the run at bad ({b.chain[n].short}) "
            "built a model with other parameters (renamed ones are compared by position only when their number, "
            "order and shapes agree). Give a bad commit whose model good's can be compared with. Runs: 1 = "
            f"{b.tested[0].run}, 2 = {last.run}."))
    if last.verdict == "skip":
        raise ScriptError(f"the command fails at bad ({b.chain[n].short}): {_whole(last)} "
                          + (last.hint or "Give a bad commit where it runs (bisect needs its run to differ from "
                             "good's)."))
    search = Search(n)
    if last.verdict == "good":
        return finish(b, "none-differs", search, None, args)
    while (i := search.next()) is not None:
        search.record(i, b.test(i).verdict or "skip")
    verdict = "found" if search.first_bad is not None else "ambiguous"
    located = None
    if verdict == "found" and not args.no_locate:
        located = _locate(b, search.lo, search.hi, args.locate_steps)
    return finish(b, verdict, search, located, args)


def _locate(b: Bisection, parent: int, first_bad: int, steps: int) -> dict[str, Any]:
    """``compare --locate`` between the first bad commit and its parent, tied to the commit's diff."""
    from ..analysis.bisect import compare_commits, relocate, tie_to_diff
    from ._comparelocate import locate_sides

    result, _ = compare_commits(b.runs[parent], b.runs[first_bad], b.tol)
    checkouts = [b.trees.add(b.chain[parent].sha), b.trees.add(b.chain[first_bad].sha)]
    try:
        sides = [b.side(i, c, label) for i, c, label in zip((parent, first_bad), checkouts, "AB")]
        errors: WriteErrors = []
        doc = locate_sides(sides, [b.runs[parent], b.runs[first_bad]], result, b.out, b.opts, steps, errors)
    finally:
        for c in checkouts:
            b.trees.remove(c)
    doc = relocate(doc, {"parent": checkouts[0], "commit": checkouts[1]})
    doc["diff"] = tie_to_diff(doc, b.repo.diff(b.chain[parent].sha, b.chain[first_bad].sha))
    doc["compared"] = {"verdict": result.verdict, "first_divergent_step": result.check.first_step,
                       "diverged_first": [d.label for d in result.check.first]}
    return doc


def finish(b: Bisection, verdict: str, search: Any, located: dict[str, Any] | None,
           args: argparse.Namespace) -> int:
    from ._bisect_render import render_bisect

    first = search.first_bad if verdict == "found" else None
    doc = {
        "schema": SCHEMA, "verdict": verdict, "exit_code": EXIT[verdict], "command": " ".join(b.argv),
        "good": b.chain[0].to_json(), "bad": b.chain[-1].to_json(), "tolerance": b.tol.to_json(),
        "commits": len(b.chain) - 1, "recordings": len(b.order),
        "first_bad_commit": None if first is None else {
            **b.chain[first].to_json(), "parent": b.chain[first - 1].to_json(), "compare": b.tested[first].compare},
        "candidates": [b.chain[i].to_json() for i in search.candidates] if verdict == "ambiguous" else [],
        "tested": [b.tested[i].to_json() for i in b.order],
        "chain": [{**c.to_json(), "verdict": b.tested[i].verdict if i in b.tested else None}
                  for i, c in enumerate(b.chain)],
        "locate": located, "out": str(b.out),
    }
    from ._html.reports import bisect_report
    from ._output import Verdict, emit

    return emit(Verdict(doc, EXIT[verdict], "bisect.json", summary=lambda _: render_bisect(doc),
                        report=lambda d, summary: bisect_report(d, b.out, summary)),
                b.out, as_json=args.json)

