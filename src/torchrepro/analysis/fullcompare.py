"""``compare`` of torchrun commands: what is compared when a side ran on several ranks.

A side recorded on several ranks (``torchrepro compare 'torchrun --nproc-per-node 2 t.py' ...``, or a run
directory of several ranks) holds one run per rank, each with its *local shards* of the DTensors (FSDP2, tensor
parallel). Which runs are then compared:

* **The full-tensor views** (``--full-tensors``, see :mod:`torchrepro.record.fullview`): each side's rank 0 wrote
  every DTensor parameter and gradient assembled whole, at the kept steps. Runs with *other* world sizes or meshes
  compare there: bitwise, or within ``--rtol``/``--atol``, and the first step and tensor where they part say
  whether (and where) the numerics depend on the shard count. A side of one process is its own full view.
* **Rank by rank**: two sides with the same ranks and the same layouts (placements, mesh, shapes), recorded without
  the full view: rank ``r`` of A against rank ``r`` of B, by local shard; the verdict is the rank that parts first.
* Otherwise the runs are refused as not comparable (each rank holds other parts of the tensors), saying to add
  ``--full-tensors``.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from .._core.errors import RunsNotComparableError
from ..record.fullview import FULL
from ..record.store import MANIFEST, Run, load_ranks, load_run
from .crossrun import CompareResult, compare_commands
from .rankcompare import layout_mismatches, layouts_at
from .tolerance import Tolerance

# manifest keys of a full view that replace rank 0's (the rest, the environment and command first, are rank 0's)
_FULL_KEYS = ("step_mode", "steps", "optimizer_steps", "backward_calls", "fingerprint_algorithm", "trace_records",
              "values_saved", "values_skipped", "values_error", "values_failed", "full_view")


class RanksCompareResult(CompareResult):
    """A comparison of torchrun sides: its next action does not offer ``--locate`` (it traces one process)."""

    @property
    def action(self) -> str | None:
        base = super().action
        if base is None or "--locate" not in base:
            return base
        a, b = (shlex.quote(c) for c in self.commands)
        compare = shlex.join(["torchrepro", "compare", *[o for o in self.options if o != "--locate"]])
        how = (f"`{compare} --rtol dtype {a} {b}` says whether the difference is within torch.testing's per-dtype "
               "tolerance (or give your own --rtol/--atol)" if self.tolerance.bitwise else
               "look at the tensors named above, the first to part")
        return (f"{how}; --locate does not trace torchrun commands yet: record one rank of each with `torchrepro "
                "run --record DIR --trace-steps K -- torchrun ...` (same world size) and run `torchrepro diff "
                "--locate DIR_A/rank0 DIR_B/rank0`.")


def _ranked(result: CompareResult) -> RanksCompareResult:
    return RanksCompareResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result)})


def full_view(ranks: list[Run]) -> Run | None:
    """The full-tensor view of a run of several ranks (``rank0/full``), with rank 0's command and environment;
    None when it was recorded without one."""
    path = Path(ranks[0].path) / FULL
    if not (path / MANIFEST).exists():
        return None
    full = load_run(path)
    manifest = {**ranks[0].manifest, **{k: full.manifest[k] for k in _FULL_KEYS if k in full.manifest}}
    return Run(path=full.path, manifest=manifest, events=full.events)


def _has_dtensors(ranks: list[Run]) -> bool:
    return any(isinstance(e.get("layouts"), dict) for r in ranks for e in r.events)


def _side_text(label: str, ranks: list[Run] | None) -> str:
    return f"{label} on {len(ranks)} ranks" if ranks is not None else f"{label} in one process"


def compare_sides(dirs: list[Path], tol: Tolerance, *, full_tensors: bool = False, commands: list[str] | None = None,
                  **how: Any) -> tuple[CompareResult, list[Run]]:
    """Compare the runs recorded in ``dirs`` (A, B) as ``compare`` does, and return the result with the two runs
    it compared (for the environment and the report). A run of several ranks is compared by its full-tensor view
    (with ``full_tensors``, or when the sides are sharded differently), else rank by rank; see the module docs.
    ``how``: :func:`~torchrepro.analysis.crossrun.compare_commands`'s keywords."""
    tops = [load_run(d, allow_ranks=True) for d in dirs]
    if not any(t.manifest.get("ranks") for t in tops):
        return compare_commands(tops[0], tops[1], tol, commands=commands, **how), tops
    ranks: list[list[Run] | None] = [load_ranks(d)[1] if t.manifest.get("ranks") else None
                                     for d, t in zip(dirs, tops)]
    labels = ["A", "B"]
    shown = commands or [str(d) for d in dirs]
    both = [r if r is not None else [t] for r, t in zip(ranks, tops)]
    problems = layout_mismatches(both) if len(both[0]) == len(both[1]) else [
        f"A ran on {len(both[0])} rank(s) and B on {len(both[1])}: each holds other parts of the sharded tensors"]
    sharded = any(_has_dtensors(r) for r in ranks if r is not None)
    if full_tensors or (problems and sharded):
        views = [full_view(r) if r is not None else t for r, t in zip(ranks, tops)]
        missing = [f"{label} (`{what}`) was recorded without the full-tensor view (no {Path(r[0].path) / FULL})"
                   for label, what, r, v in zip(labels, shown, ranks, views) if r is not None and v is None]
        if missing:
            raise RunsNotComparableError(problems + missing, _ADD_FULL.format(a=shlex.quote(shown[0]),
                                                                                b=shlex.quote(shown[1])))
        assert views[0] is not None and views[1] is not None
        result = _ranked(compare_commands(views[0], views[1], tol, commands=commands, **how))
        result.check.notes.append(
            f"Compared the full-tensor views ({_side_text('A', ranks[0])}, {_side_text('B', ranks[1])}): every "
            "DTensor parameter and gradient assembled whole by rank 0 at the kept steps (--full-tensors); the "
            "losses, data batches and optimizer state are each rank's own and are not in it. A difference here "
            "is one of the numerics (the same model trained on the same data): it depends on how the tensors are "
            "sharded.")
        return result, [views[0], views[1]]  # their manifests carry rank 0's command and environment
    if problems and (ranks[0] is None or ranks[1] is None) and not sharded:  # DDP: rank 0 holds the whole model
        runs = [r[0] if r is not None else t for r, t in zip(ranks, tops)]
        result = _ranked(compare_commands(runs[0], runs[1], tol, commands=commands, **how))
        result.check.notes.append("Compared rank 0 of the side run on several ranks: it holds no DTensor, so each "
                                  "rank holds the whole model (data parallel).")
        return result, runs
    if problems:
        raise RunsNotComparableError(problems, _ADD_FULL.format(a=shlex.quote(shown[0]), b=shlex.quote(shown[1])))
    return _rank_by_rank(both, tol, commands=commands, **how)


_ADD_FULL = ("The sides sharded their tensors differently (other world size, mesh or placements), so each rank holds "
             "other parts of them and no step can be compared rank by rank. Add --full-tensors: every DTensor is "
             "then also assembled whole and recorded by rank 0, and the full tensors are compared: "
             "`torchrepro compare --full-tensors {a} {b}` (a recorded run directory: record it again with "
             "`torchrepro run --record DIR --full-tensors -- torchrun ...`).")


def _rank_by_rank(both: list[list[Run]], tol: Tolerance, **how: Any) -> tuple[CompareResult, list[Run]]:
    """Rank ``r`` of A against rank ``r`` of B for every rank; the result of the rank that parts first (the
    earliest first divergent step; ties: the lowest rank), else rank 0's."""
    results = [_ranked(compare_commands(a, b, tol, **how)) for a, b in zip(both[0], both[1])]
    worst = "diverged" if any(res.verdict == "diverged" for res in results) else "equivalent"
    parted = [(res.check.first_step if res.check.first_step is not None else 1 << 30, r)
              for r, res in enumerate(results) if res.verdict == worst]
    rank = min(parted)[1] if parted else 0
    lead = results[rank]
    verdicts = ", ".join(f"rank {r} {res.verdict}" for r, res in enumerate(results))
    dtensors = any(layouts_at(run)[0] for run in both[0])
    lead.check.notes.append(f"Compared rank by rank ({len(results)} ranks on each side, sharded alike"
                            f"{'; DTensors by local shard' if dtensors else ''}): {verdicts}; shown: rank {rank}.")
    return lead, [both[0][rank], both[1][rank]]
