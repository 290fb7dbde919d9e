"""DTensors (FSDP2, tensor parallelism) as torchrepro records them: by this rank's local shard, with its layout.

A DTensor is one rank's part of a tensor spread over a device mesh. torchrepro never assembles the whole tensor on
its default path (that would be a collective on every fingerprint): each rank fingerprints and saves its *local
shard* (``to_local()``, a plain tensor), and records beside it the DTensor's *layout*, which says what that shard is::

    {"placements": ["Shard(0)"],     # per mesh dimension: Shard(d), Replicate(), Partial(sum), StridedShard(d, sf=k)
     "mesh_shape": [2],              # the device mesh's shape
     "mesh_dim_names": ["dp"],       # its dimension names (null when it has none)
     "coordinate": [1],              # this rank's coordinate in the mesh (null: the rank is not in the mesh)
     "mesh_id": "5c0e...",           # 16 hex digits of the mesh's shape and global ranks: which mesh this is
     "shape": [16, 8]}               # the global (full) tensor's shape

Two ranks hold the same bits of a tensor (replicas) when their layouts have the same mesh, the same placements and
the same coordinate along every mesh dimension that is not ``Replicate()`` (:func:`replica_key`); a ``Partial``
DTensor is a pending reduction, whose local values differ between ranks by design (no replica key).

Everything here is local to the rank: no collective. ``torch.distributed.tensor`` is never imported from here: no
DTensor can exist before the program imported it.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["LayoutTracker", "constant_shards", "describe_layout", "dtensor_type", "is_dtensor", "layout",
           "local_shards", "local_tensor", "placement_text", "replica_key"]


def dtensor_type() -> Any:
    """The ``DTensor`` class when ``torch.distributed.tensor`` is imported, else None."""
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None) if mod is not None else None


def is_dtensor(t: Any) -> bool:
    cls = dtensor_type()
    return cls is not None and isinstance(t, cls)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t``'s local shard when ``t`` is a DTensor (a plain tensor, read with no collective), else ``t`` itself."""
    cls = dtensor_type()
    if cls is None or not isinstance(t, cls):
        return t
    with torch.no_grad():  # not a differentiable view: the bits this rank holds
        local: torch.Tensor = t.to_local()
    return local


def local_shards(named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``named`` with every DTensor replaced by its local shard (the same mapping, as a dict, when none is)."""
    if dtensor_type() is None:
        return dict(named)
    return {k: local_tensor(v) for k, v in named.items()}


def placement_text(p: Any) -> str:
    """``Shard(0)``, ``Replicate()``, ``Partial(sum)``, ``StridedShard(0, sf=2)``: a placement as recorded."""
    name = type(p).__name__.lstrip("_")
    if hasattr(p, "split_factor"):
        return f"{name}({p.dim}, sf={p.split_factor})"
    if hasattr(p, "dim") and callable(getattr(p, "is_shard", None)) and p.is_shard():
        return f"{name}({p.dim})"
    if callable(getattr(p, "is_partial", None)) and p.is_partial():
        return f"Partial({getattr(p, 'reduce_op', 'sum')})"
    if callable(getattr(p, "is_replicate", None)) and p.is_replicate():
        return "Replicate()"
    return str(p)


_meshes: dict[int, tuple[Any, dict[str, Any]]] = {}  # id(mesh) -> (mesh, its facts): meshes live as the program does


def _mesh_facts(mesh: Any) -> dict[str, Any]:
    """A mesh's shape, dimension names, this rank's coordinate and id, read once per mesh: reading a sub-mesh's
    ranks needs the process group, which the program may have destroyed by the time its final event is written."""
    hit = _meshes.get(id(mesh))
    if hit is not None and hit[0] is mesh:
        return hit[1]
    ranks = mesh.mesh
    coord = mesh.get_coordinate()
    names = getattr(mesh, "mesh_dim_names", None)
    facts = {
        "mesh_shape": [int(n) for n in ranks.shape],
        "mesh_dim_names": [str(n) for n in names] if names else None,
        "coordinate": [int(c) for c in coord] if coord is not None else None,
        "mesh_id": hashlib.blake2b(f"{tuple(ranks.shape)}|{ranks.flatten().tolist()}".encode(),
                                   digest_size=8).hexdigest(),
    }
    if len(_meshes) < 1024:
        _meshes[id(mesh)] = (mesh, facts)
    return facts


def layout(t: Any) -> dict[str, Any] | None:
    """The layout of a DTensor (see the module docs), or None for any other value."""
    if not is_dtensor(t):
        return None
    return {"placements": [placement_text(p) for p in t.placements], **_mesh_facts(t.device_mesh),
            "shape": [int(n) for n in t.shape]}


def replica_key(lay: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """Ranks whose tensors have equal keys hold the same bits: ``("plain",)`` for a plain tensor (a replica on every
    rank); a DTensor's mesh, placements and coordinates along its sharded mesh dimensions; None for a tensor that
    no two ranks need to agree on (a ``Partial`` DTensor, or a rank outside the mesh)."""
    if lay is None:
        return ("plain",)
    placements = [str(p) for p in lay.get("placements") or []]
    coord = lay.get("coordinate")
    if not isinstance(coord, list) or len(coord) != len(placements) or any(p.startswith("Partial") for p in placements):
        return None
    sharded = tuple((d, coord[d]) for d, p in enumerate(placements) if p != "Replicate()")
    return ("dtensor", lay.get("mesh_id"), tuple(placements), sharded)


def describe_layout(lay: Mapping[str, Any], *, coordinate: bool = True) -> str:
    """``Shard(0) on mesh (dp=2) at (1,)``, ``(Replicate(), Shard(0)) on mesh (2, 2) at (1, 0)``: a layout in words
    (without ``at ...`` when ``coordinate`` is False)."""
    placements = [str(p) for p in lay.get("placements") or []]
    text = placements[0] if len(placements) == 1 else f"({', '.join(placements)})"
    shape = list(lay.get("mesh_shape") or [])
    names = lay.get("mesh_dim_names")
    if isinstance(names, list) and len(names) == len(shape):
        mesh = "(" + ", ".join(f"{n}={s}" for n, s in zip(names, shape)) + ")"
    else:
        mesh = str(tuple(shape))
    text = f"{text} on mesh {mesh}"
    if not coordinate:
        return text
    coord = lay.get("coordinate")
    return text + (f" at {tuple(coord)}" if isinstance(coord, list) else " (this rank is not in the mesh)")


class LayoutTracker:
    """The layouts of the DTensors a recorder fingerprints, written into its events when they change.

    ``fields(params=..., grads=..., state=...)`` (each a ``{name: tensor or None}``) returns ``{"layouts": {kind:
    {name: layout or None}}}`` holding only what changed since the last call for that kind and name (``None``: the
    name was a DTensor and is a plain tensor now), or ``{}``: events of programs without DTensors never change.
    A reader carries each name's layout forward from event to event (``analysis.rankcompare.layouts_at``).

    Made with ``constant=True`` (the recorder's), and with parameters among the kinds, the result also holds
    ``"constant"``: the names of the sharded DTensor parameters (a ``Shard``/``StridedShard`` placement) whose local
    shard holds one value only (a zero bias): a reader that finds a sharded parameter's shards bitwise equal on
    every shard knows from it whether the full tensor is constant (fine) or not (a broken shard,
    ``analysis.shardcheck``). Written whenever a sharded parameter is recorded (an empty list: none is constant);
    one pass over each local shard."""

    def __init__(self, *, constant: bool = False) -> None:
        self._last: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._constant = constant

    def fields(self, **kinds: Mapping[str, Any]) -> dict[str, Any]:
        cls = dtensor_type()
        if cls is None:
            return {}
        changed: dict[str, dict[str, Any]] = {}
        for kind, named in kinds.items():
            for name, t in named.items():
                try:
                    lay = layout(t) if isinstance(t, cls) else None
                except Exception:  # noqa: BLE001 - never break the recording: the last layout written stands
                    continue
                key = (kind, name)
                if lay is None and key not in self._last:
                    continue  # a plain tensor never recorded as a DTensor: nothing to say
                if self._last.get(key, 0) != lay:
                    self._last[key] = lay
                    changed.setdefault(kind, {})[name] = lay
        out: dict[str, Any] = {"layouts": changed} if changed else {}
        if self._constant and "params" in kinds:
            constant = constant_shards(kinds["params"], cls)
            if constant is not None:
                out["constant"] = constant
        return out


def _sharded(t: Any) -> bool:
    return any(callable(getattr(p, "is_shard", None)) and p.is_shard() or hasattr(p, "split_factor")
               for p in t.placements)


def constant_shards(named: Mapping[str, Any], cls: Any = None) -> list[str] | None:
    """The names among ``named`` of the sharded DTensors whose local shard holds a single value (an empty shard
    counts as constant), or None when none of them is a sharded DTensor."""
    cls = cls if cls is not None else dtensor_type()
    if cls is None:
        return None
    found: list[str] | None = None
    for name, t in named.items():
        if not isinstance(t, cls):
            continue
        try:
            if not _sharded(t):
                continue
            local = local_tensor(t).detach().reshape(-1)
            same = local.numel() <= 1 or bool((local == local[0]).all())
        except Exception:  # noqa: BLE001 - never break the recording: not judged
            continue
        found = found if found is not None else []
        if same:
            found.append(name)
    return found
