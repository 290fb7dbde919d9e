"""Which files to lint: ``*.py`` under the given directories, minus excluded paths.

Excluded are: the usual tool and environment directories (``.git``, ``.venv``, ``venv``, ``build``,
``site-packages``, ...), the ``exclude``/``extend-exclude`` patterns of the configuration, and — unless
``respect-gitignore = false`` — whatever the ``.gitignore`` files of the repository (and ``.git/info/exclude``)
ignore. Patterns use gitignore syntax (``*``, ``**``, ``?``, ``[abc]``, ``!negation``, trailing ``/`` for
directories, a ``/`` inside to anchor). A file named on the command line is always linted unless
``--force-exclude`` is given (as in ruff; pre-commit passes file names explicitly).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError, LintConfig

DEFAULT_EXCLUDES = (
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".ipynb_checkpoints", ".mypy_cache", ".nox",
    ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache", ".svn", ".tox", ".venv", ".vscode",
    "__pypackages__", "__pycache__", "_build", "buck-out", "build", "dist", "node_modules", "site-packages", "venv",
    "*.egg-info",
)


@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        return (is_dir or not self.dir_only) and self.regex.match(rel) is not None


def _translate(glob: str) -> str:
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
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = glob.find("]", i + 2 if glob[i + 1:i + 2] in ("!", "^") else i + 1)
            if end < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = glob[i + 1:end]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


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
    return Pattern(re.compile(prefix + _translate(line) + "$", re.DOTALL), negate, dir_only)


class Excludes:
    """Layers of patterns, each relative to a base directory; later layers (deeper .gitignore files) win."""

    def __init__(self) -> None:
        self.layers: list[tuple[Path, list[Pattern]]] = []

    def add(self, base: Path, lines: Iterable[str]) -> None:
        patterns = [p for p in map(compile_pattern, lines) if p is not None]
        if patterns:
            self.layers.append((base, patterns))

    def excluded(self, path: Path, is_dir: bool) -> bool:
        result = False
        for base, patterns in self.layers:
            try:
                rel = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if rel == ".":
                continue
            for pattern in patterns:
                if pattern.matches(rel, is_dir):
                    result = not pattern.negate
        return result

    def copy(self) -> Excludes:
        new = Excludes()
        new.layers = list(self.layers)
        return new


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _repo_root(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        if (directory / ".git").exists():
            return directory
    return None


def base_excludes(config: LintConfig, start: Path) -> Excludes:
    """The exclusions in force at directory ``start``: defaults, configuration, and the .gitignore files of
    the repository from its root down to ``start``."""
    ex = Excludes()
    ex.add(Path("/"), DEFAULT_EXCLUDES)
    ex.add(config.base.absolute(), (*config.exclude, *config.extend_exclude))
    if config.respect_gitignore:
        root = _repo_root(start)
        if root is not None:
            ex.add(root, _read_lines(root / ".git" / "info" / "exclude"))
            chain = [start, *start.parents]
            for directory in reversed(chain[:chain.index(root) + 1]):
                ex.add(directory, _read_lines(directory / ".gitignore"))
    return ex


def discover(paths: Iterable[str], config: LintConfig) -> list[tuple[Path, str]]:
    """``(path, display name)`` of every file to lint, in a stable order, each once."""
    out: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for arg in paths:
        path = Path(arg)
        if not path.exists():
            raise ConfigError(f"{arg}: no such file or directory")
        absolute = path.absolute()
        if path.is_dir():
            ex = base_excludes(config, absolute.parent)
            found = _walk(absolute, os.path.normpath(arg), ex, config.respect_gitignore)
        else:
            if config.force_exclude and base_excludes(config, absolute.parent).excluded(absolute, False):
                continue
            found = iter([(absolute, os.path.normpath(arg))])
        for file, display in found:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                out.append((file, display))
    return out


def _walk(directory: Path, display: str, ex: Excludes, gitignore: bool) -> Iterator[tuple[Path, str]]:
    if gitignore:
        lines = _read_lines(directory / ".gitignore")
        if lines:
            ex = ex.copy()
            ex.add(directory, lines)
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        path = directory / entry.name
        shown = os.path.join(display, entry.name) if display != "." else entry.name
        try:
            is_dir = entry.is_dir()
        except OSError:
            continue
        if ex.excluded(path, is_dir):
            continue
        if is_dir:
            if not entry.is_symlink():
                yield from _walk(path, shown, ex, gitignore)
        elif entry.name.endswith(".py") and entry.is_file():
            yield path, shown
