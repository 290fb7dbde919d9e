"""Seeds set only when a seed option is given (for TR105): the value an expression has in a run of the default
command (a literal, an option's default, through names and parameters), whether an ``if`` around a seeding call
holds there, and the seeding calls such an ``if`` skips (:func:`_unseeded_by_default`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from .. import knowledge as K
from ..calls import argument, constant, has_splat, is_true, names_in
from ..classify import is_assumed_seeder
from ..module import Module, Scope, dotted
from ..rule import Finding


@dataclass(frozen=True)
class _Option:
    """A command-line option (``add_argument("--seed", ...)``): its flag as written and its default value."""

    dest: str
    flag: str
    default: object
    call: ast.Call


_UNKNOWN = NotImplemented  # a value the linter cannot know
_COMPARE = {ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b, ast.Eq: lambda a, b: a == b,
            ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}
_ACTION_DEFAULTS = {"store_true": False, "store_false": True, "count": None, "store_const": None, "append": None,
                    "append_const": None, "extend": None}


def _seed_argument(module: Module, call: ast.Call) -> ast.expr | None:
    """The seed a seeding call is given (None for a call that is not one, or restores a state)."""
    qual = module.qual(call.func)
    if qual in K.SEEDERS:
        _libs, pos, keywords = K.SEEDERS[qual]
        return argument(call, pos, keywords) if pos is not None else None
    func = call.func
    if func.__class__ is ast.Attribute and func.attr in ("manual_seed", "seed_everything"):
        return argument(call, 0, ("seed",))
    if qual not in K.RNG_CONSTRUCTORS and is_assumed_seeder(qual or dotted(func) or ""):
        return argument(call, 0, ("seed",))
    return None


def _option_default(module: Module, call: ast.Call) -> object:
    """The default of the option ``add_argument`` declares (``_UNKNOWN`` when it is required or not a literal)."""
    if is_true(argument(call, None, ("required",))):
        return _UNKNOWN
    flags = [constant(a) for a in call.args]
    if flags and isinstance(flags[0], str) and not flags[0].startswith("-") and constant(
            argument(call, None, ("nargs",))) not in ("?", "*"):
        return _UNKNOWN  # a positional argument: always given
    default = argument(call, None, ("default",))
    if default is not None:
        return constant(default)
    action = constant(argument(call, None, ("action",)), None)
    return _ACTION_DEFAULTS.get(action, _UNKNOWN) if isinstance(action, str) else None


def _option_of(module: Module, scope: Scope, expr: ast.Attribute) -> _Option | None:
    """The option read by ``args.seed`` (declared in ``scope``, else in the module), with a default that holds when
    the program runs: None if the module assigns the attribute or sets another default (``set_defaults``)."""
    name = dotted(expr)
    if name is None or name.count(".") != 1 or name.startswith("self."):
        return None
    dest = expr.attr
    found = next(((flag, call) for d, flag, call in _options(module, scope) if d == dest), None)
    if found is None:
        return None
    default = _option_default(module, found[1])
    for other, _scope in module.calls_to(methods=("set_defaults",)):
        if any(kw.arg == dest or kw.arg is None for kw in other.keywords):
            return None
    for store, _scope in module.stores:
        targets = store.targets if store.__class__ is ast.Assign else [getattr(store, "target", None)]
        if any(t.__class__ is ast.Attribute and t.attr == dest for t in targets):
            return None  # filled in by the program (a fallback, a config file): not judged here
    return None if default is _UNKNOWN else _Option(dest, found[0], default, found[1])


def _default_value(module: Module, scope: Scope, expr: ast.AST, depth: int = 0) -> tuple[object, _Option | None]:
    """The value of ``expr`` in a run of the default command (a literal, an option's default, through a local
    name or a parameter that every call in the module gives one option), and the option it comes from."""
    cls = expr.__class__
    if cls is ast.Constant:
        return expr.value, None
    if cls is ast.Attribute:
        option = _option_of(module, scope, expr)
        return (option.default, option) if option is not None else (_UNKNOWN, None)
    if cls is ast.Name and depth < 3:
        values = scope.values_of(expr.id)
        if len(values) == 1:
            return _default_value(module, scope, values[0], depth + 1)
        if not values and _is_parameter(scope, expr.id):
            return _argument_default(module, scope, expr.id, depth)
    return _UNKNOWN, None


def _argument_default(module: Module, scope: Scope, param: str, depth: int) -> tuple[object, _Option | None]:
    """The default-command value of parameter ``param`` of the function ``scope``: the same option at every call
    of the function in the module (``set_seed(args.seed)``)."""
    while scope is not None and not isinstance(scope.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        scope = scope.parent
    if scope is None:
        return _UNKNOWN, None
    node = scope.node
    positional = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    if param not in positional and param not in [a.arg for a in node.args.kwonlyargs]:
        return _UNKNOWN, None
    offset = 1 if scope.owner is not None and positional[:1] in (["self"], ["cls"]) else 0
    calls = module.calls_to(bare=(node.name,)) if offset == 0 else module.calls_to(methods=(node.name,))
    found: tuple[object, _Option | None] = (_UNKNOWN, None)
    for call, call_scope in calls:
        index = positional.index(param) - offset if param in positional else -1
        given = argument(call, index if index >= 0 else None, (param,))
        if given is None or has_splat(call):
            return _UNKNOWN, None
        value, option = _default_value(module, call_scope, given, depth + 1)
        if option is None or (found[1] is not None and found[1].call is not option.call):
            return _UNKNOWN, None
        found = (value, option)
    return found


def _truth(module: Module, scope: Scope, test: ast.AST) -> tuple[bool | None, _Option | None]:
    """Whether ``test`` holds in a run of the default command (None: not known), and the option it reads."""
    cls = test.__class__
    if cls is ast.UnaryOp and isinstance(test.op, ast.Not):
        truth, option = _truth(module, scope, test.operand)
        return (None if truth is None else not truth), option
    if cls is ast.BoolOp:
        parts = [_truth(module, scope, v) for v in test.values]
        known = [(t, o) for t, o in parts if t is not None]
        decisive = not isinstance(test.op, ast.And)  # `and` is false when one part is, `or` true when one is
        for truth, option in known:
            if truth is decisive:
                return truth, option
        return (not decisive, known[0][1]) if len(known) == len(parts) else (None, None)
    if cls is ast.Compare:
        if len(test.ops) != 1 or test.ops[0].__class__ not in _COMPARE:
            return None, None
        left, left_option = _default_value(module, scope, test.left)
        right, right_option = _default_value(module, scope, test.comparators[0])
        option = left_option or right_option
        if left is _UNKNOWN or right is _UNKNOWN or option is None:
            return None, None
        try:
            return bool(_COMPARE[test.ops[0].__class__](left, right)), option
        except TypeError:
            return None, None
    value, option = _default_value(module, scope, test)
    return (None, None) if value is _UNKNOWN or option is None else (bool(value), option)


def _skipping_guard(module: Module, scope: Scope, call: ast.Call) -> tuple[ast.If, _Option] | None:
    """The ``if`` around ``call`` (in its function) that a run of the default command does not enter."""
    child: ast.AST = call
    parent = module.parents.get(call)
    while parent is not None and parent is not scope.node:
        if parent.__class__ is ast.If and child is not parent.test:
            truth, option = _truth(module, scope, parent.test)
            inside = any(child is stmt for stmt in parent.body)
            if truth is not None and option is not None and truth is not inside:
                return parent, option
        child, parent = parent, module.parents.get(parent)
    return None


def _unseeded_by_default(module: Module, candidates: list[tuple[ast.Call, Scope]]) -> Iterator[Finding]:
    """Seeding calls that run only when a seed option is given (``if args.seed is not None:`` with
    ``add_argument("--seed", default=None)``), in a scope that seeds nothing in a run of the default command:
    that run is not seeded. One finding per ``if``, at its first seeding call."""
    guarded: dict[int, list[tuple[ast.Call, ast.If, _Option]]] = {}
    seeds_by_default: set[int] = set()  # scopes with a seeding call that the default command runs
    for call, scope in candidates:
        seed = _seed_argument(module, call)
        if seed is None:
            continue
        found = _skipping_guard(module, scope, call)
        if found is None:
            seeds_by_default.add(id(scope))
            continue
        guard, option = found
        _value, seed_option = _default_value(module, scope, seed)
        if (seed_option is not None and seed_option.call is option.call) or option.dest in set(names_in(seed)):
            guarded.setdefault(id(scope), []).append((call, guard, option))
    reported: set[int] = set()
    for scope_id, calls in guarded.items():
        if scope_id in seeds_by_default:
            continue
        for call, guard, option in calls:
            if id(guard) in reported:
                continue
            reported.add(id(guard))
            flag = option.flag or option.dest
            if option.default is None and argument(option.call, None, ("default",)) is None:
                reason = f"{flag} has no default, and the `if` on line {guard.lineno} skips it when {flag} is not given"
            else:
                reason = f"{flag} defaults to {option.default!r}, for which the `if` on line {guard.lineno} skips it"
            label = dotted(call.func) or "this seeding call"
            yield Finding(call, f"{label}() runs only when {flag} is given: {reason}; a run of the default command is "
                                "not seeded, so two such runs differ",
                          f"give {flag} a fixed default (add_argument(\"{flag}\", type=int, default=0)), or seed "
                          "unconditionally")


def _options(module: Module, scope: Scope) -> Iterator[tuple[str, str, ast.Call]]:
    """(destination, flag as written, call) of each ``add_argument("--seed", ...)`` of ``scope`` if it declares
    options, else of the module."""
    calls = module.calls_to(methods=("add_argument",))
    mine = [(call, sc) for call, sc in calls if sc is scope]
    for call, _scope in mine or calls:
        dest = argument(call, None, ("dest",))
        flags = [constant(a) for a in call.args if isinstance(constant(a), str)]
        flag = next((f for f in flags if f.startswith("--")), flags[0] if flags else "")
        option = constant(dest) if dest is not None else flag
        if isinstance(option, str) and option:
            yield option.lstrip("-").replace("-", "_"), flag, call


def _is_parameter(scope: Scope | None, name: str) -> bool:
    while scope is not None:
        node = scope.node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            if any(a.arg == name for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)):
                return True
        if name in scope.assigns:
            return False
        scope = scope.parent
    return False
