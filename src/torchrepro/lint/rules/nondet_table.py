"""TR203's table: the ops that are nondeterministic on CUDA (or on CPU with threads), read from the registry's rows
as the linter sees them in source (:data:`NONDETERMINISTIC_OPS`, :func:`nondeterministic_op`).

The table is derived from the registry's rows (torchrepro._core.nondet_ops, plain data shared with
torchrepro.control.registry): every linted Python spelling of a row, with the row's argument condition judged on
literals (arguments that are not literals are not judged: the call is not flagged). CUDA rows come first; a CPU
row is reported where no CUDA row applies (index_put_(accumulate=True) is deterministic on CUDA, not on CPU).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from ..._core import nondet_ops as facts
from ..._core.nondet_ops import Arg, Row
from ..calls import argument, constant, has_splat
from ..module import Module

_UNKNOWN = object()


def _expr(call: ast.Call, arg: Arg) -> ast.expr | None:
    return argument(call, arg.position, (arg.name,) if arg.name else ())


def _literal(call: ast.Call, arg: Arg) -> object:
    """The literal value of ``arg``'s argument in ``call``, its default when absent, else ``_UNKNOWN``."""
    expr = _expr(call, arg)
    if expr is None:
        return _UNKNOWN if has_splat(call) else arg.default
    return constant(expr, _UNKNOWN)


def _scalar_like(expr: ast.expr) -> bool:
    """A number literal, an attribute (a configured value: ``self.confidence``), or arithmetic on those.

    >>> _scalar_like(ast.parse("1 - self.eps", mode="eval").body), _scalar_like(ast.parse("src", mode="eval").body)
    (True, False)
    """
    if expr.__class__ is ast.BinOp:
        return _scalar_like(expr.left) and _scalar_like(expr.right)
    if expr.__class__ is ast.UnaryOp:
        return _scalar_like(expr.operand)
    return expr.__class__ is ast.Attribute or isinstance(constant(expr, None), (int, float, complex))


def _number_parameter(module: Module, call: ast.Call, expr: ast.expr) -> bool:
    """Whether ``expr`` is a parameter of the enclosing function whose default is a number (``on_value=1.0``)."""
    func = module.enclosing(call, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    if expr.__class__ is not ast.Name or func is None:
        return False
    args = func.args
    positional = args.posonlyargs + args.args
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]], args.defaults))
    defaults.update((a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)
    default = defaults.get(expr.id)
    return default is not None and _scalar_like(default)


def _tensor_argument(call: ast.Call, arg: Arg, module: Module) -> bool:
    """Whether ``arg`` is given and may be a tensor: not a number, an attribute or a number-defaulted parameter."""
    expr = _expr(call, arg)
    return expr is not None and not _scalar_like(expr) and not _number_parameter(module, call, expr)


def _on_literal(test: Callable[[object, Arg], bool]) -> Callable[[ast.Call, Arg, Module], bool]:
    return lambda call, arg, module: (value := _literal(call, arg)) is not _UNKNOWN and test(value, arg)


# How each test of the data reads a call in source (tests that need the real call are never linted).
STATIC_TESTS: dict[str, Callable[[ast.Call, Arg, Module], bool]] = {
    facts.TRUE: _on_literal(lambda v, a: bool(v)),
    facts.FALSE: _on_literal(lambda v, a: not v),
    facts.IN: _on_literal(lambda v, a: v in a.values),
    facts.NOT_IN: _on_literal(lambda v, a: v not in a.values),
    facts.GIVEN: lambda call, arg, module: (e := _expr(call, arg)) is not None and constant(e, 0) is not None,
    facts.TENSOR: _tensor_argument,
}


@dataclass(frozen=True)
class Op:
    """A TR203 table entry: a Python spelling (``label``) of a registry ``row``, reaching it when ``when`` holds."""

    label: str
    row: Row
    when: Arg | None = None

    def applies(self, call: ast.Call, module: Module) -> bool:
        return self.when is None or STATIC_TESTS[self.when.test](call, self.when, module)

    def describe(self, call: ast.Call) -> str:
        """The label with the condition that holds, e.g. ``F.pad(mode='replicate')``."""
        if self.when is None:
            return self.label
        found = _literal(call, self.when) if self.when.test == facts.IN else _UNKNOWN
        return f"{self.label}({self.when.describe(None if found is _UNKNOWN else (found,))})"


def _key(name: str) -> str:
    """The table key of a spelling: ``.method`` for ``Tensor.method`` (any receiver), else the qualified name."""
    return name[len("Tensor"):] if name.startswith("Tensor.") else name


def lint_table(rows: tuple[Row, ...]) -> dict[str, tuple[Op, ...]]:
    """Key -> the entries of every linted spelling of ``rows``, in row order (the first that applies is reported).

    >>> [op.row.effect for op in lint_table(facts.rows_for("cuda"))["torch.nn.functional.pad"]]
    ['switches kernel', 'raises']
    """
    table: dict[str, list[Op]] = {}
    for row in rows:
        for spelling in row.spellings:
            if not spelling.not_linted:
                table.setdefault(_key(spelling.name), []).append(Op(spelling.label, row, spelling.when))
    return {key: tuple(ops) for key, ops in table.items()}


# Keys are qualified names; ".name" keys match Tensor methods on any receiver.
NONDETERMINISTIC_OPS: dict[str, tuple[Op, ...]] = lint_table(facts.rows_for("cuda") + facts.rows_for("cpu"))


def nondeterministic_op(module: Module, call: ast.Call, *, cuda: bool = True) -> Op | None:
    """The table entry a call matches (None if it is not a nondeterministic op, or its arguments make it safe);
    without ``cuda``, only the entries of CPU rows (for code that never runs on CUDA)."""
    qual = module.qual(call.func)
    ops = NONDETERMINISTIC_OPS.get(qual, ()) if qual else ()
    if not ops and call.func.__class__ is ast.Attribute and (qual is None or qual.startswith("torch.")):
        ops = NONDETERMINISTIC_OPS.get("." + call.func.attr, ())
    return next((op for op in ops if (cuda or op.row.device != "cuda") and op.applies(call, module)), None)
