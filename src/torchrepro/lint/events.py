"""What a walk of a program records (:mod:`.flow`): the kinds of event, an :class:`Event` with the chain of call
sites that led to it, a :class:`Spawn` (a function run in a process of its own), and the :class:`Summary` that
keeps the first event of each kind in execution order."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from . import knowledge as K
from .module import Module, Scope

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
