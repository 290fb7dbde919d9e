"""Runs of several ranks (torchrun): divergence between runs per rank, desynchronisation between ranks.

A run recorded with ``--nproc-per-node P`` holds one run directory per rank (``RUN/rank0`` ...). Two questions:

* Divergence: is rank ``r`` of run 1 bitwise equal to rank ``r`` of runs 2..N? Each rank's runs are compared with
  :func:`~torchrepro.analysis.compare.compare_runs`, as in a single-process check.
* Desynchronisation: within one run, do the ranks hold the same replicas? Their traces are compared step by step:
  the initial parameters, then each step's gradients, parameters and optimizer state (losses and data batches
  differ between ranks by design). Tensors recorded as unreplicated (DTensor shards, FSDP flat parameters) are
  left out. The first step and tensor where ranks disagree is reported with the ranks that differ.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..record.store import Run
from .compare import CheckResult, compare_runs

SCHEMA = "torchrepro.check/1"
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
               f"{self.label} {shown}"

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


def _first_difference(maps: list[dict[str, Any]], kind: str, unreplicated: set[str]) -> tuple[list[str], list[int],
                                                                                                list[int], int] | None:
    names = list(dict.fromkeys(n for m in maps for n in m))
    compared = [n for n in names if _replicated(n, kind, unreplicated)]
    differing, first = [], None
    for name in compared:
        found = _groups([m.get(name) for m in maps])
        if found is not None:
            differing.append(name)
            first = first or found
    if first is None:
        return None
    return differing, first[1], first[0], len(compared)


def rank_desync(ranks: list[Run], run: int = 1) -> Desync | None:
    """The first step and tensors where the ranks of one run disagree, or None when their replicas are equal."""
    if len(ranks) < 2:
        return None
    unreplicated = {str(n) for r in ranks for n in (r.manifest.get("unreplicated") or [])}
    inits = [r.of_kind("init") for r in ranks]
    if all(inits):
        found = _first_difference([i[0].get("params") or {} for i in inits], "init", unreplicated)
        if found:
            return Desync(run, 0, "init", found[0], found[1], found[2], found[3])
    steps = [r.steps() for r in ranks]
    for k in range(min(len(s) for s in steps)):
        for kind in ("grads", "params", "state"):
            found = _first_difference([s[k].get(kind) or {} for s in steps], kind, unreplicated)
            if found:
                return Desync(run, k + 1, kind, found[0], found[1], found[2], found[3])
    return _steps_desync([len(s) for s in steps], run)


def _steps_desync(counts: list[int], run: int) -> Desync | None:
    """Ranks that ran different numbers of steps: those that ran fewer than the most stopped early (named)."""
    most = max(counts)
    if min(counts) == most:
        return None
    early = [r for r, c in enumerate(counts) if c < most]
    return Desync(run, min(counts) + 1, "steps", [f"rank {r}: {c}" for r, c in enumerate(counts)], early,
                  [r for r, c in enumerate(counts) if c == most])


@dataclass
class RanksCheck:
    """The outcome of checking N runs of P ranks each."""

    nproc: int
    per_rank: list[CheckResult]  # rank r's runs compared
    desync: list[Desync | None] = field(default_factory=list)  # per run

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
        """The rank whose comparison represents the check: the first that diverged, else rank 0."""
        for r, result in enumerate(self.per_rank):
            if result.verdict != "identical":
                return r, result
        return 0, self.per_rank[0]

    def to_json(self) -> dict[str, Any]:
        rank, lead = self.lead
        first = next((d for d in self.desync if d is not None), None)
        return lead.to_json() | {
            "schema": SCHEMA, "verdict": self.verdict, "nproc_per_node": self.nproc, "lead_rank": rank,
            "ranks": [{"rank": r} | res.to_json() for r, res in enumerate(self.per_rank)],
            "desync": [d.to_json() if d is not None else None for d in self.desync],
            "desync_cause": {"explanation": DESYNC_CAUSE[0], "action": DESYNC_CAUSE[1]} if first else None,
        }


def compare_rank_runs(runs: list[list[Run]]) -> RanksCheck:
    """``runs[i][r]`` is rank ``r`` of run ``i``: compare each rank across runs and the ranks within each run."""
    nproc = len(runs[0])
    per_rank = [compare_runs([run[r] for run in runs]) for r in range(nproc)]
    return RanksCheck(nproc, per_rank, [rank_desync(run, i) for i, run in enumerate(runs, start=1)])
