"""Where a seed's value comes from (for TR105): whether it varies from run to run (the clock, the OS, ``hash()``
of a string, a draw from an unseeded generator), always or only when no seed is given, and whether the chosen
value is printed or logged (:func:`_judge_seed`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from .. import knowledge as K
from ..calls import argument, constant, names_in
from ..classify import classify_call, draw_of, is_assumed_seeder
from ..events import SEED
from ..module import Module, Scope, dotted
from ..rule import Context, Finding
from .seed_options import _is_parameter, _options

_STRINGY = ("name", "tag", "path", "dir", "file", "str", "text")


@dataclass(frozen=True)
class _Source:
    """What makes a seed differ from run to run (the call that varies, described), and whether always or only
    when no seed is given."""

    what: str
    always: bool
    node: ast.AST


_FALLBACK_HELP = ("give the seed option a fixed default (add_argument(\"--seed\", type=int, default=0)), so that the "
                  "default run is repeatable")


def _judge_seed(ctx: Context, scope: Scope, call: ast.Call, seed_expr: ast.expr, seen: set[int]) -> Finding | None:
    """A finding when the seed passed to ``call`` varies: always, or when no seed is given (unless an option's
    fixed default means the random choice never runs); once per varying value."""
    source = _source(ctx, scope, seed_expr, 0)
    if source is None or id(source.node) in seen:
        return None
    module = ctx.module
    if not source.always and _fixed_default(module, scope, seed_expr):
        return None
    seen.add(id(source.node))
    logged = _logged(module, scope, seed_expr, source.node)
    if source.always:
        note = "" if logged is None else (f" (it is {_logs(logged)} on line {logged.lineno}: a run can be repeated "
                                          "only by putting that value back by hand)")
        return Finding(call, f"the seed comes from {source.what}, so it differs in every run{note}")
    if logged is None:
        return Finding(call, f"when no seed is given, the seed comes from {source.what} and is not logged, so such a "
                             "run can never be repeated", _FALLBACK_HELP)
    option = _option_name(module, scope, seed_expr)
    return Finding(call, f"when no seed is given, the seed comes from {source.what}, so two runs of the same command "
                         f"differ; it is {_logs(logged)} on line {logged.lineno}, so a run can be repeated only by "
                         f"passing that value back by hand{f' ({option})' if option else ''}", _FALLBACK_HELP)


def _logs(call: ast.Call) -> str:
    """``printed`` or ``logged``: what a log call does with the seed."""
    func = call.func
    last = func.attr if func.__class__ is ast.Attribute else func.id if func.__class__ is ast.Name else ""
    return "printed" if last in ("print", "pprint") else "logged"


def _source(ctx: Context, scope: Scope, expr: ast.AST, depth: int) -> _Source | None:
    """What makes ``expr`` differ from run to run (None if nothing does). A varying value only in a fallback
    (``seed or int(time.time())``, a name also assigned a fixed value, a parameter) is not ``always``."""
    cls = expr.__class__
    if cls is ast.Call:
        what = _call_source(ctx, scope, expr)
        if what:
            return _Source(what, True, expr)
    if cls is ast.BoolOp or cls is ast.IfExp:
        branches = expr.values if cls is ast.BoolOp else [expr.body, expr.orelse]
        return _combine([_source(ctx, scope, b, depth) for b in branches])
    if cls is ast.Name:
        values = scope.values_of(expr.id)
        if depth >= 3 or not values:
            return None
        sources = [_source(ctx, scope, v, depth + 1) for v in values]
        return _combine(sources + [None] if _is_parameter(scope, expr.id) else sources)
    if cls is ast.Attribute:
        found = _attribute_source(ctx, scope, expr, depth)
        if found is not None:
            return found
    for child in ast.iter_child_nodes(expr):  # arithmetic or conversion of a varying value varies too
        found = _source(ctx, scope, child, depth)
        if found is not None:
            return found
    return None


def _combine(sources: list[_Source | None]) -> _Source | None:
    varying = [s for s in sources if s is not None]
    if not varying:
        return None
    return _Source(varying[0].what, len(varying) == len(sources) and all(s.always for s in varying), varying[0].node)


def _call_source(ctx: Context, scope: Scope, call: ast.Call) -> str:
    module = ctx.module
    qual = module.qual(call.func)
    source = K.NONDETERMINISTIC_SOURCES.get(qual or "")
    if source:
        return source
    if module.is_builtin(call.func, "id"):
        return K.NONDETERMINISTIC_SOURCES["id"]
    if module.is_builtin(call.func, "hash") and call.args and _stringy(call.args[0]):
        return "hash() of a str, which is randomised per process unless PYTHONHASHSEED is set"
    lib, detail = draw_of(qual, call) if qual else (None, "")
    if lib is not None and not _seeded_before(ctx, scope, call, lib):
        return f"{detail} (before {K.LIB_LABEL[lib]} is seeded)"
    return ""


def _attribute_source(ctx: Context, scope: Scope, expr: ast.Attribute, depth: int) -> _Source | None:
    """``opt.seed`` assigned a varying value in the same scope: always, unless the assignment is guarded by
    an ``if`` on ``opt.seed`` (``if opt.seed is None: opt.seed = random.randint(...)``)."""
    name = dotted(expr)
    if name is None or depth >= 3:
        return None
    module = ctx.module
    for store, store_scope in reversed(module.stores):
        if store_scope is not scope or store.__class__ is not ast.Assign:
            continue
        if any(dotted(t) == name for t in store.targets):
            found = _source(ctx, scope, store.value, depth + 1)
            if found is not None:
                return _Source(found.what, not _guarded_by(module, store, name), found.node)
    return None


def _guarded_by(module: Module, node: ast.AST, name: str) -> bool:
    """Whether ``node`` lies in an ``if`` whose test mentions ``name`` (a dotted name)."""
    parent = module.enclosing(node, (ast.If,))
    while parent is not None:
        if any(dotted(n) == name for n in ast.walk(parent.test) if n.__class__ is ast.Attribute):
            return True
        parent = module.enclosing(parent, (ast.If,))
    return False


def _seeded_before(ctx: Context, scope: Scope, call: ast.Call, lib: str) -> bool:
    """Whether ``lib`` is seeded before ``call`` draws: earlier in the same scope, or first seeded outside this
    scope by the program (or a program importing this module), presumably before the scope runs."""
    items = scope.items
    index = next((i for i, item in enumerate(items) if item is call), len(items))
    if any(item.__class__ is ast.Call and _seeds(ctx, scope, item, lib) for item in items[:index]):
        return True
    if scope is ctx.module.top:
        return False
    for program in [ctx.module] if ctx.is_program else ctx.importing_programs():
        first = ctx.walker.program(program).own.first(SEED, lib)
        if first is not None and not any(node is item for _mod, node in first.chain for item in items):
            return True
    return False


def _seeds(ctx: Context, scope: Scope, call: ast.Call, lib: str) -> bool:
    """Whether ``call`` seeds ``lib``: a seeding API, a helper that seeds it, or one whose name says it seeds."""
    module = ctx.module
    qual = module.qual(call.func)
    if any(kind == SEED and found == lib for kind, found, _d in classify_call(module, scope, call, qual)):
        return True
    targets = list(ctx.walker.call_targets(module, scope, call))
    if not targets:
        return qual not in K.SEEDERS and is_assumed_seeder(qual or dotted(call.func) or "")
    return any(isinstance(t, Scope) and ctx.walker.summary(t).own.has(SEED, lib) for t in targets)


def _logged(module: Module, scope: Scope, expr: ast.AST, chosen: ast.AST) -> ast.Call | None:
    """A call that prints or logs the seed held in ``expr`` (a name or attribute) after it is ``chosen``: in
    ``scope``, or anywhere for one that logs the whole object holding it (``print(args)``,
    ``wandb.init(config=args)``; in ``scope`` only after the choice, since an earlier one logs no seed yet)."""
    wanted = dotted(expr)
    if wanted is None:
        return None
    holder = wanted.partition(".")[0] if "." in wanted else None
    after = (getattr(chosen, "lineno", 0), getattr(chosen, "col_offset", 0))
    for call, call_scope in module.calls:
        if not _is_log_call(module, call) or (call_scope is scope and (call.lineno, call.col_offset) < after):
            continue
        for arg in (*call.args, *(kw.value for kw in call.keywords)):
            for node in ast.walk(arg):
                if call_scope is scope and dotted(node) == wanted:
                    return call
                if (node.__class__ is ast.Name and node.id == holder
                        and module.parents.get(node).__class__ is not ast.Attribute):
                    return call
    return None


def _is_log_call(module: Module, call: ast.Call) -> bool:
    func = call.func
    last = func.attr if func.__class__ is ast.Attribute else func.id if func.__class__ is ast.Name else ""
    return last in K.LOG_CALL_NAMES or module.qual(func) in K.LOG_CALLS


def _seed_names(scope: Scope, expr: ast.AST) -> set[str]:
    """The names the seed in ``expr`` is read from (through a local name's values)."""
    exprs = [expr, *(scope.values_of(expr.id) if expr.__class__ is ast.Name else ())]
    return {name for e in exprs for name in names_in(e)}


def _fixed_default(module: Module, scope: Scope, expr: ast.AST) -> bool:
    """Whether the seed is an option (``args.seed``, through a local name) declared with a fixed default
    (``add_argument("--seed", default=42)``), or a parameter with one (``def main(seed=0)``): the fallback
    then runs only when it is asked for."""
    names = _seed_names(scope, expr)
    for dest, _flag, call in _options(module, scope):
        default = argument(call, None, ("default",))
        if dest in names and default is not None and constant(default, None) is not None:
            return True
    exprs = [expr, *(scope.values_of(expr.id) if expr.__class__ is ast.Name else ())]
    bare = {n.id for e in exprs for n in ast.walk(e) if n.__class__ is ast.Name}
    return any(constant(default, None) is not None for name, default in _parameter_defaults(scope) if name in bare)


def _parameter_defaults(scope: Scope) -> Iterator[tuple[str, ast.expr]]:
    """(parameter, default) of the function that ``scope`` is, or lies in."""
    while scope is not None and not isinstance(scope.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        scope = scope.parent
    if scope is None:
        return
    args = scope.node.args
    positional = [*args.posonlyargs, *args.args]
    yield from zip((a.arg for a in positional[len(positional) - len(args.defaults):]), args.defaults)
    yield from ((a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)


def _option_name(module: Module, scope: Scope, expr: ast.AST) -> str:
    """The command-line flag the seed comes from (``--manualSeed``), or ""."""
    names = _seed_names(scope, expr)
    return next((flag for dest, flag, _call in _options(module, scope) if dest in names and flag.startswith("-")), "")


def _stringy(expr: ast.AST) -> bool:
    for node in ast.walk(expr):
        if node.__class__ is ast.Constant and isinstance(node.value, str) or node.__class__ is ast.JoinedStr:
            return True
        name = node.id if node.__class__ is ast.Name else node.attr if node.__class__ is ast.Attribute else ""
        if name and name.lower().endswith(_STRINGY):
            return True
        if node.__class__ is ast.Call and node.func.__class__ is ast.Name and node.func.id in ("str", "repr"):
            return True
    return False
