"""How nondeterministic is a training step, and is a function deterministic?

:func:`measure_nondeterminism` compares repeated runs quantitatively, and exactly: it runs
forward + backward (and the optimizer step, when given) ``runs`` times from identical state -- parameters,
buffers, gradients, optimizer state and every RNG put back before each run -- and compares what came out:
per tensor, whether the runs are bitwise identical, the fraction of elements that differ, the greatest
absolute and ULP differences, and the pairwise cosine similarity of the gradients; for the model's outputs,
argmax agreement and the top-k Jaccard index. A cosine similarity alone hides last-bit differences (it
rounds to 1.0), so the cosine is computed as ``1 - distance`` with the distance taken from the differences of
the normalised gradients, and reported too.

:func:`assert_deterministic` calls a function several times from the same RNG state and raises an
``AssertionError`` that says which output differs, where, by how much, and what to try.

>>> import torch, torchrepro
>>> model = torch.nn.Linear(4, 2)
>>> report = torchrepro.measure_nondeterminism(model, torch.randn(8, 4), runs=2)
>>> report.identical
True
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import inspect
import math
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch
from torch import nn

from .._core.errors import ReproError
from .._core.fingerprint import fingerprint_many
from .._core.modules import discover_models
from .._core.naming import renamed
from .._core.table import render_table
from .._core.tolerances import PRESETS
from ..analysis.compare import tensor_delta
from ..control.determinism import deterministic
from ..control.rng import RNGState

SCHEMA = "torchrepro.measure/1"

# Tolerances for assert_deterministic(..., **TOLERANCES[name]): the presets of the one tolerance table.
TOLERANCES = PRESETS

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# --- state that every run starts from ---------------------------------------------------------------------
class _Snapshot:
    """Parameters, buffers, gradients and optimizer state of some modules, plus every RNG: taken once, put back
    before each run (:meth:`reset`) and at the end (:meth:`put_back`, which also returns the gradients)."""

    def __init__(self, modules: Mapping[str, nn.Module], optimizer: torch.optim.Optimizer | None) -> None:
        self._values: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._seen: set[int] = set()
        tensors: list[torch.Tensor] = []
        for module in modules.values():
            tensors += [*module.parameters(), *module.buffers()]
        if optimizer is not None:
            tensors += [p for group in optimizer.param_groups for p in group["params"]]
        for t in tensors:
            self.add(t, value=True)
        self.optimizer = optimizer
        self._opt_state = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
        self.rng = RNGState.capture()

    def add(self, t: torch.Tensor, *, value: bool) -> None:
        """Keep ``t``'s gradient (and its value when ``value``) to put back; clear its gradient now."""
        if id(t) in self._seen:
            return
        self._seen.add(id(t))
        if value:
            self._values.append((t, t.detach().clone()))
        if t.requires_grad:
            self._grads.append((t, t.grad))
            t.grad = None

    def reset(self) -> None:
        with torch.no_grad():
            for live, saved in self._values:
                live.copy_(saved)
        for t, _ in self._grads:
            t.grad = None
        if self.optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(self._opt_state))  # type: ignore[arg-type]  # load_state_dict aliases same-device
        self.rng.restore()

    def put_back(self) -> None:
        self.reset()
        for t, grad in self._grads:
            t.grad = grad


# --- one run ------------------------------------------------------------------------------------------------
def _main_tensor(out: Any) -> torch.Tensor | None:
    """The tensor to compare among a model's outputs: the output itself, ``.logits``, or the first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    items = out.values() if isinstance(out, Mapping) else out if isinstance(out, (list, tuple)) else ()
    return next((x for x in items if isinstance(x, torch.Tensor)), None)


def _default_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if logits.is_floating_point() and logits.dim() >= 2 and not target.is_floating_point():
        return nn.functional.cross_entropy(logits.float(), target)
    return nn.functional.mse_loss(logits.float(), target.float())


def _model_call(model: nn.Module, inputs: Any, target: Any, loss_fn: Callable[..., Any] | None) -> Callable[[], Any]:
    def call() -> tuple[Any, torch.Tensor | None]:
        if isinstance(inputs, Mapping):
            out = model(**inputs)
        elif isinstance(inputs, (tuple, list)):
            out = model(*inputs)
        else:
            out = model(inputs)
        logits = _main_tensor(out)
        if loss_fn is not None:
            loss = loss_fn(out, target) if target is not None else loss_fn(out)
        elif logits is None:
            raise TypeError(f"measure_nondeterminism: the model returned a {type(out).__name__} without a tensor "
                            "in it; pass loss_fn=... that turns its output into the loss.")
        elif target is not None:
            loss = _default_loss(logits, target)
        else:
            loss = logits.sum()  # no target: backpropagate ones through the output
        return loss, logits

    return call


def _fn_call(fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> tuple[Any, torch.Tensor | None]:
        result = fn()
        if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[1], torch.Tensor):
            return result[0], result[1]
        return result, None

    return call


def _check_loss(loss: Any) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"measure_nondeterminism: the loss is a {type(loss).__name__}, expected a tensor; the "
                        "callable must return the loss (or (loss, outputs)) without calling backward() itself.")
    if loss.numel() != 1:
        raise ValueError(f"measure_nondeterminism: the loss has shape {tuple(loss.shape)}, expected one number; "
                         "reduce it (.mean()) or pass loss_fn=....")
    if loss.grad_fn is None:
        raise ValueError("measure_nondeterminism: the loss does not depend on any tensor that requires grad, so "
                         "there is no gradient to compare. Check that the model's parameters require grad and "
                         "that the forward pass does not run under torch.no_grad().")
    return loss


def _graph_leaves(loss: torch.Tensor) -> list[torch.Tensor]:
    """The tensors whose ``.grad`` ``loss.backward()`` fills: AccumulateGrad nodes of its graph, in visit order."""
    leaves: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        stack.extend(child for child, _ in reversed(node.next_functions))
    return leaves


def _names(modules: Mapping[str, nn.Module], leaves: Sequence[torch.Tensor] = ()) -> dict[int, str]:
    """Parameter names by ``id``; when one module owns every leaf, its names without a prefix."""
    ids = {id(t) for t in leaves}
    owners = [m for m in modules.values() if any(id(p) in ids for p in m.parameters())]
    if len(owners) == 1 and len(modules) > 1:
        modules = {"": owners[0]}
    names: dict[int, str] = {}
    for prefix, module in modules.items():
        for name, p in module.named_parameters():
            names.setdefault(id(p), f"{prefix}.{name}" if prefix else name)
    return names


def _named(tensors: Sequence[torch.Tensor], names: dict[int, str]) -> list[str]:
    """Parameter names for ``tensors``; leaves outside the modules are ``tensor0``, ``tensor1``, ..."""
    out, extra = [], 0
    for t in tensors:
        if id(t) in names:
            out.append(names[id(t)])
        else:
            out.append(f"tensor{extra}")
            extra += 1
    return out


def _grad(t: torch.Tensor, *, copy: bool) -> torch.Tensor | None:
    g = t.grad
    if g is None:
        return None
    return _dense(g) if copy or g.layout != torch.strided else g.detach()


def _dense(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.detach()
    return (t.to_dense() if t.layout != torch.strided else t).clone()


@dataclass
class _Runs:
    """What each run produced: gradients and (after an optimizer step) parameters by tensor, losses, outputs."""

    names: list[str] = field(default_factory=list)
    grads: list[list[torch.Tensor | None]] = field(default_factory=list)  # [run][tensor]
    param_names: list[str] = field(default_factory=list)
    params: list[list[torch.Tensor]] = field(default_factory=list)
    losses: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)


def _run_all(call: Callable[[], Any], snap: _Snapshot, modules: Mapping[str, nn.Module], runs: int,
             optimizer: torch.optim.Optimizer | None) -> _Runs:
    out = _Runs()
    leaves: list[torch.Tensor] = []
    opt_params = [p for g in optimizer.param_groups for p in g["params"]] if optimizer is not None else []
    for r in range(runs):
        if r:  # run 1 starts from the state just taken (gradients already cleared)
            snap.reset()
        loss, output = call()
        loss = _check_loss(loss)
        if r == 0:
            found = _graph_leaves(loss)
            names = _names(modules, found)
            rank = {key: i for i, key in enumerate(names)}
            leaves = sorted(found, key=lambda t: (id(t) not in rank, rank.get(id(t), 0)))
            for t in leaves:
                snap.add(t, value=False)  # leaves outside the modules: their gradients are put back too
            out.names = _named(leaves, names)
            out.param_names = _named(opt_params, names)
        loss.backward()
        # The next reset() sets every .grad to None, so backward() never writes into these tensors again: they are
        # kept without a copy, unless an optimizer step (which may modify gradients in place) comes first.
        out.grads.append([_grad(t, copy=optimizer is not None) for t in leaves])
        if optimizer is not None:
            optimizer.step()
        if optimizer is not None:
            out.params.append([p.detach().clone() for p in opt_params])
        out.losses.append(loss.detach().clone())
        if output is not None:
            out.outputs.append(output.detach().clone())
    return out


# --- comparing the runs -------------------------------------------------------------------------------------
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


# --- the report ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NondeterminismReport:
    """What :func:`measure_nondeterminism` found. ``identical`` is the verdict; ``summary()`` a table;
    ``to_json()`` a JSON-ready document (schema ``torchrepro.measure/1``)."""

    runs: int
    grads: list[TensorReport]
    params: list[TensorReport]  # parameters after the optimizer step (empty without an optimizer)
    loss: TensorReport
    losses: list[float]
    output: OutputReport | None
    cosine_distance: list[list[float]]  # all gradients concatenated
    deterministic_algorithms: bool
    device: str
    threads: int

    @property
    def tensors(self) -> list[TensorReport]:
        return [*self.grads, *self.params]

    @property
    def identical(self) -> bool:
        return (self.loss.identical and all(t.identical for t in self.tensors)
                and (self.output is None or self.output.identical))

    @property
    def cosine(self) -> list[list[float]]:
        return [[1.0 - x for x in row] for row in self.cosine_distance]

    @property
    def min_cosine(self) -> float:
        return min(min(row) for row in self.cosine)

    @property
    def max_cosine_distance(self) -> float:
        return max(max(row) for row in self.cosine_distance)

    @property
    def max_abs(self) -> float:
        return max((t.max_abs for t in self.tensors), default=0.0)

    @property
    def max_ulp(self) -> int:
        return max((t.max_ulp for t in self.tensors), default=0)

    @property
    def differing_fraction(self) -> float:
        """Fraction of all gradient elements that differ between runs."""
        sizes = [math.prod(t.shape) for t in self.grads]
        total = sum(sizes)
        return sum(t.differing_fraction * n for t, n in zip(self.grads, sizes)) / total if total else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "identical": self.identical, "runs": self.runs,
            "deterministic_algorithms": self.deterministic_algorithms, "device": self.device, "threads": self.threads,
            "overall": {"differing_fraction": self.differing_fraction, "max_abs": _finite(self.max_abs),
                        "max_ulp": self.max_ulp, "min_cosine": self.min_cosine,
                        "max_cosine_distance": self.max_cosine_distance, "cosine": self.cosine,
                        "cosine_distance": self.cosine_distance},
            "loss": {**self.loss.to_json(), "values": [v.hex() for v in self.losses]},
            "output": self.output.to_json() if self.output is not None else None,
            "grads": [t.to_json() for t in self.grads],
            "params": [t.to_json() for t in self.params],
        }
    to_dict = renamed("to_json", "to_dict")

    def summary(self, *, max_rows: int = 30) -> str:
        """A table of the tensors that differ (all of them when none do, up to ``max_rows``), rich when installed."""
        head = self._head_lines()
        rows = [t for t in self.tensors if not t.identical] or self.tensors
        shown = rows[:max_rows]
        table = render_table(["tensor", "kind", "identical", "differing", "max |Δ|", "max ULP", "1 - min cos"],
                             [[t.name, t.kind, "yes" if t.identical else "NO", _pct(t.differing_fraction),
                               _num(t.max_abs), str(t.max_ulp), _num(t.max_cosine_distance)] for t in shown])
        tail = [f"  (+{len(rows) - len(shown)} more)"] if len(rows) > len(shown) else []
        return "\n".join([*head, table, *tail, *self._advice()])

    def _head_lines(self) -> list[str]:
        step = "forward+backward" + ("+optimizer step" if self.params else "")
        verdict = "IDENTICAL" if self.identical else "NOT IDENTICAL"
        lines = [f"torchrepro measure: {verdict} across {self.runs} runs of {step} from identical state",
                 f"  deterministic algorithms {'on' if self.deterministic_algorithms else 'off'}; device "
                 f"{self.device}; {self.threads} CPU threads"]
        loss = "identical" if self.loss.identical else f"max |Δ| {_num(self.loss.max_abs)}"
        lines.append(f"  loss: {loss}")
        if self.output is not None:
            o = self.output
            text = "identical" if o.identical else f"max |Δ| {_num(o.max_abs)}, {_pct(o.differing_fraction)} differ"
            if o.topk is not None:
                text += f"; argmax agreement {o.argmax_agreement:.2%}; top-{o.topk} Jaccard {o.topk_jaccard:.4f}"
            lines.append(f"  outputs {list(o.shape)}: {text}")
        differ = sum(not t.identical for t in self.grads)
        lines.append(f"  gradients: {differ} of {len(self.grads)} tensors differ, {self.differing_fraction:.2%} of "
                     f"their elements; max |Δ| {_num(self.max_abs)}; max ULP {self.max_ulp}; min cosine "
                     f"{self.min_cosine:.17g} (1 - cos = {_num(self.max_cosine_distance)})")
        return lines

    def _advice(self) -> list[str]:
        if self.identical:
            return ["Every run was bitwise identical."]
        if not self.deterministic_algorithms:
            return ["Next: measure again under `with torchrepro.deterministic():`; `torchrepro check --locate` names "
                    "the first nondeterministic op."]
        return ["Deterministic algorithms are on, yet the runs differ: look for state the step changes that is "
                "not a parameter, buffer or optimizer state (a global counter, a cache, a generator of your own)."]


def _pct(x: float) -> str:
    return "0" if x == 0 else f"{x:.2%}"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.3g}"


def measure_nondeterminism(
    model: nn.Module | Callable[[], Any],
    inputs: Any = None,
    *,
    target: Any = None,
    loss_fn: Callable[..., Any] | None = None,
    runs: int = 10,
    optimizer: torch.optim.Optimizer | None = None,
    topk: int = 5,
) -> NondeterminismReport:
    """Run forward + backward (+ ``optimizer.step()``) ``runs`` times from identical state and compare the results.

    Args:
        model: an ``nn.Module`` called as ``model(inputs)`` (``model(*inputs)`` for a tuple or list,
            ``model(**inputs)`` for a dict); or a callable ``fn() -> loss`` (or ``-> (loss, outputs)``) that runs the
            forward pass itself and does not call ``backward()``.
        target: passed to ``loss_fn(outputs, target)``; without ``loss_fn``, cross-entropy for integer targets and
            mean squared error otherwise. With neither, the loss is ``outputs.sum()``.
        runs: at least 2.
        optimizer: also take an optimizer step in each run and compare the updated parameters.
        topk: k of the top-k Jaccard index of the outputs (at most the number of classes - 1).

    Before each run the parameters, buffers (BatchNorm statistics), gradients (cleared), optimizer state and
    every RNG (Python, NumPy, torch CPU/CUDA, registered generators) are put back; afterwards everything is as it
    was before the call, gradients included. With a callable, the modules are found by a scan of live objects.
    State held outside parameters, buffers and the optimizer (a Python counter, a cache) is not restored.
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"measure_nondeterminism: runs must be an integer >= 2 (two runs to compare), got {runs!r}.")
    if isinstance(model, nn.Module):
        if inputs is None:
            raise TypeError("measure_nondeterminism(model, inputs): inputs is missing; pass the batch the model is "
                            "called with, or pass a callable fn() -> loss instead of the model.")
        modules: Mapping[str, nn.Module] = {"": model}
        call = _model_call(model, inputs, target, loss_fn)
    elif callable(model):
        if inputs is not None or target is not None or loss_fn is not None:
            raise TypeError("measure_nondeterminism(fn): a callable takes no inputs, target or loss_fn; it must "
                            "compute the loss itself (fn() -> loss, or fn() -> (loss, outputs)).")
        modules = discover_models()
        call = _fn_call(model)
    else:
        raise TypeError(f"measure_nondeterminism: expected an nn.Module or a callable fn() -> loss, got "
                        f"{type(model).__name__}.")
    snap = _Snapshot(modules, optimizer)
    try:
        produced = _run_all(call, snap, modules, runs, optimizer)
    finally:
        snap.put_back()
    grads, cosine_distance = _grad_reports(produced.names, produced.grads)
    params = [_report(name, "param", list(values))
              for name, values in zip(produced.param_names, zip(*produced.params))] if produced.params else []
    losses = produced.losses
    device = str(losses[0].device)
    return NondeterminismReport(
        runs=runs, grads=grads, params=params,
        loss=_report("loss", "loss", losses), losses=[float(x.float()) for x in losses],
        output=_output_report(produced.outputs, topk) if produced.outputs else None,
        cosine_distance=cosine_distance, deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        device=device, threads=torch.get_num_threads())


# --- assert_deterministic -----------------------------------------------------------------------------------
_NO_STATE = "it holds no tensors, numbers or fields to compare, and == on it compares identity"


class UncomparableResultError(ReproError, TypeError):
    """A returned object that holds nothing to compare between calls (``==`` on it would compare identity)."""

    def __init__(self, path: str, obj: Any, why: str = _NO_STATE) -> None:
        self.path, self.why = path, why
        self.kind = f"{type(obj).__qualname__} ({type(obj).__module__}.{type(obj).__qualname__})"
        super().__init__()
        self.named("the function")

    def named(self, what: str) -> UncomparableResultError:
        """The same error, its message naming ``what`` returned the object."""
        self.args = (f"{what} cannot be checked: {self.path} is of type {self.kind}, which cannot be compared between "
                     f"calls ({self.why}). Return what must come out the same instead: tensors, numbers or strings, "
                     "a module or optimizer (compared by its state_dict()), or lists, dicts, dataclasses or objects "
                     "of them.",)
        return self


# Compared with == as they are: values whose equality is their content (torch.dtype and enums are singletons).
_VALUES = (type(None), bool, int, float, complex, str, bytes, range, torch.dtype, torch.device, torch.layout,
           torch.memory_format, enum.Enum, frozenset, set, type(Ellipsis))
# Objects with no state to compare (functions, classes, modules, generators: == is identity).
_OPAQUE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type,
           types.GeneratorType, types.CoroutineType, torch.Generator)


@dataclass(frozen=True)
class _Ref:
    """An object met again inside itself (a cycle): compared by where it was first met."""

    path: str


def _slots(cls: type) -> tuple[str, ...]:
    slots = cls.__dict__.get("__slots__", ())
    return (slots,) if isinstance(slots, str) else tuple(slots)


def _fields(obj: Any) -> list[tuple[str, Any]]:
    """An object's attributes: its ``__dict__`` and the ``__slots__`` that are set."""
    found = list(vars(obj).items()) if hasattr(obj, "__dict__") else []
    names = [n for cls in type(obj).__mro__ for n in _slots(cls) if n not in ("__dict__", "__weakref__")]
    return found + [(n, getattr(obj, n)) for n in names if hasattr(obj, n)]


def _module_state(module: nn.Module) -> Iterator[tuple[str, Any]]:
    """A module's state_dict, then the buffers it leaves out (non-persistent ones)."""
    state = module.state_dict()
    yield from state.items()
    for name, buf in module.named_buffers():
        if name not in state:
            yield name, buf


def _value_leaf(obj: Any, path: str) -> tuple[str, Any]:
    """An object compared by its own ``==``: a copy, since a later call may change it."""
    try:
        return path, copy.deepcopy(obj)
    except Exception:  # not copyable: compared as it is
        return path, obj


def _leaves(obj: Any, path: str, seen: dict[int, str] | None = None) -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs of a returned structure, compared by state; tensors are copied (a later call may write
    into them). Modules and optimizers give their state_dict, objects their fields; UncomparableResultError for an
    object with nothing to compare."""
    seen = {} if seen is None else seen
    if isinstance(obj, torch.Tensor):
        yield path, _dense(obj)
        return
    if isinstance(obj, _VALUES):
        yield path, obj
        return
    if isinstance(obj, _OPAQUE):
        raise UncomparableResultError(path, obj)
    if id(obj) in seen:
        yield path, _Ref(seen[id(obj)])
        return
    seen[id(obj)] = path
    try:
        yield from _children(obj, path, seen)
    finally:
        del seen[id(obj)]


def _children(obj: Any, path: str, seen: dict[int, str]) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, nn.Module):
        for name, value in _module_state(obj):
            yield from _leaves(value, f"{path}.{name}", seen)
    elif callable(getattr(type(obj), "state_dict", None)):  # optimizers, LR schedulers, GradScaler
        yield from _leaves(obj.state_dict(), path, seen)
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _leaves(value, f"{path}[{key!r}]", seen)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        for name, value in zip(obj._fields, obj):
            yield from _leaves(value, f"{path}.{name}", seen)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _leaves(value, f"{path}[{i}]", seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name), f"{path}.{f.name}", seen)
    elif type(obj).__module__ == "numpy" and hasattr(obj, "dtype") and hasattr(obj, "shape"):
        try:
            yield path, torch.from_numpy(obj.copy()) if obj.shape else torch.tensor(obj.item())
        except (TypeError, RuntimeError):
            yield path, copy.deepcopy(obj)
    elif type(obj).__eq__ is not object.__eq__:  # type: ignore[comparison-overlap]  # a value type (Path, Decimal, datetime, ...): its own ==
        yield _value_leaf(obj, path)
    elif fields := _fields(obj):
        for name, value in fields:
            yield from _leaves(value, f"{path}.{name}", seen)
    else:
        raise UncomparableResultError(path, obj)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def _tensor_mismatch(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> str | None:
    """None when ``a`` and ``b`` agree; else how they differ (count, greatest |Δ|, where, ULPs)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"is a {_dtype_name(a)} tensor of shape {tuple(a.shape)} in one call and a {_dtype_name(b)} tensor " \
               f"of shape {tuple(b.shape)} in the other"
    if atol == 0 and rtol == 0 or not a.is_floating_point():
        bad = _differs(a, b)
    else:
        bad = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    count = int(bad.sum())
    if count == 0:
        return None
    text = f"{count} of {a.numel()} elements differ ({count / a.numel():.2%})"
    if not a.is_floating_point():
        first = _unravel(int(bad.reshape(-1).nonzero()[0]), tuple(a.shape))
        return text + f"; first at index {first}: {a[first].item()!r} vs {b[first].item()!r}"
    diff = (a.double() - b.double()).abs().reshape(-1)
    flat_bad = bad.reshape(-1)
    candidates = torch.where(flat_bad & torch.isfinite(diff), diff, torch.full_like(diff, -1.0))
    flat = int(candidates.argmax()) if float(candidates.max()) >= 0 else int(flat_bad.nonzero()[0])
    where = _unravel(flat, tuple(a.shape))
    va, vb = a.reshape(-1)[flat], b.reshape(-1)[flat]
    delta = tensor_delta(a, b)
    at = tensor_delta(va.reshape(1), vb.reshape(1))
    text += (f"; greatest |Δ| {float(diff[flat]):.6g} at index {where}: {float(va)!r} vs {float(vb)!r}"
             f" ({at.max_ulp if at else 0} ULP of {_dtype_name(a)}; largest ULP distance anywhere "
             f"{delta.max_ulp if delta else 0})")
    return text


def _close(a: float, b: float, atol: float, rtol: float) -> bool:
    """``|a - b| <= atol + rtol * |b|`` for finite numbers, as torch.isclose compares tensors (Inf only equals Inf)."""
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= atol + rtol * abs(b)


def _leaf_mismatch(a: Any, b: Any, atol: float, rtol: float, path: str = "output") -> str | None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"is a {type(a).__name__} in one call and a {type(b).__name__} in the other"
        return _tensor_mismatch(a, b, atol, rtol)
    if isinstance(a, float) and isinstance(b, float):
        same = a.hex() == b.hex() or (math.isnan(a) and math.isnan(b)) or (
            bool(atol or rtol) and _close(a, b, atol, rtol))
        return None if same else f"is {a!r} in one call and {b!r} in the other (|Δ| {abs(a - b):.6g})"
    try:
        same = bool(a == b) and type(a) is type(b)
    except Exception as exc:  # objects whose == fails or is ambiguous: no verdict rather than a wrong one
        raise UncomparableResultError(path, a, f"== on it raised {type(exc).__name__}: {exc}") from None
    return None if same else f"is {a!r} in one call and {b!r} in the other"


_STATE_CAUSE = ("state that the function changes or reads: a module in train mode (BatchNorm running statistics), "
                "a global counter or cache, a torch.Generator of its own (seed it inside the function, or register "
                "it with torchrepro.register_generator so that it is restored), or uninitialised memory "
                "(torch.empty).")


def _first_mismatch(call: Callable[[], Any], state: RNGState, runs: int, atol: float,
                    rtol: float) -> tuple[str, str | None] | None:
    """Call ``call()`` ``runs`` times, each from ``state``; the first difference from call 1 and its dtype."""
    results = []
    for _ in range(runs):
        state.restore()
        results.append(list(_leaves(call(), "output")))
    paths = [p for p, _ in results[0]]
    for i, result in enumerate(results[1:], start=2):
        if [p for p, _ in result] != paths:
            return (f"the structure of its result differs between call 1 and call {i}: {paths[:8]} vs "
                    f"{[p for p, _ in result][:8]}", None)
        for (path, a), (_, b) in zip(results[0], result):
            text = _leaf_mismatch(a, b, atol, rtol, path)
            if text is not None:
                return f"{path} differs between call 1 and call {i}: {text}", _dtype_name(a) if isinstance(
                    a, torch.Tensor) else None
    return None


def _diagnose(call: Callable[[], Any], state: RNGState, runs: int, atol: float, rtol: float) -> str:
    """Why the calls differ: repeat them under deterministic mode (when it is off) and see what changes."""
    if torch.are_deterministic_algorithms_enabled():
        return f"Cause: deterministic algorithms are on, so the difference comes from {_STATE_CAUSE}"
    try:
        with deterministic():
            again = _first_mismatch(call, state, runs, atol, rtol)
    except Exception as exc:  # an op without a deterministic implementation raises under deterministic mode
        first = (str(exc).strip().splitlines() or [""])[0].split(". ")[0].rstrip(".")[:300] + "."
        return (f"Cause: a kernel without a deterministic implementation: under torchrepro.deterministic() the call "
                f"raises {type(exc).__name__}: {first} Replace that operation, or run it under "
                "torchrepro.deterministic(warn_only=True) to list every such op.")
    if again is None:
        return (f"Cause: a nondeterministic kernel: under torchrepro.deterministic() all {runs} calls agree. Fix: run "
                "it under `with torchrepro.deterministic():` (scripts: `torchrepro run --deterministic`); "
                "torchrepro.trace_ops or `torchrepro check --locate` name the op.")
    return f"Cause: the calls differ under torchrepro.deterministic() too, so the difference comes from {_STATE_CAUSE}"


def find_nondeterminism(call: Callable[[], Any], *, runs: int = 3, atol: float = 0.0, rtol: float = 0.0,
                        what: str = "the function") -> str | None:
    """Call ``call()`` ``runs`` times from the same RNG state; None if every result matches the first, else the
    message :func:`assert_deterministic` raises.

    When the calls differ while deterministic algorithms are off, they are repeated under
    :func:`torchrepro.deterministic` to tell a nondeterministic kernel from changing state. The RNG is left as
    after the ``runs`` calls.
    """
    state = RNGState.capture()
    try:
        found = _first_mismatch(call, state, runs, atol, rtol)
    except UncomparableResultError as exc:
        raise exc.named(what) from None
    if found is None:
        return None
    problem, dtype = found
    after = RNGState.capture()
    try:
        cause = _diagnose(call, state, runs, atol, rtol)
    finally:
        after.restore()
    bitwise = atol == 0 and rtol == 0
    tolerance = "bitwise (atol=0, rtol=0)" if bitwise else f"with atol={atol:g}, rtol={rtol:g}"
    text = f"{what} is not deterministic ({runs} calls, each from the same RNG state; compared {tolerance}): " \
           f"{problem}.\n{cause}"
    if bitwise and dtype in ("float16", "bfloat16"):
        preset = "fp16-autocast" if dtype == "float16" else "bf16-autocast"
        text += (f"\nIf last-bit differences of {dtype} are acceptable here, compare with a tolerance: "
                 f"assert_deterministic(fn, ..., **torchrepro.TOLERANCES[{preset!r}]).")
    return text


def _check_tolerances(runs: Any, atol: Any, rtol: Any) -> None:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"assert_deterministic: runs must be an integer >= 2, got {runs!r}.")
    for name, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"assert_deterministic: {name} must be a number >= 0, got {value!r}. "
                             f"Presets: {', '.join(TOLERANCES)} (torchrepro.TOLERANCES).")


def assert_deterministic(fn: Callable[..., Any], *args: Any, runs: int = 3, atol: float = 0.0, rtol: float = 0.0,
                         **kwargs: Any) -> None:
    """Call ``fn(*args, **kwargs)`` ``runs`` times from identical RNG state; raise ``AssertionError`` unless every
    result equals the first -- bitwise by default, or within ``atol + rtol * |b|`` (:data:`TOLERANCES` has
    presets for fp16/bf16 autocast).

    Results may be tensors, numbers, strings, or lists, tuples, dicts and dataclasses of them; modules and
    optimizers are compared by their ``state_dict()`` (modules also by their non-persistent buffers), other objects
    by their attributes. An object with nothing to compare (``object()``, a function, a ``torch.Generator``) raises
    :class:`UncomparableResultError` (a ``TypeError``) saying what to return instead. The message names
    the output that differs, how many elements, the greatest absolute and ULP difference and where, and what to
    try. The RNG is left as after one call.

    >>> import torch, torchrepro
    >>> torchrepro.assert_deterministic(torch.rand, 3)
    """
    __tracebackhide__ = True
    _check_tolerances(runs, atol, rtol)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if inspect.iscoroutinefunction(fn):
        raise TypeError(f"assert_deterministic: {name} is a coroutine function; pass a plain function.")
    message = find_nondeterminism(lambda: fn(*args, **kwargs), runs=runs, atol=atol, rtol=rtol, what=f"`{name}`")
    if message is not None:
        raise AssertionError(message)
