"""Gitignore patterns as regular expressions, matched the way git matches them (its ``wildmatch``).

``*`` and ``?`` do not match ``/``; ``**/``, ``/**/`` and a trailing ``/**`` match across directories; ``[...]``
is a bracket expression (``!`` or ``^`` negates, ``a-z`` ranges, ``[:alpha:]`` classes, ``\\`` escapes), which
never matches ``/``; ``\\`` escapes any character. Where git accepts a pattern but it does not do what it seems
to, the pattern does what git does and :attr:`Pattern.problem` says why: a reversed range (``[z-a]`` matches only
``z``), an unclosed ``[``, an unknown class or a trailing ``\\`` (the pattern matches nothing). A ``.gitignore``
is read as git reads it; the linter's own configuration refuses such patterns (``config.check_patterns``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NEVER = "(?!)"  # a regular expression that matches nothing
# git's character classes (ASCII, as wildmatch's ctype macros), as members of a regular-expression class.
CLASSES = {
    "alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9",
    "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~", "space": " \\t\\n\\r",
    "upper": "A-Z", "xdigit": "0-9A-Fa-f",
}
UNCLOSED = ("the '[' is never closed, so the pattern matches nothing; close it with ']', or write '\\[' for a literal "
            "'['")
_SIMPLE = {"*": "[^/]*", "?": "[^/]"}  # neither matches "/"
_ONLY = {False: "matches only", True: "excludes only"}  # what a reversed range leaves of a bracket, by negation
BACKSLASH = "it ends with a lone '\\', so it matches nothing; remove it, or write '\\\\' for a literal backslash"


class _NoMatch(Exception):
    """The pattern can never match (git's ``WM_ABORT_ALL``); the message says why."""


@dataclass(frozen=True)
class Pattern:
    """One gitignore line: its regular expression (relative paths, ``/``-separated), ``!`` and trailing ``/``;
    ``problem`` says why it matches less than it seems to (None when it is fine)."""

    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    problem: str | None = None

    def matches(self, rel: str, is_dir: bool) -> bool:
        return (is_dir or not self.dir_only) and self.regex.match(rel) is not None


def compile_pattern(line: str) -> Pattern | None:
    """A gitignore line as a :class:`Pattern` (None for blank lines and comments)."""
    line = line.rstrip("\r\n")
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    elif line.startswith(("\\#", "\\!")):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    prefix = "^" if anchored else "^(?:.*/)?"
    problems: list[str] = []
    try:
        regex = prefix + _translate(line, problems) + "$"
    except _NoMatch as exc:
        regex, problems = NEVER, [str(exc)]
    return Pattern(re.compile(regex, re.DOTALL), negate, dir_only, problems[0] if problems else None)


def _translate(glob: str, problems: list[str]) -> str:
    """The regular expression of a glob; reversed ranges are noted in ``problems``."""
    out = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if glob.startswith("**/", i) and (i == 0 or glob[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i) and i + 2 == n and (i == 0 or glob[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif c in _SIMPLE:
            out.append(_SIMPLE[c])
            i += 1
        elif c == "[":
            regex, i = _bracket(glob, i + 1, problems)
            out.append(regex)
        elif c == "\\":
            if i + 1 == n:
                raise _NoMatch(BACKSLASH)
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _bracket(glob: str, i: int, problems: list[str]) -> tuple[str, int]:
    """The regular expression of the bracket expression whose body starts at ``glob[i]`` (just after its ``[``),
    and the index after its ``]``. Follows git's wildmatch: a ``]`` first in the body is a member, a ``-`` that
    cannot make a range is a member, a reversed range adds nothing (its first character is already a member)."""
    n = len(glob)
    negate = glob[i:i + 1] in ("!", "^")
    i += negate
    members: list[str] = []
    prev = ""  # the last single character, which a following "-x" turns into a range
    first = True
    while True:
        if i >= n:
            raise _NoMatch(UNCLOSED)
        c = glob[i]
        if c == "]" and not first:
            break
        first = False
        if c == "\\":
            i += 1
            if i >= n:
                raise _NoMatch(UNCLOSED)
            prev = glob[i]
            members.append(re.escape(prev))
        elif c == "-" and prev and i + 1 < n and glob[i + 1] != "]":
            i, high = _range_end(glob, i + 1)
            if prev <= high:
                members.append(f"{re.escape(prev)}-{re.escape(high)}")
            elif not problems:
                problems.append(f"the range {prev}-{high} is reversed ({prev!r} sorts after {high!r}), so it "
                                f"{_ONLY[negate]} {prev!r}; write the range low to high: [{high}-{prev}]")
            prev = ""
        elif c == "[" and glob[i + 1:i + 2] == ":" and (end := _class_end(glob, i)) is not None:
            members.append(_class(glob[i + 2:end - 1]))
            i, prev = end, ""
        else:
            prev = c
            members.append(re.escape(c))
        i += 1
    body = "".join(members)
    return "(?!/)" + (f"[^{body}]" if negate else f"[{body}]"), i + 1


def _range_end(glob: str, i: int) -> tuple[int, str]:
    """The index and character that end a range at ``glob[i]`` (which may be escaped)."""
    if glob[i] == "\\":
        if i + 1 >= len(glob):
            raise _NoMatch(UNCLOSED)
        i += 1
    return i, glob[i]


def _class_end(glob: str, i: int) -> int | None:
    """For ``[:name:]`` at ``glob[i]``: the index of its ``]``; None when there is no ``:]`` (the ``[`` is then a
    member, as in git)."""
    end = glob.find("]", i + 2)
    if end < 0:
        raise _NoMatch(UNCLOSED)
    return end if end - 1 >= i + 2 and glob[end - 1] == ":" else None


def _class(name: str) -> str:
    if name not in CLASSES:
        raise _NoMatch(f"[:{name}:] is not a character class, so the pattern matches nothing; the classes are "
                       + ", ".join(f"[:{known}:]" for known in CLASSES))
    return CLASSES[name]
