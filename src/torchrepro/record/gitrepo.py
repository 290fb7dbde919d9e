"""The git repository a command runs in: revisions, the commits between two, their diff, and temporary worktrees
(layer L3).

``torchrepro bisect`` runs a command at other commits without touching the user's checkout: each commit is
checked out with ``git worktree add --detach`` into a temporary directory of its own (never the working tree,
the index, HEAD, branches or the stash), and removed with ``git worktree remove --force --force`` when done, by
:class:`Worktrees` on exit, on an error, on Ctrl-C and on SIGTERM/SIGHUP (the caller turns those into exceptions).
Worktrees a killed bisect left behind (its process gone) are removed by the next one. Hooks never run
(``core.hooksPath`` is pointed at an empty directory for these commands). ``git worktree add`` leaves git submodules
empty: with ``Worktrees(repo, submodules=True)`` each one is cloned (``--shared``, no network) from the user's
checkout's copy of it and checked out at the revision the commit records, recursively.

Example:
    >>> repo = Repo.find(Path.cwd())                              # doctest: +SKIP
    >>> good, bad = repo.commit("v1.0"), repo.commit("HEAD")       # doctest: +SKIP
    >>> with Worktrees(repo) as trees:                             # doctest: +SKIP
    ...     path = trees.add(bad.sha)                              # a detached checkout of HEAD in /tmp
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .._core.errors import ReproError

GIT_TIMEOUT_S = 300
_PREFIX = "torchrepro-bisect-"
_OURS = re.compile(re.escape(_PREFIX) + r"(\d+)-")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class GitError(ReproError):
    """A git repository, revision or command that bisect cannot use (exit 2)."""


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:12]

    def to_json(self) -> dict[str, str]:
        return {"sha": self.sha, "subject": self.subject}


@dataclass(frozen=True)
class Submodule:
    """A git submodule of a commit: its path in the checkout, its name in ``.gitmodules`` and the commit recorded."""

    path: str
    name: str | None  # None: a gitlink that .gitmodules does not list
    sha: str


@dataclass
class FileHunks:
    """The lines one file's diff removes (old numbering) and adds (new numbering), with their text."""

    removed: dict[int, str] = field(default_factory=dict)
    added: dict[int, str] = field(default_factory=dict)
    old_path: str | None = None


class Repo:
    """A git repository, read through ``git`` (it must be on PATH)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def find(cls, where: Path) -> Repo:
        """The repository ``where`` lies in; :class:`GitError` outside one."""
        if shutil.which("git") is None:
            raise GitError("git is not installed (not found on PATH); bisect needs it to check out commits.")
        try:
            top = _git(["rev-parse", "--show-toplevel"], where).strip()
        except GitError:
            raise GitError(f"{where} is not inside a git repository; run bisect from the repository whose history "
                           "holds the good and the bad commit.") from None
        return cls(Path(top))

    def git(self, *args: str) -> str:
        return _git(list(args), self.root)

    def commit(self, rev: str) -> Commit:
        """The commit ``rev`` names (a sha, branch, tag, ``HEAD~3``); :class:`GitError` naming it otherwise."""
        try:
            sha = self.git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}").strip()
        except GitError:
            sha = ""
        if not sha:
            raise GitError(f"unknown revision {rev!r}: it names no commit in {self.root} (expected a commit sha, "
                           "branch, tag or an expression such as HEAD~3).")
        return Commit(sha, self.git("log", "-1", "--format=%s", sha).strip())

    def is_ancestor(self, a: str, b: str) -> bool:
        try:
            self.git("merge-base", "--is-ancestor", a, b)
            return True
        except GitError:
            return False

    def chain(self, good: Commit, bad: Commit) -> list[Commit]:
        """The commits of ``bad``'s first-parent history that contain ``good`` (``good`` excluded), oldest first,
        ``bad`` last; empty when ``good`` is not an ancestor of ``bad``.

        When ``good`` lies on that history these are the commits after it. When it lies on a side branch merged
        later, the first of them is the merge that brought it in (``git log --first-parent --ancestry-path`` is
        empty then: the first-parent walk never reaches ``good``).
        """
        contains = set(self.git("rev-list", "--ancestry-path", f"{good.sha}..{bad.sha}").split())
        out = self.git("log", "--first-parent", "--reverse", "--format=%H%x00%s", f"{good.sha}..{bad.sha}")
        return [Commit(*line.split("\0", 1)) for line in out.splitlines()
                if "\0" in line and line.split("\0", 1)[0] in contains]

    def first_parent(self, sha: str) -> str | None:
        """The first parent of ``sha`` (None for a root commit)."""
        parents = self.git("rev-list", "--parents", "-n", "1", sha).split()[1:]
        return parents[0] if parents else None

    def diff(self, old: str, new: str) -> dict[str, FileHunks]:
        """Per file (new path), the lines ``git diff -U0 old new`` removes and adds."""
        out = self.git("diff", "-U0", "--no-color", "--no-ext-diff", "--find-renames", old, new)
        files: dict[str, FileHunks] = {}
        current: FileHunks | None = None
        old_line = new_line = 0
        old_path = None
        header = False  # between `diff --git` and the first hunk: the --- / +++ lines name the files
        for line in out.splitlines():
            if line.startswith("diff --git "):
                header, current = True, None
            elif header and line.startswith("--- "):
                old_path = line[6:] if line.startswith("--- a/") else None
            elif header and line.startswith("+++ "):
                path = line[6:] if line.startswith("+++ b/") else old_path
                current = files.setdefault(path or "", FileHunks(old_path=old_path))
            elif (m := _HUNK.match(line)) is not None:
                header = False
                old_line, new_line = int(m.group(1)), int(m.group(3))
            elif current is not None and line.startswith("-"):
                current.removed[old_line] = line[1:]
                old_line += 1
            elif current is not None and line.startswith("+"):
                current.added[new_line] = line[1:]
                new_line += 1
        return files

    def removal(self, sha: str, path: Path) -> tuple[Commit, str | None] | None:
        """The commit of ``sha``'s history that last changed ``path`` (relative to the root; absent at ``sha``):
        the one that deleted it, and its new path when that commit renamed it. None when no commit there held it."""
        out = self.git("log", "-1", "--format=%H%x00%s", sha, "--", f":(literal){path.as_posix()}").strip()
        if "\0" not in out:
            return None
        commit = Commit(*out.split("\0", 1))
        words = self.git("diff-tree", "-r", "-M", "-z", "--name-status", "--no-commit-id", commit.sha).split("\0")
        renamed = next((words[i + 2] for i in range(len(words) - 2)
                        if words[i].startswith("R") and words[i + 1] == path.as_posix()), None)
        return commit, renamed

    def tracked(self, path: Path) -> bool:
        """Whether ``path`` (a file of the working tree) is in the index: committed or staged."""
        rel = self.relative(path)
        if rel is None:
            return False
        try:
            return bool(self.git("ls-files", "--error-unmatch", "--", str(rel)).strip())
        except GitError:
            return False

    def relative(self, path: Path) -> Path | None:
        """``path`` relative to the repository root (None when it lies outside)."""
        try:
            return path.resolve().relative_to(self.root.resolve())
        except ValueError:
            return None


def _git(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                           env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"`git {' '.join(args)}` could not run in {cwd}: {exc}.") from None
    if p.returncode != 0:
        raise GitError(f"`git {' '.join(args)}` failed in {cwd} ({p.stderr.strip()[:400] or f'exit {p.returncode}'}).")
    return p.stdout


def submodules(checkout: Path) -> list[Submodule]:
    """The git submodules of the commit checked out in ``checkout``: the gitlinks of its index, named from its
    ``.gitmodules`` (none without one)."""
    if not (checkout / ".gitmodules").is_file():
        return []
    try:
        listed = _git(["config", "--file", ".gitmodules", "--null", "--get-regexp", r"^submodule\..*\.path$"],
                      checkout)
    except GitError:  # no entry (exit 1) or an unreadable file: the gitlinks are still submodules
        listed = ""
    names = {}
    for entry in listed.split("\0"):
        key, _, value = entry.partition("\n")
        if key.startswith("submodule.") and key.endswith(".path") and value:
            names[value] = key[len("submodule."):-len(".path")]
    found = []
    for entry in _git(["ls-files", "--stage", "-z"], checkout).split("\0"):
        meta, _, path = entry.partition("\t")
        if meta.startswith("160000 "):
            found.append(Submodule(path, names.get(path), meta.split()[1]))
    return found


def _git_dir(path: Path) -> Path:
    """The git directory of ``path``: ``path/.git`` (a directory, or a file naming one), or ``path`` itself."""
    dot = path / ".git"
    if dot.is_file():
        text = dot.read_text(errors="replace").strip()
        if text.startswith("gitdir:"):
            named = Path(text[len("gitdir:"):].strip())
            return named if named.is_absolute() else (path / named).resolve()
    return dot if dot.is_dir() else path


class Worktrees:
    """Temporary detached worktrees of one repository, all removed on :meth:`close` (a context manager).

    With ``submodules=True`` each worktree's submodules are checked out too (see :meth:`add`)."""

    def __init__(self, repo: Repo, submodules: bool = False) -> None:
        self.repo = repo
        self.dir: Path | None = None
        self.paths: list[Path] = []
        self._no_hooks: Path | None = None
        self.with_submodules = submodules
        self.submodules: dict[Path, list[Submodule]] = {}  # each worktree's submodules (checked out or left empty)

    def open(self) -> Worktrees:
        """Remove what a killed bisect left, then make the temporary directory."""
        remove_stale(self.repo)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
        self._no_hooks = self.dir / "no-hooks"
        self._no_hooks.mkdir()
        return self

    def __enter__(self) -> Worktrees:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, sha: str) -> Path:
        """A detached checkout of ``sha`` in a new directory under the temporary directory."""
        assert self.dir is not None, "open() the Worktrees first (or use them as a context manager)"
        path = self.dir / f"c-{sha[:12]}-{len(self.paths)}"
        self.paths.append(path)
        _git(["-c", f"core.hooksPath={self._no_hooks}", "-c", "advice.detachedHead=false", "worktree", "add",
              "--detach", "--quiet", str(path), sha], self.repo.root)
        self.submodules[path] = submodules(path)
        if self.with_submodules and self.submodules[path]:
            gitdirs = [Path(self.repo.git("rev-parse", "--absolute-git-dir").strip()),
                       (self.repo.root / self.repo.git("rev-parse", "--git-common-dir").strip()).resolve()]
            self._check_out_submodules(path, sha[:12], self.repo.root, gitdirs, 0)
        return path

    def _check_out_submodules(self, checkout: Path, commit: str, mine: Path, gitdirs: list[Path], depth: int) -> None:
        """Clone each submodule of ``checkout`` from the user's copy of it (``mine``: the user's working tree at the
        same level; ``gitdirs``: where its ``modules/NAME`` git directories lie) and check out the recorded commit;
        then theirs, recursively. Local only: ``git clone --shared`` of a directory, never a URL."""
        for sub in submodules(checkout) if depth < 8 else []:
            named = sub.name is not None and not Path(sub.name).is_absolute() and ".." not in Path(sub.name).parts
            sources = [g / "modules" / str(sub.name) for g in gitdirs if named] + [mine / sub.path]
            source = next((p for p in sources if (p / "HEAD").is_file() or (p / ".git").exists()), None)
            if source is None:
                raise GitError(f"--submodules: submodule {sub.path} of commit {commit} is not checked out in your "
                               f"checkout ({mine / sub.path}), and bisect copies submodules from there, never from "
                               "the network: run `git submodule update --init --recursive` in your checkout, then "
                               "bisect again.")
            dest = checkout / sub.path
            _git(["-c", f"core.hooksPath={self._no_hooks}", "clone", "--quiet", "--shared", "--no-checkout",
                  str(source), str(dest)], checkout)
            try:
                _git(["-c", f"core.hooksPath={self._no_hooks}", "-c", "advice.detachedHead=false", "checkout",
                      "--quiet", "--detach", sub.sha], dest)
            except GitError:
                raise GitError(f"--submodules: commit {commit} records submodule {sub.path} at {sub.sha[:12]}, "
                               f"which your checkout's copy of it ({source}) does not have: fetch it there (`git -C "
                               f"{mine / sub.path} fetch`), then bisect again.") from None
            self._check_out_submodules(dest, sub.sha[:12], mine / sub.path, [_git_dir(source)], depth + 1)

    def remove(self, path: Path) -> None:
        """Remove one worktree this object made (its files and git's note of it)."""
        self.submodules.pop(path, None)
        with contextlib.suppress(GitError):
            _git(["worktree", "remove", "--force", "--force", str(path)], self.repo.root)
        shutil.rmtree(path, ignore_errors=True)
        if path in self.paths:
            self.paths.remove(path)

    def close(self) -> None:
        """Remove every worktree this object made, then the temporary directory."""
        for path in list(self.paths):
            self.remove(path)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(repo: Repo) -> list[str]:
    """Remove the worktrees of this repository that a killed bisect left (under its temporary directory, its
    process gone); return their paths. Other worktrees are never touched."""
    try:
        listing = repo.git("worktree", "list", "--porcelain")
    except GitError:
        return []
    tmp = Path(tempfile.gettempdir()).resolve()
    removed = []
    for line in listing.splitlines():
        if not line.startswith("worktree "):
            continue
        path = Path(line[len("worktree "):])
        m = _OURS.match(path.parent.name)
        if path.parent.parent.resolve() != tmp or m is None or _alive(int(m.group(1))):
            continue
        with contextlib.suppress(GitError):
            _git(["worktree", "remove", "--force", "--force", str(path)], repo.root)
        shutil.rmtree(path.parent, ignore_errors=True)
        removed.append(str(path))
    return removed
