"""Comparing the runs of :func:`~torchrepro.measure_nondeterminism` tensor by tensor: bitwise classes of runs,
the spread of each value (:class:`Spread`, :class:`TensorReport`, :class:`OutputReport`) and the cosine similarities
of the gradients, computed without cancellation."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch

from .._core.fingerprint import fingerprint_many
from .._core.naming import renamed
from ..analysis.tensordelta import tensor_delta

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _dense(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.detach()
    return (t.to_dense() if t.layout != torch.strided else t).clone()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as integers of the same width (bitwise comparison: NaN payloads and -0.0 count)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bool:
        return t
    if t.is_complex():
        t = torch.view_as_real(t).contiguous()
    size = t.element_size()
    return t.view(_INT_OF_SIZE[size]) if size in _INT_OF_SIZE else t.view(torch.uint8)


def _differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where ``a`` and ``b`` (same shape and dtype) differ bitwise, as a bool tensor of their shape."""
    bad = _bits(a) != _bits(b)
    return bad.reshape(*a.shape, -1).any(-1) if bad.shape != a.shape else bad


def _classes(values: Sequence[torch.Tensor | None]) -> list[int]:
    """For each run, the first run bitwise equal to it (-1 where there is no value).

    Runs are grouped by :func:`~torchrepro.fingerprint` (one read of each tensor, on its device): equal fingerprints
    mean equal bits up to the guarantee documented there (a collision has probability about 2**-64)."""
    present = [i for i, v in enumerate(values) if v is not None]
    fps = fingerprint_many([values[i] for i in present])  # type: ignore[misc]
    first: dict[str, int] = {}
    out = [-1] * len(values)
    for i, fp in zip(present, fps):
        out[i] = first.setdefault(fp, i)
    return out


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class Spread:
    """How one value (a tensor) differs across the runs.

    ``differing_fraction`` counts the elements that differ from run 1 in any run; ``max_abs`` and ``max_ulp`` are
    the largest differences from run 1 at positions finite in both (``nonfinite`` counts positions where NaN/Inf
    differ).
    """

    shape: tuple[int, ...]
    dtype: str
    identical: bool
    differing_fraction: float
    max_abs: float
    max_ulp: int
    nonfinite: int = 0

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(shape=list(self.shape), max_abs=_finite(self.max_abs))
        return d
    to_dict = renamed("to_json", "to_dict")


_S = TypeVar("_S", bound=Spread)


def _extend(spread: Spread, cls: type[_S], **extra: Any) -> _S:
    """``spread`` as an instance of its subclass ``cls``, with ``extra`` fields."""
    return cls(**{f.name: getattr(spread, f.name) for f in dataclasses.fields(Spread)}, **extra)


@dataclass(frozen=True)
class TensorReport(Spread):
    """A :class:`Spread` of a named tensor: a gradient, a parameter after the optimizer step, or the loss.

    For gradients, ``cosine`` is the runs x runs matrix of cosine similarities and ``cosine_distance`` the same
    as ``1 - cosine`` computed without cancellation: a last-bit difference shows there even where the cosine
    rounds to 1.0. ``missing`` lists runs (from 1) in which a gradient was not computed at all.
    """

    name: str = ""
    kind: str = "grad"  # "grad", "param" or "loss"
    cosine: list[list[float]] | None = None
    cosine_distance: list[list[float]] | None = None
    missing: list[int] = field(default_factory=list)

    @property
    def min_cosine(self) -> float | None:
        return None if self.cosine is None else min(min(row) for row in self.cosine)

    @property
    def max_cosine_distance(self) -> float | None:
        return None if self.cosine_distance is None else max(max(row) for row in self.cosine_distance)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, **super().to_json(), "min_cosine": self.min_cosine,
                "max_cosine_distance": self.max_cosine_distance}
    to_dict = renamed("to_json", "to_dict")


def _spread(values: list[torch.Tensor], classes: list[int]) -> Spread:
    """Bitwise identity, fraction of differing elements and the greatest |Δ| / ULP distance from run 1."""
    base = values[0]
    identical = len(set(classes)) == 1
    differing, max_abs, max_ulp, nonfinite = 0.0, 0.0, 0, 0
    if any(v.shape != base.shape or v.dtype != base.dtype for v in values):  # not even the same kind of tensor
        return Spread(tuple(base.shape), _dtype_name(base), False, 1.0, math.inf, 0)
    if not identical and base.numel():
        mask = torch.zeros(base.shape, dtype=torch.bool, device=base.device)
        for rep in sorted(set(classes) - {classes[0]}):
            mask |= _differs(base, values[rep])
            delta = tensor_delta(base, values[rep])
            if delta is not None:
                max_abs, max_ulp = max(max_abs, delta.max_abs), max(max_ulp, delta.max_ulp)
                nonfinite = max(nonfinite, sum(delta.nan_only) + delta.inf)
        differing = int(mask.sum()) / base.numel()
    return Spread(tuple(base.shape), _dtype_name(base), identical, differing, max_abs, max_ulp, nonfinite)


def _report(name: str, kind: str, values: list[torch.Tensor]) -> TensorReport:
    return _extend(_spread(values, _classes(values)), TensorReport, name=name, kind=kind)


@dataclass
class _GramParts:
    """Dot products of one tensor's distinct values (``x_c`` for each class c of runs, class 0 = run 1's value),
    written as ``x_c = x_0 + δ_c`` so that differences never come from subtracting nearly equal dot products:
    ``xx = x_0·x_0``, ``dx[c] = δ_c·x_0``, ``dd[c, c'] = δ_c·δ_c'``."""

    xx: torch.Tensor
    dx: torch.Tensor
    dd: torch.Tensor

    @classmethod
    def of(cls, reps: list[torch.Tensor], sq_norm0: torch.Tensor) -> _GramParts:
        if len(reps) == 1:  # every run equal: nothing to read again
            zero = torch.zeros(1, dtype=torch.float64)
            return cls(sq_norm0, zero, zero.reshape(1, 1))
        rows = torch.stack([r.reshape(-1) for r in reps]).to(torch.float64).nan_to_num(0.0, 0.0, 0.0)
        delta = rows - rows[0]  # exact: float32 values subtracted in float64
        return cls(sq_norm0, (delta @ rows[0]).cpu(), (delta @ delta.t()).cpu())

    def distance_gram(self, classes: list[int], norms: torch.Tensor) -> torch.Tensor:
        """Gram matrix of ``d_i = x_i / norm_i - x_1 / norm_1`` over the runs (``norms`` per run)."""
        reps = sorted(set(classes))
        at = torch.tensor([reps.index(c) for c in classes])
        safe = torch.where(norms > 0, norms, torch.ones_like(norms))
        inv = torch.where(norms > 0, 1.0 / safe, torch.zeros_like(norms))
        s = inv - inv[0]  # d_i = s_i x_0 + inv_i δ_i
        w = inv * self.dx[at]
        return (s[:, None] * s[None, :] * self.xx + s[:, None] * w[None, :] + w[:, None] * s[None, :]
                + self.dd[at][:, at] * inv[:, None] * inv[None, :])


def _sq_norm(t: torch.Tensor) -> torch.Tensor:
    """Squared 2-norm in float64 over the finite elements, on the CPU."""
    sq = torch.linalg.vector_norm(t, dtype=torch.float64).square().cpu()
    if not torch.isfinite(sq):
        sq = torch.linalg.vector_norm(t.nan_to_num(0.0, 0.0, 0.0), dtype=torch.float64).square().cpu()
    return cast(torch.Tensor, sq)


def _distances(gram: torch.Tensor, norms: torch.Tensor, classes: list[int]) -> list[list[float]]:
    """``1 - cos`` for each pair of runs from a :meth:`_GramParts.distance_gram` (exactly 0 for equal runs)."""
    diag = gram.diagonal()
    dist = (0.5 * (diag[:, None] + diag[None, :] - 2 * gram)).clamp(0.0, 2.0)
    zero = norms == 0
    dist = torch.where(zero[:, None] ^ zero[None, :], torch.ones_like(dist), dist)  # zero vs nonzero: cos 0
    dist = torch.where(zero[:, None] & zero[None, :], torch.zeros_like(dist), dist)
    same = torch.tensor(classes)
    dist = torch.where(same[:, None] == same[None, :], torch.zeros_like(dist), dist)
    return dist.tolist()


def _grad_reports(names: list[str], grads: list[list[torch.Tensor | None]]) -> tuple[list[TensorReport],
                                                                                    list[list[float]]]:
    """Per-gradient reports, and the ``1 - cos`` matrix of all gradients concatenated.

    Only the distinct values of each gradient are read again (once, in float64): when every run agrees, the
    cosines cost nothing beyond the fingerprints."""
    runs = len(grads)
    reports: list[TensorReport] = []
    classes_of: list[list[int]] = []
    parts: dict[int, tuple[_GramParts, torch.Tensor]] = {}  # index into names -> (parts, norm per run)
    for k, name in enumerate(names):
        values = [g[k] for g in grads]
        classes = _classes(values)
        classes_of.append(classes)
        missing = [r + 1 for r, v in enumerate(values) if v is None]
        first = next((v for v in values if v is not None), None)
        if first is None:  # no run computed a gradient for it: they agree
            reports.append(TensorReport((), "none", True, 0.0, 0.0, 0, name=name))
            continue
        if missing:  # a gradient computed in some runs only: the runs took different paths
            reports.append(TensorReport(tuple(first.shape), _dtype_name(first), False, 1.0, math.inf, 0, name=name,
                                        missing=missing))
            continue
        reports.append(_extend(_spread(values, classes), TensorReport, name=name))  # type: ignore[arg-type]
        if first.is_floating_point():
            reps = sorted(set(classes))
            sq = {c: _sq_norm(values[c]) for c in reps}  # type: ignore[arg-type]
            gram_parts = _GramParts.of([values[c] for c in reps], sq[0])  # type: ignore[misc]
            parts[k] = (gram_parts, torch.stack([sq[c] for c in classes]).sqrt())
    total = torch.zeros(runs, dtype=torch.float64)
    for _, norms in parts.values():
        total += norms.square()
    total = total.sqrt()
    total_gram = torch.zeros(runs, runs, dtype=torch.float64)
    for k, (gram_parts, norms) in parts.items():
        dist = _distances(gram_parts.distance_gram(classes_of[k], norms), norms, classes_of[k])
        reports[k] = dataclasses.replace(reports[k], cosine=[[1.0 - x for x in row] for row in dist],
                                         cosine_distance=dist)
        total_gram += gram_parts.distance_gram(classes_of[k], total)
    keys = [tuple(c[r] for c in classes_of) for r in range(runs)]
    first_of: dict[tuple[int, ...], int] = {}
    overall = [first_of.setdefault(key, r) for r, key in enumerate(keys)]
    return reports, _distances(total_gram, total, overall)


@dataclass(frozen=True)
class OutputReport(Spread):
    """A :class:`Spread` of the model's outputs.

    For outputs with a class dimension (the last one, of size >= 2): ``argmax_agreement`` is the smallest
    fraction of rows whose argmax agrees between two runs, ``topk_jaccard`` the smallest mean Jaccard index
    ``|A ∩ B| / |A ∪ B|`` of two runs' top-k class sets; the matrices hold every pair.
    """

    topk: int | None = None
    argmax_agreement: float | None = None
    topk_jaccard: float | None = None
    agreement: list[list[float]] | None = None
    jaccard: list[list[float]] | None = None


def _output_report(outputs: list[torch.Tensor], topk: int) -> OutputReport:
    report = _extend(_spread(outputs, _classes(outputs)), OutputReport)
    first = outputs[0]
    if not first.is_floating_point() or first.dim() < 1 or first.shape[-1] < 2 or first.numel() == 0 or any(
            o.shape != first.shape for o in outputs):
        return report
    classes = first.shape[-1]
    k = max(1, min(topk, classes - 1))
    rows = [o.reshape(-1, classes).float() for o in outputs]
    top1 = [r.argmax(-1) for r in rows]
    topk_idx = [r.topk(k, dim=-1).indices for r in rows]
    n = len(outputs)
    agreement = [[1.0] * n for _ in range(n)]
    jaccard = [[1.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            agreement[i][j] = agreement[j][i] = float((top1[i] == top1[j]).double().mean())
            inter = (topk_idx[i][:, :, None] == topk_idx[j][:, None, :]).any(-1).sum(-1).double()
            jaccard[i][j] = jaccard[j][i] = float((inter / (2 * k - inter)).mean())
    return dataclasses.replace(report, topk=k, argmax_agreement=min(map(min, agreement)),
                               topk_jaccard=min(map(min, jaccard)), agreement=agreement, jaccard=jaccard)
