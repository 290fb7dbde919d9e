"""Branches that a call rules out: ``if do_sample:`` in a function called with ``do_sample=False``.

The walker (:mod:`.flow`) takes both branches of an ``if``, except where the test is a parameter (``if p:`` or
``if not p:``, never reassigned) that the call gives a literal value, or leaves at a literal default.
"""

from __future__ import annotations

import ast

from .calls import constant, has_splat
from .module import Module, Scope

Flags = frozenset[tuple[str, bool]]  # (parameter name, truth value) pairs
NO_FLAGS: Flags = frozenset()
# The test of a module's `if __name__ == "__main__":` block, false where the module is imported: a spawned
# child re-imports the program's main module (as `__mp_main__`), running its top level but not that block.
MAIN = "__name__ == '__main__'"
AS_IMPORTED: Flags = frozenset({(MAIN, False)})


def _params(node: ast.AST) -> list[ast.arg]:
    args = node.args
    return [*args.posonlyargs, *args.args, *args.kwonlyargs]


def flag_parameters(scope: Scope) -> frozenset[str]:
    """Parameters that an ``if`` in the function tests directly (``if p:`` / ``if not p:``), never reassigned."""
    node = scope.node
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return frozenset()
    params = {a.arg for a in _params(node)} - set(scope.assigns)
    found = set()
    todo = list(node.body)
    while todo:
        stmt = todo.pop()
        if stmt.__class__ is ast.If:
            name = _tested_name(stmt.test)[0]
            if name in params:
                found.add(name)
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(stmt, field, ()))
    return frozenset(found)


def _tested_name(test: ast.AST) -> tuple[str | None, bool]:
    """``("p", True)`` for ``p``, ``("p", False)`` for ``not p``."""
    if test.__class__ is ast.Name:
        return test.id, True
    if test.__class__ is ast.UnaryOp and isinstance(test.op, ast.Not) and test.operand.__class__ is ast.Name:
        return test.operand.id, False
    return None, True


def literal_flags(call: ast.Call, target: Scope, names: frozenset[str], offset: int) -> Flags:
    """The truth values ``call`` gives the flag parameters ``names`` of ``target`` (a literal argument, or a
    literal default when the call passes none); ``offset`` skips ``self``/``cls``."""
    if not names or has_splat(call):
        return NO_FLAGS
    node = target.node
    positional = [*node.args.posonlyargs, *node.args.args]
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(node.args.defaults):]], node.args.defaults))
    defaults.update((a.arg, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None)
    index = {a.arg: i - offset for i, a in enumerate(positional)}
    out = set()
    for name in names:
        given = next((kw.value for kw in call.keywords if kw.arg == name), None)
        if given is None and 0 <= index.get(name, -1) < len(call.args):
            given = call.args[index[name]]
        value = constant(given if given is not None else defaults.get(name))
        if value is not NotImplemented:
            out.add((name, bool(value)))
    return frozenset(out)


def branch_guards(module: Module, scope: Scope, names: frozenset[str]) -> dict[int, tuple[tuple[str, bool], ...]]:
    """For each item of ``scope`` inside ``if p:`` branches on the flag parameters ``names`` (or in the main
    guard, :data:`MAIN`): the truth value of each ``p`` that its branch needs."""
    out: dict[int, tuple[tuple[str, bool], ...]] = {}
    parents, top, guard = module.parents, scope.node, module.main_guard
    for item in scope.items:
        needs = []
        child, parent = item, parents.get(item)
        while parent is not None and parent is not top:
            if parent.__class__ is ast.If and child is not parent.test:
                name, truth = (MAIN, True) if parent is guard else _tested_name(parent.test)
                if name in names or name == MAIN:
                    needs.append((name, truth if any(child is s for s in parent.body) else not truth))
            child, parent = parent, parents.get(parent)
        if needs:
            out[id(item)] = tuple(needs)
    return out


def is_classmethod(scope: Scope) -> bool:
    decorators = getattr(scope.node, "decorator_list", ())
    return any(d.__class__ is ast.Name and d.id == "classmethod" for d in decorators)


def self_offset(target: Scope) -> int:
    """1 when calls of ``target`` pass ``self``/``cls`` implicitly (a method that is not a staticmethod)."""
    if target.owner is None or target.parent is None or target.parent.kind != "class":
        return 0
    decorators = getattr(target.node, "decorator_list", ())
    return 0 if any(d.__class__ is ast.Name and d.id == "staticmethod" for d in decorators) else 1
