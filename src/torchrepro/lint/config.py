"""Configuration: which rules run on which files, from ``[tool.torchrepro.lint]`` in ``pyproject.toml`` and the
command line.

Rule selection works like ruff's: ``select``/``ignore`` take codes or prefixes (``TR1`` is the seeding family,
``ALL`` everything); for each rule the longest matching prefix wins, and ``ignore`` wins a tie.

Reading TOML needs ``tomllib`` (Python 3.11+) or the ``tomli`` package. On Python 3.10 without ``tomli`` a
``pyproject.toml`` without a ``[tool.torchrepro.lint]`` section is fine (it is never parsed); one with the
section is a configuration error (exit 2) that says to install ``tomli`` or pass ``--isolated``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

from .rules import RULES

DEFAULT_SELECT = ("TR",)
_SECTION = re.compile(r"(?m)^\s*(\[\s*)?tool\s*\.\s*[\"']?torchrepro[\"']?\s*(\]|\.)")
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

    def enabled_codes(self) -> frozenset[str]:
        return frozenset(code for code in RULES if _enabled(code, (*self.select, *self.extend_select), self.ignore))

    def with_cli(self, *, select: Iterable[str] | None = None, ignore: Iterable[str] = (),
                 extend_select: Iterable[str] = (), exclude: Iterable[str] | None = None,
                 extend_exclude: Iterable[str] = (), force_exclude: bool = False) -> LintConfig:
        """This configuration with command-line options applied. ``--select`` starts the selection afresh (the
        configured select, extend-select and ignore no longer apply); ``--exclude`` replaces the configured
        exclude; the other options add to the configuration."""
        fresh = select is not None
        return replace(self,
                       select=tuple(_norm(select)) if fresh else self.select,
                       ignore=(*(() if fresh else self.ignore), *_norm(ignore)),
                       extend_select=(*(() if fresh else self.extend_select), *_norm(extend_select)),
                       exclude=tuple(exclude) if exclude is not None else self.exclude,
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
        if candidate.is_file():
            try:
                text = candidate.read_text(encoding="utf-8", errors="replace")
            except OSError:
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
    section = data.get("tool", {}).get("torchrepro", {}).get("lint")
    if section is None:
        return LintConfig(base=path.parent, source=str(path))
    if not isinstance(section, Mapping):
        raise ConfigError(f"{path}: [tool.torchrepro.lint] must be a table, got {type(section).__name__}")
    return config_from_table(section, base=path.parent, source=f"{path} [tool.torchrepro.lint]")


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
