"""Binary search for the first commit whose run differs, with commits that cannot be tested skipped (layer L4).

The commits are a chain ``[good, c1, ..., cn]`` (``cn`` the bad one). Each test says ``good`` (the run agrees with
good's recording: identical, or equivalent within the tolerance), ``bad`` (it differs) or ``skip`` (the command
failed there, as ``git bisect skip``). The search keeps the last known good and first known bad index and tests
the middle commit between them; a skipped middle is replaced by the untested commit nearest to it (the later of
two as near). It ends when
nothing untested lies between them: the first bad commit is then known, or (with skips right before it) only a
range of candidates is. With no skips it needs ``ceil(log2(n))`` tests between good and bad.

Once found, the localization between the first bad commit and its parent (``compare --locate``) names source
lines in the two checkouts; :func:`tie_to_diff` says which of them the commit's diff removes or adds.

Example:
    >>> search = Search(n=5)          # chain of 6: good + 5 commits, the 5th (index 5) is bad
    >>> search.next()
    2
    >>> search.record(2, "good"); search.next()
    3
    >>> search.record(3, "bad"); search.next() is None, search.first_bad, search.candidates
    (True, 3, [3])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.errors import RunsNotComparableError
from ..record.gitrepo import FileHunks
from ..record.store import Run

if TYPE_CHECKING:
    import torch

    from .crossrun import CompareResult
    from .tolerance import Tolerance

VERDICTS = ("good", "bad", "skip")


@dataclass
class Search:
    """The state of one bisection over indices ``0`` (good) .. ``n`` (bad) of a commit chain."""

    n: int
    lo: int = 0  # the last index known good
    hi: int = -1  # the first index known bad
    verdicts: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hi < 0:
            self.hi = self.n
        self.verdicts.setdefault(0, "good")
        self.verdicts.setdefault(self.n, "bad")

    def record(self, index: int, verdict: str) -> None:
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
        self.verdicts[index] = verdict
        if verdict == "good" and self.lo < index < self.hi:
            self.lo = index
        elif verdict == "bad" and self.lo < index < self.hi:
            self.hi = index

    def next(self) -> int | None:
        """The index to test next, or None when the search is over."""
        untested = [i for i in range(self.lo + 1, self.hi) if i not in self.verdicts]
        if not untested:
            return None
        mid = (self.lo + self.hi) // 2
        return min(untested, key=lambda i: (abs(i - mid), -i))  # a tie: the later one, nearer the known bad

    @property
    def candidates(self) -> list[int]:
        """Where the first bad commit may be: the skipped commits right before the first known bad, and it."""
        return [i for i in range(self.lo + 1, self.hi + 1)]

    @property
    def first_bad(self) -> int | None:
        """The first bad index when it is known (no untestable commit before it in the range)."""
        return self.hi if self.hi - self.lo == 1 else None


# --- comparing a commit's run with good's when parameters were renamed -------------------------------------------
_RENAMED_PARTS = ("params", "grads", "state")  # the trace's parts keyed by parameter name ("name.key" in state)


class RenamedRun(Run):
    """A run whose parameters are named by ``renames`` (``{its name: new name}``), in its trace and its values;
    optimizer state ``"name.key"`` follows its parameter. ``torch.compile``'s ``_orig_mod.`` is dropped first."""

    def __init__(self, run: Run, renames: dict[str, str]) -> None:
        self.renames = dict(renames)
        events = [e | {p: {self.name(k): v for k, v in e[p].items()} for p in _RENAMED_PARTS
                       if isinstance(e.get(p), dict)} for e in run.events]
        super().__init__(path=run.path, manifest=run.manifest, events=events)

    def name(self, key: str) -> str:
        from .crossrun import plain_name

        key = plain_name(key)
        if key in self.renames:
            return self.renames[key]
        parts = key.split(".")
        for i in range(len(parts) - 1, 0, -1):  # "fc.weight.momentum_buffer": the longest renamed prefix
            head = ".".join(parts[:i])
            if head in self.renames:
                return self.renames[head] + "." + ".".join(parts[i:])
        return key

    def values(self, name: str, *, mmap: bool = False) -> dict[str, torch.Tensor] | None:
        found = super().values(name, mmap=mmap)
        return None if found is None else {self.name(k): v for k, v in found.items()}


def positional_renames(run_a: Run, run_b: Run) -> dict[str, str] | None:
    """``{b's name: a's name}`` for the parameters whose names differ at the same position, when both runs list
    the same number of parameters under other names (a layer renamed); None otherwise."""
    from .comparable import _param_names
    from .crossrun import plain_name

    names_a, names_b = _param_names(run_a), _param_names(run_b)
    if names_a is None or names_b is None or len(names_a) != len(names_b):
        return None
    names_a, names_b = [plain_name(n) for n in names_a], [plain_name(n) for n in names_b]
    if set(names_a) == set(names_b) or len(set(names_b)) != len(names_b):
        return None
    return {b: a for a, b in zip(names_a, names_b) if a != b}


def compare_commits(run_a: Run, run_b: Run, tol: Tolerance) -> tuple[CompareResult, dict[str, str]]:
    """``compare_commands(run_a, run_b, tol)``; when the parameter names differ but their number, order and
    shapes agree (a rename), run_b's parameters are compared with run_a's by position. Returns the result and
    the renames (``{b's name: a's name}``, empty when names matched); raises the first
    :class:`RunsNotComparableError` when the runs cannot be compared either way."""
    from .crossrun import compare_commands

    try:
        return compare_commands(run_a, run_b, tol), {}
    except RunsNotComparableError as exc:
        renames = positional_renames(run_a, run_b)
        if not renames:
            raise
        try:
            return compare_commands(run_a, RenamedRun(run_b, renames), tol), renames
        except RunsNotComparableError:
            raise exc from None


# --- the localization's source lines against the commit's diff -------------------------------------------------
def relocate(doc: Any, roots: dict[str, Path]) -> Any:
    """``doc`` with every ``file`` under one of ``roots`` (the two checkouts) made relative to it, and a
    ``checkout`` key naming which (``{"parent": ..., "commit": ...}``)."""
    if isinstance(doc, list):
        return [relocate(x, roots) for x in doc]
    if not isinstance(doc, dict):
        return doc
    out = {k: relocate(v, roots) for k, v in doc.items()}
    path = doc.get("file")
    if isinstance(path, str):
        for name, root in roots.items():
            try:
                out["file"] = str(Path(path).relative_to(root))
            except ValueError:
                continue
            out["checkout"] = name
            break
    return out


def _sites(doc: Any) -> list[dict[str, Any]]:
    """Every op site (a dict with ``file``, ``line`` and ``checkout``) in a localization document."""
    if isinstance(doc, list):
        return [s for x in doc for s in _sites(x)]
    if not isinstance(doc, dict):
        return []
    own = [doc] if doc.get("checkout") and isinstance(doc.get("line"), int) else []
    return own + [s for k, v in doc.items() if k != "context" for s in _sites(v)]


def tie_to_diff(doc: dict[str, Any], hunks: dict[str, FileHunks]) -> dict[str, Any]:
    """Which source lines the localization names are lines the commit removes (parent side) or adds (commit
    side), and what the commit changes otherwise (files, lines added and removed)."""
    by_old = {h.old_path or path: h for path, h in hunks.items()}
    touches: list[dict[str, Any]] = []
    seen: set[tuple[str, str, int]] = set()
    for site in _sites(doc):
        key = (site["checkout"], site["file"], site["line"])
        if key in seen:
            continue
        seen.add(key)
        if site["checkout"] == "commit" and site["file"] in hunks:
            text = hunks[site["file"]].added.get(site["line"])
            change = "added"
        elif site["checkout"] == "parent" and site["file"] in by_old:
            text = by_old[site["file"]].removed.get(site["line"])
            change = "removed"
        else:
            continue
        if text is not None:
            touches.append({"checkout": site["checkout"], "file": site["file"], "line": site["line"],
                            "change": change, "text": text, "op": site.get("op")})
    return {"touches": touches, "touched": bool(touches),
            "files": {path: {"added": len(h.added), "removed": len(h.removed)} for path, h in hunks.items()}}
