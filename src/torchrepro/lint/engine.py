"""The engine: read and parse files, run the selected rules, apply suppressions, collect diagnostics.

Suppress a finding on its line (the first or last line of the flagged statement) with a comment::

    loader = DataLoader(ds, shuffle=True)  # torchrepro: noqa: TR301
    x = f()  # torchrepro: noqa            (every rule on this line)
"""

from __future__ import annotations

import ast
import contextlib
import gc
import io
import os
import re
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .config import LintConfig
from .files import DEFAULT_EXCLUDES, Excludes, discover
from .flow import Walker
from .globs import compile_pattern
from .module import Module, source_lines
from .project import Project, SourceProblem, read_module
from .reading import Unreadable, read_regular
from .rule import Context, Diagnostic, Rule
from .rules import RULES

_NOQA = re.compile(r"#\s*torchrepro\s*:\s*noqa\b(?:\s*:\s*(?P<codes>[A-Za-z]+\d*(?:[\s,]+[A-Za-z]+\d+)*))?",
                   re.IGNORECASE)
_ALL = frozenset({"ALL"})
_INSTANCES: dict[str, Rule] = {code: rule() for code, rule in RULES.items()}
MAX_SCANNED_FILES = 5000


@dataclass
class LintResult:
    """The diagnostics of one run (sorted by path, line, column, code) and the files checked."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.diagnostics else 0


def suppressions(text: str) -> dict[int, frozenset[str]]:
    """Line -> codes suppressed on it by ``# torchrepro: noqa[: CODES]`` comments (``{"ALL"}`` for all)."""
    if "noqa" not in text.lower():
        return {}
    out: dict[int, frozenset[str]] = {}
    if "\r" in text:  # a lone \r ends a line for ast but not for io.StringIO's readline
        text = "\n".join(source_lines(text))
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return {}
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            match = _NOQA.search(tok.string)
            if match:
                codes = match.group("codes")
                out[tok.start[0]] = (frozenset(c.upper() for c in re.split(r"[\s,]+", codes) if c)
                                     if codes else _ALL)
    return out


class Engine:
    """Lints a set of files together, so that programs and the modules they import see each other."""

    def __init__(self, config: LintConfig | None = None) -> None:
        self.config = config or LintConfig()
        self.enabled = self.config.enabled_codes()
        self.project = Project()
        self.walker = Walker(self.project)
        self._scanned: dict[Path, list[tuple[Path, str]]] = {}
        self._per_file = [(compile_pattern(pattern), frozenset(codes))
                          for pattern, codes in self.config.per_file_ignores]

    def run(self, files: Iterable[tuple[Path, str]]) -> LintResult:
        result = LintResult()
        modules: list[Module] = []
        for path, display in files:
            result.files.append(display)
            codes = self._codes_for(path)
            loaded = read_module(path, display)
            if isinstance(loaded, SourceProblem):
                if loaded.code in codes:
                    result.diagnostics.append(Diagnostic(display, loaded.line, loaded.column, loaded.code,
                                                         loaded.message, RULES[loaded.code].help))
                continue
            self.project.add(loaded)
            modules.append(loaded)
        contexts = [Context(m, self.project, self.walker, [], self._more_programs) for m in modules]
        programs = [ctx.module for ctx in contexts if ctx.is_program]
        for ctx in contexts:
            ctx.programs = programs
            result.diagnostics.extend(self.check(ctx, self._codes_for(ctx.module.path)))
        result.diagnostics.sort()
        return result

    def check(self, ctx: Context, codes: frozenset[str]) -> list[Diagnostic]:
        module = ctx.module
        out: list[Diagnostic] = []
        ctx.noqa = suppressions(module.text)
        for code in sorted(codes):
            rule = _INSTANCES[code]
            if rule.program and not ctx.is_program:
                continue
            for finding in rule.check(ctx):
                node = finding.node
                if ctx.suppressed(node, code):
                    continue
                line = getattr(node, "lineno", 1)
                end_line = getattr(node, "end_lineno", None) or line
                col = module.column(line, getattr(node, "col_offset", 0))
                end_col = module.column(end_line, getattr(node, "end_col_offset", None) or 0)
                out.append(Diagnostic(module.display, line, col, code, finding.message, finding.help or rule.help,
                                      end_line, end_col))
        return out

    def _codes_for(self, path: Path) -> frozenset[str]:
        codes = self.enabled
        if not self._per_file:
            return codes
        try:
            rel = path.absolute().relative_to(self.config.base.absolute()).as_posix()
        except ValueError:
            rel = path.name
        for pattern, ignored in self._per_file:
            if pattern is not None and pattern.matches(rel, False):
                codes = frozenset(c for c in codes if not any(c.startswith(i) or i == "ALL" for i in ignored))
        return codes

    def _more_programs(self, module: Module) -> list[Module]:
        """Programs of the module's project (not linted now) that may import it: files under the project root
        that contain ``__main__`` and the module's name. The root is scanned once, at most
        :data:`MAX_SCANNED_FILES` files."""
        root = self.project.root_of(module.path.parent.absolute())
        if root is None:
            return []
        if root not in self._scanned:
            found: list[tuple[Path, str]] = []
            ex = Excludes()
            ex.add(Path("/"), DEFAULT_EXCLUDES)
            count = 0
            for directory, dirs, names in os.walk(root):
                here = Path(directory)
                dirs[:] = sorted(d for d in dirs if not ex.excluded(here / d, True))
                for name in sorted(names):
                    if not name.endswith(".py"):
                        continue
                    count += 1
                    if count > MAX_SCANNED_FILES:
                        break
                    try:
                        text = read_regular(here / name).decode("utf-8", "replace")
                    except Unreadable:  # a FIFO, a device, too large: not a program to look at
                        continue
                    if "__main__" in text:
                        found.append((here / name, text))
            self._scanned[root] = found
        stem = module.path.stem if module.path.name != "__init__.py" else module.path.parent.name
        me = module.path.resolve()
        out = []
        for path, text in self._scanned[root]:
            if stem in text and path.resolve() != me:
                candidate = self.project.module_at(path)
                if candidate is not None and candidate.main_guard is not None \
                        and me in self.project.imported_files(candidate):
                    out.append(candidate)
        return out


def lint_paths(paths: Iterable[str], config: LintConfig | None = None) -> LintResult:
    """Lint files and directories (``*.py`` under them, minus excluded paths)."""
    config = config or LintConfig()
    with gc_paused():
        return Engine(config).run(discover(list(paths), config))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (and restore it as it was).

    Linting keeps every parsed module alive until the end, and builds hundreds of thousands of objects: each
    automatic collection walks all of them again, which took about half of lint's time on a 200-file corpus
    (``benchmarks/bench_lint.py``). Nothing that lint makes needs collecting before it returns.

    >>> import gc
    >>> with gc_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def lint_source(text: str, path: str | Path = "<string>.py", config: LintConfig | None = None) -> list[Diagnostic]:
    """Lint one module given as text (it is parsed as if it lived at ``path``)."""
    engine = Engine(config)
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        return [Diagnostic(str(path), exc.lineno or 1, exc.offset or 1, "TR001", f"syntax error: {exc.msg}",
                           RULES["TR001"].help)]
    module = Module(Path(path).absolute(), str(path), text, tree)
    engine.project.add(module)
    ctx = Context(module, engine.project, engine.walker, [], engine._more_programs)
    if ctx.is_program:
        ctx.programs = [module]
    return sorted(engine.check(ctx, engine.enabled))
