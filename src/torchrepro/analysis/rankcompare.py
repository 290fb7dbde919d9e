"""Runs of several ranks (torchrun): divergence between runs per rank, desynchronisation between ranks.

A run recorded with ``--nproc-per-node P`` holds one run directory per rank (``RUN/rank0`` ...). Two questions:

* Divergence: is rank ``r`` of run 1 bitwise equal to rank ``r`` of runs 2..N? Each rank's runs are compared with
  :func:`~torchrepro.analysis.compare.compare_runs`, as in a single-process check.
* Desynchronisation: within one run, do the ranks hold the same replicas? Their traces are compared step by step:
  the initial parameters, then each step's gradients, parameters and optimizer state (losses and data batches
  differ between ranks by design). The first step and tensor where ranks disagree is reported with the ranks that
  differ.

Which ranks must agree on a tensor: a plain tensor is a replica on every rank; a DTensor (FSDP2, tensor parallel),
whose recorder wrote its layout into the trace (``"layouts"``, see ``_core/dtensor``), is compared only between the
ranks that hold the same shard of it (same mesh and placements, same coordinate along every mesh dimension that is
not ``Replicate()``): a ``Replicate()`` parameter must be bitwise equal on every rank of its mesh, the shards of a
``Shard(d)`` one differ by design and are never a desynchronisation, and a ``Partial`` one is not compared.
Optimizer state without a layout of its own follows its parameter. Runs recorded before layouts were written fall
back to the manifest's ``unreplicated`` names (left out).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .._core.dtensor import describe_layout, replica_key
from .._core.errors import RunsNotComparableError
from .._core.fingerprint import UNREADABLE
from ..record.store import Run
from .compare import CheckResult, compare_runs
from .shardcheck import placement_problems

SCHEMA = "torchrepro.check/1"
_FINGERPRINT = re.compile(r"[0-9a-f]{32}")
# What is compared between ranks, in causal order within a step.
RANK_LABELS = {"init": "initial parameters", "grads": "gradients", "params": "parameters",
               "state": "optimizer state", "steps": "number of steps"}
DESYNC_CAUSE = (
    "Replicas that must be equal on every rank differ within one run: code that changes the model on some ranks "
    "only (`if rank == 0:` updates, per-rank randomness in the model), gradients that skip the all-reduce "
    "(no_sync, parameters unused on some ranks), or a rank that ran a different number of steps.",
    "Look at what the named rank does differently at that step; call torchrepro.check_consistency(model, optimizer, "
    "step=step, raise_on_mismatch=True) in the script to stop right there.",
)


@dataclass
class Desync:
    """Where the ranks of one run first disagree: step (0 = initial parameters), what, which tensors and ranks."""

    run: int  # 1-based
    step: int
    kind: str
    names: list[str]
    ranks: list[int]  # the ranks that differ from the reference ranks (for the first name; "steps": ran fewer)
    reference: list[int]
    compared: int = 0  # tensors compared at that step
    # the first name's DTensor layout (placements, mesh) and each named rank's mesh coordinate; None: a plain tensor
    placements: list[str] | None = None
    mesh_shape: list[int] | None = None
    mesh_dim_names: list[str] | None = None
    coordinates: dict[int, list[int] | None] | None = None

    @property
    def label(self) -> str:
        return RANK_LABELS[self.kind]

    def describe(self) -> str:
        them = " and ".join(f"rank {r}" for r in self.ranks)
        ref = " and ".join(f"rank {r}" for r in self.reference)
        if self.kind == "steps":
            return (f"run {self.run}: {them} stopped early: the ranks ran different numbers of steps "
                    f"({', '.join(self.names)})")
        shown = ", ".join(self.names[:3]) + (f" (+{len(self.names) - 3} more)" if len(self.names) > 3 else "")
        where = "in the initial parameters" if self.step == 0 else f"at step {self.step}"
        return f"run {self.run}: {them} {'differs' if len(self.ranks) == 1 else 'differ'} from {ref} {where}: " \
               f"{self.label} {shown}{self._mesh_text()}"

    def _mesh_text(self) -> str:
        """`` [Replicate() on mesh (tp=2); rank 1 at (1,), rank 0 at (0,)]`` for a DTensor, else empty."""
        if self.placements is None:
            return ""
        mesh = describe_layout({"placements": self.placements, "mesh_shape": self.mesh_shape,
                                "mesh_dim_names": self.mesh_dim_names}, coordinate=False)
        coords = self.coordinates or {}
        at = ", ".join(f"rank {r} at {tuple(coords.get(r) or ())}" for r in [*self.ranks, *self.reference]
                       if coords.get(r) is not None)
        return f" [{mesh}{'; ' + at if at else ''}]"

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"label": self.label, "text": self.describe()}


def _groups(values: list[Any]) -> tuple[list[int], list[int]] | None:
    """(reference ranks, differing ranks) when ``values`` (one per rank) are not all equal, else None."""
    by_value: dict[str, list[int]] = {}
    for r, v in enumerate(values):
        by_value.setdefault(repr(v), []).append(r)
    if len(by_value) == 1:
        return None
    ordered = sorted(by_value.values(), key=lambda rs: (-len(rs), min(rs)))
    return sorted(ordered[0]), sorted(r for rs in ordered[1:] for r in rs)


def _replicated(name: str, kind: str, unreplicated: set[str]) -> bool:
    if name in unreplicated:
        return False
    return not (kind == "state" and any(name.startswith(f"{u}.") for u in unreplicated))


Layouts = dict[str, dict[str, Any]]  # kind ("params", "grads", "state") -> {name: layout}


def layouts_at(run: Run) -> tuple[Layouts, list[Layouts]]:
    """The DTensor layouts in force at a run's init event and at each of its steps (``Run.steps()``), carried
    forward from the ``"layouts"`` fields of its events (a recorder writes a layout when it changes)."""
    current: Layouts = {}
    init: Layouts = {}
    steps: list[Layouts] = []
    step_kind = "step" if run.step_mode == "optimizer" else "backward"
    for event in run.events:
        changed = event.get("layouts")
        if isinstance(changed, dict):
            for kind, named in changed.items():
                if isinstance(named, dict):
                    current[kind] = {**current.get(kind, {}), **named}
        if event.get("kind") == "init":
            init = dict(current)
        elif event.get("kind") == step_kind:
            steps.append(dict(current))
    return init, steps


def _owner(name: str, params: dict[str, Any]) -> str | None:
    """The parameter an optimizer-state entry (``fc1.weight.exp_avg``) belongs to, among ``params``."""
    head = name
    while "." in head:
        head = head.rsplit(".", 1)[0]
        if head in params:
            return head
    return None


def _layout_of(name: str, kind: str, layouts: Layouts) -> dict[str, Any] | None:
    """The layout that says which ranks hold ``name``'s bits: its own, else (gradients, optimizer state) its
    parameter's."""
    own = (layouts.get(kind) or {}).get(name)
    if own is not None:
        return own
    params = layouts.get("params") or {}
    if kind == "grads":
        return params.get(name)
    if kind == "state":
        owner = _owner(name, params)
        return params.get(owner) if owner is not None else None
    return None


def _replica_keys(name: str, kind: str, layouts: list[Layouts], unreplicated: set[str]
                  ) -> tuple[list[Any], list[dict[str, Any] | None]]:
    """Per rank: the key of the replica group holding ``name`` (None: compared with no other rank) and its layout."""
    lays = [_layout_of(name, "params" if kind == "init" else kind, lay) for lay in layouts]
    if all(lay is None for lay in lays):  # plain tensors (or a run recorded before layouts)
        key = ("plain",) if _replicated(name, kind, unreplicated) else None
        return [key] * len(layouts), lays
    return [replica_key(lay) for lay in lays], lays


def _first_difference(maps: list[dict[str, Any]], kind: str, unreplicated: set[str],
                      layouts: list[Layouts] | None = None) -> tuple[list[str], list[int], list[int], int,
                                                                     dict[str, Any] | None] | None:
    """The tensors of one kind that replicas disagree on: (names, differing ranks and reference ranks of the first,
    tensors compared, the first one's layout on its reference rank or None)."""
    layouts = layouts or [{} for _ in maps]
    names = list(dict.fromkeys(n for m in maps for n in m))
    differing: list[str] = []
    first: tuple[list[int], list[int]] | None = None
    first_layout: dict[str, Any] | None = None
    compared = 0
    for name in names:
        keys, lays = _replica_keys(name, kind, layouts, unreplicated)
        groups: dict[Any, list[int]] = {}
        for r, key in enumerate(keys):
            if key is not None:
                groups.setdefault(key, []).append(r)
        groups = {k: rs for k, rs in groups.items() if len(rs) > 1}  # a shard held by one rank: nothing to compare
        if not groups:
            continue
        compared += 1
        for ranks in groups.values():
            found = _groups([maps[r].get(name) for r in ranks])
            if found is None:
                continue
            if name not in differing:
                differing.append(name)
            if first is None:
                first = ([ranks[i] for i in found[0]], [ranks[i] for i in found[1]])
                first_layout = {"reference": lays[first[0][0]], "coordinates": {
                    r: (lays[r] or {}).get("coordinate") for r in (*first[0], *first[1])}}
    if first is None:
        return None
    return differing, first[1], first[0], compared, first_layout


def _desync(run: int, step: int, kind: str, found: tuple[Any, ...]) -> Desync:
    names, ranks, reference, compared, lay = found
    desync = Desync(run, step, kind, names, ranks, reference, compared)
    ref = (lay or {}).get("reference")
    if ref is not None:
        desync.placements = [str(p) for p in ref.get("placements") or []]
        desync.mesh_shape = list(ref.get("mesh_shape") or [])
        desync.mesh_dim_names = ref.get("mesh_dim_names")
        desync.coordinates = dict(lay["coordinates"])
    return desync


def rank_desync(ranks: list[Run], run: int = 1) -> Desync | None:
    """The first step and tensors where the ranks of one run disagree, or None when their replicas are equal."""
    if len(ranks) < 2:
        return None
    unreplicated = {str(n) for r in ranks for n in (r.manifest.get("unreplicated") or [])}
    tracked = [layouts_at(r) for r in ranks]
    inits = [r.of_kind("init") for r in ranks]
    if all(inits):
        found = _first_difference([i[0].get("params") or {} for i in inits], "init", unreplicated,
                                  [t[0] for t in tracked])
        if found:
            return _desync(run, 0, "init", found)
    steps = [r.steps() for r in ranks]
    for k in range(min(len(s) for s in steps)):
        step_layouts = [t[1][k] if k < len(t[1]) else {} for t in tracked]
        for kind in ("grads", "params", "state"):
            found = _first_difference([s[k].get(kind) or {} for s in steps], kind, unreplicated, step_layouts)
            if found:
                return _desync(run, k + 1, kind, found)
    return _steps_desync([len(s) for s in steps], run)


def _steps_desync(counts: list[int], run: int) -> Desync | None:
    """Ranks that ran different numbers of steps: those that ran fewer than the most stopped early (named)."""
    most = max(counts)
    if min(counts) == most:
        return None
    early = [r for r, c in enumerate(counts) if c < most]
    return Desync(run, min(counts) + 1, "steps", [f"rank {r}: {c}" for r, c in enumerate(counts)], early,
                  [r for r, c in enumerate(counts) if c == most])


def shard_text(lay: dict[str, Any]) -> str:
    """``shard 1 of 2`` (the shard's index over the mesh dimensions that shard it), or ``a replica``."""
    placements = [str(p) for p in lay.get("placements") or []]
    coord, shape = lay.get("coordinate"), lay.get("mesh_shape") or []
    dims = [d for d, p in enumerate(placements) if p != "Replicate()" and not p.startswith("Partial")]
    if any(p.startswith("Partial") for p in placements):
        return "a partial sum (pending reduction)"
    if not dims or not isinstance(coord, list) or len(coord) != len(placements) or len(shape) != len(placements):
        return "a replica"
    index, count = 0, 1
    for d in dims:
        index, count = index * shape[d] + coord[d], count * shape[d]
    return f"shard {index} of {count}"


def tensor_counts(run: Run) -> dict[str, int]:
    """How many tensors a run's trace holds fingerprints of, by kind (each name once), how many of them are
    DTensors (compared by local shard), and how many were unreadable (not compared)."""
    kinds: dict[str, set[str]] = {"params": set(), "grads": set(), "state": set()}
    unreadable: set[tuple[str, str]] = set()
    for event in run.events:
        if event.get("kind") not in ("init", "step", "backward", "final"):
            continue
        for kind in kinds:
            for name, fp in (event.get(kind) or {}).items():
                if not isinstance(fp, str) or not (_FINGERPRINT.fullmatch(fp) or fp.startswith(UNREADABLE)):
                    continue  # a gradient that is None; a scalar of the optimizer state (its repr)
                (unreadable.add((kind, name)) if fp.startswith(UNREADABLE) else kinds[kind].add(name))
    init, steps = layouts_at(run)
    last = steps[-1] if steps else init
    dtensors = sum(1 for kind, names in kinds.items() for n in names if (last.get(kind) or {}).get(n) is not None
                   or (kind == "params" and (init.get("params") or {}).get(n) is not None))
    counts = {kind: len(names) for kind, names in kinds.items()}
    return {"compared": sum(counts.values()), **counts, "dtensors": dtensors, "unreadable": len(unreadable)}


@dataclass
class RanksCheck:
    """The outcome of checking N runs of P ranks each."""

    nproc: int
    per_rank: list[CheckResult]  # rank r's runs compared
    desync: list[Desync | None] = field(default_factory=list)  # per run
    counts: list[dict[str, int]] = field(default_factory=list)  # per rank: tensors compared (tensor_counts)
    # per rank: {name: layout} of the DTensors among the tensors that differ first (empty: none, or identical)
    first_layouts: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    # per run: broken shards and questionable random draws (analysis.shardcheck), and how many draws were compared;
    # reported beside the verdict, which they do not change
    placement: list[tuple[list[Any], int]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if any(r.verdict != "identical" for r in self.per_rank):
            return "diverged"
        return "desynchronised" if any(self.desync) else "identical"

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "identical" else 1

    @property
    def lead(self) -> tuple[int, CheckResult]:
        """The rank whose comparison represents the check: the one that diverged first (the earliest step; ties:
        the lowest rank), else rank 0. A rank that diverges makes the others diverge through the next collective,
        one step later: the first is where to look."""
        diverged = [(res.first_step if res.first_step is not None else float("inf"), r)
                    for r, res in enumerate(self.per_rank) if res.verdict != "identical"]
        if diverged:
            r = min(diverged)[1]
            return r, self.per_rank[r]
        return 0, self.per_rank[0]

    def mesh_text(self, rank: int) -> str:
        """``mesh coordinate (1,), shard 1 of 2 of fc1.weight Shard(0)`` for a rank whose first differing tensor
        is a DTensor; empty otherwise."""
        layouts = self.first_layouts[rank] if rank < len(self.first_layouts) else {}
        if not layouts:
            return ""
        name, lay = next(iter(layouts.items()))
        coord = lay.get("coordinate")
        at = f"mesh coordinate {tuple(coord)}, " if isinstance(coord, list) else ""
        return f"{at}{shard_text(lay)} of {name} {', '.join(map(str, lay.get('placements') or []))}"

    def counts_text(self, rank: int) -> str:
        """``20 tensors compared: 4 parameters, 4 gradients, 12 optimizer-state (20 DTensors, by local shard)``."""
        c = self.counts[rank] if rank < len(self.counts) else None
        if not c:
            return ""
        text = (f"{c['compared']} tensors compared: {c['params']} parameters, {c['grads']} gradients, "
                f"{c['state']} optimizer-state")
        if c["dtensors"]:
            text += f" ({c['dtensors']} DTensors, by local shard)"
        if c["unreadable"]:
            text += f"; {c['unreadable']} unreadable, not compared"
        return text

    def to_json(self) -> dict[str, Any]:
        rank, lead = self.lead
        first = next((d for d in self.desync if d is not None), None)

        def extra(r: int) -> dict[str, Any]:
            out: dict[str, Any] = {}
            if r < len(self.counts):
                out["tensors"] = self.counts[r]
            if r < len(self.first_layouts) and self.first_layouts[r]:
                out["first_layouts"] = self.first_layouts[r]
                out["mesh_text"] = self.mesh_text(r)
            return out

        return lead.to_json() | {
            "schema": SCHEMA, "verdict": self.verdict, "nproc_per_node": self.nproc, "lead_rank": rank,
            "lead_mesh": self.mesh_text(rank) or None,
            "ranks": [{"rank": r} | res.to_json() | extra(r) for r, res in enumerate(self.per_rank)],
            "desync": [d.to_json() if d is not None else None for d in self.desync],
            "desync_cause": {"explanation": DESYNC_CAUSE[0], "action": DESYNC_CAUSE[1]} if first else None,
            "placement": [{"run": i, "problems": [p.to_json() for p in problems], "draws_compared": n}
                          for i, (problems, n) in enumerate(self.placement, start=1)],
        }


def _first_layouts(run: Run, result: CheckResult) -> dict[str, dict[str, Any]]:
    """The layouts (in ``run``) of the DTensors among the tensors that differ first in ``result``."""
    if result.verdict == "identical" or result.first_step is None:
        return {}
    init, steps = layouts_at(run)
    at = init if result.first_step == 0 else (steps[result.first_step - 1] if result.first_step <= len(steps) else {})
    out: dict[str, dict[str, Any]] = {}
    for diff in result.first:
        kind = "params" if diff.kind == "init" else diff.kind
        if kind not in ("params", "grads", "state"):
            continue
        for name in diff.names:
            lay = _layout_of(name, kind, at)
            if lay is not None and name not in out:
                out[name] = lay
    return out


def _layout_notes(rank: int, layouts: dict[str, dict[str, Any]]) -> str | None:
    if not layouts:
        return None
    shown = "; ".join(f"{name}: {describe_layout(lay)}, {shard_text(lay)}" for name, lay in list(layouts.items())[:3])
    more = f" (+{len(layouts) - 3} more)" if len(layouts) > 3 else ""
    return (f"On rank {rank} the first differing tensors are DTensors, fingerprinted and compared by this rank's "
            f"local shard: {shown}{more}.")


def layout_mismatches(runs: list[list[Run]]) -> list[str]:
    """Sentences naming the tensors whose DTensor layout (placements, mesh shape, global shape) differs between
    run 1 and a later run on the same rank: such runs hold different shards, and comparing them bitwise would
    only say that they differ."""
    problems: list[str] = []
    for r in range(len(runs[0])):
        base = layouts_at(runs[0][r])[0].get("params") or {}
        for i, run in enumerate(runs[1:], start=2):
            if r >= len(run):
                continue
            other = layouts_at(run[r])[0].get("params") or {}
            for name in dict.fromkeys([*base, *other]):
                a, b = base.get(name), other.get(name)
                if _layout_facts(a) != _layout_facts(b):
                    problems.append(f"rank {r}: {name} is {_facts_text(a)} in run 1 and {_facts_text(b)} in run {i}")
                    break
    return problems


def _layout_facts(lay: dict[str, Any] | None) -> tuple[Any, ...] | None:
    if lay is None:
        return None
    return (tuple(map(str, lay.get("placements") or [])), tuple(lay.get("mesh_shape") or []),
            tuple(lay.get("shape") or []), tuple(lay.get("coordinate") or []))


def _facts_text(lay: dict[str, Any] | None) -> str:
    return "a plain tensor" if lay is None else f"{describe_layout(lay)} (global shape {tuple(lay.get('shape') or [])})"


def compare_rank_runs(runs: list[list[Run]]) -> RanksCheck:
    """``runs[i][r]`` is rank ``r`` of run ``i``: compare each rank across runs and the ranks within each run.

    Raises :class:`~torchrepro._core.errors.RunsNotComparableError` when the runs laid their DTensors out
    differently (other placements, mesh or world size): their shards hold different parts of the tensors."""
    problems = layout_mismatches(runs)
    if problems:
        raise RunsNotComparableError(problems, "The runs sharded their tensors differently (other placements, device "
                                     "mesh or number of ranks), so each rank holds other parts of them and no "
                                     "step can be compared bitwise. Compare runs with the same mesh and "
                                     "parallelisation, or compare the full tensors: `torchrepro compare "
                                     "--full-tensors 'torchrun ... A' 'torchrun ... B'` (runs recorded with "
                                     "`torchrepro run --full-tensors` compare by directory too).")
    nproc = len(runs[0])
    per_rank = [compare_runs([run[r] for run in runs]) for r in range(nproc)]
    first_layouts = [_first_layouts(runs[0][r], res) for r, res in enumerate(per_rank)]
    for r, res in enumerate(per_rank):
        note = _layout_notes(r, first_layouts[r])
        if note:
            res.notes.append(note)
    return RanksCheck(nproc, per_rank, [rank_desync(run, i) for i, run in enumerate(runs, start=1)],
                      counts=[tensor_counts(runs[0][r]) for r in range(nproc)], first_layouts=first_layouts,
                      placement=[placement_problems(run, [layouts_at(r) for r in run], i)
                                 for i, run in enumerate(runs, start=1)])
