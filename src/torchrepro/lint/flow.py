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

The result is a :class:`~.events.Summary`: the first occurrence of each kind of :class:`~.events.Event`, in
execution order, over all processes (``events``) and in the program's own process (``own``), with the processes
it spawns (``spawns``). An event carries the chain of call sites that led to it, so a rule can point at the line
in the linted file. What one call causes is :mod:`.classify`.
"""


from __future__ import annotations

import ast
from collections.abc import Iterator

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
from .classify import (
    classify_call,
    dynamic_qual,
    is_assumed_determinism,
    is_assumed_seeder,
    is_seed_choice,
    store_events,
)
from .events import DET, DRAW, MODEL, SEED, SHARDED, Event, Spawn, Summary
from .module import ClassInfo, Module, Scope, dotted
from .processes import Start, process_start, unwrap_partial
from .project import Project, is_external

MAX_DEPTH = 16
MAX_PROCESSES = 16  # processes of one program that the seeding rules look at


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
