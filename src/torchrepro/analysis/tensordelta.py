"""How two tensors differ: bitwise first, then the greatest finite |Δ| and ULP distance, with NaN/Inf positions
counted apart (:func:`tensor_delta`, :class:`TensorDelta`), and the per-snapshot helpers built on it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaNs with the same bits are equal; -0.0 and 0.0 are not)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    ra, rb = a.detach().contiguous().reshape(-1), b.detach().contiguous().reshape(-1)
    if ra.dtype != torch.bool:
        ra, rb = ra.view(torch.uint8), rb.view(torch.uint8)
    return bool(torch.equal(ra, rb))


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """Float bits mapped onto a monotonic integer line: int64 for 32 bits and fewer (differences exact), float64 for
    float64 (whose line spans about 2**64: exact up to 2**53, no overflow)."""
    ix = x.contiguous().view(_INT_VIEW[x.dtype]).long()
    top = (1 << (torch.iinfo(_INT_VIEW[x.dtype]).bits - 1)) - 1
    ordered = torch.where(ix < 0, -(ix & top), ix)
    return ordered.double() if x.dtype == torch.float64 else ordered


@dataclass
class TensorDelta:
    """How two same-shape tensors differ. |Δ| and ULPs cover positions finite in both; NaN/Inf are counted apart."""

    equal: bool  # bitwise
    max_abs: float = 0.0
    max_ulp: int = 0
    nan_only: tuple[int, int] = (0, 0)  # positions that are NaN in the first tensor only, in the second only
    inf: int = 0  # positions where an ±Inf (in either) meets a different value that is not NaN

    def nonfinite_text(self, name: str, run_a: int, run_b: int) -> list[str]:
        """Sentences like ``param fc.weight: NaN at 3 positions in run 2 only`` (runs numbered from 1)."""
        out = []
        for count, run in zip(self.nan_only, (run_a, run_b)):
            if count:
                out.append(f"{name}: NaN at {count} position{'s' if count > 1 else ''} in run {run} only")
        if self.inf:
            out.append(f"{name}: ±Inf at {self.inf} position{'s' if self.inf > 1 else ''} where run {run_a} and "
                       f"run {run_b} differ")
        return out


def tensor_delta(a: torch.Tensor, b: torch.Tensor) -> TensorDelta | None:
    """Compare bits first (identical bits: Δ 0, even with NaNs), then values; None for different shapes or dtypes."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return None
    if _same_bits(a, b):
        return TensorDelta(True)
    if a.is_complex():  # real and imaginary parts compared as floats
        return tensor_delta(*(torch.view_as_real(t.detach().resolve_conj()) for t in (a, b)))
    if not a.is_floating_point():
        return TensorDelta(False)
    a, b = a.detach(), b.detach()
    finite = torch.isfinite(a) & torch.isfinite(b)
    delta = TensorDelta(False)
    if bool(finite.all()):  # the usual case: no masks, no copies of the finite positions
        fa, fb = a, b
    else:
        na, nb = torch.isnan(a), torch.isnan(b)
        inf = ~(na | nb) & ~finite & (a != b)
        delta.nan_only, delta.inf = (int((na & ~nb).sum()), int((nb & ~na).sum())), int(inf.sum())
        if not bool(finite.any()):
            return delta
        fa, fb = a[finite], b[finite]
    delta.max_abs = min(float((fa.double() - fb.double()).abs().max()), sys.float_info.max)
    if a.dtype in _INT_VIEW:
        delta.max_ulp = int((_ordered(fa) - _ordered(fb)).abs().max())
    return delta


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between two same-shape float tensors (0 if identical).

    Positions where either value is NaN or ±Inf are left out (see :func:`tensor_delta`).
    """
    if a.dtype not in _INT_VIEW or a.shape != b.shape or a.numel() == 0:
        return 0
    d = tensor_delta(a, b)
    return d.max_ulp if d is not None else 0


def _deltas(va: dict[str, torch.Tensor], vb: dict[str, torch.Tensor]) -> dict[str, TensorDelta]:
    """Per-tensor deltas of the tensors both snapshots hold with the same shape and dtype."""
    out = {}
    for name, x in va.items():
        y = vb.get(name)
        d = tensor_delta(x, y) if y is not None else None
        if d is not None:
            out[name] = d
    return out


def _worst(deltas: dict[str, TensorDelta], attr: str) -> tuple[float, str | None]:
    """Largest ``attr`` (finite |Δ| or ULPs) and its tensor; the first differing tensor when all are 0."""
    best, where = 0.0, None
    for name, d in deltas.items():
        if not d.equal and (getattr(d, attr) > best or where is None):
            best, where = getattr(d, attr), name
    return best, where


def _nonfinite(deltas: dict[str, TensorDelta], step: int | None, run: int) -> list[dict[str, Any]]:
    """Entries for ``CheckResult.nonfinite``: NaN/Inf positions that differ between run 1 and ``run``."""
    out = []
    for name, d in deltas.items():
        for text in d.nonfinite_text(name, 1, run):
            out.append({"step": step, "tensor": name, "runs": [0, run - 1], "nan_only": list(d.nan_only),
                        "inf": d.inf, "text": text})
    return out


def _differing_elements(a: torch.Tensor, b: torch.Tensor) -> int:
    if a.dtype in _INT_VIEW:
        return int((a.contiguous().view(_INT_VIEW[a.dtype]) != b.contiguous().view(_INT_VIEW[b.dtype])).sum())
    return int((a != b).sum())
