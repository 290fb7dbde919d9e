"""How nondeterministic is a training step, and is a function deterministic?

:func:`measure_nondeterminism` compares repeated runs quantitatively, and exactly: it runs
forward + backward (and the optimizer step, when given) ``runs`` times from identical state -- parameters,
buffers, gradients, optimizer state and every RNG put back before each run -- and compares what came out:
per tensor, whether the runs are bitwise identical, the fraction of elements that differ, the greatest
absolute and ULP differences, and the pairwise cosine similarity of the gradients; for the model's outputs,
argmax agreement and the top-k Jaccard index. A cosine similarity alone hides last-bit differences (it
rounds to 1.0), so the cosine is computed as ``1 - distance`` with the distance taken from the differences of
the normalised gradients, and reported too.

:func:`assert_deterministic` (:mod:`.assertdet`, re-exported here) calls a function several times from the same
RNG state and raises an ``AssertionError`` that says which output differs, where, by how much, and what to try.
The per-tensor comparison of the runs is :mod:`.spread`.

>>> import torch, torchrepro
>>> model = torch.nn.Linear(4, 2)
>>> report = torchrepro.measure_nondeterminism(model, torch.randn(8, 4), runs=2)
>>> report.identical
True
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._core.modules import discover_models
from .._core.naming import renamed
from .._core.table import render_table
from ..control.rng import RNGState
from .assertdet import TOLERANCES as TOLERANCES  # re-exported: assert_deterministic and its presets live there
from .assertdet import UncomparableResultError as UncomparableResultError
from .assertdet import assert_deterministic as assert_deterministic
from .assertdet import find_nondeterminism as find_nondeterminism
from .spread import OutputReport, TensorReport, _dense, _finite, _grad_reports, _output_report, _report

SCHEMA = "torchrepro.measure/1"


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
