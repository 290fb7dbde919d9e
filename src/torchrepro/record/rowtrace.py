"""The op tracer of batch invariance: every ATen op of one forward pass with the *row slice* of its tensors.

``check_batch_invariance`` runs a row alone (a batch of one) and inside a batch of ``size`` rows at ``position``.
The alone run is the reference: each op's tensors are kept whole (they are one row's). In a batched run each
tensor is compared, op by op, with the reference's tensor of the same op: a tensor whose shape is the
reference's with one dimension ``size`` times longer holds the rows in that dimension, batch-major (``(batch,
tokens, features)`` flattened to ``(batch*tokens, features)`` before an ``addmm`` included), and its slice at
``position`` is kept; a tensor of the reference's shape has no batch dimension (a weight, a statistic over the
batch) and is kept whole; any other shape cannot be mapped to rows and is marked so. The module path and the
user's source line of each op come from the same building blocks as :mod:`torchrepro.record.optrace`'s
(``ModuleContext``, ``_site_of``); this tracer is its own ``TorchDispatchMode`` because it keeps row slices of
values, where the op tracer keeps fingerprints of whole tensors.

Example:
    >>> import torch
    >>> lin, one, five = torch.nn.Linear(4, 3), torch.ones(1, 4), torch.ones(5, 4)
    >>> with RowTracer(models={"": lin}) as ref:
    ...     _ = lin(one)
    >>> with RowTracer(size=5, position=2, reference=ref.trace, models={"": lin}) as batched:
    ...     _ = lin(five)
    >>> [(op.op, op.module, [t.kind for t in op.ins], [t.kind for t in op.outs]) for op in batched.trace.ops]
    [('aten.t', 'Linear', ['whole'], ['whole']), ('aten.addmm', 'Linear', ['whole', 'row', 'whole'], ['row'])]
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from .._core.dispatchmode import QuietDispatchMode
from .._core.fingerprint import fingerprint
from .._core.modules import ModuleContext, discover_models
from .opsite import _code_line, _site_of

VALUE_CAP = 1 << 20  # elements: a row slice (or whole tensor) up to this size is kept as a copy, beyond as a digest
# Ops that neither compute nor move values (their outputs are their inputs, or sizes).
SKIP_OPS = frozenset({"aten.detach", "aten.alias", "prim.device", "aten.sym_size", "aten.sym_stride",
                      "aten.sym_numel", "aten.sym_storage_offset", "aten.is_same_size", "aten.lift_fresh"})

ROW, WHOLE, UNMAPPED = "row", "whole", "unmapped"


@dataclass
class TensorRecord:
    """One tensor of an op: ``kind`` is ``row`` (the slice of the traced row, along ``dim``), ``whole`` (no batch
    dimension: the tensor itself) or ``unmapped`` (a shape that cannot be mapped to rows: nothing kept)."""

    shape: tuple[int, ...]
    dtype: str
    kind: str
    dim: int | None = None
    value: torch.Tensor | None = None  # a copy, up to VALUE_CAP elements
    digest: str | None = None  # beyond VALUE_CAP, or for tensors that cannot be copied

    def same(self, other: TensorRecord) -> bool | None:
        """Whether the two hold the same bits; None when that cannot be told (unmapped, or kept differently)."""
        if UNMAPPED in (self.kind, other.kind) or self.dtype != other.dtype:
            return None
        a, b = self.value, other.value
        if a is not None and b is not None:
            if a.shape != b.shape:
                return False
            if a.numel() == 0:
                return True
            ra, rb = a.reshape(-1), b.reshape(-1)
            if ra.dtype != torch.bool and ra.element_size() > 0:
                try:
                    ra, rb = ra.view(torch.uint8), rb.view(torch.uint8)
                except RuntimeError:  # a dtype without a byte view: values compared (NaN != NaN: "differ")
                    pass
            return bool(torch.equal(ra, rb))
        if self.digest is not None and other.digest is not None:
            return self.digest == other.digest
        return None


@dataclass
class OpRecord:
    """One ATen op: its number in its trace, the number of the reference's op it is compared with, its name,
    module path, source site and the records of its tensor inputs and outputs."""

    index: int
    ref_index: int
    op: str
    module: str
    file: str | None
    line: int | None
    code: str
    ins: list[TensorRecord]
    outs: list[TensorRecord]

    @property
    def where(self) -> str:
        """``aten.addmm in `fc` (model.py:12)``."""
        module = f" in `{self.module}`" if self.module else ""
        site = f" ({self.file.rsplit('/', 1)[-1]}:{self.line})" if self.file else ""
        return f"{self.op}{module}{site}"


@dataclass
class RowTrace:
    """The ops of one traced call. ``parted``: the op number at which the ops stopped matching the reference's
    (another op ran there: the batch size changed the program, e.g. a shape-dependent branch), with the two names;
    recording stops there unless the tracer was given an alignment. ``names``: every op's name, in order (also
    the ops not recorded), to align with the reference's."""

    size: int
    position: int
    ops: list[OpRecord] = field(default_factory=list)
    parted: tuple[int, str, str] | None = None
    names: list[tuple[str, str]] = field(default_factory=list)  # (op, module) of every op


def _copy(t: torch.Tensor, cap: int) -> tuple[torch.Tensor | None, str | None]:
    """A copy of ``t`` (at most ``cap`` elements) or its digest. A parameter (or a view of one: a weight's
    ``.t()``) is named instead of read: the same parameter, unchanged (its version counter), holds the same bits,
    and a 4096x4096 weight is not hashed at every op that reads it."""
    param = t if isinstance(t, nn.Parameter) else t._base if isinstance(t._base, nn.Parameter) else None
    if param is not None:
        return None, (f"parameter {id(param)} v{param._version} {t.dtype} {tuple(t.shape)} {t.stride()} "
                      f"+{t.storage_offset()}")
    try:
        if t.numel() <= cap and t.layout == torch.strided and t.device.type != "meta":
            return t.detach().clone(memory_format=torch.contiguous_format), None
        return None, fingerprint(t.detach())
    except Exception:  # a tensor that cannot be read (meta, freed storage): neither is kept
        return None, None


def _row_dim(shape: tuple[int, ...], ref: tuple[int, ...], size: int) -> int | None:
    """The dimension that holds the rows: the one ``size`` times the reference's, all others equal."""
    if len(shape) != len(ref):
        return None
    dims = [d for d, (a, b) in enumerate(zip(shape, ref)) if a != b]
    if len(dims) == 1 and shape[dims[0]] == ref[dims[0]] * size:
        return dims[0]
    return None


class RowTracer(QuietDispatchMode):
    """Trace the ATen ops of a block, keeping row slices (see the module docs).

    ``size``/``position``: the batch the block runs and where the traced row is in it; ``reference``: the trace of
    the row alone (None: this is that trace); ``align``: this trace's op numbers -> the reference's, for a program
    that the batch size changes (ops without a partner are not recorded; without it ops are paired by number and
    recording stops where they part); ``models``: named root modules for module paths (default: the modules alive
    in the process).
    """

    def __init__(self, *, size: int = 1, position: int = 0, reference: RowTrace | None = None,
                 align: Mapping[int, int] | None = None, models: Mapping[str, nn.Module] | None = None,
                 cap: int = VALUE_CAP) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.trace = RowTrace(size, position)
        self.reference = reference
        self.align = align
        self.cap = cap
        self._names: dict[int, str] = {}
        for prefix, model in (models if models is not None else discover_models()).items():
            for name, mod in model.named_modules():
                self._names.setdefault(id(mod), ".".join(x for x in (prefix, name) if x) or type(mod).__name__)
        self._context = ModuleContext(lambda m: self._names.get(id(m), type(m).__name__))
        self._lines: dict[str, list[str]] = {}

    def __enter__(self) -> RowTracer:
        self._context.install()
        try:
            super().__enter__()  # type: ignore[no-untyped-call]
        except BaseException:
            self._context.remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)  # type: ignore[no-untyped-call]
        finally:
            self._context.remove()

    def _record(self, t: torch.Tensor, ref: TensorRecord | None) -> TensorRecord:
        shape = tuple(t.shape)
        if ref is None or shape == ref.shape:
            value, digest = _copy(t, self.cap)
            return TensorRecord(shape, str(t.dtype), WHOLE, None, value, digest)
        dim = _row_dim(shape, ref.shape, self.trace.size)
        if dim is None:
            return TensorRecord(shape, str(t.dtype), UNMAPPED)
        width = ref.shape[dim]
        value, digest = _copy(t.narrow(dim, self.trace.position * width, width), self.cap)
        return TensorRecord(shape, str(t.dtype), ROW, dim, value, digest)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        trace = self.trace
        if name in SKIP_OPS or name.startswith("profiler."):
            return func(*args, **kwargs)
        index = len(trace.names)
        trace.names.append((name, self._context.path))
        if trace.parted is not None:
            return func(*args, **kwargs)
        ref_index, ref_op = index, None
        if self.reference is not None:
            ref_ops = self.reference.ops
            ref_index = self.align.get(index, -1) if self.align is not None else index
            ref_op = ref_ops[ref_index] if 0 <= ref_index < len(ref_ops) else None
            if ref_op is None or ref_op.op != name:
                if self.align is None:
                    trace.parted = (index, ref_op.op if ref_op is not None else "(the end of the ops)", name)
                return func(*args, **kwargs)
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if ref_op is not None and len(ins) != len(ref_op.ins):
            if self.align is None:
                trace.parted = (index, ref_op.op, name)
            return func(*args, **kwargs)
        in_recs = [self._record(t, ref_op.ins[j] if ref_op else None) for j, t in enumerate(ins)]
        out = func(*args, **kwargs)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if ref_op is not None and len(outs) != len(ref_op.outs):
            if self.align is None:
                trace.parted = (index, ref_op.op, name)
            return out
        out_recs = [self._record(t, ref_op.outs[j] if ref_op else None) for j, t in enumerate(outs)]
        site = _site_of(sys._getframe(1))
        code = _code_line(site[0], site[1], self._lines) if site else ""
        trace.ops.append(OpRecord(index, ref_index, name, self._context.path, site[0] if site else None,
                                  site[1] if site else None, code, in_recs, out_recs))
        return out
