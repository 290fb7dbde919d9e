"""One parsed source file and the facts every rule needs, gathered in a single pass over its syntax tree.

A :class:`Module` knows its imports (local name -> qualified name), its scopes (module, functions, lambdas,
classes) with the calls and stores of each in execution order, and the parent of every node. Rules and the
program walker (:mod:`.flow`) read these facts; nothing here knows about any rule.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from .knowledge import normalise

_LEAVES = frozenset({ast.Constant, ast.Name, ast.Load, ast.Store, ast.Del, ast.Pass, ast.Break, ast.Continue,
                     ast.alias, ast.Global, ast.Nonlocal})
# Fields that never hold nodes, and per node class the fields that may.
_SCALAR_FIELDS = frozenset({"ctx", "id", "attr", "arg", "name", "kind", "type_comment", "module", "level",
                            "lineno", "is_async", "conversion", "simple", "asname", "names", "tag"})
_FIELDS: dict[type, tuple[str, ...]] = {}
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_NESTED = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef})
_LINE_END = re.compile(r"\r\n?|\n")


def source_lines(text: str) -> list[str]:
    """The lines of source ``text`` as Python's tokenizer (and so ``ast``) numbers them: ended by ``\\n``,
    ``\\r\\n`` or a lone ``\\r`` only, not by the form feeds, U+2028, NEL and the other characters where
    :meth:`str.splitlines` also splits (inside strings and comments, or as whitespace)."""
    return _LINE_END.split(text) if "\r" in text else text.split("\n")


class Scope:
    """A module body, function, lambda or class body.

    ``items`` holds, in execution order, the calls (after their arguments), the assignments (after their
    values) and the imports of this scope, not those of nested functions. ``assigns`` maps a local name to the
    values assigned to it, in order.
    """

    __slots__ = ("node", "kind", "parent", "owner", "module", "items", "defs", "classes", "assigns")

    def __init__(self, node: ast.AST, kind: str, parent: Scope | None, module: Module,
                 owner: ClassInfo | None = None) -> None:
        self.node, self.kind, self.parent, self.module, self.owner = node, kind, parent, module, owner
        self.items: list[ast.AST] = []
        self.defs: dict[str, Scope] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.assigns: dict[str, list[ast.expr]] = {}

    @property
    def name(self) -> str:
        return getattr(self.node, "name", "<lambda>" if self.kind == "lambda" else "<module>")

    def values_of(self, name: str) -> list[ast.expr]:
        """The values assigned to local ``name`` in the nearest scope (this one or an enclosing one) that
        assigns it."""
        scope: Scope | None = self
        while scope is not None:
            if name in scope.assigns:
                return scope.assigns[name]
            scope = scope.parent
        return []

    def lookup_def(self, name: str) -> Scope | ClassInfo | None:
        """The function or class called ``name`` visible from this scope (enclosing scopes, then the module)."""
        scope: Scope | None = self
        while scope is not None:
            if scope.kind != "class" or scope is self:
                found = scope.defs.get(name) or scope.classes.get(name)
                if found is not None:
                    return found
            scope = scope.parent
        return None

    def __repr__(self) -> str:
        return f"<Scope {self.kind} {self.name} of {self.module.display}>"


class ClassInfo:
    __slots__ = ("name", "node", "scope", "module")

    def __init__(self, node: ast.ClassDef, scope: Scope, module: Module) -> None:
        self.name, self.node, self.scope, self.module = node.name, node, scope, module

    @property
    def methods(self) -> dict[str, Scope]:
        return self.scope.defs

    def __repr__(self) -> str:
        return f"<ClassInfo {self.name} of {self.module.display}>"


class Module:
    """A parsed file: ``path`` on disk, ``display`` as reported, and the facts of :class:`Scope`."""

    def __init__(self, path: Path, display: str, text: str, tree: ast.Module) -> None:
        self.path, self.display, self.text, self.tree = path, display, text, tree
        self.imports: dict[str, str] = {}
        self.parents: dict[ast.AST, ast.AST] = {}
        self.calls: list[tuple[ast.Call, Scope]] = []
        self.stores: list[tuple[ast.AST, Scope]] = []
        self.loops: list[tuple[ast.AST, Scope]] = []
        self.set_literals: list[tuple[ast.Set, Scope]] = []
        self.all_scopes: list[Scope] = []
        self.scope_of: dict[ast.AST, Scope] = {}  # function, lambda and class nodes -> their scopes
        self.main_guard: ast.If | None = None
        self._lines: list[str] | None = None
        self._quals: dict[ast.AST, str | None] = {}
        self._index: tuple[dict[str, list[tuple[ast.Call, Scope]]], ...] | None = None
        self.top = Scope(tree, "module", None, self)
        self.all_scopes.append(self.top)
        _Scanner(self).body(tree.body, self.top, tree)
        for stmt in tree.body:
            if isinstance(stmt, ast.If) and _is_main_test(stmt.test):
                self.main_guard = stmt

    # -- names -----------------------------------------------------------------------------------------------
    def qual(self, expr: ast.AST) -> str | None:
        """The normalised qualified name of ``a.b.c`` when ``a`` is imported (``np.random.seed`` ->
        ``numpy.random.seed``), else None."""
        cache = self._quals
        if expr in cache:
            return cache[expr]
        name, attrs = _chain(expr)
        base = self.imports.get(name) if name else None
        if base is not None:
            if attrs:
                base = base + "." + ".".join(attrs)
            if base[0] != ".":
                base = normalise(base)
        cache[expr] = base
        return base

    def is_builtin(self, func: ast.AST, name: str) -> bool:
        """Whether ``func`` is the builtin ``name`` (not shadowed by an import or a module-level definition)."""
        return (func.__class__ is ast.Name and func.id == name and name not in self.imports
                and name not in self.top.defs and name not in self.top.classes)

    # -- calls by name ---------------------------------------------------------------------------------------
    @property
    def index(self) -> tuple[dict[str, list[tuple[ast.Call, Scope]]], ...]:
        """The calls grouped three ways: by qualified name, by method name (``x.m()``), by bare name (``f()``)."""
        if self._index is None:
            by_qual: dict[str, list[tuple[ast.Call, Scope]]] = {}
            by_attr: dict[str, list[tuple[ast.Call, Scope]]] = {}
            by_name: dict[str, list[tuple[ast.Call, Scope]]] = {}
            for entry in self.calls:
                func = entry[0].func
                qual = self.qual(func)
                if qual is not None:
                    by_qual.setdefault(qual, []).append(entry)
                if func.__class__ is ast.Attribute:
                    by_attr.setdefault(func.attr, []).append(entry)
                elif func.__class__ is ast.Name:
                    by_name.setdefault(func.id, []).append(entry)
            self._index = (by_qual, by_attr, by_name)
        return self._index

    def calls_to(self, names: Iterable[str] = (), *, methods: Iterable[str] = (),
                 bare: Iterable[str] = ()) -> list[tuple[ast.Call, Scope]]:
        """The calls of any of the qualified ``names``, ``methods`` (``x.name()`` on any receiver) or ``bare``
        names (``name()``), in source order."""
        by_qual, by_attr, by_name = self.index
        found: dict[int, tuple[ast.Call, Scope]] = {}
        for table, keys in ((by_qual, names), (by_attr, methods), (by_name, bare)):
            for key in (keys,) if isinstance(keys, str) else keys:
                for entry in table.get(key, ()):
                    found[id(entry[0])] = entry
        return sorted(found.values(), key=lambda e: (e[0].lineno, e[0].col_offset))

    # -- positions -------------------------------------------------------------------------------------------
    @property
    def lines(self) -> list[str]:
        """The lines of the source, as ``ast`` numbers them (:func:`source_lines`)."""
        if self._lines is None:
            self._lines = source_lines(self.text)
        return self._lines

    def column(self, lineno: int, col_offset: int) -> int:
        """1-based column in characters of a UTF-8 byte offset on line ``lineno``."""
        lines = self.lines
        if not 0 < lineno <= len(lines):
            return col_offset + 1
        line = lines[lineno - 1]
        if line.isascii():
            return col_offset + 1
        return len(line.encode("utf-8")[:col_offset].decode("utf-8", "replace")) + 1

    def enclosing(self, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
        parent = self.parents.get(node)
        while parent is not None and not isinstance(parent, kinds):
            parent = self.parents.get(parent)
        return parent


def _chain(expr: ast.AST) -> tuple[str | None, list[str]]:
    """``("a", ["b", "c"])`` for ``a.b.c``; ``(None, ...)`` when the chain does not start at a name."""
    attrs = []
    while expr.__class__ is ast.Attribute:
        attrs.append(expr.attr)
        expr = expr.value
    attrs.reverse()
    return (expr.id if expr.__class__ is ast.Name else None), attrs


def dotted(expr: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    name, attrs = _chain(expr)
    return ".".join([name, *attrs]) if name else None


def walk_own(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not descending into nested functions, lambdas and classes."""
    todo = list(getattr(node, "body", ()))
    while todo:
        current = todo.pop()
        yield current
        todo.extend(c for c in ast.iter_child_nodes(current) if c.__class__ not in _NESTED)


def _is_main_test(test: ast.AST) -> bool:
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names and consts)


class _Scanner:
    """Fills a :class:`Module` in one recursive pass. Calls are recorded after their arguments (the order
    in which Python evaluates them); assignments after their values."""

    def __init__(self, module: Module) -> None:
        self.m = module
        self.parents = module.parents
        self.handlers = {
            ast.Call: self.call, ast.FunctionDef: self.function, ast.AsyncFunctionDef: self.function,
            ast.Lambda: self.lambda_, ast.ClassDef: self.class_, ast.Assign: self.assign,
            ast.AnnAssign: self.assign, ast.AugAssign: self.assign, ast.Import: self.import_,
            ast.ImportFrom: self.import_, ast.For: self.loop, ast.AsyncFor: self.loop,
            ast.ListComp: self.loop, ast.SetComp: self.loop, ast.DictComp: self.loop, ast.GeneratorExp: self.loop,
            ast.Set: self.set_,
        }

    def body(self, stmts: list[ast.stmt], scope: Scope, parent: ast.AST) -> None:
        parents, handlers = self.parents, self.handlers
        for stmt in stmts:
            parents[stmt] = parent
            handler = handlers.get(stmt.__class__)
            if handler is None:
                self.visit(stmt, scope)
            else:
                handler(stmt, scope)

    def visit(self, node: ast.AST, scope: Scope) -> None:
        """Visit the children of ``node`` (what ``ast.iter_child_nodes`` gives, without its generator)."""
        parents, handlers = self.parents, self.handlers
        fields = _FIELDS.get(node.__class__)
        if fields is None:
            fields = _FIELDS[node.__class__] = tuple(f for f in node._fields if f not in _SCALAR_FIELDS)
        for field in fields:
            value = getattr(node, field, None)
            if value is None:
                continue
            children = value if value.__class__ is list else (value,)
            for child in children:
                cls = child.__class__
                if cls in _LEAVES or not isinstance(child, ast.AST):
                    if cls in _LEAVES:
                        parents[child] = node
                    continue
                parents[child] = node
                handler = handlers.get(cls)
                if handler is None:
                    self.visit(child, scope)
                else:
                    handler(child, scope)

    def call(self, node: ast.Call, scope: Scope) -> None:
        self.visit(node, scope)
        scope.items.append(node)
        self.m.calls.append((node, scope))

    def loop(self, node: ast.AST, scope: Scope) -> None:
        self.visit(node, scope)
        self.m.loops.append((node, scope))

    def set_(self, node: ast.Set, scope: Scope) -> None:
        self.visit(node, scope)
        self.m.set_literals.append((node, scope))

    def _new_scope(self, node: ast.AST, kind: str, scope: Scope, owner: ClassInfo | None = None) -> Scope:
        new = Scope(node, kind, scope, self.m, owner)
        self.m.all_scopes.append(new)
        self.m.scope_of[node] = new
        return new

    def function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, scope: Scope) -> None:
        parents = self.parents
        for deco in node.decorator_list:
            parents[deco] = node
            self._expr(deco, scope)
        parents[node.args] = node
        self.visit(node.args, scope)
        if node.returns is not None:
            parents[node.returns] = node
        new = self._new_scope(node, "function", scope, scope.owner if scope.kind == "class" else None)
        scope.defs[node.name] = new
        self.body(node.body, new, node)

    def lambda_(self, node: ast.Lambda, scope: Scope) -> None:
        self.visit(node.args, scope)
        new = self._new_scope(node, "lambda", scope)
        self.parents[node.body] = node
        self._expr(node.body, new)

    def class_(self, node: ast.ClassDef, scope: Scope) -> None:
        parents = self.parents
        for expr in (*node.decorator_list, *node.bases, *node.keywords):
            parents[expr] = node
            self._expr(expr, scope)
        new = self._new_scope(node, "class", scope)
        new.owner = scope.classes[node.name] = ClassInfo(node, new, self.m)
        self.body(node.body, new, node)

    def _expr(self, expr: ast.AST, scope: Scope) -> None:
        handler = self.handlers.get(expr.__class__)
        if handler is None:
            if expr.__class__ not in _LEAVES:
                self.visit(expr, scope)
        else:
            handler(expr, scope)

    def assign(self, node: ast.Assign | ast.AnnAssign | ast.AugAssign, scope: Scope) -> None:
        parents = self.parents
        value = node.value
        if value is not None:
            parents[value] = node
            self._expr(value, scope)
        targets = node.targets if node.__class__ is ast.Assign else [node.target]
        for target in targets:
            parents[target] = node
            if target.__class__ is ast.Name:
                if value is not None and node.__class__ is not ast.AugAssign:
                    scope.assigns.setdefault(target.id, []).append(value)
            else:
                self._expr(target, scope)
        scope.items.append(node)
        self.m.stores.append((node, scope))

    def import_(self, node: ast.Import | ast.ImportFrom, scope: Scope) -> None:
        imports = self.m.imports
        if node.__class__ is ast.Import:
            for alias in node.names:
                if alias.asname:
                    imports[alias.asname] = alias.name
                else:
                    top = alias.name.partition(".")[0]
                    imports.setdefault(top, top)
        else:
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name == "*":
                    continue
                sep = "" if base.endswith(".") else "."
                imports[alias.asname or alias.name] = f"{base}{sep}{alias.name}"
        scope.items.append(node)
