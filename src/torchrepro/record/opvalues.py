"""Copies of the tensors an op trace fingerprinted, for comparing ops within a tolerance (layer L3).

An op record (:mod:`.optrace`) holds fingerprints only: enough to say whether two ops saw and made the same bits,
not how far apart their values are. When :data:`OP_VALUES_ENV` gives a byte budget, the tracer also keeps a CPU
copy of every floating-point tensor an op reads (before the op runs) or writes, keyed by its fingerprint, and
writes them to ``op_values.pt`` beside ``ops.jsonl`` when tracing ends (``torch.save`` of ``{fingerprint:
tensor}``, loaded with ``weights_only=True``; a DTensor is kept as its local shard, a plain tensor). Tensors past
the budget are counted, not kept: their ops can then only be compared bitwise. ``torchrepro compare --locate`` sets it.

Example:
    >>> keep = OpValues(budget=1 << 20)                     # doctest: +SKIP
    >>> keep.keep([torch.ones(3)], ["00ab..."]); keep.kept  # doctest: +SKIP
    {'00ab...': tensor([1., 1., 1.])}
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .._core.dtensor import local_tensor
from .._core.io import atomic_write

OP_VALUES_ENV = "TORCHREPRO_OP_VALUES"  # byte budget of the values an op trace keeps (unset: none)
OP_VALUES = "op_values.pt"


class OpValues:
    """CPU copies of traced tensors by fingerprint, within ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.skipped = 0  # tensors over the budget
        self.kept: dict[str, torch.Tensor] = {}

    @classmethod
    def from_env(cls) -> OpValues | None:
        text = os.environ.get(OP_VALUES_ENV, "")
        return cls(int(text)) if text.isdigit() and int(text) > 0 else None

    def keep(self, tensors: list[torch.Tensor], fps: list[str]) -> None:
        """Copy the floating-point tensors not kept yet (fresh ``torch.empty`` memory and unreadable ones never)."""
        for t, fp in zip(tensors, fps):
            if fp in self.kept or len(fp) != 32:  # "uninitialized", "unfingerprintable: ..."
                continue
            try:
                t = local_tensor(t)  # a DTensor: this rank's shard (what its fingerprint is of), a plain tensor
                if not (t.is_floating_point() or t.is_complex()) or t.layout is not torch.strided or t.is_meta:
                    continue
                size = t.numel() * t.element_size()
                if self.used + size > self.budget:
                    self.skipped += 1
                    continue
                self.kept[fp] = t.detach().to("cpu", copy=True)
                self.used += size
            except Exception:  # noqa: BLE001 - a tensor subclass without storage: compared bitwise only
                continue

    def save(self, path: Path) -> None:
        """Write the copies to ``path`` atomically (nothing when none was kept)."""
        if self.kept:
            atomic_write(path, lambda f: torch.save(self.kept, f), durable=False)
