"""Comparing values within a tolerance: per-dtype defaults, and how far apart two tensors are (layer L4).

Two values agree when ``|a - b| <= atol + rtol * |b|`` elementwise (``torch.isclose``); NaN agrees with NaN and an
infinity with the same infinity. Unless given, ``rtol`` and ``atol`` come from the dtype, as in
``torch.testing.assert_close``; a pair of different dtypes (float32 vs bfloat16) takes the looser one's.
A ``bitwise`` tolerance accepts no difference at all, but still measures each one against the tolerances (the
per-dtype defaults), so a report can say how far from acceptable a difference is.

Example:
    >>> import torch
    >>> tol = Tolerance()
    >>> d = value_delta(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.000001]), tol)
    >>> d.within, f"{d.max_abs:.1e}", d.differing
    (True, '9.5e-07', 1)
    >>> Tolerance(rtol=0.0, atol=0.0).for_dtype(torch.float32)
    (0.0, 0.0)
    >>> Tolerance(bitwise=True).describe()
    'bitwise (each difference measured against the per-dtype defaults: float32 rtol=1.3e-06, atol=1e-05)'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .._core.tolerances import BY_DTYPE as DEFAULT_TOLERANCES
from .._core.tolerances import EXACT

LOSS_DTYPE = torch.float32  # the recorded loss is a Python float; its tolerance is float32's unless given


@dataclass(frozen=True)
class Tolerance:
    """``rtol``/``atol`` given on the command line, or None for the dtype's default (:data:`DEFAULT_TOLERANCES`);
    ``bitwise``: accept no difference (each is still measured against these tolerances)."""

    rtol: float | None = None
    atol: float | None = None
    bitwise: bool = False

    def for_dtype(self, dtype: torch.dtype) -> tuple[float, float]:
        """(rtol, atol) for values of ``dtype``."""
        rtol, atol = DEFAULT_TOLERANCES.get(dtype, EXACT)
        return (rtol if self.rtol is None else self.rtol, atol if self.atol is None else self.atol)

    def for_pair(self, a: torch.dtype, b: torch.dtype) -> tuple[float, float]:
        """The looser of the two dtypes' tolerances (float32 vs bfloat16: bfloat16's)."""
        ra, aa = self.for_dtype(a)
        rb, ab = self.for_dtype(b)
        return max(ra, rb), max(aa, ab)

    def describe(self) -> str:
        """``rtol=1e-05, atol=1e-06``, ``rtol=1e-05, atol per dtype (float32: 1e-05)``, or ``bitwise (...)``."""
        rt, at = self.for_dtype(torch.float32)
        if self.bitwise:
            return (f"bitwise (each difference measured against the per-dtype defaults: float32 rtol={rt:g}, "
                    f"atol={at:g})")
        if self.rtol is not None and self.atol is not None:
            return f"rtol={self.rtol:g}, atol={self.atol:g}"
        if self.rtol is None and self.atol is None:
            return f"per dtype (float32: rtol={rt:g}, atol={at:g}; see docs/compare.md)"
        given, other, value = (("rtol", self.rtol, ("atol", at)) if self.rtol is not None
                               else ("atol", self.atol, ("rtol", rt)))
        return f"{given}={other:g}, {value[0]} per dtype (float32: {value[1]:g})"

    def to_json(self) -> dict[str, Any]:
        return {"bitwise": self.bitwise, "rtol": self.rtol, "atol": self.atol,
                "defaults": {str(k).removeprefix("torch."): {"rtol": self.for_dtype(k)[0], "atol": self.for_dtype(k)[1]}
                             for k in DEFAULT_TOLERANCES}}


@dataclass
class ValueDelta:
    """How far apart two tensors are: largest |Δ|, largest relative |Δ| / |b|, and ``ratio``, the largest
    ``|Δ| / (atol + rtol * |b|)`` (above 1: out of tolerance)."""

    within: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    ratio: float = 0.0
    differing: int = 0  # elements whose bits differ
    elements: int = 0
    rtol: float = 0.0
    atol: float = 0.0
    note: str | None = None  # e.g. "NaN in one only", "dtypes float32 and bfloat16"

    def to_json(self) -> dict[str, Any]:
        return {"within": self.within, "max_abs": _finite(self.max_abs), "max_rel": _finite(self.max_rel),
                "ratio": _finite(self.ratio), "differing": self.differing, "elements": self.elements,
                "rtol": self.rtol, "atol": self.atol, "note": self.note}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def value_delta(a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> ValueDelta | None:
    """How ``a`` and ``b`` differ under ``tol``; None when their shapes differ (they cannot be compared).

    Values are compared in float64; NaNs at the same positions and equal infinities agree.
    """
    if a.shape != b.shape:
        return None
    rtol, atol = tol.for_pair(a.dtype, b.dtype)
    note = None if a.dtype == b.dtype else f"dtypes {_name(a.dtype)} and {_name(b.dtype)}"
    if a.is_complex() or b.is_complex():
        a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
    x, y = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
    n = x.numel()
    if n == 0:
        return ValueDelta(True, rtol=rtol, atol=atol, note=note)
    same = (x == y) | (torch.isnan(x) & torch.isnan(y))
    differing = int((~same).sum())
    if a.dtype == b.dtype and a.dtype in _INT_VIEW:  # count bit differences (-0.0 vs 0.0, NaN payloads)
        differing = int((a.detach().contiguous().view(_INT_VIEW[a.dtype]) !=
                         b.detach().contiguous().view(_INT_VIEW[b.dtype])).sum())
    if bool(same.all()):
        return ValueDelta(True, differing=differing, elements=n, rtol=rtol, atol=atol, note=note)
    nan_mismatch = int((torch.isnan(x) ^ torch.isnan(y)).sum())
    diff = (x - y).abs().masked_fill(same, 0.0)
    bound = atol + rtol * y.abs()
    with torch.no_grad():
        max_abs = float(diff.max())
        rel = diff / y.abs()
        rel = rel.masked_fill(same | torch.isnan(rel), 0.0)
        ratio = torch.where(bound > 0, diff / bound, torch.where(diff > 0, torch.inf, 0.0))
    delta = ValueDelta(bool(float(ratio.max()) <= 1.0) and nan_mismatch == 0, max_abs=max_abs,
                       max_rel=float(rel.max()), ratio=float(ratio.max()), differing=differing, elements=n,
                       rtol=rtol, atol=atol, note=note)
    if nan_mismatch:
        delta.note = "; ".join(filter(None, [note, f"NaN in one tensor only at {nan_mismatch} position(s)"]))
    return delta


def scalar_delta(a: float, b: float, tol: Tolerance, dtype: torch.dtype = LOSS_DTYPE) -> ValueDelta:
    """:func:`value_delta` of two numbers (a recorded loss)."""
    found = value_delta(torch.tensor([a], dtype=torch.float64), torch.tensor([b], dtype=torch.float64),
                        Tolerance(*tol.for_dtype(dtype), bitwise=tol.bitwise))
    assert found is not None
    return found


_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
