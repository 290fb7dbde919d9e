"""Batch invariance: does a row get the same outputs alone as inside a batch of any size, at any position?

This is not run-to-run determinism. A model can give the same bits every time it runs on the same batch and still
give a row other bits when the row is batched with others: kernels choose their order of summation by the shape
of the whole batch (a BLAS picks another kernel for 3 rows than for 64). A server that batches requests then
answers the same prompt differently depending on what else arrived. :func:`check_batch_invariance` measures it:

1. every row of ``batch`` runs alone (a batch of one), twice;
2. for each size and position, the row runs inside a batch of that size at that position, filled with the other
   rows of ``batch`` (repeated when the size is larger), twice: two runs that differ are run-to-run
   nondeterminism, reported apart from batch variance;
3. each output's row is compared bitwise with the row's output alone (max |Δ| and ULPs when it differs);
4. a row that differs runs once more in a batch of the same size made of copies of itself: the same shape, other
   neighbours. If its output changes, the function mixes rows by design (a BatchNorm in training mode normalises
   with the batch's statistics) and that is reported as such, not as a kernel;
5. the first variant context is traced op by op (:mod:`torchrepro.record.rowtrace`) to name the first op whose
   row slice of the inputs is bitwise equal alone and batched while its row slice of the output is not, with
   its module, source line and the batch sizes at which it varies.

Example:
    >>> import torch, torchrepro
    >>> norm = torch.nn.LayerNorm(8)
    >>> result = torchrepro.check_batch_invariance(norm, torch.randn(4, 8), sizes=(2, 4), locate=False)
    >>> result.verdict, result.invariant
    ('invariant', True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._core.errors import BatchInvarianceError
from .._core.table import printable, render_table
from ..record.rowtrace import ROW, UNMAPPED, WHOLE, OpRecord, RowTrace, RowTracer
from .tensordelta import tensor_delta

SCHEMA = "torchrepro.invariance/1"
DEFAULT_SIZES = (2, 3, 4, 8, 16, 32)
DEFAULT_POSITIONS = (0, -1)  # first and last
# The order in which statuses win when one size (or the whole result) has several.
STATUSES = ("nondeterministic", "row-mixing", "variant", "invariant")
# What torchrepro.batch_invariant() replaces (on CPU).
FIXED_OPS = frozenset({"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm",
                       "aten._scaled_dot_product_flash_attention_for_cpu"})
FIX_CALL = "with torchrepro.batch_invariant(): ..."


# --- the batch ----------------------------------------------------------------------------------------------
class _Batch:
    """A tensor, or a mapping / tuple / list holding tensors, with the rows in dim 0 of each tensor of ≥ 1 dims
    (other values are passed through). :meth:`take` builds a batch of chosen rows; :meth:`call` calls ``fn``
    with it as a model is called: ``fn(x)``, ``fn(**mapping)``, ``fn(*sequence)``."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch
        if isinstance(batch, torch.Tensor):
            self.kind, items = "tensor", [("batch", batch)]
        elif isinstance(batch, Mapping):
            self.kind, items = "mapping", [(f"batch[{k!r}]", v) for k, v in batch.items()]
        elif isinstance(batch, (tuple, list)):
            self.kind, items = "sequence", [(f"batch[{i}]", v) for i, v in enumerate(batch)]
        else:
            raise BatchInvarianceError(
                f"batch is a {type(batch).__name__}; expected a tensor, or a dict, tuple or list of tensors with the "
                "rows in dim 0 (as a tokenizer's output is). Pass the inputs the model is called with.")
        tensors = [(name, v) for name, v in items if isinstance(v, torch.Tensor) and v.dim() >= 1]
        if not tensors:
            shown = ", ".join(f"{name}: {_describe(v)}" for name, v in items) or "nothing"
            raise BatchInvarianceError(f"batch holds no tensor with a batch dimension ({shown}); expected tensors "
                                       "with the rows in dim 0.")
        self.rows = len(tensors[0][1])
        other = [(name, tuple(v.shape)) for name, v in tensors if len(v) != self.rows]
        if other:
            shapes = ", ".join(f"{name} {tuple(v.shape)}" for name, v in tensors)
            raise BatchInvarianceError(f"the tensors of the batch disagree on the number of rows ({shapes}); every "
                                       "tensor of the batch needs its rows in dim 0, one row per request.")
        self.device = tensors[0][1].device

    def take(self, rows: Sequence[int]) -> Any:
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)

        def pick(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.dim() >= 1:
                return v.index_select(0, index.to(v.device))  # a fresh contiguous tensor
            return v

        if self.kind == "tensor":
            return pick(self.batch)
        if self.kind == "mapping":
            return {k: pick(v) for k, v in self.batch.items()}
        return type(self.batch)(pick(v) for v in self.batch) if isinstance(self.batch, list) else \
            tuple(pick(v) for v in self.batch)

    def call(self, fn: Callable[..., Any], sub: Any) -> Any:
        if self.kind == "mapping":
            return fn(**sub)
        if self.kind == "sequence":
            return fn(*sub)
        return fn(sub)

    def shapes(self, sub: Any) -> str:
        if isinstance(sub, torch.Tensor):
            return str(tuple(sub.shape))
        items = sub.items() if isinstance(sub, Mapping) else enumerate(sub)
        return ", ".join(f"{k}: {_describe(v)}" for k, v in items)



def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def _describe(v: Any) -> str:
    return f"tensor{tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__


def _outputs(out: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """The tensors of ``fn``'s output with their names: ``output``, ``output[1]``, ``logits`` (a dict or a
    ``ModelOutput``), ``hidden_states[2]``; other values (a cache object, None) are left out."""
    if isinstance(out, torch.Tensor):
        return [(prefix or "output", out)]
    found: list[tuple[str, torch.Tensor]] = []
    if isinstance(out, Mapping):
        for k, v in out.items():
            found += _outputs(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(out, (tuple, list)):
        for i, v in enumerate(out):
            found += _outputs(v, f"{prefix or 'output'}[{i}]")
    return found


# --- results ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowComparison:
    """One output of one row, alone against inside a batch of ``size`` rows at ``position``."""

    row: int
    size: int
    position: int
    output: str
    status: str  # invariant | variant | row-mixing | nondeterministic
    max_abs: float = 0.0
    max_ulp: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"row": self.row, "size": self.size, "position": self.position, "output": self.output,
                "status": self.status, "max_abs": self.max_abs, "max_ulp": self.max_ulp}


@dataclass
class VariantOp:
    """The first op whose row output differs between the row alone and the row batched.

    ``kind``: ``kernel`` (the same inputs give other bits at another batch size: its reduction order depends on
    the batch shape) or ``row-mixing`` (its output depends on the other rows' values: a statistic over the batch).
    When the batch size changes which ops run, the two op sequences are aligned first (``note`` says where they
    part). ``inputs_equal``:
    whether the op's row inputs were bitwise equal (False: the difference came through an op whose output cannot
    be mapped to rows, named in ``note``). ``varies_at``/``invariant_at``: the batch sizes traced.
    """

    op: str
    module: str
    file: str | None
    line: int | None
    code: str
    index: int
    kind: str
    inputs_equal: bool | None = True
    ref_index: int = -1  # the number of the same op in the trace of the row alone
    varies_at: list[int] = field(default_factory=list)
    invariant_at: list[int] = field(default_factory=list)
    max_abs: float | None = None
    max_ulp: int | None = None
    note: str = ""

    @property
    def where(self) -> str:
        module = f" in `{self.module}`" if self.module else ""
        site = f" ({self.file.rsplit('/', 1)[-1]}:{self.line})" if self.file else ""
        return f"{self.op}{module}{site}"

    def sizes_text(self) -> str:
        """``varies between batch 1 and batch 2, 3, 8; invariant from 16 on``."""
        if not self.varies_at:
            return ""
        text = f"varies between batch 1 and batch {', '.join(map(str, self.varies_at))}"
        if self.invariant_at and min(self.invariant_at) > max(self.varies_at):
            text += f"; invariant from {min(self.invariant_at)} on (of the sizes traced)"
        elif self.invariant_at:
            text += f"; invariant at {', '.join(map(str, self.invariant_at))}"
        return text

    def describe(self) -> str:
        text = self.where
        sizes = self.sizes_text()
        return f"{text}: {sizes}" if sizes else text

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "module": self.module, "file": self.file, "line": self.line, "code": self.code,
                "index": self.index, "kind": self.kind, "inputs_equal": self.inputs_equal,
                "varies_at": self.varies_at, "invariant_at": self.invariant_at, "max_abs": self.max_abs,
                "max_ulp": self.max_ulp, "note": self.note, "text": self.describe()}


@dataclass
class BatchInvarianceResult:
    """What :func:`check_batch_invariance` found. ``invariant``: every row's outputs were bitwise equal alone and
    in every batch tried; ``comparisons``: one per row, size, position and output; ``first_op``: the first variant
    op (when ``locate`` found one); ``table()``/``summary()``: the text; ``to_json()``: the document."""

    verdict: str
    comparisons: list[RowComparison]
    sizes: list[int]
    positions: list[int]
    rows: list[int]
    outputs: list[str]
    runs: int
    first_op: VariantOp | None = None
    mixing_op: VariantOp | None = None  # the first op that mixes rows, when it is not first_op
    locate_note: str | None = None
    notes: list[str] = field(default_factory=list)
    under_fix: bool = False  # checked inside torchrepro.batch_invariant()
    device: str = "cpu"

    @property
    def invariant(self) -> bool:
        return self.verdict == "invariant"

    @property
    def row_mixing(self) -> bool:
        return any(c.status == "row-mixing" for c in self.comparisons)

    @property
    def nondeterministic(self) -> bool:
        return any(c.status == "nondeterministic" for c in self.comparisons)

    def by_size(self) -> list[dict[str, Any]]:
        """One row per batch size: contexts compared (row × position), how many were bitwise equal, the worst
        |Δ| and ULP, and the worst status."""
        out = []
        for size in self.sizes:
            found = [c for c in self.comparisons if c.size == size]
            if not found:
                continue
            contexts: dict[tuple[int, int], str] = {}
            for c in found:
                key = (c.row, c.position)
                contexts[key] = _worst([contexts.get(key, "invariant"), c.status])
            out.append({"size": size, "compared": len(contexts),
                        "equal": sum(s == "invariant" for s in contexts.values()),
                        "max_abs": max(c.max_abs for c in found), "max_ulp": max(c.max_ulp for c in found),
                        "status": _worst([c.status for c in found])})
        return out

    @property
    def variant_sizes(self) -> list[int]:
        return [s["size"] for s in self.by_size() if s["status"] != "invariant"]

    def table(self) -> str:
        rows = [[str(s["size"]), str(s["compared"]), str(s["equal"]), _num(s["max_abs"]),
                 str(s["max_ulp"]) if s["max_ulp"] else "0", s["status"]] for s in self.by_size()]
        return render_table(["batch size", "contexts", "bitwise equal", "max |Δ|", "max ULP", "status"], rows,
                            right={0, 1, 2, 3, 4})

    def headline(self) -> str:
        what = {"invariant": "INVARIANT - every row gets the same bits alone and in every batch tried",
                "variant": "VARIANT - a row's outputs depend on the size of the batch it is in",
                "row-mixing": "ROW-MIXING - a row's outputs depend on the other rows' values (by design, "
                              "not a kernel)",
                "nondeterministic": "NONDETERMINISTIC - the same batch gave other bits on a second run"}[self.verdict]
        return f"torchrepro invariance: {what}"

    def fix(self) -> str | None:
        """The next action, as one sentence (None when invariant)."""
        return fix_for(self)

    def summary(self) -> str:
        lines = [self.headline(),
                 f"rows {_ranges(self.rows)} of {len(self.outputs)} output(s) ({', '.join(self.outputs)}), alone and "
                 f"in batches of {', '.join(map(str, self.sizes))} at positions {_positions(self.positions)}; each "
                 f"context run {self.runs} times" + (" -- inside torchrepro.batch_invariant()" if self.under_fix
                                                     else ""),
                 "", self.table()]
        for op in (self.first_op, self.mixing_op):
            if op is None:
                continue
            lines += ["", {"kernel": "First batch-variant op: ", "row-mixing": "First op that mixes rows: "}[op.kind]
                      + op.describe()]
            if op.code:
                lines.append(f"  {op.code}")
            if op.kind == "kernel":
                lines.append("  its row inputs are bitwise equal alone and batched; its row output is not"
                             + (f" (max |Δ| {_num(op.max_abs)}, {op.max_ulp} ULP)" if op.max_abs else ""))
            elif op.kind == "row-mixing":
                lines.append("  its row output changes when only the other rows of the batch change: it computes "
                             "across rows by design")
            if op.note:
                lines.append(f"  {op.note}")
        if self.first_op is None and self.locate_note:
            lines += ["", f"Locate: {self.locate_note}"]
        return closing(lines, self.notes, self.fix())

    def __str__(self) -> str:
        return self.summary()

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "verdict": self.verdict, "invariant": self.invariant, "sizes": self.sizes,
                "positions": self.positions, "rows": self.rows, "outputs": self.outputs, "runs": self.runs,
                "batch_invariant": self.under_fix, "device": self.device, "by_size": self.by_size(),
                "comparisons": [c.to_json() for c in self.comparisons],
                "first_op": self.first_op.to_json() if self.first_op else None,
                "mixing_op": self.mixing_op.to_json() if self.mixing_op else None, "locate_note": self.locate_note,
                "fix": self.fix(), "notes": self.notes}


def _num(x: float | None) -> str:
    if not x:
        return "0"
    return f"{x:.2g}" if x < 1e-2 or x >= 1e3 else f"{x:.3g}"


def _ranges(values: Sequence[int]) -> str:
    """``0-7``, ``0, 3, 5``."""
    vals = sorted(values)
    if len(vals) > 2 and vals == list(range(vals[0], vals[-1] + 1)):
        return f"{vals[0]}-{vals[-1]}"
    return ", ".join(map(str, vals))


def _positions(positions: Sequence[int]) -> str:
    names = {0: "first", -1: "last"}
    return ", ".join(names.get(p, str(p)) for p in positions)


def _worst(statuses: Iterable[str]) -> str:
    found = set(statuses)
    return next((s for s in STATUSES if s in found), "invariant")


def fix_for(result: BatchInvarianceResult) -> str | None:
    """The next action for a result: the fix of its first op, or what to do about row mixing or noise."""
    if result.invariant:
        return None
    op = result.first_op
    if result.verdict == "nondeterministic":
        return ("the function is not deterministic run to run, so batch invariance cannot be judged: make it "
                "deterministic first (model.eval() for dropout; `torchrepro.deterministic()`; `torchrepro check`), "
                "then check again.")
    if result.verdict == "row-mixing" or (op is not None and op.kind == "row-mixing"):
        mixer = result.mixing_op or (op if op is not None and op.kind == "row-mixing" else None)
        where = f" ({mixer.where})" if mixer is not None else ""
        return (f"this is the model's design, not a kernel{where}: an op computes across the rows of the batch "
                "(BatchNorm in training mode normalises with the batch's statistics). For inference call "
                "model.eval() (BatchNorm then uses its running statistics) or use a per-row normalisation "
                "(LayerNorm, GroupNorm); a model that must mix rows cannot be batch invariant.")
    if op is not None and op.kind == "kernel" and op.op in FIXED_OPS:
        if result.device != "cpu":
            return (f"{op.op} on {result.device}: torchrepro.batch_invariant() replaces the CPU kernels only; on "
                    "CUDA serve with a batch-invariant mode (vLLM, SGLang, torchtitan: see docs/invariance.md) "
                    "and check the model under it again.")
        if result.under_fix:
            return (f"{op.op} still varies inside torchrepro.batch_invariant(), which should not happen: please "
                    "report it with this output.")
        return (f"run the model inside `{FIX_CALL}` (CPU matrix products in fixed row tiles and attention as "
                "its math on them: the same bits for a row whatever the batch), then check again under it "
                "(`torchrepro invariance --batch-invariant ...`): it should say INVARIANT.")
    if op is not None and op.kind == "kernel":
        return (f"torchrepro has no batch-invariant replacement for {op.op} yet: keep batches of one size (pad to "
                f"a fixed size), or replace the op with one whose result for a row does not depend on the batch.")
    return "look at the op named above; `torchrepro.batch_invariant()` covers the CPU matrix products and attention."


# --- the check ----------------------------------------------------------------------------------------------
class _Runner:
    """Runs ``fn`` on chosen rows of the batch, outputs as named tensors, every failure worded."""

    def __init__(self, fn: Callable[..., Any], batch: _Batch, model: nn.Module | None = None) -> None:
        self.fn, self.batch = fn, batch
        self.names: list[str] | None = None  # the outputs with a batch dimension
        self.models = {"": model} if model is not None else _models(fn)
        models = self.models
        # A module's buffers as they were: put back after every call, so that every context starts from the same
        # state (BatchNorm's running statistics and counter) and the model is left as it was found.
        self.buffers = [(b, b.detach().clone()) for m in (models or {}).values() for b in m.buffers()]

    def _restore(self) -> None:
        with torch.no_grad():
            for buf, saved in self.buffers:
                if buf.shape == saved.shape:
                    buf.copy_(saved)

    def outputs(self, rows: Sequence[int], *, trace: RowTracer | None = None) -> dict[str, torch.Tensor]:
        sub = self.batch.take(rows)
        size = len(rows)
        try:
            with torch.no_grad():
                if trace is None:
                    out = self.batch.call(self.fn, sub)
                else:
                    with trace:
                        out = self.batch.call(self.fn, sub)
        except BatchInvarianceError:
            raise
        except Exception as exc:
            raise BatchInvarianceError(
                f"the function raised {type(exc).__name__} on a batch of {size} row{'s' if size > 1 else ''} "
                f"({self.batch.shapes(sub)}): {_first_line(exc)}. "
                + ("A model that cannot run one row alone computes across rows (BatchNorm in training mode): for "
                   "inference call model.eval()." if size == 1 else
                   "Leave that size out (sizes=...) or fix the model so that it runs on that batch.")) from exc
        finally:
            self._restore()
        found = _outputs(out)
        if self.names is None:  # the first call: a batch of one
            self.names = [name for name, t in found if t.dim() >= 1 and t.shape[0] == size]
            if not self.names:
                shown = ", ".join(f"{name} {tuple(t.shape)}" for name, t in found) or f"a {type(out).__name__}"
                raise BatchInvarianceError(
                    f"the function's output has no batch dimension: for a batch of {size} row(s) it returned "
                    f"{shown}; expected tensors with one row per input row in dim 0 (logits, hidden states), not a "
                    "loss or another value reduced over the batch. Return the per-row outputs.")
        got = dict(found)
        kept = {}
        for name in self.names:
            t = got.get(name)
            if t is None or t.dim() < 1 or t.shape[0] != size:
                shown = "nothing" if t is None else f"shape {tuple(t.shape)}"
                raise BatchInvarianceError(
                    f"output {name} has no batch dimension for a batch of {size} rows: it returned {shown} (one row "
                    f"per input row in dim 0 was expected, as for a batch of one). Return per-row outputs.")
            kept[name] = t.detach()
        return kept


def _validate(sizes: Iterable[int], positions: Iterable[int], rows: Iterable[int] | None, n: int,
              runs: int) -> tuple[list[int], list[int], list[int]]:
    try:
        sizes_l = sorted({int(s) for s in sizes})
        positions_l = list(dict.fromkeys(int(p) for p in positions))
        rows_l = list(range(n)) if rows is None else list(dict.fromkeys(int(r) for r in rows))
    except (TypeError, ValueError) as exc:
        raise BatchInvarianceError(f"sizes, positions and rows must be integers: {exc}") from exc
    bad = [s for s in sizes_l if s < 1]
    if bad or not [s for s in sizes_l if s > 1]:
        raise BatchInvarianceError(f"sizes {sizes_l} must hold batch sizes of 2 rows or more (a row alone is always "
                                   "the reference), e.g. sizes=(2, 8, 32).")
    if not positions_l:
        raise BatchInvarianceError("positions is empty; give positions in the batch such as (0, -1): first, last.")
    out_of_range = [r for r in rows_l if not 0 <= r < n]
    if out_of_range or not rows_l:
        raise BatchInvarianceError(f"rows {out_of_range or rows_l} are not rows of the batch (it has {n}: 0 to "
                                   f"{n - 1}).")
    if runs < 1:
        raise BatchInvarianceError(f"runs must be 1 or more, got {runs}")
    return [s for s in sizes_l if s > 1], positions_l, rows_l


def _window(row: int, size: int, position: int, n: int) -> tuple[int, ...]:
    """The rows of a batch of ``size`` with ``row`` at ``position``, the others following it in the batch's
    order (repeated when the batch has fewer rows)."""
    start = row - position
    return tuple((start + i) % n for i in range(size))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all((d := tensor_delta(a[k], b[k])) is not None and d.equal for k in a)


def check_batch_invariance(fn: Callable[..., Any], batch: Any, *, sizes: Iterable[int] = DEFAULT_SIZES,
                           positions: Iterable[int] = DEFAULT_POSITIONS, rows: Iterable[int] | None = None,
                           runs: int = 2, locate: bool = True, model: nn.Module | None = None) -> BatchInvarianceResult:
    """Check that each row of ``batch`` gets bitwise the same outputs from ``fn`` alone and inside batches.

    ``fn`` is called as a model is: ``fn(x)`` for a tensor batch, ``fn(**batch)`` for a dict (a tokenizer's
    output), ``fn(*batch)`` for a tuple or list; every tensor of ``batch`` holds the rows in dim 0 (at least 2
    rows: the others fill the batches). Its outputs (a tensor, tuple, dict or ``ModelOutput``) are compared row by
    row; outputs without a batch dimension are an error. ``sizes``: the batch sizes tried besides 1;
    ``positions``: where the row sits in each batch (negative: from the end); ``rows``: which rows are checked
    (default: all); ``runs``: how often each context runs (2: run-to-run nondeterminism is told apart);
    ``locate``: trace the first variant context and name the first variant op; ``model``: when ``fn`` is not the
    model itself (a closure, a step function), the module whose submodules name the ops. Runs under
    ``torch.no_grad()``; the model's buffers (BatchNorm's running statistics) are put back after every call.

    Raises :class:`~torchrepro.BatchInvarianceError` for inputs that cannot be checked (the message says why).
    See the module docs for the method.
    """
    b = _Batch(batch)
    if b.rows < 2:
        raise BatchInvarianceError(
            f"the batch has {b.rows} row ({b.shapes(batch)}); batch invariance compares a row alone with the same "
            "row among others, and the others come from the batch: pass at least 2 rows (e.g. several real inputs "
            "stacked, or a tokenizer's output for several prompts).")
    sizes_l, positions_l, rows_l = _validate(sizes, positions, rows, b.rows, runs)
    runner = _Runner(fn, b, model)
    from ..nn.invariant import active

    notes: list[str] = []
    alone: dict[int, dict[str, torch.Tensor]] = {}
    noisy_alone: set[int] = set()
    for r in rows_l:
        try:
            first = runner.outputs([r])
        except BatchInvarianceError as exc:
            if runner.names is not None:  # a row alone failed after another ran: not a batch-of-one refusal
                raise
            result = _mixing_without_alone(runner, rows_l, sizes_l[0], runs, exc)
            if result is None:
                raise
            return result
        for _ in range(runs - 1):
            if not _same(first, runner.outputs([r])):
                noisy_alone.add(r)
        alone[r] = first
    if noisy_alone:
        notes.append(f"row(s) {_ranges(sorted(noisy_alone))} alone gave other bits on a second run: the function is "
                     "nondeterministic run to run.")
    names = runner.names or []
    comparisons: list[RowComparison] = []
    for size in sizes_l:
        windows: dict[tuple[int, ...], tuple[dict[str, torch.Tensor], bool]] = {}
        dups: dict[int, dict[str, torch.Tensor]] = {}
        for r in rows_l:
            for pos in dict.fromkeys(p if p >= 0 else size + p for p in positions_l):
                if not 0 <= pos < size:
                    continue
                rows_w = _window(r, size, pos, b.rows)
                if rows_w not in windows:
                    out = runner.outputs(rows_w)
                    steady = all(_same(out, runner.outputs(rows_w)) for _ in range(runs - 1))
                    windows[rows_w] = (out, steady)
                out, steady = windows[rows_w]
                deltas = {k: tensor_delta(out[k][pos], alone[r][k][0]) for k in names}
                differ = [k for k, d in deltas.items() if d is None or not d.equal]
                mixing = False
                if differ and steady and r not in noisy_alone:
                    if r not in dups:
                        dups[r] = runner.outputs([r] * size)
                    mixing = not all((d := tensor_delta(dups[r][k][pos], out[k][pos])) is not None and d.equal
                                     for k in differ)
                for k in names:
                    d = deltas[k]
                    if not steady or r in noisy_alone:
                        status = "nondeterministic"
                    elif d is not None and d.equal:
                        status = "invariant"
                    else:
                        status = "row-mixing" if mixing else "variant"
                    comparisons.append(RowComparison(r, size, pos, k, status,
                                                     _finite(d.max_abs) if d is not None else math.inf,
                                                     d.max_ulp if d is not None else 0))
        del windows, dups
    verdict = _worst(c.status for c in comparisons)
    result = BatchInvarianceResult(verdict, comparisons, sizes_l, positions_l, rows_l, names, runs, notes=notes,
                                   under_fix=active(), device=str(b.device.type))
    if locate and verdict in ("variant", "row-mixing"):
        chosen = next(c for c in comparisons if c.status == verdict)
        result.first_op, result.mixing_op, result.locate_note = _locate(runner, chosen, sizes_l)
    return result


def _mixing_without_alone(runner: _Runner, rows: list[int], size: int, runs: int,
                          error: BatchInvarianceError) -> BatchInvarianceResult | None:
    """A function that refuses a batch of one row (BatchNorm in training mode): whether a row's outputs change
    when only its neighbours change, at the smallest size. None when they do not (the refusal is then the error)."""
    comparisons = []
    for r in rows:
        out = runner.outputs(_window(r, size, 0, runner.batch.rows))
        dup = runner.outputs([r] * size)
        for k in runner.names or []:
            d = tensor_delta(out[k][0], dup[k][0])
            status = "invariant" if d is not None and d.equal else "row-mixing"
            comparisons.append(RowComparison(r, size, 0, k, status, _finite(d.max_abs) if d is not None else 0.0,
                                             d.max_ulp if d is not None else 0))
    if not any(c.status == "row-mixing" for c in comparisons):
        return None
    why = str(error.__cause__ or error).splitlines()[0]
    from ..nn.invariant import active

    return BatchInvarianceResult(
        "row-mixing", comparisons, [size], [0], rows, list(runner.names or []), runs,
        locate_note="not traced: the locator compares each op with the row alone, and the function refuses a row "
                    "alone.",
        notes=[f"the function cannot run on one row alone ({why}); in batches of {size} a row's outputs change when "
               "only the other rows change (compared with a batch of copies of the row): it computes across rows."],
        under_fix=active(), device=str(runner.batch.device.type))


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def assert_batch_invariant(fn: Callable[..., Any], batch: Any, **options: Any) -> BatchInvarianceResult:
    """:func:`check_batch_invariance`, raising ``AssertionError`` with its summary (the table, the first variant
    op and the fix) unless the result is invariant; returns the result. For tests::

        def test_model_is_batch_invariant():
            with torchrepro.batch_invariant():
                torchrepro.assert_batch_invariant(model, inputs, sizes=(2, 8))
    """
    result = check_batch_invariance(fn, batch, **options)
    if not result.invariant:
        raise AssertionError(result.summary())
    return result


# --- locate -------------------------------------------------------------------------------------------------
def _models(fn: Any) -> dict[str, nn.Module] | None:
    """Named roots for module paths: the model itself when ``fn`` is one (or a bound method of one)."""
    owner = fn if isinstance(fn, nn.Module) else getattr(fn, "__self__", None)
    return {"": owner} if isinstance(owner, nn.Module) else None


def _pairs(base: RowTrace, trace: RowTrace, *, base_is_reference: bool) -> list[tuple[OpRecord, OpRecord]]:
    """The ops of ``trace`` with their partners in ``base``: the reference itself, or another trace made against
    the same reference (paired through the reference's op numbers)."""
    if base_is_reference:
        return [(base.ops[b.ref_index], b) for b in trace.ops if 0 <= b.ref_index < len(base.ops)]
    by_ref = {a.ref_index: a for a in base.ops}
    return [(by_ref[b.ref_index], b) for b in trace.ops if b.ref_index in by_ref]


def _first_difference(base: RowTrace, trace: RowTrace, *,
                      base_is_reference: bool = True) -> tuple[VariantOp | None, str | None]:
    """The first op whose row output differs between ``base`` (the row alone, or the row among other neighbours)
    and ``trace``. Outputs without a batch dimension (a statistic over the batch, ``mask.sum()``) are not rows:
    they count only through the row outputs they change."""
    unmapped: OpRecord | None = None
    for a, b in _pairs(base, trace, base_is_reference=base_is_reference):
        differ = [i for i, (ra, rb) in enumerate(zip(a.outs, b.outs)) if rb.kind == ROW and ra.same(rb) is False]
        if not differ:
            if unmapped is None and any(r.kind == UNMAPPED for r in b.outs):
                unmapped = b
            continue
        rows = [ra.same(rb) for ra, rb in zip(a.ins, b.ins) if rb.kind != WHOLE]
        wide = sum(ra.same(rb) is False for ra, rb in zip(a.ins, b.ins) if rb.kind == WHOLE)
        op = VariantOp(b.op, b.module, b.file, b.line, b.code, b.index, "kernel",
                       inputs_equal=False if False in rows else (None if None in rows else True),
                       ref_index=b.ref_index)
        ra, rb = a.outs[differ[0]], b.outs[differ[0]]
        d = tensor_delta(rb.value, ra.value) if ra.value is not None and rb.value is not None else None
        if d is not None:
            op.max_abs, op.max_ulp = _finite(d.max_abs), d.max_ulp
        if op.inputs_equal is False:
            came = (f"through {unmapped.where}, whose output cannot be mapped to rows" if unmapped is not None
                    else "from outside the traced ops")
            op.note = (f"its row inputs already differed: the difference came {came}; this is the first op whose "
                       "row output could be compared and differs.")
        elif op.inputs_equal is None:
            came = f" (they come through {unmapped.where})" if unmapped is not None else ""
            op.note = f"some of its inputs cannot be mapped to rows{came}; those that can are bitwise equal."
        if wide:
            op.note = (op.note + " " if op.note else "") + (
                f"It also reads {wide} tensor(s) without a batch dimension that differ (computed across the rows "
                "of the batch).")
        return op, None
    if unmapped is not None:
        return None, (f"every op whose row slice could be compared was bitwise equal; the outputs of "
                      f"{unmapped.where} (op {unmapped.index}) and later ones cannot be mapped to rows, so the "
                      "difference may come from there.")
    return None, ("no op's row output differed in the traced runs: the difference did not recur while tracing, or "
                  "comes from work outside PyTorch ops.")


def _op_varies(ref: RowTrace, trace: RowTrace, op: VariantOp) -> bool | None:
    b = next((x for x in trace.ops if x.ref_index == op.ref_index), None)
    if b is None or not 0 <= op.ref_index < len(ref.ops) or b.op != op.op:
        return None
    a = ref.ops[op.ref_index]
    same = [ra.same(rb) for ra, rb in zip(a.outs, b.outs) if rb.kind == ROW]
    return True if False in same else (None if None in same else False)


def _trace(runner: _Runner, rows: Sequence[int], size: int, position: int, ref: RowTrace,
           models: dict[str, nn.Module] | None) -> tuple[RowTrace, str | None]:
    """The row traced in a batch against ``ref``: ops paired by number, or -- when the batch size changes which ops
    run -- by aligning the two op sequences (a second traced run), with a sentence saying where they part."""
    tracer = RowTracer(size=size, position=position, reference=ref, models=models)
    runner.outputs(rows, trace=tracer)
    trace = tracer.trace
    if trace.parted is None:
        return trace, None
    from .align import common_pairs

    index, alone_op, batched_op = trace.parted
    align = {j: i for i, j in common_pairs(ref.names, trace.names)}
    aligned = RowTracer(size=size, position=position, reference=ref, align=align, models=models)
    runner.outputs(rows, trace=aligned)
    module = trace.names[index][1] if index < len(trace.names) else ""
    return aligned.trace, (f"the batch size changes which ops run: op {index}{f' in `{module}`' if module else ''} "
                           f"is {alone_op} alone but {batched_op} in a batch of {size}; the ops were compared after "
                           "aligning the two sequences.")


def _locate(runner: _Runner, first: RowComparison,
            sizes: list[int]) -> tuple[VariantOp | None, VariantOp | None, str | None]:
    """Trace the row alone and in a batch of each size (at ``first``'s position, or the last one of a smaller
    batch); name the first variant op of ``first``'s context and, when the row's neighbours matter, the first op
    that mixes rows (the first op whose row output changes when only the neighbours change)."""
    models = runner.models
    n = runner.batch.rows
    ref_tracer = RowTracer(models=models)
    runner.outputs([first.row], trace=ref_tracer)
    ref = ref_tracer.trace
    traces: dict[int, RowTrace] = {}
    program: str | None = None
    for size in sizes:
        pos = min(first.position, size - 1)
        traces[size], parted = _trace(runner, _window(first.row, size, pos, n), size, pos, ref, models)
        if size == first.size:
            program = parted
    window = traces[first.size]
    op, note = _first_difference(ref, window)
    if op is None:
        return None, None, " ".join(x for x in (program, note) if x)
    if program:
        op.note = (op.note + " " if op.note else "") + program[0].upper() + program[1:]
    _sizes(op, ref, traces)
    # Same shape, other neighbours: a kernel gives the same bits, an op that computes across rows does not.
    dup, _ = _trace(runner, [first.row] * first.size, first.size, first.position, ref, models)
    mixing, _ = _first_difference(window, dup, base_is_reference=False)
    if mixing is None:
        return op, None, note
    mixing.kind, mixing.note = "row-mixing", ""
    if mixing.ref_index == op.ref_index:
        op.kind = "row-mixing"
        return op, None, note
    _sizes(mixing, ref, traces)
    return op, mixing, note


def _sizes(op: VariantOp, ref: RowTrace, traces: dict[int, RowTrace]) -> None:
    """Fill ``op.varies_at``/``invariant_at`` from the traces of each batch size."""
    for size, trace in traces.items():
        varies = _op_varies(ref, trace, op)
        if varies:
            op.varies_at.append(size)
        elif varies is False:
            op.invariant_at.append(size)


def closing(lines: list[str], notes: Sequence[str], fix: str | None) -> str:
    """A summary's text: ``lines``, then its notes and its fix, printable (control characters escaped)."""
    lines = [*lines, *(f"Note: {n}" for n in notes)]
    if fix:
        lines += ["", f"Fix: {fix}"]
    return printable("\n".join(lines)).replace("\\n", "\n")
