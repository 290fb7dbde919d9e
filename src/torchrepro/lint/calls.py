"""Small helpers to read the arguments of a call and the environment variables a statement sets."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .module import Module

_MISSING = object()


def argument(call: ast.Call, pos: int | None, names: tuple[str, ...] = ()) -> ast.expr | None:
    """The argument given by keyword (one of ``names``) or at position ``pos``; None when absent or hidden
    behind ``*args``."""
    for kw in call.keywords:
        if kw.arg in names:
            return kw.value
    if pos is None:
        return None
    args = call.args
    for i, arg in enumerate(args):
        if arg.__class__ is ast.Starred:
            return None
        if i == pos:
            return arg
    return None


def has_keyword(call: ast.Call, name: str) -> bool:
    return any(kw.arg == name for kw in call.keywords)


def has_splat(call: ast.Call) -> bool:
    """Whether the call passes ``*args`` or ``**kwargs`` (so any argument may be present)."""
    return any(kw.arg is None for kw in call.keywords) or any(a.__class__ is ast.Starred for a in call.args)


def constant(expr: ast.AST | None, default: object = _MISSING) -> object:
    """The value of a literal (``True``, ``0``, ``"cuda"``, ``-1``), else ``default`` (or ``NotImplemented``)."""
    if expr.__class__ is ast.Constant:
        return expr.value
    if expr.__class__ is ast.UnaryOp and isinstance(expr.op, ast.USub) and expr.operand.__class__ is ast.Constant:
        value = expr.operand.value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    return NotImplemented if default is _MISSING else default


def is_true(expr: ast.AST | None) -> bool:
    """A literal that Python treats as true (``True``, ``1``, ``"warn"``)."""
    value = constant(expr)
    return value is not NotImplemented and bool(value)


def is_false(expr: ast.AST | None) -> bool:
    """A literal that Python treats as false (``False``, ``0``, ``None``)."""
    value = constant(expr)
    return value is not NotImplemented and not value


def names_in(expr: ast.AST) -> Iterator[str]:
    """Every identifier and attribute name in ``expr``."""
    for node in ast.walk(expr):
        if node.__class__ is ast.Name:
            yield node.id
        elif node.__class__ is ast.Attribute:
            yield node.attr
        elif node.__class__ is ast.Constant and isinstance(node.value, str):
            yield node.value


def env_assignments(module: Module, node: ast.AST) -> list[tuple[str, ast.expr | None]]:
    """``(VARIABLE, value)`` for each environment variable that ``node`` sets with a literal name:
    ``os.environ["X"] = v``, ``os.environ.setdefault("X", v)``, ``os.environ.update(X=v)`` / ``({"X": v})``,
    ``os.putenv("X", v)``."""
    out: list[tuple[str, ast.expr | None]] = []
    if node.__class__ is ast.Assign or node.__class__ is ast.AnnAssign:
        targets = node.targets if node.__class__ is ast.Assign else [node.target]
        for target in targets:
            if target.__class__ is ast.Subscript and module.qual(target.value) == "os.environ":
                key = constant(target.slice)
                if isinstance(key, str):
                    out.append((key, node.value))
        return out
    if node.__class__ is not ast.Call:
        return out
    func = node.func
    if func.__class__ is not ast.Attribute:
        return out
    owner = module.qual(func.value)
    if owner == "os.environ" and func.attr == "setdefault" or module.qual(func) == "os.putenv":
        key = constant(argument(node, 0))
        if isinstance(key, str):
            out.append((key, argument(node, 1)))
    elif owner == "os.environ" and func.attr == "update":
        for kw in node.keywords:
            if kw.arg is not None:
                out.append((kw.arg, kw.value))
        first = argument(node, 0)
        if first.__class__ is ast.Dict:
            for key, value in zip(first.keys, first.values):
                name = constant(key)
                if isinstance(name, str):
                    out.append((name, value))
    return out
