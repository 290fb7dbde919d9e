"""What a program does, in order, on the path from its entry point: seeds, draws, model construction, CUDA use.

The walker starts at a module's top level (which includes its ``if __name__ == "__main__":`` block) and follows
every call it can resolve to a project definition: functions, methods on ``self`` and on locals built from a
project class (or returned by its classmethods), class constructors (``__init__``), ``super()``, and project
functions passed as arguments to any call (callbacks, ``threading.Thread(target=...)``). The top-level code of
imported project modules is not followed (that would mean reading a whole package for one file). Branches count
as taken and loops run once, so "seeded on the path" means "seeded on some path"; only a branch on a parameter
that the call gives a literal value is skipped (:mod:`.branches`).

A function started in a new process that does not inherit the parent's generators (``mp.spawn(fn)``,
``Process(target=fn)``; see :mod:`.processes`) is walked too, but as an entry point of its own: its events join
the program's, not those of the program's own process.

The result is a :class:`Summary`: the first occurrence of each kind of :class:`Event`, in execution order, over
all processes (``events``) and in the program's own process (``own``), with the processes it spawns
(``spawns``). An event carries the chain of call sites that led to it, so a rule can point at the line in the
linted file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from . import knowledge as K
from .branches import (
    AS_IMPORTED,
    NO_FLAGS,
    Flags,
    branch_guards,
    flag_parameters,
    is_classmethod,
    literal_flags,
    self_offset,
)
from .calls import argument, constant, env_assignments, has_keyword, is_false, is_true, names_in
from .module import ClassInfo, Module, Scope, dotted
from .processes import Start, process_start, unwrap_partial
from .project import Project, is_external

MAX_DEPTH = 16
MAX_PROCESSES = 16  # processes of one program that the seeding rules look at
MAX_SPAWNS = 32  # spawn sites recorded per scope

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
        return _site_in(self.chain, module)

    def where(self) -> str:
        return f"{self.module.display}:{getattr(self.node, 'lineno', 1)}"


def _site_in(chain: tuple[tuple[Module, ast.AST], ...], module: Module) -> ast.AST:
    for mod, node in reversed(chain):
        if mod is module:
            return node
    return chain[0][1]


@dataclass(frozen=True)
class Spawn:
    """A function run in a new process that does not inherit the parent's generators (the spawn or forkserver
    start method, or the platform's default): an entry point of its own."""

    chain: tuple[tuple[Module, ast.AST], ...]  # call sites from the outermost to the call that starts it
    target: Scope
    api: str  # the starting call as written: "mp.spawn", "ctx.Process"
    method: str | None  # "spawn", "forkserver", or None for the platform's default
    seeded: frozenset[str]  # the libraries the parent seeded before the call
    settings: frozenset[str] = frozenset()  # the determinism settings (DET, CUDNN_DET) the parent made before it

    @property
    def node(self) -> ast.AST:
        return self.chain[-1][1]

    def site_in(self, module: Module) -> ast.AST:
        return _site_in(self.chain, module)

    def below(self, module: Module, site: ast.AST, seeded: frozenset[str],
              settings: frozenset[str] = frozenset()) -> Spawn:
        """This spawn as seen from a caller that reached it through ``site`` with ``seeded`` libraries and the
        determinism ``settings`` made."""
        return Spawn(((module, site), *self.chain), self.target, self.api, self.method, self.seeded | seeded,
                     self.settings | settings)


class Summary:
    """The first event of each (kind, library), in execution order, over every process the program starts.

    ``own`` holds the events of the program's own process only (what runs in it, or in children that inherit
    its state), and ``spawns`` the functions it starts in processes of their own (see :class:`Spawn`).
    """

    __slots__ = ("events", "_index", "own", "spawns")

    def __init__(self, *, split: bool = True) -> None:
        self.events: list[Event] = []
        self._index: dict[tuple[str, str | None], int] = {}
        self.own: Summary = Summary(split=False) if split else self
        self.spawns: list[Spawn] = []

    def add(self, event: Event) -> None:
        """Record an event of the program's own process."""
        self.add_any(event)
        if self.own is not self:
            self.own.add_any(event)

    def add_any(self, event: Event) -> None:
        """Record an event (of this process or of a spawned one) in the all-process view only."""
        key = (event.kind, event.lib)
        if key not in self._index:
            self._index[key] = len(self.events)
            self.events.append(event)

    def add_spawn(self, spawn: Spawn) -> None:
        key = (id(spawn.target), id(spawn.node))
        if len(self.spawns) < MAX_SPAWNS and all((id(s.target), id(s.node)) != key for s in self.spawns):
            self.spawns.append(spawn)

    def seeded(self) -> frozenset[str]:
        """The libraries seeded so far in the program's own process."""
        own = self.own
        return frozenset(lib for lib in K.LIBS if (SEED, lib) in own._index)

    def settings(self) -> frozenset[str]:
        """The determinism settings made so far in the program's own process: deterministic mode (DET), cuDNN's
        deterministic flag (CUDNN_DET)."""
        own = self.own
        return frozenset(kind for kind in (DET, CUDNN_DET) if (kind, None) in own._index)

    def rechained(self, prefix: tuple[tuple[Module, ast.AST], ...]) -> Summary:
        """The own-process events, reached through the call sites ``prefix`` (a process view)."""
        out = Summary(split=False)
        for event in self.own.events:
            out.add_any(Event(event.kind, event.lib, (*prefix, *event.chain), event.detail))
        return out

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
        elif attr in K.SAMPLING_METHODS and is_true(argument(call, None, ("do_sample",))):
            yield DRAW, K.TORCH, f".{attr}(do_sample=True)"
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
        if draws_initial_weights(module, scope, qual, call):
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
    if qual in K.MODEL_FACTORIES:
        return qual
    prefix = next((p for p in K.MODEL_FACTORY_PREFIXES if qual.startswith(p)), None)
    if prefix is not None and _builds_model(qual[len(prefix):]):
        return qual
    head, _, method = qual.rpartition(".")
    if (method in K.MODEL_BUILDER_METHODS and head.startswith("transformers.")
            and not head.endswith(K.NOT_MODEL_SUFFIXES)):
        return f"{head.rpartition('.')[2]}.{method}"
    return ""


def _builds_model(member: str) -> bool:
    """Whether calling ``member`` of a model factory prefix builds a model (``resnet50``, ``get_model``,
    ``detection.fasterrcnn_resnet50_fpn``, ``__dict__[...]``): not a look-up (``list_models``, ``get_weight``)
    nor a weights enum (``ResNet50_Weights.DEFAULT.transforms``)."""
    return not any(part in K.NOT_MODEL_MEMBERS or part.endswith(K.WEIGHTS_ENUM_SUFFIX) for part in member.split("."))


def draws_initial_weights(module: Module, scope: Scope, qual: str, call: ast.Call) -> bool:
    """Whether building a model with ``call`` leaves weights drawn from torch's generator in it: not when
    every weight comes from a checkpoint (``from_pretrained`` without a new task head, ``weights=`` that are
    surely given, ``pretrained=True``)."""
    head, _, method = qual.rpartition(".")
    if method in K.PRETRAINED_LOADERS and head.startswith("transformers."):
        return (any(word in head.rpartition(".")[2] for word in K.NEW_HEAD_WORDS)
                or any(has_keyword(call, kw) for kw in K.NEW_HEAD_KEYWORDS))
    for prefix, options in K.PRETRAINED_FACTORIES.items():
        if qual.startswith(prefix) and any(_gives(module, scope, call, kw, value) for kw, value in options):
            new_head = K.NEW_CLASSIFIER_KEYWORDS.get(prefix)
            return new_head is not None and has_keyword(call, new_head)
    return True


def _gives(module: Module, scope: Scope, call: ast.Call, keyword: str, value: bool | None) -> bool:
    """Whether ``call`` passes ``keyword=value`` (``value`` None: weights that are surely given)."""
    given = argument(call, None, (keyword,))
    if given is None:
        return False
    return weights_given(module, scope, given) if value is None else is_true(given)


def weights_given(module: Module, scope: Scope, expr: ast.expr, depth: int = 0) -> bool:
    """Whether ``expr`` surely names pretrained weights: a non-empty string, a ``*_Weights`` entry or a look-up
    of one (``get_weight(...)``, ``get_model_weights(arch).DEFAULT``), or a local name or ``a if c else b``
    that is one in every case. ``None``, ``"DEFAULT" if args.pretrained else None`` and values the linter
    cannot know (``args.weights``, a parameter: often None, training from scratch) are not."""
    cls = expr.__class__
    if cls is ast.Constant:
        return isinstance(expr.value, str) and bool(expr.value)
    if cls is ast.IfExp:
        return all(weights_given(module, scope, branch, depth) for branch in (expr.body, expr.orelse))
    if cls is ast.Name and expr.id not in module.imports:
        values = scope.values_of(expr.id) if depth < 3 else []
        return bool(values) and all(weights_given(module, scope, v, depth + 1) for v in values)
    return _names_weights(module, expr)


def _names_weights(module: Module, expr: ast.AST) -> bool:
    """Whether ``expr`` is (or is taken from) a torchvision weights enum or a weights look-up."""
    node: ast.AST | None = expr
    while node is not None:
        cls = node.__class__
        name = module.qual(node) if cls is ast.Name or cls is ast.Attribute else None
        if name and (name in K.WEIGHTS_LOOKUPS or any(p.endswith(K.WEIGHTS_ENUM_SUFFIX) for p in name.split("."))):
            return True
        node = node.func if cls is ast.Call else node.value if cls is ast.Attribute or cls is ast.Subscript else None
    return False


def dynamic_qual(module: Module, func: ast.AST) -> str | None:
    """A name for a member looked up at run time: ``models.__dict__[arch]`` and ``getattr(models, arch)`` give
    ``torchvision.models.__dict__[...]`` when ``models`` is ``torchvision.models``."""
    owner = None
    if func.__class__ is ast.Subscript and func.value.__class__ is ast.Attribute and func.value.attr == "__dict__":
        owner = module.qual(func.value.value)
    elif (func.__class__ is ast.Call and module.is_builtin(func.func, "getattr") and len(func.args) >= 2
          and func.args[1].__class__ is not ast.Constant):
        owner = module.qual(func.args[0])
    return f"{owner}.__dict__[...]" if owner else None


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


def _pretrained_drop(summary: Summary) -> set[int]:
    """ids of the draws of a pretrained loader that only initialise the model it then overwrites."""
    drop = set()
    for view in (summary, summary.own):
        model, draw = view.first(MODEL), view.first(DRAW, K.TORCH)
        if model is not None and draw is not None and model.chain == draw.chain:
            drop.add(id(draw))
    return drop


# --- the walker ----------------------------------------------------------------------------------------------------
class Walker:
    """Computes (and caches) the :class:`Summary` of any scope, following calls into project definitions."""

    def __init__(self, project: Project, *, local_only: bool = False) -> None:
        self.project = project
        self.local_only = local_only  # follow calls only within the module being walked
        self._memo: dict[tuple[int, Flags], Summary] = {}
        self._active: set[tuple[int, Flags]] = set()
        self._depth = 0
        self._local: Walker | None = None
        self._reached: set[int] = set()  # ids of the scopes summarised (reached from some entry point)
        self._flags: dict[int, frozenset[str]] = {}
        self._guards: dict[int, dict[int, tuple[tuple[str, bool], ...]]] = {}

    def program(self, module: Module) -> Summary:
        return self.summary(module.top)

    def local(self, module: Module) -> Summary:
        """Like :meth:`program`, without following calls into other files (cheap: nothing else is read)."""
        if self._local is None:
            self._local = Walker(self.project, local_only=True)
        return self._local.program(module)

    def reached(self, scope: Scope) -> bool:
        """Whether some walk followed calls into ``scope`` (so its draws were judged on a path)."""
        return id(scope) in self._reached

    def processes(self, summary: Summary) -> list[tuple[Summary, Spawn | None]]:
        """The program's own process and every process it spawns (directly or from a spawned one): the events
        of each, with how it was started (None for the program's own)."""
        out: list[tuple[Summary, Spawn | None]] = [(summary.own, None)]
        todo, seen = list(summary.spawns), set()
        while todo and len(out) <= MAX_PROCESSES:
            spawn = todo.pop(0)
            key = (id(spawn.target), id(spawn.node))
            if key in seen:
                continue
            seen.add(key)
            child = self.summary(spawn.target)
            out.append((self._child_events(spawn, child), spawn))
            todo.extend(Spawn((*spawn.chain, *s.chain), s.target, s.api, s.method, s.seeded, s.settings)
                        for s in child.spawns)
        return out

    def _child_events(self, spawn: Spawn, child: Summary) -> Summary:
        """What runs in a spawned process: the import of the program's main module (its top level without the
        ``__main__`` block) and of the function's module, then the function."""
        main = spawn.chain[0][0]
        out = Summary(split=False)
        for module in dict.fromkeys((main, spawn.target.module)):
            prefix = () if module is main else spawn.chain[:1]
            for event in self.summary(module.top, AS_IMPORTED).own.events:
                out.add_any(Event(event.kind, event.lib, (*prefix, *event.chain), event.detail))
        for event in child.rechained(spawn.chain).events:
            out.add_any(event)
        return out

    def summary(self, scope: Scope, flags: Flags = NO_FLAGS) -> Summary:
        key = (id(scope), flags)
        memo = self._memo.get(key)
        if memo is not None:
            return memo
        out = Summary()
        if key in self._active or self._depth >= MAX_DEPTH:
            return out
        self._active.add(key)
        self._reached.add(key[0])
        self._depth += 1
        try:
            self._fill(scope, out, flags)
        finally:
            self._depth -= 1
            self._active.discard(key)
        self._memo[key] = out
        return out

    def _fill(self, scope: Scope, out: Summary, flags: Flags) -> None:
        module = scope.module
        qual_of = module.qual
        guards = self._guards_of(scope) if flags else None
        for item in scope.items:
            if guards and any((name, not truth) in flags for name, truth in guards.get(id(item), ())):
                continue  # in a branch that the literal arguments of this call rule out
            cls = item.__class__
            if cls is ast.Call:
                func = item.func
                qual = qual_of(func)
                if qual is None and func.__class__ is not ast.Name and func.__class__ is not ast.Attribute:
                    qual = dynamic_qual(module, func)
                if qual is not None and self.project.is_own(module, qual):
                    # the project's own package of a library's name: its code first, else the library's tables
                    if not self._follow(module, scope, item, qual, out):
                        self._classify(module, scope, item, qual, out)
                else:
                    self._classify(module, scope, item, qual, out)
                    if qual is None or qual[0] == "." or not is_external(qual):
                        self._follow(module, scope, item, qual, out)
                if qual != K.PARTIAL:  # partial() only wraps its function
                    self._follow_callbacks(module, scope, item, process_start(module, scope, item, qual), out)
            elif cls is ast.Import or cls is ast.ImportFrom:
                continue  # the top level of imported modules is not followed (see the module docstring)
            else:
                for kind, lib, detail in store_events(module, item):
                    out.add(Event(kind, lib, ((module, item),), detail))

    @staticmethod
    def _classify(module: Module, scope: Scope, call: ast.Call, qual: str | None, out: Summary) -> None:
        """The events of a library call, from the tables (a seed chosen at random is not a draw)."""
        for kind, lib, detail in classify_call(module, scope, call, qual):
            if kind != DRAW or not is_seed_choice(module, call):
                out.add(Event(kind, lib, ((module, call),), detail))

    def _flags_of(self, scope: Scope) -> frozenset[str]:
        found = self._flags.get(id(scope))
        if found is None:
            found = self._flags[id(scope)] = flag_parameters(scope)
        return found

    def _guards_of(self, scope: Scope) -> dict[int, tuple[tuple[str, bool], ...]]:
        found = self._guards.get(id(scope))
        if found is None:
            found = self._guards[id(scope)] = branch_guards(scope.module, scope, self._flags_of(scope))
        return found

    def _inline(self, module: Module, site: ast.AST, target: Scope, out: Summary, call: ast.Call | None = None,
                offset: int = 0) -> None:
        """Add the events of ``target``, run from ``site`` (a call whose literal arguments may rule out
        branches of ``target``)."""
        if self.local_only and target.module is not module:
            return
        flags = literal_flags(call, target, self._flags_of(target), offset) if call is not None else NO_FLAGS
        sub = self.summary(target, flags)
        drop = _pretrained_drop(sub) if target.name in K.PRETRAINED_LOADERS else ()
        seeded = out.seeded() if sub.spawns else frozenset()
        settings = out.settings() if sub.spawns else frozenset()
        made: dict[int, Event] = {}
        for event in sub.events:
            if id(event) not in drop:
                made[id(event)] = Event(event.kind, event.lib, ((module, site), *event.chain), event.detail)
                out.add_any(made[id(event)])
        for event in sub.own.events:
            if id(event) not in drop:
                out.own.add_any(made.get(id(event)) or Event(event.kind, event.lib, ((module, site), *event.chain),
                                                             event.detail))
        for spawn in sub.spawns:
            out.add_spawn(spawn.below(module, site, seeded, settings))

    def _spawn(self, module: Module, call: ast.Call, target: Scope, start: Start, out: Summary) -> None:
        """``target`` runs in a new process: its events count for the program, not for its own process."""
        if self.local_only and target.module is not module:
            return
        for event in self.summary(target).events:
            out.add_any(Event(event.kind, event.lib, ((module, call), *event.chain), event.detail))
        out.add_spawn(Spawn(((module, call),), target, start.api, start.method, out.seeded(), out.settings()))

    def _follow(self, module: Module, scope: Scope, call: ast.Call, qual: str | None, out: Summary) -> bool:
        """Add the events of the project definitions ``call`` runs; whether there are any."""
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
                self._inline(module, call, target, out, call, self_offset(target))
        return bool(targets)

    def _follow_callbacks(self, module: Module, scope: Scope, call: ast.Call, start: Start | None,
                          out: Summary) -> None:
        """Functions passed as arguments run (callbacks, thread targets), or start a process of their own."""
        args = [*call.args, *(kw.value for kw in call.keywords if kw.arg not in K.DEFERRED_CALLBACKS)]
        for arg in args:
            expr = unwrap_partial(module, arg)
            cls = expr.__class__
            if cls is ast.Name or cls is ast.Attribute:
                ref = self.project.resolve_expr(module, scope, expr)
            elif cls is ast.Lambda:
                ref = module.scope_of.get(expr)
            else:
                continue
            if not isinstance(ref, Scope):
                continue
            if start is not None and arg is start.fn and start.method != "fork":
                self._spawn(module, call, ref, start, out)
            else:
                self._inline(module, call, ref, out)

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
                self._inline(module, call, target, out, call, 1)

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
        values = [expr] if expr.__class__ is ast.Call else (
            reversed(scope.values_of(expr.id)) if expr.__class__ is ast.Name else ())
        for value in values:
            if value.__class__ is ast.Call:
                found = self.project.resolve_expr(module, scope, value.func)
                if isinstance(found, ClassInfo):
                    return found
                if isinstance(found, Scope) and found.owner is not None and is_classmethod(found):
                    return found.owner  # a factory classmethod: `model = GPT.from_pretrained(...)`
        return None


def _owner(scope: Scope) -> ClassInfo | None:
    while scope is not None:
        if scope.owner is not None:
            return scope.owner
        scope = scope.parent
    return None
