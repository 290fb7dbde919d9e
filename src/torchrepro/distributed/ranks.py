"""Distributed training: rank-aware seeds, RNG synchronisation and cross-rank consistency checks.

Everything here runs on ``torch.distributed`` as the program set it up (gloo on CPU, NCCL on CUDA, launched
with ``torchrun``); torchrepro starts no process group and no transport of its own. Every collective it runs
has a time limit (``timeout=``, default :data:`DEFAULT_TIMEOUT_S` seconds or ``TORCHREPRO_DIST_TIMEOUT``): a
rank that exited or is stuck gives a :class:`~torchrepro._core.errors.CollectiveError` naming the collective, the
ranks and the limit, not a hang.

The seeding scheme (details and the table of streams in docs/distributed.md)::

    torchrepro.seed_everything(0)   # every rank: same init stream; per-rank dropout stream from the first forward
    model = DDP(Net())              # identical initial weights on every rank (DDP also broadcasts rank 0's)
    loader = torchrepro.ResumableLoader(data, batch_size=32, seed=0)   # one shard per rank
    for step, batch in enumerate(...):
        ...
        if step % 100 == 0:
            torchrepro.distributed.ranks.check_consistency(model, opt, step=step, raise_on_mismatch=True)
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._core.errors import CollectiveError, RankMismatchError
from .._core.fingerprint import fingerprint_many
from .._core.naming import renamed
from ..control.rng import RNGState
from ..control.seeding import (
    STREAMS,
    current_rank,
    derive_seed,
    rng_streams,
    seed_from_env,
    start_rank_streams,
    stream_rank,
    stream_seed,
    validate_seed,
    world_size,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "KINDS",
    "STREAMS",
    "ConsistencyReport",
    "TensorMismatch",
    "check_consistency",
    "collective_timeout",
    "current_rank",
    "rank_generator",
    "rank_seed",
    "rng_streams",
    "start_rank_streams",
    "stream_seed",
    "sync_rng_states",
    "unreplicated_names",
    "world_size",
]

DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_ENV = "TORCHREPRO_DIST_TIMEOUT"
KINDS = ("params", "buffers", "grads", "optimizer")
LABELS = {"params": "parameter", "buffers": "buffer", "grads": "gradient", "optimizer": "optimizer state"}


# --- seeds ------------------------------------------------------------------------------------------------
def rank_seed(seed: int | None = None, stream: str = "data", *, rank: int | None = None) -> int:
    """A seed for ``stream`` that differs between ranks: ``derive_seed(seed, stream, "rank", rank)``.

    ``seed`` defaults to ``TORCHREPRO_SEED`` (exported by :func:`~torchrepro.seed_everything`); ``rank`` to the
    stream rank (the ``rank=`` given to seed_everything, else the global rank).

    >>> rank_seed(0, "augment", rank=0) != rank_seed(0, "augment", rank=1)
    True
    """
    if seed is None:
        seed = seed_from_env()
        if seed is None:
            raise ValueError("rank_seed() needs a seed: pass one, or call torchrepro.seed_everything(SEED) first.")
    return derive_seed(validate_seed(seed), stream, "rank", stream_rank() if rank is None else rank)


def rank_generator(seed: int | None = None, stream: str = "data", *, rank: int | None = None,
                   device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with :func:`rank_seed`: a private per-rank stream.

    Pass it to the random calls that must differ between ranks (``torch.rand(..., generator=g)``,
    augmentation) without touching the global RNGs.
    """
    return torch.Generator(device=device).manual_seed(rank_seed(seed, stream, rank=rank))


# --- collectives with time limits ---------------------------------------------------------------------------
def collective_timeout(timeout: float | datetime.timedelta | None = None) -> datetime.timedelta:
    """The time limit of torchrepro's collectives: ``timeout``, else ``TORCHREPRO_DIST_TIMEOUT``, else 300 s."""
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif timeout is not None:
        seconds = float(timeout)
    else:
        raw = os.environ.get(TIMEOUT_ENV, "").strip()
        try:
            seconds = float(raw) if raw else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds; set it to e.g. 60 or unset it.") \
                from None
    if not seconds > 0:
        raise ValueError(f"the collective timeout must be a positive number of seconds, got {seconds!r}.")
    return datetime.timedelta(seconds=seconds)


def _dist() -> Any:
    dist = torch.distributed
    return dist if dist.is_available() and dist.is_initialized() else None


def _group_ranks(group: Any) -> list[int]:
    dist = torch.distributed
    try:
        return list(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    except Exception:  # an older torch or a group object without the mapping: the world
        return list(range(dist.get_world_size(group)))


def _comm_device(group: Any) -> torch.device:
    """Where the tensors of a collective on ``group`` must live: the current CUDA device for NCCL, else CPU."""
    backend = str(torch.distributed.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _Collectives:
    """The collectives of one torchrepro call on one group, each waited for with the time limit."""

    def __init__(self, what: str, group: Any, timeout: datetime.timedelta) -> None:
        self.what = what
        self.group = group
        self.timeout = timeout
        self.ranks = _group_ranks(group)
        self.rank = torch.distributed.get_rank()
        self.device = _comm_device(group)

    def _fail(self, op: str, exc: BaseException | None, elapsed: float) -> CollectiveError:
        seconds = self.timeout.total_seconds()
        detail = f" ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]})" if exc is not None and \
            str(exc).strip() else ""
        if elapsed < 0.9 * seconds:  # the backend gave up early: a peer closed its connection (it exited)
            what = f"failed on rank {self.rank} after {elapsed:.1f}s{detail}. Another rank has exited or crashed"
        else:
            what = (f"did not complete on rank {self.rank} within {seconds:g}s{detail}. Another rank has exited, "
                    "crashed, or is stuck")
        return CollectiveError(
            f"{self.what}: the {op} over ranks {self.ranks} {what} before reaching it: every rank must make this "
            f"call at the same point (e.g. every N steps on all ranks). Look at the other ranks' output for the "
            f"first error; raise the limit with timeout= or {TIMEOUT_ENV} if a rank is only slow.",
            ranks=self.ranks, rank=self.rank, timeout_s=seconds)

    def _wait(self, op: str, start: Any) -> None:
        t0 = time.monotonic()
        try:
            work = start()
            done = work.wait(timeout=self.timeout)
        except Exception as exc:  # gloo/NCCL raise RuntimeError or DistBackendError on timeouts and dead peers
            raise self._fail(op, exc, time.monotonic() - t0) from exc
        if done is False:
            raise self._fail(op, None, time.monotonic() - t0)

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        t = t.to(self.device)
        out = [torch.empty_like(t) for _ in self.ranks]
        self._wait("all-gather", lambda: torch.distributed.all_gather(out, t, group=self.group, async_op=True))
        return [o.cpu() for o in out]

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Byte strings of any length from every rank (two all-gathers: lengths, then padded bytes)."""
        sizes = self.all_gather(torch.tensor([len(payload)], dtype=torch.int64))
        return self.all_gather_padded(payload, [int(s.item()) for s in sizes])

    def all_gather_padded(self, payload: bytes, sizes: list[int]) -> list[bytes]:
        width = max(sizes) if sizes else 0
        buf = torch.zeros(max(width, 1), dtype=torch.uint8)
        if payload:
            buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        out = self.all_gather(buf)
        return [o[:n].numpy().tobytes() for o, n in zip(out, sizes)]

    def broadcast_bytes(self, payload: bytes | None, src: int) -> bytes:
        size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64, device=self.device)
        self._wait("broadcast", lambda: torch.distributed.broadcast(size, src, group=self.group, async_op=True))
        n = int(size.item())
        buf = torch.zeros(max(n, 1), dtype=torch.uint8)
        if payload is not None and n:
            buf[:n] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        buf = buf.to(self.device)
        self._wait("broadcast", lambda: torch.distributed.broadcast(buf, src, group=self.group, async_op=True))
        return buf.cpu()[:n].numpy().tobytes()


# --- RNG synchronisation -----------------------------------------------------------------------------------
def sync_rng_states(src: int = 0, *, group: Any = None, timeout: float | datetime.timedelta | None = None,
                    generators: Mapping[str, Any] | None = None) -> RNGState:
    """Give every rank of ``group`` the RNG states of rank ``src`` (a global rank); return the state applied.

    Python ``random``, NumPy's global RNG, torch CPU, CUDA, and the registered or given ``generators`` are
    broadcast as :meth:`RNGState.to_json` JSON (one broadcast of the size, one of the bytes). When a rank sees
    a different number of CUDA devices than ``src`` (one GPU per rank), ``src``'s current device's state is
    applied to this rank's current device. Without a process group it does nothing and returns the current state.
    """
    if _dist() is None:
        return RNGState.capture(generators)
    comm = _Collectives("sync_rng_states", group, collective_timeout(timeout))
    if src not in comm.ranks:
        raise ValueError(f"sync_rng_states(src={src}): rank {src} is not in the group (ranks {comm.ranks}).")
    payload = None
    if comm.rank == src:
        state = RNGState.capture(generators)
        current = torch.cuda.current_device() if state.cuda else None
        payload = json.dumps({"state": state.to_json(), "cuda_current": current}).encode()
    data = json.loads(comm.broadcast_bytes(payload, src).decode())
    state_dict, current = data["state"], data["cuda_current"]
    cuda = state_dict.get("cuda") or []
    if cuda and (not torch.cuda.is_available() or len(cuda) != torch.cuda.device_count()):
        state_dict = dict(state_dict, cuda=[])
        state = RNGState.from_dict(state_dict, source=f"RNG state of rank {src}")
        if torch.cuda.is_available() and current is not None:
            torch.cuda.set_rng_state(RNGState.from_dict({**state_dict, "cuda": [cuda[current]]}).cuda[0],
                                     torch.cuda.current_device())
    else:
        state = RNGState.from_dict(state_dict, source=f"RNG state of rank {src}")
    state.restore(generators, source=f"RNG state of rank {src}")
    return state


# --- consistency checks ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorMismatch:
    """One tensor whose replicas differ between ranks.

    ``ranks`` disagree with the ``reference`` ranks (the largest group of ranks holding equal values; ties go to
    the group with the lowest rank, so with two ranks the higher one is named). ``fingerprints`` maps every
    compared rank to its fingerprint.
    """

    kind: str
    name: str
    ranks: tuple[int, ...]
    reference: tuple[int, ...]
    fingerprints: dict[int, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{LABELS.get(self.kind, self.kind)} {self.name!r}"

    def describe(self) -> str:
        them = " and ".join(f"rank {r}" for r in self.ranks)
        ref = " and ".join(f"rank {r}" for r in self.reference)
        verb = "differs" if len(self.ranks) == 1 else "differ"
        return f"{self.label}: {them} {verb} from {ref}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "label": self.label, "ranks": list(self.ranks),
                "reference": list(self.reference), "fingerprints": {str(k): v for k, v in self.fingerprints.items()}}
    to_dict = renamed("to_json", "to_dict")


@dataclass(frozen=True)
class ConsistencyReport:
    """The outcome of :func:`check_consistency` on one rank (every rank of the group gets the same report).

    ``checked`` counts tensors compared between at least two ranks; ``unreplicated`` counts tensors no other
    rank holds a replica of (a shard, or a pending ``Partial`` DTensor), which were not compared.
    ``problems`` lists ranks whose models or optimizers hold different tensors (names, or grads present on some
    ranks only): then nothing was compared tensor by tensor.
    """

    step: int | None
    ranks: tuple[int, ...]
    checked: int
    unreplicated: int = 0
    mismatches: tuple[TensorMismatch, ...] = ()
    problems: tuple[str, ...] = ()
    what: tuple[str, ...] = KINDS

    @property
    def ok(self) -> bool:
        """True when every replicated tensor is bitwise equal on every rank holding it."""
        return not self.mismatches and not self.problems

    @property
    def disagreeing_ranks(self) -> tuple[int, ...]:
        return tuple(sorted({r for m in self.mismatches for r in m.ranks}))

    def summary(self, limit: int = 5) -> str:
        where = f"at step {self.step}" if self.step is not None else "now"
        if self.ok:
            return (f"ranks {list(self.ranks)} agree {where}: {self.checked} replicated tensor(s) bitwise equal"
                    + (f" ({self.unreplicated} sharded tensor(s) not compared)" if self.unreplicated else "") + ".")
        if self.problems:
            lines = [f"ranks {list(self.ranks)} hold different tensors {where}:"]
            lines += [f"  - {p}" for p in self.problems[:limit]]
        else:
            lines = [f"ranks {list(self.ranks)} disagree {where} on {len(self.mismatches)} of {self.checked} "
                     f"replicated tensor(s) (ranks {list(self.disagreeing_ranks)} differ):"]
            lines += [f"  - {m.describe()}" for m in self.mismatches[:limit]]
        if len(self.problems or self.mismatches) > limit:
            lines.append(f"  (+{len(self.problems or self.mismatches) - limit} more)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "ok": self.ok, "ranks": list(self.ranks), "checked": self.checked,
                "unreplicated": self.unreplicated, "what": list(self.what),
                "mismatches": [m.to_json() for m in self.mismatches], "problems": list(self.problems)}
    to_dict = renamed("to_json", "to_dict")


_REPLICATED = b"\x00" * 8
_NOT_COMPARED = b"\xff" * 8


def _key(parts: Any) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()


def _unique_key(rank: int) -> bytes:
    return _key(("alone", rank))


def _dtensor_type() -> Any:
    mod = sys.modules.get("torch.distributed.tensor")  # no DTensor can exist before its module was imported
    return getattr(mod, "DTensor", None) if mod is not None else None


def _flat_param_type() -> Any:
    mod = sys.modules.get("torch.distributed.fsdp._flat_param")
    return getattr(mod, "FlatParameter", None) if mod is not None else None


def _local(t: torch.Tensor, rank: int, dtensor: Any, flat: Any) -> tuple[torch.Tensor, bytes]:
    """The tensor whose bits this rank holds and its replica key: ranks compare a tensor when their keys match.

    Plain tensors are replicated; a DTensor is keyed by its mesh coordinates along sharded mesh dimensions (so
    the ranks holding the same shard compare it) and not compared while ``Partial`` (a pending reduction);
    FSDP1's flat parameters hold one shard per rank and are not compared.
    """
    if dtensor is not None and isinstance(t, dtensor):
        coord = t.device_mesh.get_coordinate()
        placements = t.placements
        if coord is None or any(p.is_partial() for p in placements):
            return t.to_local(), _NOT_COMPARED
        shards = tuple((d, coord[d]) for d, p in enumerate(placements) if not p.is_replicate())
        mesh = tuple(t.device_mesh.mesh.flatten().tolist())
        return t.to_local(), _key(("dtensor", mesh, shards)) if shards else _key(("dtensor", mesh))
    if flat is not None and isinstance(t, flat):
        return t, _unique_key(rank)
    return t, _REPLICATED


def unreplicated_names(named: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the tensors that are not one replica of a whole (DTensor shards or partials, FSDP1 flat
    parameters): two ranks' values of them differ by design."""
    dtensor, flat = _dtensor_type(), _flat_param_type()
    if dtensor is None and flat is None:
        return []
    def whole(t: torch.Tensor) -> bool:
        if dtensor is not None and isinstance(t, dtensor):
            return all(p.is_replicate() for p in t.placements)
        return not (flat is not None and isinstance(t, flat))

    return [name for name, t in named.items() if not whole(t)]


def _models(model: Any) -> dict[str, tuple[nn.Module, bool]]:
    """``{prefix: (module, buffers_rebroadcast)}``: DDP wrappers looked through; the flag is True for a DDP
    model with ``broadcast_buffers`` (rank 0's buffers overwrite the others' at every forward)."""
    if isinstance(model, nn.Module):
        models = {"": model}
    elif isinstance(model, Mapping):
        models = dict(model)
    else:
        raise TypeError(f"check_consistency(model=...) takes an nn.Module or a {{prefix: module}} dict, got "
                        f"{type(model).__name__}.")
    out = {}
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    for prefix, m in models.items():
        if ddp is not None and isinstance(m, ddp):  # names without "module."
            out[prefix] = (m.module, bool(getattr(m, "broadcast_buffers", False)))
        else:
            out[prefix] = (m, False)
    return out


def _scalar_fp(value: Any) -> bytes:
    return hashlib.blake2b(repr(value).encode(), digest_size=16).digest()


def _collect(model: Any, optimizers: Sequence[Any], what: Sequence[str], rank: int
             ) -> tuple[list[str], list[torch.Tensor | bytes | None], list[bytes]]:
    """Names (``kind:name``), values (tensors, or fingerprints of plain values) and replica keys, in order."""
    dtensor, flat = _dtensor_type(), _flat_param_type()
    names: list[str] = []
    values: list[torch.Tensor | bytes | None] = []
    keys: list[bytes] = []
    param_keys: dict[int, bytes] = {}
    param_names: dict[int, str] = {}

    def add(kind: str, name: str, value: Any, key: bytes | None = None, *, absent: bool = False) -> None:
        names.append(f"{kind}:{name}")
        if absent:  # a gradient that is None: compared by presence only
            values.append(None)
            keys.append(_NOT_COMPARED)
        elif isinstance(value, torch.Tensor):
            local, k = _local(value.detach(), rank, dtensor, flat)
            values.append(local)
            keys.append(k if key is None or (k != _REPLICATED and key != _NOT_COMPARED) else key)
        else:
            values.append(_scalar_fp(value))
            keys.append(key or _REPLICATED)

    for prefix, (m, rebroadcast) in _models(model).items():
        for name, p in m.named_parameters(remove_duplicate=True):
            full = f"{prefix}.{name}" if prefix else name
            param_names[id(p)] = full
            local_key = _local(p.detach(), rank, dtensor, flat)[1] if (dtensor or flat) else _REPLICATED
            param_keys[id(p)] = local_key
            if "params" in what:
                add("params", full, p)
            if "grads" in what:
                add("grads", full, p.grad, local_key, absent=p.grad is None)
        if "buffers" in what:
            for name, b in m.named_buffers(remove_duplicate=True):
                # DDP broadcasts rank 0's buffers at each forward; until then each rank's running statistics
                # hold its own batch's: they are meant to differ between forwards, so they are not compared.
                add("buffers", f"{prefix}.{name}" if prefix else name, b, _NOT_COMPARED if rebroadcast else None)
    if "optimizer" in what:
        for o, opt in enumerate(optimizers):
            tag = f"opt{o}." if len(optimizers) > 1 else ""
            for g, group in enumerate(opt.param_groups):
                for key in sorted(k for k in group if k != "params"):
                    if isinstance(group[key], (torch.Tensor, bool, int, float, str, type(None))):
                        add("optimizer", f"{tag}param_groups[{g}].{key}", group[key])
                for i, p in enumerate(group["params"]):
                    pname = param_names.get(id(p), f"param_groups[{g}].params[{i}]")
                    for skey, value in sorted(opt.state.get(p, {}).items(), key=lambda kv: str(kv[0])):
                        add("optimizer", f"{tag}{pname}.{skey}", value, param_keys.get(id(p)))
    return names, values, keys


def _fingerprints(values: list[torch.Tensor | bytes]) -> list[bytes]:
    idx = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    fps = fingerprint_many([values[i] for i in idx])  # type: ignore[misc]
    out = list(values)
    for i, fp in zip(idx, fps):
        out[i] = bytes.fromhex(fp)
    return out  # type: ignore[return-value]


_ENTRY = 24  # bytes per tensor on the wire: 16 of fingerprint, 8 of replica key


def check_consistency(
    model: nn.Module | Mapping[str, nn.Module],
    optimizer: Any = None,
    *,
    what: Iterable[str] = KINDS,
    group: Any = None,
    raise_on_mismatch: bool = False,
    step: int | None = None,
    timeout: float | datetime.timedelta | None = None,
) -> ConsistencyReport:
    """Check that every replica of the model (and optimizer) is bitwise equal on every rank of ``group``.

    Each rank fingerprints its parameters, buffers, gradients and optimizer state (``what``) on their own device,
    then the ranks exchange one 48-byte header in one all-gather: a digest of the tensors' names, a digest of
    all replicated tensors' fingerprints, and counts. When every rank holds the same names and the same digest,
    that is all. Otherwise a second all-gather exchanges every tensor's fingerprint (or, when the ranks hold
    different tensors, their names), so that the report names each tensor and rank that differ.

    Replicated tensors are compared between all ranks; sharded ones (DTensor ``Shard`` placements, FSDP2) only
    between the ranks holding the same shard; FSDP1 flat parameters, ``Partial`` DTensors and the buffers of a
    DDP model with ``broadcast_buffers`` are not compared. Every rank of the group must call it at the same
    point.

    Args:
        model: an ``nn.Module`` (a ``DistributedDataParallel`` wrapper is looked through, so names have no
            ``module.`` prefix) or a ``{prefix: module}`` dict.
        optimizer: an optimizer, a list of them, or None.
        what: any of ``"params"``, ``"buffers"``, ``"grads"``, ``"optimizer"``.
        group: the process group (default: the world).
        raise_on_mismatch: raise :class:`~torchrepro._core.errors.RankMismatchError` (on every rank) instead of
            returning a report that is not ``ok``.
        step: the training step, quoted in the report.
        timeout: time limit of each collective (see :func:`collective_timeout`).

    Without an initialised process group it compares nothing and returns an ``ok`` report of this rank alone.
    """
    what = tuple(what)
    unknown = [w for w in what if w not in KINDS]
    if unknown:
        raise ValueError(f"check_consistency(what=...) got {unknown}; choose from {list(KINDS)}.")
    optimizers = [] if optimizer is None else list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    if "optimizer" in what and optimizer is None:
        what = tuple(w for w in what if w != "optimizer")
    limit = collective_timeout(timeout)
    rank = current_rank()
    names, values, keys = _collect(model, optimizers, what, rank)
    if _dist() is None:
        return ConsistencyReport(step=step, ranks=(rank,), checked=0, unreplicated=len(names), what=what)
    comm = _Collectives("check_consistency", group, limit)
    rank = comm.rank
    present = [v is not None for v in values]
    fps = _fingerprints([v if v is not None else b"\x00" * 16 for v in values])
    structure = _digest("\n".join(f"{n}|{int(p)}" for n, p in zip(names, present)).encode())
    replicated = [i for i, (p, k) in enumerate(zip(present, keys)) if p and k == _REPLICATED]
    alone = [i for i, (p, k) in enumerate(zip(present, keys)) if p and k == _NOT_COMPARED]
    sharded = sum(present) - len(replicated) - len(alone)
    # One fixed-size all-gather settles the common case: the same tensors on every rank, all replicated (or not
    # compared), and one digest of all their fingerprints that every rank shares.
    header = _words(structure) + _words(_digest(b"".join(fps[i] for i in replicated))) + [len(names), sharded]
    headers = [h.tolist() for h in comm.all_gather(torch.tensor(header, dtype=torch.int64))]
    ranks = tuple(comm.ranks)
    if any(h[:2] != headers[0][:2] or h[4] != headers[0][4] for h in headers):
        listing = json.dumps([n if p else f"{n}|none" for n, p in zip(names, present)]).encode()
        lists = [json.loads(b.decode()) for b in comm.all_gather_bytes(listing)]
        report = ConsistencyReport(step=step, ranks=ranks, checked=0, what=what,
                                   problems=tuple(_structure_problems(ranks, lists)))
    elif not any(h[5] for h in headers) and all(h[2:4] == headers[0][2:4] for h in headers):
        report = ConsistencyReport(step=step, ranks=ranks, checked=len(replicated), unreplicated=len(alone),
                                   what=what)
    else:  # something differs, or shards must be matched with their replicas: exchange every fingerprint
        payload = b"".join(fp + k for fp, k in zip(fps, keys))
        gathered = comm.all_gather_padded(payload, [len(payload)] * len(ranks))
        report = _compare(step, ranks, names, gathered, present, what)
    if raise_on_mismatch and not report.ok:
        raise RankMismatchError(report)
    return report


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _words(digest: bytes) -> list[int]:
    """A 16-byte digest as two int64 words (the header tensor's dtype)."""
    return [int.from_bytes(digest[:8], "little", signed=True), int.from_bytes(digest[8:], "little", signed=True)]


def _structure_problems(ranks: tuple[int, ...], lists: list[list[str]]) -> list[str]:
    base = lists[0]
    problems = []
    for r, other in zip(ranks[1:], lists[1:]):
        if other == base:
            continue
        only_base = [n for n in base if n not in set(other)]
        only_other = [n for n in other if n not in set(base)]
        parts = []
        for who, names in ((f"rank {ranks[0]}", only_base), (f"rank {r}", only_other)):
            if names:
                shown = ", ".join(_pretty(n) for n in names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3
                                                                     else "")
                parts.append(f"only {who} has {shown}")
        problems.append(f"ranks {ranks[0]} and {r} hold different tensors: " + ("; ".join(parts) or
                        "the same names in another order"))
    return problems


def _pretty(entry: str) -> str:
    """``grads:fc.weight|none`` -> ``no gradient 'fc.weight'``; ``params:fc.bias`` -> ``parameter 'fc.bias'``."""
    absent = entry.endswith("|none")
    kind, _, name = entry.removesuffix("|none").partition(":")
    label = f"{LABELS.get(kind, kind)} {name!r}"
    return f"no {label}" if absent else label


def _compare(step: int | None, ranks: tuple[int, ...], names: list[str], gathered: list[bytes],
             present: list[bool], what: tuple[str, ...]) -> ConsistencyReport:
    mismatches = []
    checked = unreplicated = 0
    for i, entry in enumerate(names):
        if not present[i]:
            continue
        lo = i * _ENTRY
        by_key: dict[bytes, dict[int, bytes]] = {}
        for r, data in zip(ranks, gathered):
            key = data[lo + 16: lo + _ENTRY]
            if key != _NOT_COMPARED:
                by_key.setdefault(key, {})[r] = data[lo: lo + 16]
        replicas = [holders for holders in by_key.values() if len(holders) > 1]
        if not replicas:
            unreplicated += 1
            continue
        checked += 1
        for holders in replicas:
            groups: dict[bytes, list[int]] = {}
            for r, fp in holders.items():
                groups.setdefault(fp, []).append(r)
            if len(groups) == 1:
                continue
            ordered = sorted(groups.values(), key=lambda rs: (-len(rs), min(rs)))
            reference = tuple(sorted(ordered[0]))
            others = tuple(sorted(r for rs in ordered[1:] for r in rs))
            kind, _, name = entry.partition(":")
            mismatches.append(TensorMismatch(kind, name, others, reference,
                                             {r: fp.hex() for r, fp in sorted(holders.items())}))
    return ConsistencyReport(step=step, ranks=ranks, checked=checked, unreplicated=unreplicated,
                             mismatches=tuple(mismatches), what=what)
