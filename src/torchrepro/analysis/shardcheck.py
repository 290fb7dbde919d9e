"""Shards and random draws that contradict their placements, within one run of several ranks.

Two signs of a sharded run that computes something else than it should, read from the ranks' traces (no
collective was run for them):

* **A broken shard**: a sharded parameter (a ``Shard``/``StridedShard`` placement) whose shards are bitwise equal on
  every shard while its full tensor is not constant. Each rank records which of its sharded parameters hold one
  value only (``"constant"``, ``_core/dtensor.constant_shards``): a shard that is not constant means a full tensor
  that is not either, so equal shards mean the same values repeated shard after shard, as when every rank
  initialised its shard from the same random state (pytorch#196562, torchtitan#3106) or wrote the whole tensor's
  first rows into its shard.
* **Correlated random numbers / replicas that drew apart**: the random draws of the first steps
  (``record/draws``). A draw on a DTensor must be equal on the ranks holding the same shard and differ between
  shards; a plain draw in a module's forward must be equal on ranks whose input to that module is bitwise equal
  (a replicated region) and differ between ranks whose inputs differ (a sharded region, or other data). Equal draws
  across shards are *correlated random numbers* (each shard's dropout drops the same positions); different draws
  on replicas make replicas part. Draws outside any forward on plain tensors (initialisation, data) are not judged.

Neither changes the verdict of a check (the runs may repeat each other bitwise); both are reported beside it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from .._core.dtensor import describe_layout, replica_key
from ..record.store import Run

_FINGERPRINT = re.compile(r"[0-9a-f]{32}")
KINDS = {"broken-shard": "broken shard", "correlated": "correlated random numbers",
         "replicas-drew": "replicas drew different random numbers"}
CAUSES = {
    "broken-shard": (
        "Every shard of a sharded parameter holds the same values although the tensor is not constant: each rank "
        "filled its shard as if it were the whole tensor from the same random state (initialisation after "
        "sharding with the same seed on every rank, e.g. on CPU where torch.distributed.tensor has no offset-based "
        "RNG tracker, or with FSDP2's CPU offload: pytorch#196562), or copied the same rows into every shard.",
        "Initialise before sharding (then shard with distribute_tensor/fully_shard), or give each shard its own "
        "values: a per-rank seed for the initialisation of sharded parameters, or the full tensor's slice."),
    "correlated": (
        "Ranks holding different shards (or different data) drew bitwise identical random numbers: their dropout "
        "masks and noise are correlated instead of independent, as when every rank reseeds its generator alike "
        "before a sharded region's random op (pytorch#196562's symptom).",
        "Give each shard its own random stream: do not reseed identically inside the model; with torchrepro."
        "seed_everything every rank gets its own stream from the first forward; on CUDA, DTensor's offset-based RNG "
        "tracker (torch.distributed.tensor._random) draws each shard's part of one stream."),
    "replicas-drew": (
        "Ranks that compute the same replicated region (bitwise equal inputs, or a Replicate() DTensor) drew "
        "different random numbers: their outputs part and the replicas diverge.",
        "Draw the replicated region's random numbers from a stream that is the same on the ranks of that region "
        "(tensor parallel: seeded alike across the tensor-parallel group, different across data-parallel ranks)."),
}


@dataclass
class PlacementProblem:
    """One broken shard or questionable draw found in run ``run``: what, where, on which ranks."""

    run: int  # 1-based
    kind: str  # broken-shard, correlated, replicas-drew
    step: int  # broken-shard: 0 = initial parameters; draws: the step whose work drew them
    name: str  # the parameter, or the op of the draw
    ranks: list[int]
    site: str | None = None  # draws: the module whose forward drew ("": outside any forward)
    index: int | None = None  # draws: the index of the draw among that op's at that site in that step
    placements: list[str] | None = None
    mesh_shape: list[int] | None = None
    mesh_dim_names: list[str] | None = None
    more: int = 0  # further parameters or draws of the same kind in this run

    @property
    def label(self) -> str:
        return KINDS[self.kind]

    def _mesh(self) -> str:
        if self.placements is None:
            return ""
        return " [" + describe_layout({"placements": self.placements, "mesh_shape": self.mesh_shape,
                                       "mesh_dim_names": self.mesh_dim_names}, coordinate=False) + "]"

    def describe(self) -> str:
        them = _ranks_text(self.ranks)
        more = f" (+{self.more} more)" if self.more else ""
        if self.kind == "broken-shard":
            where = "in the initial parameters" if self.step == 0 else f"at step {self.step}"
            return (f"run {self.run}: broken shard {where}: {self.name}{self._mesh()} has bitwise identical shards "
                    f"on {them} although the tensor is not constant{more}")
        site = (f"in {self.site} during step {self.step}" if self.site
                else f"outside any module's forward by the end of step {self.step}")
        what = f"{self.name} #{self.index} {site}{self._mesh()}"
        if self.kind == "correlated":
            whose = "other shards" if self.placements is not None else "different inputs"
            return f"run {self.run}: correlated random numbers: {what} drew bitwise identical values on {them}, " \
                   f"which hold {whose}{more}"
        whose = "the same shard" if self.placements is not None else "bitwise equal inputs"
        return f"run {self.run}: replicas drew different random numbers: {what} differs between {them}, which " \
               f"hold {whose}{more}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"label": self.label, "text": self.describe()}


def _ranks_text(ranks: list[int]) -> str:
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}" if len(ranks) > 1 else f"rank {ranks[0]}"


def _with_layout(problem: PlacementProblem, lay: dict[str, Any] | None) -> PlacementProblem:
    if lay is not None:
        problem.placements = [str(p) for p in lay.get("placements") or []]
        problem.mesh_shape = list(lay.get("mesh_shape") or [])
        problem.mesh_dim_names = lay.get("mesh_dim_names")
    return problem


def _is_sharded(lay: dict[str, Any] | None) -> bool:
    return lay is not None and any(str(p).startswith(("Shard", "StridedShard")) for p in lay.get("placements") or [])


Layouts = dict[str, dict[str, Any]]  # kind -> {name: layout}, as analysis.rankcompare.layouts_at gives them


def broken_shards(ranks: list[Run], tracked: list[tuple[Layouts, list[Layouts]]], run: int = 1
                  ) -> PlacementProblem | None:
    """The first event (initial parameters, then each step) where a sharded parameter has bitwise equal shards on
    every shard while some rank's shard is not constant; None when there is none or the run did not record which
    shards are constant (recorded before torchrepro wrote it). ``tracked``: each rank's layouts at its init event
    and at each step (``analysis.rankcompare.layouts_at``)."""
    if len(ranks) < 2:
        return None
    inits = [r.of_kind("init") for r in ranks]
    events: list[tuple[int, list[dict[str, Any]], list[dict[str, Any]]]] = []
    if all(inits):
        events.append((0, [i[0] for i in inits], [t[0].get("params") or {} for t in tracked]))
    steps = [r.steps() for r in ranks]
    for k in range(min(len(s) for s in steps)):
        events.append((k + 1, [s[k] for s in steps],
                       [(t[1][k] if k < len(t[1]) else {}).get("params") or {} for t in tracked]))
    for step, evs, lays in events:
        if not all(isinstance(e.get("constant"), list) for e in evs):
            continue
        constant = {str(n) for e in evs for n in e["constant"]}
        found: list[str] = []
        for name in evs[0].get("params") or {}:
            if name in constant or not all(_is_sharded(lay.get(name)) for lay in lays):
                continue
            fps = [(e.get("params") or {}).get(name) for e in evs]
            if not all(isinstance(fp, str) and _FINGERPRINT.fullmatch(fp) for fp in fps) or len(set(fps)) != 1:
                continue
            keys = [replica_key(lay.get(name)) for lay in lays]
            if any(k is None for k in keys) or len(set(keys)) < 2:
                continue  # every rank holds the same shard (a mesh of one shard): nothing says they should differ
            found.append(name)
        if found:
            return _with_layout(PlacementProblem(run, "broken-shard", step, found[0], list(range(len(ranks))),
                                                 more=len(found) - 1), lays[0].get(found[0]))
    return None


def _draws(run: Run) -> dict[tuple[int, str, str, int], dict[str, Any]]:
    out: dict[tuple[int, str, str, int], dict[str, Any]] = {}
    for e in run.events:
        if e.get("kind") == "draw" and isinstance(e.get("fp"), str):
            out.setdefault((int(e.get("during_step") or 0), str(e.get("site") or ""), str(e.get("op") or ""),
                            int(e.get("i") or 0)), e)
    return out


def _region(draw: dict[str, Any]) -> Any:
    """Ranks whose draws have equal regions must draw alike; None: not judged."""
    lay = draw.get("layout")
    if isinstance(lay, dict):
        return replica_key(lay)
    return ("input", draw["in"]) if isinstance(draw.get("in"), str) else None


def draw_problems(ranks: list[Run], run: int = 1) -> tuple[list[PlacementProblem], int]:
    """The first draw of correlated random numbers and the first of replicas that drew apart (each with how many
    more there are), and how many draws were compared (present on every rank and judged)."""
    if len(ranks) < 2:
        return [], 0
    per_rank = [_draws(r) for r in ranks]
    first: dict[str, PlacementProblem] = {}
    compared = 0
    for key in per_rank[0]:
        draws = [d.get(key) for d in per_rank]
        if any(d is None for d in draws):
            continue
        regions = [_region(d) for d in draws]  # type: ignore[arg-type]
        if any(r is None for r in regions):
            continue
        compared += 1
        groups: dict[Any, list[int]] = {}
        for r, region in enumerate(regions):
            groups.setdefault(region, []).append(r)
        step, site, op, index = key
        lay = draws[0].get("layout")  # type: ignore[union-attr]
        found: list[tuple[str, list[int]]] = []
        for members in groups.values():
            if len({draws[r]["fp"] for r in members}) > 1:  # type: ignore[index]
                found.append(("replicas-drew", members))
                break
        if len(groups) > 1:
            by_fp: dict[str, set[Any]] = {}
            for r, d in enumerate(draws):
                if not d.get("const"):  # type: ignore[union-attr]
                    by_fp.setdefault(d["fp"], set()).add(regions[r])  # type: ignore[index]
            same = next((fp for fp, regs in by_fp.items() if len(regs) > 1), None)
            if same is not None:
                found.append(("correlated", [r for r, d in enumerate(draws) if d["fp"] == same]))  # type: ignore[index]
        for kind, members in found:
            if kind in first:
                first[kind].more += 1
            else:
                first[kind] = _with_layout(PlacementProblem(run, kind, step, op, members, site=site, index=index),
                                           lay if isinstance(lay, dict) else None)
    return [first[k] for k in ("correlated", "replicas-drew") if k in first], compared


def placement_problems(ranks: list[Run], tracked: list[tuple[Layouts, list[Layouts]]], run: int = 1
                       ) -> tuple[list[PlacementProblem], int]:
    """Broken shards and questionable draws of one run (see the module docs), and how many draws were compared;
    ``tracked`` as for :func:`broken_shards`."""
    shard = broken_shards(ranks, tracked, run)
    draws, compared = draw_problems(ranks, run)
    return ([shard] if shard is not None else []) + draws, compared
