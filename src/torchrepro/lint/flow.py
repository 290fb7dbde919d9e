"""What a program does, in order, on the path from its entry point: seeds, draws, model construction, CUDA use.

The walker starts at a module's top level (which includes its ``if __name__ == "__main__":`` block) and follows
every call it can resolve to a project definition: functions, methods on ``self`` and on locals built from a
project class, class constructors (``__init__``), ``super()``, and functions passed as arguments (callbacks such
as ``mp.spawn(main_worker)``). The top-level code of imported project modules is not followed (that would mean
reading a whole package for one file). Branches count as taken and loops run once, so "seeded on the path"
means "seeded on some path".

The result is a :class:`Summary`: the first occurrence of each kind of :class:`Event`, in execution order. An
event carries the chain of call sites that led to it, so a rule can point at the line in the linted file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from . import knowledge as K
from .calls import argument, constant, env_assignments, has_keyword, is_false, is_true, names_in
from .module import ClassInfo, Module, Scope, dotted
from .project import Project, is_external

MAX_DEPTH = 16

SEED, DRAW, MODEL, DET, CUDNN_DET, CUDA, CUBLAS_ENV = "seed", "draw", "model", "det", "cudnn_det", "cuda", "cublas"
SET_EPOCH, DIST, SHARDED, RANK_SEED, WORKER_SEEDS = "set_epoch", "dist", "sharded", "rank_seed", "worker_seeds"


@dataclass(frozen=True)
class Event:
    kind: str
    lib: str | None
    chain: tuple[tuple[Module, ast.AST], ...]  # call sites from the outermost to the event itself
    detail: str = ""

    @property
    def node(self) -> ast.AST:
        return self.chain[-1][1]

    @property
    def module(self) -> Module:
        return self.chain[-1][0]

    def site_in(self, module: Module) -> ast.AST:
        """The innermost node of the chain that lies in ``module`` (where to report the event)."""
        for mod, node in reversed(self.chain):
            if mod is module:
                return node
        return self.chain[0][1]

    def where(self) -> str:
        return f"{self.module.display}:{getattr(self.node, 'lineno', 1)}"


class Summary:
    """The first event of each (kind, library), in execution order."""

    __slots__ = ("events", "_index")

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._index: dict[tuple[str, str | None], int] = {}

    def add(self, event: Event) -> None:
        key = (event.kind, event.lib)
        if key not in self._index:
            self._index[key] = len(self.events)
            self.events.append(event)

    def first(self, kind: str, lib: str | None = None) -> Event | None:
        i = self._index.get((kind, lib))
        return None if i is None else self.events[i]

    def position(self, event: Event) -> int:
        return self._index[(event.kind, event.lib)]

    def has(self, kind: str, lib: str | None = None) -> bool:
        return (kind, lib) in self._index


# --- classifying one call ------------------------------------------------------------------------------------------
def _seed_value(call: ast.Call, pos: int | None, keywords: tuple[str, ...]) -> ast.expr | None:
    return argument(call, pos, keywords) if pos is not None else None


def _mentions_rank(expr: ast.AST | None) -> bool:
    return expr is not None and any(w in name.lower() for name in names_in(expr) for w in K.RANK_WORDS)


def is_assumed_seeder(name: str) -> bool:
    """A helper we cannot see whose name says it seeds (``set_seed``, ``seed_all``, ``fix_seeds``)."""
    last = name.rpartition(".")[2].lower().lstrip("_")
    return ("seed" in last and not last.startswith(K.NOT_SEEDING_PREFIXES)
            and last not in ("seed_worker", "seed_worker_fn"))


def is_assumed_determinism(name: str) -> bool:
    last = name.rpartition(".")[2].lower()
    return "determinis" in last and "nondeterminis" not in last and not last.startswith(("is_", "get", "check"))


def mentions_cuda(module: Module, scope: Scope, expr: ast.AST | None, depth: int = 0) -> bool:
    """Whether ``expr`` names a CUDA device: ``"cuda"``, ``"cuda:0"``, or a local assigned from one."""
    if expr is None:
        return False
    value = constant(expr)
    if isinstance(value, str):
        return value.startswith("cuda")
    for node in ast.walk(expr):
        if node.__class__ is ast.Constant and isinstance(node.value, str) and node.value.startswith("cuda"):
            return True
        if node.__class__ is ast.Name and depth < 2:
            for value_expr in scope.values_of(node.id):
                if mentions_cuda(module, scope, value_expr, depth + 1):
                    return True
    return False


def classify_call(module: Module, scope: Scope, call: ast.Call, qual: str | None) -> Iterator[tuple[str, str | None,
                                                                                                    str]]:
    """The events a call to a library API causes: ``(kind, library, detail)``."""
    func = call.func
    attr = func.attr if func.__class__ is ast.Attribute else None
    if qual is not None:
        yield from _classify_known(module, scope, call, qual)
    if attr is not None:
        if attr in K.SEED_ALL_METHODS and qual not in K.SEEDERS:
            for lib in K.LIBS:
                yield SEED, lib, f"{dotted(func) or attr}()"
            if is_true(argument(call, 1, ("workers",))):
                yield WORKER_SEEDS, None, ""
        elif attr in K.TORCH_INPLACE_DRAWS and not has_keyword(call, "generator") and not _foreign(qual):
            yield DRAW, K.TORCH, f".{attr}()"
        elif attr == "cuda" and not call.args and qual is None:
            yield CUDA, None, ".cuda()"
        elif attr == "to" and qual is None and (mentions_cuda(module, scope, argument(call, 0, ("device",)))):
            yield CUDA, None, ".to(cuda)"
        elif attr == "set_epoch":
            yield SET_EPOCH, None, ""


def _foreign(qual: str | None) -> bool:
    """A name resolved to a library other than torch (so a method name match is not a torch method)."""
    return qual is not None and not qual.startswith("torch")


def _classify_known(module: Module, scope: Scope, call: ast.Call, qual: str) -> Iterator[tuple[str, str | None, str]]:
    seeder = K.SEEDERS.get(qual)
    if seeder is not None:
        libs, pos, keywords = seeder
        value = _seed_value(call, pos, keywords)
        if pos is not None and value is None and not call.args and not call.keywords:
            return  # seeds from entropy: not a seed (TR105 reports it)
        for lib in K.LIBS:
            if lib in libs:
                yield SEED, lib, qual
        if _mentions_rank(value):
            yield RANK_SEED, None, qual
        if qual.endswith("seed_everything") and is_true(argument(call, 1, ("workers",))):
            yield WORKER_SEEDS, None, ""
        if is_true(argument(call, 1, ("deterministic",))) and not qual.startswith("torch."):
            yield DET, None, qual
        if qual == "monai.utils.set_determinism":
            yield DET, None, qual
        return
    if qual in K.HF_TRAINERS:
        for lib in K.LIBS:
            yield SEED, lib, f"{qual.rpartition('.')[2]}(...) seeds in its constructor"
        yield SHARDED, None, qual
        return
    if qual in K.DETERMINISM_ENABLERS:
        mode = argument(call, 0, ("mode", "d", "debug_mode"))
        if not (is_false(mode) or constant(mode) == "default"):
            yield DET, None, qual
        return
    if qual == K.LIGHTNING_TRAINER:
        yield SHARDED, None, qual
        if is_true(argument(call, None, ("deterministic",))):
            yield DET, None, "Trainer(deterministic=...)"
        return
    if qual in K.HF_TRAINING_ARGUMENTS:
        if is_true(argument(call, None, ("full_determinism",))):
            yield DET, None, "TrainingArguments(full_determinism=True)"
        return
    if qual.startswith("accelerate.Accelerator") or qual.startswith("lightning.fabric.Fabric"):
        yield SHARDED, None, qual
        return
    if qual in K.DIST_INIT:
        yield DIST, None, qual
        return
    if qual.startswith("torch.cuda.") and qual.count(".") == 2 and qual[11:] not in K.CUDA_HARMLESS:
        yield CUDA, None, qual
        return
    if qual == K.DATALOADER:
        if (is_true(argument(call, K.LOADER_SHUFFLE, ("shuffle",)))
                and argument(call, K.LOADER_GENERATOR, ("generator",)) is None):
            yield DRAW, K.TORCH, "DataLoader(shuffle=True)"
        return
    if qual in K.ORDER_DRAWS:
        if argument(call, K.ORDER_DRAWS[qual], ("generator",)) is None:
            yield DRAW, K.TORCH, qual.rpartition(".")[2]
        return
    lib, detail = draw_of(qual, call)
    if lib is not None:
        yield DRAW, lib, detail
        return
    model = model_of(qual)
    if model:
        yield MODEL, None, model
        yield DRAW, K.TORCH, model


def draw_of(qual: str, call: ast.Call) -> tuple[str | None, str]:
    """Which global generator a call to ``qual`` draws from (None if none)."""
    if qual in K.RANDOM_DRAWS:
        return K.RANDOM, qual
    if qual.startswith("numpy.random.") and qual.count(".") == 2 and qual[13:] not in K.NUMPY_NOT_DRAWS:
        return K.NUMPY, qual.replace("numpy.", "np.", 1)
    if (qual in K.TORCH_DRAWS or (qual.startswith(K.TORCH_INIT_PREFIX)
                                  and qual[len(K.TORCH_INIT_PREFIX):] not in K.TORCH_INIT_NOT_DRAWS)):
        if not has_keyword(call, "generator"):
            return K.TORCH, qual
    return None, ""


def is_seed_choice(module: Module, call: ast.Call) -> bool:
    """Whether a draw picks the seed itself (``opt.manualSeed = random.randint(1, 10000)`` when no seed is given,
    ``torch.manual_seed(random.randint(...))``): the value is a seed, not a random number the run consumes."""
    node: ast.AST = call
    parent = module.parents.get(node)
    while parent is not None and not isinstance(parent, ast.stmt):
        if parent.__class__ is ast.Call and parent is not call:
            name = module.qual(parent.func) or dotted(parent.func) or ""
            if name in K.SEEDERS or is_assumed_seeder(name) or name.endswith(".manual_seed"):
                return True
        node, parent = parent, module.parents.get(parent)
    if parent.__class__ in (ast.Assign, ast.AnnAssign):
        targets = parent.targets if parent.__class__ is ast.Assign else [parent.target]
        return any("seed" in (dotted(t) or "").lower() for t in targets)
    return False


def may_draw(qual: str) -> bool:
    """Whether some call of ``qual`` draws from a global generator (depending on its arguments)."""
    return (qual == K.DATALOADER or qual in K.ORDER_DRAWS or qual in K.RANDOM_DRAWS or qual in K.TORCH_DRAWS
            or qual.startswith(("numpy.random.", K.TORCH_INIT_PREFIX)) or bool(model_of(qual)))


def model_of(qual: str) -> str:
    """A description of the model built by calling ``qual`` ("" if it builds none)."""
    if qual.startswith("torch.nn.") and qual.count(".") == 2 and qual[9:] in K.RANDOM_INIT_LAYERS:
        return qual.replace("torch.", "", 1)
    if qual in K.MODEL_FACTORIES or qual.startswith(K.MODEL_FACTORY_PREFIXES):
        return qual
    head, _, method = qual.rpartition(".")
    if (method in K.MODEL_BUILDER_METHODS and head.startswith("transformers.")
            and not head.endswith(K.NOT_MODEL_SUFFIXES)):
        return f"{head.rpartition('.')[2]}.{method}"
    return ""


def store_events(module: Module, node: ast.AST) -> Iterator[tuple[str, str | None, str]]:
    """Events of an assignment: ``cudnn.deterministic = True``, ``os.environ["CUBLAS_WORKSPACE_CONFIG"] = ...``."""
    if node.__class__ is ast.Assign:
        for target in node.targets:
            if (target.__class__ is ast.Attribute and target.attr == "deterministic"
                    and module.qual(target.value) == K.CUDNN and is_true(node.value)):
                yield CUDNN_DET, None, "torch.backends.cudnn.deterministic = True"
    for name, _value in env_assignments(module, node):
        if name == "CUBLAS_WORKSPACE_CONFIG":
            yield CUBLAS_ENV, None, name


# --- the walker ----------------------------------------------------------------------------------------------------
class Walker:
    """Computes (and caches) the :class:`Summary` of any scope, following calls into project definitions."""

    def __init__(self, project: Project, *, local_only: bool = False) -> None:
        self.project = project
        self.local_only = local_only  # follow calls only within the module being walked
        self._memo: dict[int, Summary] = {}
        self._active: set[int] = set()
        self._depth = 0
        self._local: Walker | None = None

    def program(self, module: Module) -> Summary:
        return self.summary(module.top)

    def local(self, module: Module) -> Summary:
        """Like :meth:`program`, without following calls into other files (cheap: nothing else is read)."""
        if self._local is None:
            self._local = Walker(self.project, local_only=True)
        return self._local.program(module)

    def summary(self, scope: Scope) -> Summary:
        key = id(scope)
        memo = self._memo.get(key)
        if memo is not None:
            return memo
        out = Summary()
        if key in self._active or self._depth >= MAX_DEPTH:
            return out
        self._active.add(key)
        self._depth += 1
        try:
            self._fill(scope, out)
        finally:
            self._depth -= 1
            self._active.discard(key)
        self._memo[key] = out
        return out

    def _fill(self, scope: Scope, out: Summary) -> None:
        module = scope.module
        qual_of = module.qual
        for item in scope.items:
            cls = item.__class__
            if cls is ast.Call:
                qual = qual_of(item.func)
                for kind, lib, detail in classify_call(module, scope, item, qual):
                    if kind != DRAW or not is_seed_choice(module, item):
                        out.add(Event(kind, lib, ((module, item),), detail))
                if qual is None or qual[0] == "." or not is_external(qual):
                    self._follow(module, scope, item, qual, out)
            elif cls is ast.Import or cls is ast.ImportFrom:
                continue  # the top level of imported modules is not followed (see the module docstring)
            else:
                for kind, lib, detail in store_events(module, item):
                    out.add(Event(kind, lib, ((module, item),), detail))

    def _inline(self, module: Module, site: ast.AST, target: Scope, out: Summary) -> None:
        if self.local_only and target.module is not module:
            return
        for event in self.summary(target).events:
            out.add(Event(event.kind, event.lib, ((module, site), *event.chain), event.detail))

    def _follow(self, module: Module, scope: Scope, call: ast.Call, qual: str | None, out: Summary) -> None:
        targets = list(self.call_targets(module, scope, call))
        name = None if targets else (qual or dotted(call.func))
        if name:
            if is_assumed_seeder(name):
                for lib in K.LIBS:
                    out.add(Event(SEED, lib, ((module, call),), f"{name}() (assumed to seed every library)"))
            elif is_assumed_determinism(name):
                out.add(Event(DET, None, ((module, call),), f"{name}() (assumed to enable deterministic mode)"))
        for target in targets:
            if isinstance(target, ClassInfo):
                self._construct(module, call, target, out)
            else:
                self._inline(module, call, target, out)
        for arg in (*call.args, *(kw.value for kw in call.keywords)):
            if arg.__class__ is ast.Name or arg.__class__ is ast.Attribute:
                ref = self.project.resolve_expr(module, scope, arg)
                if isinstance(ref, Scope):
                    self._inline(module, call, ref, out)
            elif arg.__class__ is ast.Lambda and arg in module.scope_of:
                self._inline(module, call, module.scope_of[arg], out)

    def _construct(self, module: Module, call: ast.Call, cls: ClassInfo, out: Summary) -> None:
        if self.local_only and cls.module is not module:
            return
        project = self.project
        if project.derives_from(cls, K.MODULE_BASES):
            out.add(Event(MODEL, None, ((module, call),), f"{cls.name}()"))
            out.add(Event(DRAW, K.TORCH, ((module, call),), f"{cls.name}() (model initialisation)"))
        if project.derives_from(cls, K.HF_TRAINERS):
            for lib in K.LIBS:
                out.add(Event(SEED, lib, ((module, call),), f"{cls.name}(...) seeds in its constructor"))
        if project.derives_from(cls, frozenset({K.LIGHTNING_TRAINER})):
            out.add(Event(SHARDED, None, ((module, call),), cls.name))
        for method in ("__init__", "__post_init__"):
            target = project.method(cls, method)
            if target is not None:
                self._inline(module, call, target, out)

    def call_targets(self, module: Module, scope: Scope, call: ast.Call) -> Iterator[Scope | ClassInfo]:
        """The project definitions a call may run: a function, a method, or a class (its constructor)."""
        func = call.func
        project = self.project
        if func.__class__ is ast.Name:
            found = project.resolve_expr(module, scope, func)
            if isinstance(found, (Scope, ClassInfo)):
                yield found
            return
        if func.__class__ is not ast.Attribute:
            return
        receiver = func.value
        if receiver.__class__ is ast.Name and receiver.id in ("self", "cls"):
            owner = _owner(scope)
            if owner is not None:
                found = project.method(owner, func.attr)
                if found is not None:
                    yield found
            return
        if (receiver.__class__ is ast.Call and receiver.func.__class__ is ast.Name and receiver.func.id == "super"):
            owner = _owner(scope)
            if owner is not None:
                for base in project.bases(owner):
                    if isinstance(base, ClassInfo):
                        found = project.method(base, func.attr)
                        if found is not None:
                            yield found
                            return
            return
        found = project.resolve_expr(module, scope, func)
        if isinstance(found, (Scope, ClassInfo)):
            yield found
            return
        cls = self._instance_class(module, scope, receiver)
        if cls is not None:
            found = project.method(cls, func.attr)
            if found is not None:
                yield found

    def _instance_class(self, module: Module, scope: Scope, expr: ast.AST) -> ClassInfo | None:
        """The project class of ``x`` in ``x.method()`` when ``x`` was built from one (``x = Trainer(...)``)."""
        if expr.__class__ is ast.Call:
            found = self.project.resolve_expr(module, scope, expr.func)
            return found if isinstance(found, ClassInfo) else None
        if expr.__class__ is ast.Name:
            for value in reversed(scope.values_of(expr.id)):
                if value.__class__ is ast.Call:
                    found = self.project.resolve_expr(module, scope, value.func)
                    if isinstance(found, ClassInfo):
                        return found
        return None


def _owner(scope: Scope) -> ClassInfo | None:
    while scope is not None:
        if scope.owner is not None:
            return scope.owner
        scope = scope.parent
    return None
