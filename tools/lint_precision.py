"""Precision and recall of ``torchrepro lint`` against an answer key, per project, as a table.

Each subdirectory (and each top-level ``.py`` file) of ROOT is one project, linted alone with every rule. The
key is written into the linted files (as in tests/lint/lint_fixtures/styles/, see the README there):

    x = f(y)   # expect: TR301            this line must be flagged with TR301
    x = f(y)   # expect: TR101|TR106      ... with either code
    x = f(y)   # expect[seed]: TR105      lines sharing a label form one expected finding, found on any of them
    x = f(y)   # also: TR203              a TR203 finding here is allowed: neither a true nor a false positive
    x = f(y)   # ok: <reason>             a near miss: nothing may be flagged here (nor on any unmarked line)

or in a separate file (--key), one entry a line, paths relative to ROOT (other lines are ignored):

    dcgan/main.py:51: TR201 - reason
    dcgan/main.py:46,48,49: TR105 - one finding, on any of these lines
    dcgan/main.py:110: also TR203 - reason
    dcgan/main.py:85: ok - reason

A finding is a true positive when it is on a line of an expected finding with one of its codes, neutral on an
``also`` line with that code, and a false positive anywhere else. Recall counts expected findings; precision
counts findings. Exit status: 0 when every expected finding is found and nothing else is, 1 otherwise.

    python tools/lint_precision.py                                  # the style fixtures
    python tools/lint_precision.py /tmp/realcode --key /tmp/realcode/KEY.md
    python tools/lint_precision.py --json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import tokenize
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__" and str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))  # this checkout's torchrepro, not another installed one

from torchrepro.lint import Diagnostic, LintConfig, LintResult, lint_paths  # noqa: E402

STYLES = ROOT / "tests" / "lint" / "lint_fixtures" / "styles"
Place = tuple[str, int]  # (path as the linter prints it, line)

_CODE = r"TR\d{3}"
_ALTERNATIVES = re.compile(rf"{_CODE}(?:\|{_CODE})*")
_MARKER = re.compile(r"#\s*(expect|also|ok)\b")
_SEGMENT = re.compile(r"#\s*(?P<kind>expect|also|ok)(?:\[(?P<label>[\w.-]+)\])?:(?P<rest>[^#]*)")
_KEY_LINE = re.compile(r"^[-*\s`]*(?P<path>[^\s:`]+):(?P<lines>\d+(?:,\d+)*)`?:\s*(?P<rest>.*)$")


class MarkerError(ValueError):
    """A malformed marker or key entry."""


@dataclass(frozen=True)
class Expected:
    """One finding the key requires: any of ``codes`` on any of ``places``."""

    codes: frozenset[str]
    places: tuple[Place, ...]
    label: str = ""

    def matches(self, d: Diagnostic) -> bool:
        return d.code in self.codes and (d.path, d.line) in self.places

    def __str__(self) -> str:
        where = ", ".join(f"{p}:{n}" for p, n in self.places)
        return f"{where}: {'|'.join(sorted(self.codes))}" + (f" [{self.label}]" if self.label else "")


@dataclass
class Key:
    """The answer key of one project."""

    expected: list[Expected] = field(default_factory=list)
    also: set[tuple[str, int, str]] = field(default_factory=set)
    ok: dict[Place, str] = field(default_factory=dict)

    def classify(self, d: Diagnostic) -> str:
        """``tp``, ``also`` (neutral) or ``fp``."""
        if any(e.matches(d) for e in self.expected):
            return "tp"
        return "also" if (d.path, d.line, d.code) in self.also else "fp"


def _codes(text: str, where: str) -> tuple[list[frozenset[str]], str]:
    """The code alternatives at the start of ``text`` (separated by spaces or commas), and the rest (a reason)."""
    found: list[frozenset[str]] = []
    rest = text.strip()
    while True:
        match = _ALTERNATIVES.match(rest)
        if not match or (match.end() < len(rest) and rest[match.end()] not in " ,\t"):
            break
        found.append(frozenset(match.group().split("|")))
        rest = rest[match.end():].lstrip(" ,\t")
    if not found:
        raise MarkerError(f"{where}: no rule code after the marker")
    return found, rest


def _comments(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment of a Python source."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def parse_markers(text: str, shown: str) -> Iterator[tuple[str, str, int, list[frozenset[str]], str]]:
    """(kind, label, line, code alternatives, reason) of each marker in the comments of one file."""
    for lineno, comment in _comments(text):
        starts = [m.start() for m in _MARKER.finditer(comment)]
        for start in starts:
            where = f"{shown}:{lineno}"
            segment = _SEGMENT.match(comment, start)
            if not segment:
                raise MarkerError(f"{where}: malformed marker {comment[start:]!r} (a colon must follow it)")
            kind, label, rest = segment.group("kind"), segment.group("label") or "", segment.group("rest")
            if kind == "ok":
                if label or not rest.strip():
                    raise MarkerError(f"{where}: '# ok: <reason>' takes a reason and no label")
                yield kind, "", lineno, [], rest.strip()
                continue
            if label and kind != "expect":
                raise MarkerError(f"{where}: only '# expect' takes a [label]")
            codes, reason = _codes(rest, where)
            yield kind, label, lineno, codes, reason


def _build(entries: Iterable[tuple[str, str, tuple[Place, ...], list[frozenset[str]], str]]) -> Key:
    """A key from (kind, label, places, codes, reason) entries; labelled expectations are merged."""
    key = Key()
    groups: dict[str, tuple[frozenset[str], list[Place]]] = {}
    for kind, label, places, codes, reason in entries:
        if kind == "ok":
            for place in places:
                key.ok[place] = reason
        elif kind == "also":
            key.also.update((path, line, code) for path, line in places for alt in codes for code in alt)
        elif label:
            if len(codes) != 1:
                raise MarkerError(f"{places[0][0]}:{places[0][1]}: a labelled expectation takes one code (or A|B)")
            known = groups.setdefault(label, (codes[0], []))
            if known[0] != codes[0]:
                raise MarkerError(f"{places[0][0]}:{places[0][1]}: [{label}] expects {'|'.join(sorted(known[0]))} "
                                f"elsewhere")
            known[1].extend(places)
        else:
            key.expected.extend(Expected(alt, places) for alt in codes)
    key.expected.extend(Expected(codes, tuple(places), label) for label, (codes, places) in groups.items())
    for e in key.expected:
        for place in e.places:
            if place in key.ok:
                raise MarkerError(f"{place[0]}:{place[1]}: marked both expect and ok")
    return key


def project_files(project: Path) -> list[tuple[str, Path]]:
    """(path as the linter prints it from the project's parent, file) of each Python file of a project."""
    if project.is_file():
        return [(project.name, project)]
    return [(f"{project.name}/{p.relative_to(project).as_posix()}", p) for p in sorted(project.rglob("*.py"))]


def read_inline_key(project: Path) -> Key:
    """The key written as markers in the comments of a project's files."""
    entries = []
    for shown, path in project_files(project):
        for kind, label, line, codes, reason in parse_markers(path.read_text(encoding="utf-8"), shown):
            entries.append((kind, label, ((shown, line),), codes, reason))
    return _build(entries)


def read_key_file(text: str) -> dict[str, Key]:
    """Keys from a key file, by project (the first component of each path)."""
    entries: dict[str, list] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        match = _KEY_LINE.match(raw)
        if not match:
            continue
        path, rest = match.group("path"), match.group("rest").strip()
        places = tuple((path, int(n)) for n in match.group("lines").split(","))
        word, _, tail = rest.partition(" ")
        where = f"key line {number}"
        if word in ("ok", "ok:"):
            kind, label, codes, reason = "ok", "", [], tail.lstrip("-\u2014: ").strip()
        elif word in ("also", "also:"):
            kind, label = "also", ""
            codes, reason = _codes(tail, where)
        else:
            kind = "expect"
            codes, reason = _codes(rest, where)
            label = f"{path}:{match.group('lines')}" if len(places) > 1 else ""
            if label and len(codes) != 1:
                raise MarkerError(f"{where}: several lines take one code (or A|B)")
        entries.setdefault(path.split("/", 1)[0], []).append((kind, label, places, codes, reason))
    return {project: _build(items) for project, items in entries.items()}


@contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def lint_project(project: Path) -> LintResult:
    """Lint one project with every rule, from its parent directory (so paths read ``project/file.py``)."""
    with _cwd(project.parent):
        return lint_paths([project.name], LintConfig(select=("ALL",), base=project.parent))


@dataclass
class Score:
    """How the findings of one project compare with its key."""

    project: str
    expected: int
    found: int
    true_positives: int
    false_positives: list[Diagnostic]
    missed: list[Expected]
    neutral: int

    @property
    def precision(self) -> float | None:
        flagged = self.true_positives + len(self.false_positives)
        return self.true_positives / flagged if flagged else None

    @property
    def recall(self) -> float | None:
        return (self.expected - len(self.missed)) / self.expected if self.expected else None

    def as_dict(self) -> dict[str, object]:
        return {"project": self.project, "expected": self.expected, "found": self.found,
                "true_positives": self.true_positives, "false_positives": len(self.false_positives),
                "false_negatives": len(self.missed), "neutral": self.neutral, "precision": self.precision,
                "recall": self.recall,
                "false_positive_findings": [f"{d.path}:{d.line}:{d.column}: {d.code} {d.message}"
                                            for d in self.false_positives],
                "missed_findings": [str(e) for e in self.missed]}

    def problems(self) -> str:
        """The false positives and misses, one a line (empty when there are none)."""
        lines = [f"false positive: {d.path}:{d.line}:{d.column}: {d.code} {d.message}" for d in self.false_positives]
        lines += [f"missed: {e}" for e in self.missed]
        return "\n".join(lines)


def score(project: str, key: Key, diagnostics: Sequence[Diagnostic]) -> Score:
    kinds = [key.classify(d) for d in diagnostics]
    missed = [e for e in key.expected if not any(e.matches(d) for d in diagnostics)]
    return Score(project, len(key.expected), len(diagnostics), kinds.count("tp"),
                 [d for d, kind in zip(diagnostics, kinds) if kind == "fp"], missed, kinds.count("also"))


def total(scores: Sequence[Score]) -> Score:
    return Score("total", sum(s.expected for s in scores), sum(s.found for s in scores),
                 sum(s.true_positives for s in scores), [d for s in scores for d in s.false_positives],
                 [e for s in scores for e in s.missed], sum(s.neutral for s in scores))


def projects(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir()
                  if (p.is_dir() and not p.name.startswith((".", "__")) and any(p.rglob("*.py")))
                  or (p.is_file() and p.suffix == ".py"))


def measure(root: Path, key_file: Path | None = None) -> list[Score]:
    """A score per project of ``root``, with the inline key or the one in ``key_file``."""
    keys = read_key_file(key_file.read_text(encoding="utf-8")) if key_file else {}
    scores = []
    for project in projects(root):
        key = keys.get(project.name, Key()) if key_file else read_inline_key(project)
        scores.append(score(project.name, key, lint_project(project).diagnostics))
    return scores


def table(scores: Sequence[Score]) -> str:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    rows = [*scores, total(scores)]
    width = max(len("project"), *(len(s.project) for s in rows))
    head = f"{'project':<{width}}  expected  found   TP   FP   FN  also  precision  recall"
    lines = [head, "-" * len(head)]
    for s in rows:
        if s.project == "total":
            lines.append("-" * len(head))
        lines.append(f"{s.project:<{width}}  {s.expected:8d}  {s.found:5d}  {s.true_positives:3d}  "
                     f"{len(s.false_positives):3d}  {len(s.missed):3d}  {s.neutral:4d}  {pct(s.precision):>9}  "
                     f"{pct(s.recall):>6}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=STYLES,
                        help="directory of projects (default: %(default)s)")
    parser.add_argument("--key", type=Path, help="a key file instead of the markers in the files")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("-q", "--quiet", action="store_true", help="the table only, not the problems")
    args = parser.parse_args(argv)
    scores = measure(args.root.resolve(), args.key.resolve() if args.key else None)
    overall = total(scores)
    if args.json:
        print(json.dumps({"root": str(args.root), "projects": [s.to_json() for s in scores],
                          "total": overall.to_json()}, indent=2))
    else:
        print(table(scores))
        if not args.quiet and overall.problems():
            print()
            print(overall.problems())
    return 0 if not overall.false_positives and not overall.missed else 1


if __name__ == "__main__":
    sys.exit(main())
