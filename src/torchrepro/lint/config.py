"""Configuration: which rules run on which files, from ``[tool.torchrepro.lint]`` in ``pyproject.toml`` and the
command line.

Rule selection works like ruff's: ``select``/``ignore`` take codes or prefixes (``TR1`` is the seeding family,
``ALL`` everything); for each rule the longest matching prefix wins, and ``ignore`` wins a tie.

Reading TOML needs ``tomllib`` (Python 3.11+) or the ``tomli`` package. On Python 3.10 without ``tomli`` a
``pyproject.toml`` without a ``[tool.torchrepro.lint]`` section is fine (it is never parsed); one with the
section is a configuration error (exit 2) that says to install ``tomli`` or pass ``--isolated``.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

from .globs import compile_pattern
from .reading import Unreadable, read_regular
from .rules import RULES

DEFAULT_SELECT = ("TR",)
# A pyproject.toml is parsed only when it may configure torchrepro: a [tool.torchrepro...] or [[tool.torchrepro...]]
# header, a dotted key tool.torchrepro... = ..., or a torchrepro... = ... key in a [tool] table.
_SECTION = re.compile(r"""(?mx)
    ^[ \t]*(?:\[[ \t]*){0,2}tool[ \t]*\.[ \t]*["']?torchrepro["']?[ \t]*[\].=]
  | ^[ \t]*\[[ \t]*tool[ \t]*\][^\n]*\n(?:(?![ \t]*\[)[^\n]*\n)*?[ \t]*["']?torchrepro["']?[ \t]*[.=]
""")
_LINT = ("tool", "torchrepro", "lint")
# TOML's names for the values a TOML reader returns (bool before int: a bool is an int).
_TOML_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"), (list, "an array"),
    (datetime.datetime, "a date-time"), (datetime.date, "a date"), (datetime.time, "a time"),
)
_KEYS = ("select", "ignore", "extend-select", "exclude", "extend-exclude", "per-file-ignores", "respect-gitignore",
         "force-exclude")


class ConfigError(Exception):
    """A configuration or command line the linter cannot use (exit 2). The message says what to change."""


@dataclass(frozen=True)
class LintConfig:
    """What to lint and with which rules. Paths in ``exclude`` and ``per_file_ignores`` are gitignore-style
    patterns relative to ``base`` (the directory of the ``pyproject.toml``, else the current directory)."""

    select: tuple[str, ...] = DEFAULT_SELECT
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    extend_exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    respect_gitignore: bool = True
    force_exclude: bool = False
    base: Path = field(default_factory=Path.cwd)
    source: str = "defaults"

    def __post_init__(self) -> None:
        for what, selectors in (("select", self.select), ("ignore", self.ignore),
                                ("extend-select", self.extend_select)):
            check_selectors(selectors, f"{what} ({self.source})")
        for pattern, codes in self.per_file_ignores:
            check_selectors(codes, f"per-file-ignores[{pattern!r}] ({self.source})")
        for what, patterns in (("exclude", self.exclude), ("extend-exclude", self.extend_exclude),
                               ("per-file-ignores", [pattern for pattern, _ in self.per_file_ignores])):
            check_patterns(patterns, f"{what} ({self.source})")

    def enabled_codes(self) -> frozenset[str]:
        return frozenset(code for code in RULES if _enabled(code, (*self.select, *self.extend_select), self.ignore))

    def with_cli(self, *, select: Iterable[str] | None = None, ignore: Iterable[str] = (),
                 extend_select: Iterable[str] = (), exclude: Iterable[str] | None = None,
                 extend_exclude: Iterable[str] = (), force_exclude: bool = False) -> LintConfig:
        """This configuration with command-line options applied. ``--select`` starts the selection afresh (the
        configured select, extend-select and ignore no longer apply); ``--exclude`` replaces the configured
        exclude; the other options add to the configuration."""
        fresh = select is not None
        exclude = None if exclude is None else tuple(exclude)
        extend_exclude = tuple(extend_exclude)
        check_patterns(exclude or (), "--exclude (command line)")
        check_patterns(extend_exclude, "--extend-exclude (command line)")
        return replace(self,
                       select=tuple(_norm(select)) if fresh else self.select,
                       ignore=(*(() if fresh else self.ignore), *_norm(ignore)),
                       extend_select=(*(() if fresh else self.extend_select), *_norm(extend_select)),
                       exclude=exclude if exclude is not None else self.exclude,
                       extend_exclude=(*self.extend_exclude, *extend_exclude),
                       force_exclude=self.force_exclude or force_exclude,
                       source=self.source if select is None and not ignore and not extend_select
                       else "command line")


def _norm(selectors: Iterable[str]) -> list[str]:
    return [s.strip().upper() for s in selectors if s.strip()]


def check_selectors(selectors: Iterable[str], where: str) -> None:
    for selector in selectors:
        sel = selector.upper()
        if sel != "ALL" and not any(code.startswith(sel) for code in RULES):
            raise ConfigError(f"unknown rule code or prefix {selector!r} in {where}; codes are "
                              f"{min(RULES)}..{max(RULES)} (see `torchrepro rule`), prefixes such as TR1 select "
                              "a family, ALL selects every rule")


def check_patterns(patterns: Iterable[str], where: str) -> None:
    """Refuse a pattern that git would accept but that matches less than it seems to (a reversed range, an
    unclosed ``[``, an unknown class, a trailing backslash): in the linter's own configuration it is a mistake."""
    for pattern in patterns:
        compiled = compile_pattern(pattern)
        if compiled is not None and compiled.problem:
            raise ConfigError(f"invalid pattern '{pattern}' in {where}: {compiled.problem}")


def _match_len(code: str, selectors: Iterable[str]) -> int:
    best = -1
    for sel in selectors:
        sel = sel.upper()
        if sel == "ALL":
            best = max(best, 0)
        elif code.startswith(sel):
            best = max(best, len(sel))
    return best


def _enabled(code: str, select: Iterable[str], ignore: Iterable[str]) -> bool:
    chosen = _match_len(code, select)
    return chosen >= 0 and chosen > _match_len(code, ignore)


def _toml() -> ModuleType | None:
    try:
        import tomllib
        return tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli  # type: ignore[import-not-found]
            return tomli
        except ImportError:
            return None


def find_config(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` that has a ``[tool.torchrepro...]`` section."""
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        try:
            text = read_regular(candidate).decode("utf-8", "replace")
        except Unreadable:  # none here (or not a readable regular file)
            continue
        if _SECTION.search(text):
            return candidate
    return None


def load_config(path: Path | None = None, *, start: Path | None = None, toml: ModuleType | None | bool = True
                ) -> LintConfig:
    """The configuration in ``path`` (or found from ``start``, default the current directory); the defaults
    when there is none. ``toml`` overrides the TOML reader (for tests of Python 3.10 without tomli)."""
    start = (start or Path.cwd()).absolute()
    if path is None:
        path = find_config(start)
        if path is None:
            return LintConfig(base=start)
    path = path.absolute()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the configuration: {exc}") from None
    if not _SECTION.search(text):
        return LintConfig(base=path.parent, source=str(path))
    reader = _toml() if toml is True else toml
    if reader is None:
        raise ConfigError(f"{path} has a [tool.torchrepro.lint] section, but reading TOML on this Python needs the "
                          "'tomli' package (Python 3.11+ has tomllib built in); run `pip install tomli`, or pass "
                          "--isolated to ignore the file and use command-line options only")
    try:
        data = reader.loads(text)
    except Exception as exc:  # tomllib.TOMLDecodeError, tomli.TOMLDecodeError
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    top = _table_at(data, _LINT[:2], path)
    if top is not None:
        _check_misplaced(top, path)
    section = _table_at(data, _LINT, path)
    if section is None:
        return LintConfig(base=path.parent, source=str(path))
    return config_from_table(section, base=path.parent, source=f"{path} [tool.torchrepro.lint]")


def _table_at(data: Mapping[str, object], keys: tuple[str, ...], path: Path) -> Mapping[str, object] | None:
    """The table at ``keys`` (``tool.torchrepro.lint``) of a parsed file; None when absent. A value on the way
    that is not a table (``[[tool.torchrepro.lint]]``, ``tool.torchrepro = 1``) is a :class:`ConfigError`."""
    table = data
    for depth, key in enumerate(keys, 1):
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: {_not_a_table('.'.join(keys[:depth]), value)}")
        table = value
    return table


def _not_a_table(name: str, value: object) -> str:
    what = _toml_type(value)
    if what == "an array of tables":
        return (f"[{name}] must be a table, got an array of tables ([[{name}]]); write the header with single "
                f"brackets: [{name}]")
    return (f"[{name}] must be a table, got {what} ({value!r}); write the settings under a "
            "[tool.torchrepro.lint] header, one `key = value` per line")


def _toml_type(value: object) -> str:
    """The TOML type of a parsed value, in words: ``an integer``, ``an array of tables``, ..."""
    if isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
        return "an array of tables"
    return next((name for cls, name in _TOML_TYPES if isinstance(value, cls)), type(value).__name__)


def _check_misplaced(top: Mapping[str, object], path: Path) -> None:
    """Lint settings written directly in [tool.torchrepro] (which would be ignored) are an error."""
    misplaced = sorted(set(top) & set(_KEYS))
    if misplaced:
        one = len(misplaced) == 1
        raise ConfigError(f"{path}: [tool.torchrepro] has {', '.join(misplaced)}, "
                          f"{'a setting' if one else 'settings'} of [tool.torchrepro.lint]; move "
                          f"{'it' if one else 'them'} under a [tool.torchrepro.lint] header")


def config_from_table(table: Mapping[str, object], *, base: Path, source: str) -> LintConfig:
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(_KEYS)}")

    def strings(key: str) -> tuple[str, ...]:
        value = table.get(key, ())
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{source}: {key} must be a list of strings, got {value!r}")
        return tuple(value)

    def flag(key: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
        return value

    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, Mapping):
        raise ConfigError(f"{source}: per-file-ignores must be a table of pattern = [codes], got {pfi!r}")
    per_file: list[tuple[str, tuple[str, ...]]] = []
    for pattern, codes in pfi.items():
        if not isinstance(codes, (list, tuple)) or not all(isinstance(c, str) for c in codes):
            raise ConfigError(f"{source}: per-file-ignores[{pattern!r}] must be a list of codes, got {codes!r}")
        per_file.append((pattern, tuple(c.upper() for c in codes)))
    return LintConfig(
        select=tuple(s.upper() for s in strings("select")) if "select" in table else DEFAULT_SELECT,
        ignore=tuple(s.upper() for s in strings("ignore")),
        extend_select=tuple(s.upper() for s in strings("extend-select")),
        exclude=strings("exclude"), extend_exclude=strings("extend-exclude"), per_file_ignores=tuple(per_file),
        respect_gitignore=flag("respect-gitignore", True), force_exclude=flag("force-exclude", False),
        base=base, source=source)
