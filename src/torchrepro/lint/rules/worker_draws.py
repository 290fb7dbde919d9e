"""What a DataLoader's worker processes run, and whether it draws random numbers (for TR302).

Workers run the dataset's ``__getitem__``/``__iter__`` (and the helpers and transforms they call) and the
``collate_fn``. :class:`WorkerDraws` follows the expressions that build them: names to their assignments,
``self.x`` to the assignments of the attribute in the class, a project class to its methods (with the
constructor's arguments bound to ``__init__``'s parameters), a project function to what it returns, a
function's parameter to the arguments of its callers in the module. torchvision transforms and datasets, torch
dataset wrappers and timm's ``create_transform`` are known from tables (:mod:`..knowledge`). Anything else from
a library is unknown.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .. import knowledge as K
from ..calls import argument, has_keyword, is_false, is_true
from ..classify import draw_of
from ..module import ClassInfo, Module, Scope, dotted, walk_own
from ..project import Project, is_external

# Verdicts, weakest first: the strongest one found wins.
NONE, UNKNOWN, DRAWS, HELD = 0, 1, 2, 3
_BUDGET = 400  # expressions followed per DataLoader
_MAX_CALLERS = 6


@dataclass(frozen=True)
class Verdict:
    """How much randomness a piece of worker code draws: NONE, UNKNOWN, DRAWS (from a global generator, which
    each worker seeds from the loader's base seed) or HELD (from a generator object the dataset holds, which
    every worker copies with the same state); ``detail`` says what draws, and where."""

    level: int
    detail: str = ""


_NO = Verdict(NONE)
_UNKNOWN = Verdict(UNKNOWN)


def strongest(verdicts: Iterable[Verdict]) -> Verdict:
    best = _NO
    for verdict in verdicts:
        if verdict.level > best.level:
            best = verdict
            if best.level == HELD:
                break
    return best


@dataclass
class _Frame:
    """A scope being evaluated, with the arguments bound to its parameters (``binds``) and, for the methods of
    one instance, the frames of that instance's methods (``instance``: scope id -> frame)."""

    scope: Scope
    binds: dict[str, tuple[ast.expr, _Frame]] = field(default_factory=dict)
    instance: dict[int, _Frame] = field(default_factory=dict)

    def at(self, scope: Scope) -> _Frame:
        """The frame to evaluate code of ``scope`` in (bound when it is this frame's or the instance's)."""
        if scope is self.scope:
            return self
        return self.instance.get(id(scope)) or _Frame(scope, instance=self.instance)


class WorkerDraws:
    """Evaluates the dataset and ``collate_fn`` of DataLoader calls in one module."""

    def __init__(self, module: Module, project: Project) -> None:
        self.home, self.project = module, project
        self.budget = _BUDGET
        self.active: set[tuple[int, str]] = set()

    def loader(self, call: ast.Call, scope: Scope) -> Verdict:
        self.budget = _BUDGET
        frame = _Frame(scope)
        dataset = argument(call, 0, ("dataset",))
        collate = argument(call, K.LOADER_COLLATE, ("collate_fn",))
        parts = [self.expr(dataset, frame) if dataset is not None else _UNKNOWN]
        if collate is not None:
            parts.append(self.expr(collate, frame))
        return strongest(parts)

    # -- values --------------------------------------------------------------------------------------------------
    def expr(self, node: ast.AST | None, frame: _Frame) -> Verdict:
        if node is None or self.budget <= 0:
            return _UNKNOWN
        self.budget -= 1
        handler = _HANDLERS.get(node.__class__)
        return _UNKNOWN if handler is None else handler(self, node, frame)

    def _all(self, nodes: Iterable[ast.AST], frame: _Frame) -> Verdict:
        return strongest(self.expr(n, frame) for n in nodes)

    def _constant(self, node: ast.Constant, frame: _Frame) -> Verdict:
        return _NO

    def _if(self, node: ast.IfExp, frame: _Frame) -> Verdict:
        truth = self.truth(node.test, frame)
        if truth is not None:
            return self.expr(node.body if truth else node.orelse, frame)
        return self._all((node.body, node.orelse), frame)

    def _bool(self, node: ast.BoolOp, frame: _Frame) -> Verdict:
        return self._all(node.values, frame)

    def _sequence(self, node: ast.List | ast.Tuple, frame: _Frame) -> Verdict:
        return self._all(node.elts, frame)

    def _subscript(self, node: ast.Subscript, frame: _Frame) -> Verdict:
        return self.expr(node.value, frame)

    def _starred(self, node: ast.Starred, frame: _Frame) -> Verdict:
        return self.expr(node.value, frame)

    def _lambda(self, node: ast.Lambda, frame: _Frame) -> Verdict:
        scope = frame.scope.module.scope_of.get(node)
        return self.body(scope, frame.at(scope)) if scope is not None else _UNKNOWN

    def _name(self, node: ast.Name, frame: _Frame) -> Verdict:
        name = node.id
        if name in frame.binds:
            value, at = frame.binds[name]
            return self.expr(value, at)
        owner, values = _assigned(frame.scope, name)
        key = (id(owner or frame.scope), name)
        if key in self.active:  # a cycle (x = x or default): a parameter's argument, else evaluated outside
            return self._unassigned(node, frame) if _parameter(frame.scope, name) is not None else _NO
        self.active.add(key)
        try:
            if values:
                return self._all(values, frame.at(owner))
            return self._unassigned(node, frame)
        finally:
            self.active.discard(key)

    def _unassigned(self, node: ast.Name, frame: _Frame) -> Verdict:
        """A name never assigned in its scopes: a parameter (its default, or the arguments of the callers in
        the module), or a function used as a value (it runs in the workers, e.g. ``collate_fn=mixup``)."""
        scope = frame.scope
        while scope is not None and scope.kind != "module":
            default = _parameter(scope, node.id)
            if default is _REQUIRED:
                return self._callers(scope, node.id)
            if default is not None:
                return self.expr(default, frame.at(scope.parent)) if scope.parent else _UNKNOWN
            scope = scope.parent
        target = self.project.resolve_expr(frame.scope.module, frame.scope, node)
        if isinstance(target, Scope):
            return self.body(target, frame.at(target))
        return _UNKNOWN

    def _callers(self, function: Scope, name: str) -> Verdict:
        """A parameter without default: what the callers in the same module pass for it."""
        module = function.module
        if function.kind != "function":
            return _UNKNOWN
        fname = function.name
        method = function.parent is not None and function.parent.kind == "class"
        calls = module.calls_to(methods=fname) if method else module.calls_to(bare=fname)
        verdicts = []
        for call, scope in calls[:_MAX_CALLERS]:
            binds = _bind(function, call, _Frame(scope), skip_self=method)
            if name in binds:
                value, at = binds[name]
                verdicts.append(self.expr(value, at))
        return strongest(verdicts) if verdicts else _UNKNOWN

    def _attribute(self, node: ast.Attribute, frame: _Frame) -> Verdict:
        """``self.x``: every value the class assigns to the attribute; any other attribute is unknown."""
        cls = _owner(frame.scope)
        if cls is None or node.value.__class__ is not ast.Name or node.value.id != "self":
            return _UNKNOWN
        key = (id(cls), node.attr)
        if key in self.active:
            return _NO
        self.active.add(key)
        try:
            values = _attribute_values(cls, node.attr)
            if not values:
                method = self.project.method(cls, node.attr)
                return self.body(method, frame.at(method)) if method is not None else _UNKNOWN
            return strongest(self.expr(value, frame.at(scope)) for value, scope in values)
        finally:
            self.active.discard(key)

    def _call(self, node: ast.Call, frame: _Frame) -> Verdict:
        module = frame.scope.module
        func = node.func
        shadowed = func.__class__ is ast.Name and frame.scope.lookup_def(func.id) is not None  # class Dataset(Dataset)
        qual = None if shadowed else module.qual(func)
        if qual is None or qual[0] == ".":
            return self._project_call(node, frame)
        if self.project.is_own(module, qual):  # the project's own package of a library's name comes first
            found = self._project_call(node, frame)
            return found if found is not _UNKNOWN else self._library(qual, node, frame) or _UNKNOWN
        known = self._library(qual, node, frame)
        if known is not None:
            return known
        return _UNKNOWN if is_external(qual) else self._project_call(node, frame)

    def _project_call(self, node: ast.Call, frame: _Frame) -> Verdict:
        """A call of a project class (its worker methods) or function (what it returns)."""
        module = frame.scope.module
        target = self.project.resolve_expr(module, frame.scope, node.func)
        if target is None and node.func.__class__ is ast.Attribute and dotted(node.func.value) == "self":
            cls = _owner(frame.scope)
            target = self.project.method(cls, node.func.attr) if cls is not None else None
        if isinstance(target, ClassInfo):
            return self._instance(target, node, frame)
        if isinstance(target, Scope):
            return self._returns(target, node, frame)
        return _UNKNOWN

    def _library(self, qual: str, call: ast.Call, frame: _Frame) -> Verdict | None:
        """A known library call's verdict (None when the tables do not know it)."""
        name = qual.rpartition(".")[2]
        if qual.startswith(K.TRANSFORMS):
            if name in K.TRANSFORM_CONTAINERS:
                return self._all((*call.args, *(kw.value for kw in call.keywords)), frame)
            if name.startswith("Random") or name in K.TRANSFORM_DRAWS:
                return Verdict(DRAWS, self.where(frame.scope.module, call, ast.unparse(call.func)))
            if name == "Lambda":
                return self.expr(argument(call, 0, ("lambd",)), frame)
            return _NO
        if qual in K.TRANSFORM_FACTORIES:
            pos, keyword = K.TRANSFORM_FACTORIES[qual]
            flag = argument(call, pos, (keyword,))
            if flag is None or is_false(flag):
                return _NO
            shown = f"{ast.unparse(call.func)}({keyword}={ast.unparse(flag)})"
            return Verdict(DRAWS, self.where(frame.scope.module, call, shown)) if is_true(flag) else _UNKNOWN
        if qual.startswith(K.VISION_DATASETS):
            positions = K.VISION_TRANSFORM_POSITIONS.get(name, ())
            given = [kw.value for kw in call.keywords if kw.arg in K.TRANSFORM_KEYWORDS]
            given += [call.args[p] for p in positions if p < len(call.args)]
            return self._all(given, frame)
        if qual in K.DATASET_WRAPPERS:
            return self.expr(argument(call, K.DATASET_WRAPPERS[qual], ("dataset", "datasets")), frame)
        if qual in K.DETERMINISTIC_DATASETS:
            return _NO
        if qual == "functools.partial":
            return self.expr(argument(call, 0, ("func",)), frame)
        return None

    def _instance(self, cls: ClassInfo, call: ast.Call, frame: _Frame) -> Verdict:
        """A project class built by ``call``: what its worker methods draw, with ``__init__`` bound to the call."""
        project = self.project
        instance: dict[int, _Frame] = {}
        init = project.method(cls, "__init__")
        if init is not None:
            instance[id(init)] = _Frame(init, _bind(init, call, frame, skip_self=True), instance)
        methods = [m for m in (project.method(cls, n) for n in K.WORKER_METHODS) if m is not None]
        if not methods:
            return _UNKNOWN
        return strongest(self.body(m, instance.get(id(m)) or _Frame(m, instance=instance)) for m in methods)

    def _returns(self, function: Scope, call: ast.Call, frame: _Frame) -> Verdict:
        """A project function that builds a dataset or a transform: what it returns, with its parameters bound."""
        method = function.parent is not None and function.parent.kind == "class"
        inner = _Frame(function, _bind(function, call, frame, skip_self=method), frame.instance)
        values = [n.value for n in walk_own(function.node) if n.__class__ is ast.Return and n.value is not None]
        return self._all(values, inner) if values else _UNKNOWN

    # -- code that runs in the workers ---------------------------------------------------------------------------
    def body(self, scope: Scope | None, frame: _Frame) -> Verdict:
        """What the calls of a function (a dataset method, a transform, a collate function) draw."""
        if scope is None:
            return _UNKNOWN
        key = (id(scope), "<body>")
        if key in self.active or self.budget <= 0:
            return _NO
        self.active.add(key)
        try:
            return strongest(self._worker_call(item, frame) for item in scope.items
                             if item.__class__ is ast.Call and not self._skipped(item, scope, frame))
        finally:
            self.active.discard(key)

    def _skipped(self, node: ast.AST, scope: Scope, frame: _Frame) -> bool:
        """Whether ``node`` sits in a branch that this instance never takes (``if self.augment:`` in a dataset
        built with ``augment=False``)."""
        parents = scope.module.parents
        child, parent = node, parents.get(node)
        while parent is not None and parent is not scope.node:
            if parent.__class__ is ast.If and child is not parent.test:
                truth = self.truth(parent.test, frame)
                if truth is not None and truth != any(child is stmt for stmt in parent.body):
                    return True
            child, parent = parent, parents.get(parent)
        return False

    # -- conditions ----------------------------------------------------------------------------------------------
    def truth(self, test: ast.AST, frame: _Frame) -> bool | None:
        """The truth value of a condition when the linter can tell (``self.train`` bound to ``False``,
        ``split == "train"`` with ``split="val"``), else None."""
        if test.__class__ is ast.UnaryOp and test.op.__class__ is ast.Not:
            inner = self.truth(test.operand, frame)
            return None if inner is None else not inner
        if test.__class__ is ast.Compare:
            if len(test.ops) != 1 or test.ops[0].__class__ not in (ast.Eq, ast.NotEq):
                return None
            left, right = self.literal(test.left, frame), self.literal(test.comparators[0], frame)
            if left is _UNSET or right is _UNSET:
                return None
            return (left == right) == (test.ops[0].__class__ is ast.Eq)
        value = self.literal(test, frame)
        return None if value is _UNSET else bool(value)

    def literal(self, node: ast.AST, frame: _Frame, depth: int = 0) -> object:
        """The constant an expression always holds (through names, bound parameters, defaults and ``self.x``
        attributes), else ``_UNSET``."""
        if node.__class__ is ast.Constant:
            return node.value
        if depth > 4:
            return _UNSET
        if node.__class__ is ast.Name:
            if node.id in frame.binds:
                value, at = frame.binds[node.id]
                return self.literal(value, at, depth + 1)
            owner, values = _assigned(frame.scope, node.id)
            if values:
                return _same(self.literal(v, frame.at(owner), depth + 1) for v in values)
            default = _parameter(frame.scope, node.id)
            if default is not None and default is not _REQUIRED and frame.scope.parent is not None:
                return self.literal(default, frame.at(frame.scope.parent), depth + 1)
            return _UNSET
        cls = _owner(frame.scope)
        if node.__class__ is ast.Attribute and cls is not None and dotted(node.value) == "self":
            values = _attribute_values(cls, node.attr)
            return _same(self.literal(v, frame.at(sc), depth + 1) for v, sc in values) if values else _UNSET
        return _UNSET

    def _worker_call(self, call: ast.Call, frame: _Frame) -> Verdict:
        self.budget -= 1
        module = frame.scope.module
        func = call.func
        qual = module.qual(func)
        if qual is not None and qual[0] != ".":
            held = self._held_generator(argument(call, None, ("generator",)), frame)
            if held is not None and qual in K.TORCH_DRAWS:
                return Verdict(HELD, self.where(module, call, ast.unparse(func)))
            lib, _detail = draw_of(qual, call)
            if lib is not None:
                return Verdict(DRAWS, self.where(module, call, ast.unparse(func)))
            if is_external(qual) and not self.project.is_own(module, qual):
                return _NO  # reading files, converting images: a library call that draws nothing
        if func.__class__ is ast.Attribute:
            return self._method_call(call, func, frame)
        if func.__class__ is ast.Name:
            target = self.project.resolve_expr(module, frame.scope, func)
            if isinstance(target, Scope):
                return self.body(target, frame.at(target))
        return _NO

    def _method_call(self, call: ast.Call, func: ast.Attribute, frame: _Frame) -> Verdict:
        module = frame.scope.module
        if func.attr in K.TORCH_INPLACE_DRAWS and not has_keyword(call, "generator"):
            return Verdict(DRAWS, self.where(module, call, f".{func.attr}()"))
        if self._held_generator(func.value, frame) is not None:
            return Verdict(HELD, self.where(module, call, ast.unparse(func)))
        if func.value.__class__ is ast.Name and func.value.id == "self":
            return self.expr(func, frame)  # self.helper(...) or self.transform(...)
        return _NO

    def _held_generator(self, node: ast.AST | None, frame: _Frame) -> ast.AST | None:
        """``node`` when it is ``self.x`` and the class assigns a generator object to ``x``."""
        cls = _owner(frame.scope)
        if node is None or cls is None or node.__class__ is not ast.Attribute or dotted(node.value) != "self":
            return None
        for value, scope in _attribute_values(cls, node.attr):
            if _builds_generator(scope.module, value):
                return node
        return None

    def where(self, module: Module, node: ast.AST, text: str) -> str:
        place = f"line {node.lineno}" if module is self.home else f"{self._shown(module)}:{node.lineno}"
        return f"{text}, {place}"

    def _shown(self, module: Module) -> str:
        """``datasets/__init__.py``: another file's path from the linted file's directory (else its name)."""
        try:
            return module.path.relative_to(self.home.path.parent).as_posix()
        except ValueError:
            return module.path.name


_HANDLERS = {
    ast.Constant: WorkerDraws._constant, ast.IfExp: WorkerDraws._if, ast.BoolOp: WorkerDraws._bool,
    ast.List: WorkerDraws._sequence, ast.Tuple: WorkerDraws._sequence, ast.Subscript: WorkerDraws._subscript,
    ast.Starred: WorkerDraws._starred, ast.Lambda: WorkerDraws._lambda, ast.Name: WorkerDraws._name,
    ast.Attribute: WorkerDraws._attribute, ast.Call: WorkerDraws._call,
}
_REQUIRED = object()
_UNSET = object()


def _same(values: Iterable[object]) -> object:
    """The one value all of ``values`` are, else ``_UNSET``."""
    found: object = _UNSET
    for value in values:
        if value is _UNSET or (found is not _UNSET and (value != found or type(value) is not type(found))):
            return _UNSET
        found = value
    return found


def _assigned(scope: Scope, name: str) -> tuple[Scope | None, list[ast.expr]]:
    """The nearest scope (this one or an enclosing one) that assigns ``name``, and the values it assigns,
    tuple unpacking included (``train, val = random_split(...)`` gives the whole call)."""
    current: Scope | None = scope
    while current is not None:
        values = list(current.assigns.get(name, ()))
        values += _unpacked(current, name)
        if values:
            return current, values
        if _parameter(current, name) is not None:
            return None, []
        current = current.parent
    return None, []


def _unpacked(scope: Scope, name: str) -> list[ast.expr]:
    out = []
    for item in scope.items:
        if item.__class__ is ast.Assign:
            for target in item.targets:
                out.extend(_element(target, item.value, lambda t: t.__class__ is ast.Name and t.id == name))
    return out


def _element(target: ast.AST, value: ast.expr, match) -> Iterator[ast.expr]:
    """The part of ``value`` that a tuple target's matching element receives."""
    if target.__class__ not in (ast.Tuple, ast.List):
        return
    for i, elt in enumerate(target.elts):
        if match(elt):
            same = value.__class__ in (ast.Tuple, ast.List) and len(value.elts) == len(target.elts)
            yield value.elts[i] if same else value


def _attribute_values(cls: ClassInfo, attr: str) -> list[tuple[ast.expr, Scope]]:
    """The values assigned to ``self.<attr>`` in the methods of ``cls`` (tuple unpacking included)."""
    out = []

    def is_attr(t: ast.AST) -> bool:
        return t.__class__ is ast.Attribute and t.attr == attr and dotted(t.value) == "self"

    for method in cls.methods.values():
        for item in method.items:
            if item.__class__ is ast.Assign or (item.__class__ is ast.AnnAssign and item.value is not None):
                targets = item.targets if item.__class__ is ast.Assign else [item.target]
                for target in targets:
                    if is_attr(target):
                        out.append((item.value, method))
                    out.extend((v, method) for v in _element(target, item.value, is_attr))
    return out


def _parameter(scope: Scope, name: str) -> object | None:
    """For a parameter ``name`` of a function scope: its default expression, or ``_REQUIRED``; else None."""
    node = scope.node
    if scope.kind not in ("function", "lambda"):
        return None
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for arg, default in (*zip(positional, defaults), *zip(args.kwonlyargs, args.kw_defaults)):
        if arg.arg == name:
            return _REQUIRED if default is None else default
    return None


def _bind(function: Scope, call: ast.Call, caller: _Frame, *, skip_self: bool) -> dict[str, tuple[ast.expr, _Frame]]:
    """The arguments of ``call`` bound to ``function``'s parameters (``*args``/``**kwargs`` are not bound)."""
    args = function.node.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)][1 if skip_self else 0:]
    binds: dict[str, tuple[ast.expr, _Frame]] = {}
    for name, value in zip(positional, call.args):
        if value.__class__ is ast.Starred:
            break
        binds[name] = (value, caller)
    for kw in call.keywords:
        if kw.arg is not None:
            binds[kw.arg] = (kw.value, caller)
    return binds


def _owner(scope: Scope | None) -> ClassInfo | None:
    while scope is not None:
        if scope.owner is not None:
            return scope.owner
        scope = scope.parent
    return None


def _builds_generator(module: Module, value: ast.AST) -> bool:
    """Whether ``value`` builds a generator object (``np.random.default_rng(seed)``, ``random.Random(s)``,
    ``torch.Generator().manual_seed(s)``)."""
    for node in ast.walk(value):
        if node.__class__ is ast.Call:
            qual = module.qual(node.func)
            if qual in K.RNG_CONSTRUCTORS or qual == K.TORCH_GENERATOR:
                return True
    return False
