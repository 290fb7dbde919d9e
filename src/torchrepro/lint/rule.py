"""The unit of the linter: a :class:`Rule` (code, documentation, check) and what a check produces."""

from __future__ import annotations

import ast
import textwrap
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

from . import knowledge as K
from .classify import classify_call, is_seed_choice, may_draw
from .events import DRAW, Summary
from .flow import Walker
from .module import Module, Scope
from .project import Project


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One finding, positioned with 1-based line and column (columns count characters)."""

    path: str
    line: int
    column: int
    code: str
    message: str
    help: str = ""
    end_line: int = 0
    end_column: int = 0

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "help": self.help, "path": self.path,
                "line": self.line, "column": self.column, "end_line": self.end_line or self.line,
                "end_column": self.end_column or self.column}

    def to_dict(self) -> dict[str, object]:
        """Deprecated: use :meth:`to_json` (the old name goes in torchrepro 0.3)."""
        warnings.warn("Diagnostic.to_dict() is deprecated, use Diagnostic.to_json()", DeprecationWarning, stacklevel=2)
        return self.to_json()


@dataclass(frozen=True)
class Finding:
    """What a check yields: the node to point at, the message, and a help line when it differs from the rule's."""

    node: ast.AST
    message: str
    help: str = ""


class Rule:
    """A rule: a stable ``code``, a kebab-case ``name``, its documentation, and :meth:`check`.

    ``what``, ``why``, ``example`` and ``instead`` are the documentation printed by ``torchrepro rule CODE``;
    ``help`` is the one-line fix printed under each finding. A rule whose ``program`` flag is set runs only on
    programs (modules with an entry point); the others run on every module.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    family: ClassVar[str]
    summary: ClassVar[str]
    what: ClassVar[str]
    why: ClassVar[str]
    example: ClassVar[str]
    instead: ClassVar[str]
    help: ClassVar[str]
    program: ClassVar[bool] = False

    def check(self, ctx: Context) -> Iterator[Finding]:
        return iter(())

    @classmethod
    def documentation(cls) -> str:
        def block(text: str) -> str:
            return textwrap.indent(textwrap.dedent(text).strip("\n"), "    ")

        return (f"{cls.code} {cls.name} ({cls.family})\n\n{cls.summary}\n\n"
                f"What it finds\n{block(cls.what)}\n\nWhy it matters\n{block(cls.why)}\n\n"
                f"Example\n{block(cls.example)}\n\nUse instead\n{block(cls.instead)}\n\nFix: {cls.help}\n")

    @classmethod
    def to_json(cls) -> dict[str, str]:
        clean = textwrap.dedent
        return {"code": cls.code, "name": cls.name, "family": cls.family, "summary": cls.summary,
                "what": clean(cls.what).strip(), "why": clean(cls.why).strip(),
                "example": clean(cls.example).strip("\n"), "instead": clean(cls.instead).strip("\n"),
                "help": cls.help}

    @classmethod
    def as_dict(cls) -> dict[str, str]:
        """Deprecated: use :meth:`to_json` (the old name goes in torchrepro 0.3)."""
        warnings.warn("Rule.as_dict() is deprecated, use Rule.to_json()", DeprecationWarning, stacklevel=2)
        return cls.to_json()


def is_suppressed(codes: frozenset[str] | None, code: str) -> bool:
    """Whether a ``# torchrepro: noqa`` comment naming ``codes`` (None: no comment) silences ``code``.

    >>> is_suppressed(frozenset({"TR2"}), "TR203"), is_suppressed(None, "TR203")
    (True, False)
    """
    return codes is not None and ("ALL" in codes or any(code.startswith(c) for c in codes))


class Context:
    """What a check sees: the module, the project around it, and facts computed once and shared by rules."""

    def __init__(self, module: Module, project: Project, walker: Walker, programs: list[Module],
                 more_programs: Callable[[Module], list[Module]] | None = None) -> None:
        self.module = module
        self.project = project
        self.walker = walker
        self.programs = programs  # every linted module that is a program
        self._more_programs = more_programs
        self.noqa: dict[int, frozenset[str]] = {}  # line -> codes its noqa comment names (set by the engine)

    def suppressed(self, node: ast.AST, code: str) -> bool:
        """Whether a noqa comment on the first or last line of ``node`` silences ``code`` (the engine's test, for
        rules that report several places in one finding)."""
        line = getattr(node, "lineno", 1)
        end = getattr(node, "end_lineno", None) or line
        return is_suppressed(self.noqa.get(line), code) or is_suppressed(self.noqa.get(end), code)

    @cached_property
    def summary(self) -> Summary:
        """Events on the path from this module's entry point (its top level)."""
        return self.walker.program(self.module)

    @cached_property
    def is_program(self) -> bool:
        """A module with ``if __name__ == "__main__":``, or a script whose top level seeds or draws."""
        if self.module.main_guard is not None:
            return True
        return any(event.kind in ("seed", "draw", "model") for event in self.walker.local(self.module).events)

    @cached_property
    def dataset_scopes(self) -> frozenset[int]:
        """ids of the scopes inside Dataset subclasses (their randomness runs in worker processes)."""
        out = set()
        for scope in self.module.all_scopes:
            if scope.kind == "class" and scope.owner is not None and self.project.derives_from(
                    scope.owner, K.DATASET_BASES):
                out.add(id(scope))
        return frozenset(out)

    def in_dataset(self, scope: Scope) -> bool:
        datasets = self.dataset_scopes
        while scope is not None:
            if id(scope) in datasets:
                return True
            scope = scope.parent
        return False

    @cached_property
    def draws(self) -> dict[str, list[tuple[ast.Call, str, Scope]]]:
        """Every call in this module that draws from a global generator, by library (outside Dataset classes)."""
        out: dict[str, list[tuple[ast.Call, str, Scope]]] = {lib: [] for lib in K.LIBS}
        module = self.module
        names = [q for q in module.index[0] if may_draw(q)]
        for call, scope in module.calls_to(names, methods=(*K.TORCH_INPLACE_DRAWS, *K.SAMPLING_METHODS)):
            for kind, lib, detail in classify_call(module, scope, call, module.qual(call.func)):
                if kind == DRAW and lib is not None and not self.in_dataset(scope) and not is_seed_choice(module, call):
                    out[lib].append((call, detail, scope))
        return out

    @cached_property
    def _importers(self) -> list[Module]:
        me = self.module.path.resolve()
        found = [p for p in self.programs if p is not self.module and me in self.project.imported_files(p)]
        if not found and self._more_programs is not None:
            found = self._more_programs(self.module)
        return found

    def importing_programs(self) -> list[Module]:
        """The programs that import this module (directly or through other project modules): the linted ones,
        else the programs found in the module's project."""
        return self._importers

