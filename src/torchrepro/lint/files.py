"""Which files to lint: ``*.py`` under the given directories, minus excluded paths.

Excluded are: the usual tool and environment directories (``.git``, ``.venv``, ``venv``, ``build``,
``site-packages``, ...), the ``exclude``/``extend-exclude`` patterns of the configuration, and — unless
``respect-gitignore = false`` — whatever the ``.gitignore`` files of the repository (and ``.git/info/exclude``)
ignore. Patterns use gitignore syntax (``*``, ``**``, ``?``, ``[abc]``, ``!negation``, trailing ``/`` for
directories, a ``/`` inside to anchor; see :mod:`.globs`). A file named on the command line is always linted
unless ``--force-exclude`` is given (as in ruff; pre-commit passes file names explicitly).

Every entry named ``*.py`` that is not a directory is passed on, FIFOs and devices included: the engine reads
only regular files (:mod:`.reading`) and reports the others (TR004), as it does a directory that cannot be
listed. Dangling symbolic links are skipped; symbolic links to directories are not followed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from .config import ConfigError, LintConfig
from .globs import Pattern, compile_pattern
from .reading import Unreadable, read_regular

DEFAULT_EXCLUDES = (
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".ipynb_checkpoints", ".mypy_cache", ".nox",
    ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache", ".svn", ".tox", ".venv", ".vscode",
    "__pypackages__", "__pycache__", "_build", "buck-out", "build", "dist", "node_modules", "site-packages", "venv",
    "*.egg-info",
)


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
    """The lines of a .gitignore as git splits them (at ``\\n`` only); none when it is not a readable file."""
    try:
        return read_regular(path).decode("utf-8", "replace").split("\n")
    except Unreadable:
        return []


def _repo_root(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        if os.path.exists(directory / ".git"):
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
        absolute = path.absolute()
        if _is_directory(arg):
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


def _is_directory(arg: str) -> bool:
    """Whether a path named on the command line is a directory (symbolic links followed). One that does not
    exist is an error; one that cannot be examined (permission denied) is a file, which the engine reports."""
    try:
        return stat.S_ISDIR(os.stat(arg).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{arg}: no such file or directory") from None
    except OSError:
        return False


def _dangling(entry: os.DirEntry[str]) -> bool:
    """Whether a directory entry is a symbolic link to nothing (such as an editor's lock file ``.#name.py``)."""
    if not entry.is_symlink():
        return False
    try:
        os.stat(entry.path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _walk(directory: Path, display: str, ex: Excludes, gitignore: bool) -> Iterator[tuple[Path, str]]:
    """The ``*.py`` files under ``directory`` that are not excluded, and every other entry named ``*.py`` that
    is not a directory (a FIFO, a device: the engine reports them); a directory that cannot be listed is yielded
    itself, to be reported. Symbolic links to directories are not followed; dangling ones are skipped."""
    if gitignore:
        lines = _read_lines(directory / ".gitignore")
        if lines:
            ex = ex.copy()
            ex.add(directory, lines)
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        yield directory, display
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
        elif entry.name.endswith(".py") and not _dangling(entry):
            yield path, shown
