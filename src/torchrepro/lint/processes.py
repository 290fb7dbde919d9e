"""Calls that run a function in a new process, and the start method each uses.

``mp.spawn(fn)``, ``start_processes(fn)``, ``multiprocessing.Process(target=fn)`` and
``get_context(method).Process(target=fn)``: the spawn and forkserver start methods run ``fn`` in a fresh
interpreter (which does not inherit the parent's generators); fork copies the parent.
"""

from __future__ import annotations

import ast
from typing import NamedTuple

from . import knowledge as K
from .calls import argument, constant
from .module import Module, Scope, dotted


class Start(NamedTuple):
    """A call that runs a function in a new process: the function passed, the call as written, the start
    method ("spawn", "fork", "forkserver", or None for the platform's default)."""

    fn: ast.expr
    api: str
    method: str | None


def process_start(module: Module, scope: Scope, call: ast.Call, qual: str | None) -> Start | None:
    """How ``call`` starts a process (``mp.spawn(fn)``, ``Process(target=fn)``, ``ctx.Process(target=fn)``)."""
    spec = K.PROCESS_STARTERS.get(qual) if qual is not None else None
    func = call.func
    if spec is None:
        name, pos, keyword = K.CONTEXT_PROCESS
        if func.__class__ is not ast.Attribute or func.attr != name:
            return None
        method = _context_method(module, scope, func.value)
        if method is NotImplemented:
            return None
        spec = (pos, keyword, method)
    pos, keyword, method = spec
    fn = argument(call, pos, (keyword,))
    if fn is None:
        return None
    override = K.START_METHOD_ARGUMENT.get(qual or "")
    if override is not None:
        given = constant(argument(call, override[0], (override[1],)), None)
        method = given if isinstance(given, str) else method
    if method is None:
        method = _module_start_method(module)
    return Start(fn, dotted(func) or qual or name, method)


def _context_method(module: Module, scope: Scope, expr: ast.AST) -> str | None | object:
    """The start method of ``get_context(method)`` (None: the default), through a local name; NotImplemented
    when ``expr`` is not such a context."""
    values = scope.values_of(expr.id) if expr.__class__ is ast.Name else [expr]
    for value in reversed(values):
        if value.__class__ is ast.Call and module.qual(value.func) in K.GET_CONTEXT:
            method = constant(argument(value, 0, ("method",)), None)
            return method if isinstance(method, str) else None
    return NotImplemented


def _module_start_method(module: Module) -> str | None:
    """The start method the module sets with ``set_start_method("...")`` (None if it sets none)."""
    for call, _scope in module.calls_to(K.SET_START_METHOD):
        method = constant(argument(call, 0, ("method",)), None)
        if isinstance(method, str):
            return method
    return None


def unwrap_partial(module: Module, expr: ast.expr) -> ast.expr:
    """``f`` for ``functools.partial(f, ...)``, else ``expr``."""
    if expr.__class__ is ast.Call and expr.args and module.qual(expr.func) == K.PARTIAL:
        return expr.args[0]
    return expr
