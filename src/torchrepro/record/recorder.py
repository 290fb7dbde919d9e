"""The step recorder: fingerprints what a training script does, step by step, with no code change.

It hooks three global places: ``torch.autograd.backward`` (the loss), the optimizer step post-hook (every
``optimizer.step()``), and the DataLoader iterator (each batch). Per optimizer step it records the losses that
``backward()`` was called on since the previous step, the batches yielded since then, and fingerprints of each
named parameter, its gradient and its optimizer state. Scripts that update parameters by hand (no
``torch.optim``) get one step per ``backward()`` call instead.

Scripts that draw their batches without a DataLoader (nanoGPT's ``get_batch``, any hand-written loop) have their
data fingerprinted where the model receives it: the tensors passed to the outermost ``forward`` of the root
modules, recorded in place of the batches of a step that saw no DataLoader batch (``"batches_source":
"model-inputs"``; :mod:`torchrepro.record.inputs`).

Its settings are grouped by feature (:mod:`torchrepro.record.settings`); parameter value snapshots are written
in the background (:mod:`torchrepro.record.valuewriter`).

Recording never breaks the script: a tensor that cannot be fingerprinted, a batch that cannot be read and a
value file that cannot be written are recorded as such (``"unreadable: <reason>"``, ``values_error``), with a
:class:`~torchrepro._core.errors.ReproWarning`, and ``compare`` reports them.

From code::

    with torchrepro.watch(model, optimizer, run_dir="runs/a"):
        train()
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from .._core.dtensor import LayoutTracker
from .._core.errors import ReproWarning
from .._core.fingerprint import (
    UNREADABLE,
    algorithms_since,
    fingerprint,
    fingerprint_many,
    fingerprint_object,
    unreadable_text,
    usage_mark,
)
from .._core.modules import discover_models, optimizers_exist
from .._core.patches import Patches
from ..distributed.ranks import unreplicated_names
from ..env.info import environment_summary
from .compiled import CompileWatch, measure_graphs
from .divergence import DivergenceWatch
from .draws import DrawWatch
from .fullview import FullView
from .inputs import ModelInputs, _grad_enabled, _unrecorded, data_fields
from .inputs import unrecorded_batches as unrecorded_batches  # imported from here too
from .optrace import OpTracer
from .resumemarks import ResumeMarker, optimizer_state, rng_fingerprints
from .settings import DEFAULT_VALUES_BUDGET as DEFAULT_VALUES_BUDGET  # imported from here too
from .settings import (
    SCHEDULES,
    RecorderSettings,
    ResumeMarks,
    StopSettings,
    TraceSettings,
    ValueSettings,
)
from .settings import sampled_step as sampled_step  # imported from here too
from .store import GRAD_VALUE_STEPS, GRAD_VALUES_ENV, MODEL_INPUTS, OPS, VALUES, TraceWriter, write_manifest  # noqa: F401
from .valuewriter import ValueWriter

_ValueWriter = ValueWriter  # its name before it had a module of its own


class MaxStepsReached(SystemExit):
    """Raised from the step hook to end a script cleanly after ``--max-steps`` steps.

    A ``SystemExit`` (``code`` 0), so that ``except Exception`` in user code between the hook and the caller
    does not swallow it; ``torchrepro run`` catches it at the top of the script, :class:`watch` at the end
    of its ``with`` block.
    """

    def __init__(self) -> None:
        super().__init__(0)


def _float_hex(t: torch.Tensor) -> str | None:
    try:
        if t.numel() != 1 or not t.is_floating_point() or t.layout != torch.strided:
            return None
        return float(t.detach().reshape(()).item()).hex()
    except Exception:  # e.g. a tensor subclass without data: the fingerprint says it is unreadable
        return None


def _env_int(name: str) -> int:
    try:
        return max(0, int(os.environ.get(name, "0") or 0))
    except ValueError:
        return 0


def _warn(message: str) -> None:
    warnings.warn(f"torchrepro: {message}", ReproWarning, stacklevel=4)


class Recorder:
    """Records a training run into a run directory. Use :func:`watch`, or ``torchrepro run`` for scripts.

    Args:
        run_dir: where ``trace.jsonl`` and ``values/`` go.
        models: ``{prefix: module}`` giving parameter names; None discovers the root modules at the first step.
        values: what is kept of parameter values besides fingerprints (:class:`~.settings.ValueSettings`: keep,
            budget, schedule, gradient snapshots); by default nothing.
        trace: which steps are traced op by op (:class:`~.settings.TraceSettings`); by default none.
        resume: what ``check --resume-at`` needs (:class:`~.settings.ResumeMarks`: RNG states, sample indices,
            optimizer state before the first step; the boundary and the stop around step K); by default none.
        stop: when the script is ended with :class:`MaxStepsReached` (:class:`~.settings.StopSettings`:
            ``max_steps``, ``divergence``); by default never.
        timing: record only step boundaries (``t`` of each event, taken after synchronising CUDA), no
            fingerprints: what ``torchrepro bench`` times.
        check_ranks_every: in a distributed program, run :func:`torchrepro.distributed.ranks.check_consistency`
            after every N-th optimizer step on every rank, write its report into the trace (``"kind": "ranks"``)
            and warn when replicas differ.

    The flat keywords of the settings' fields are accepted too (``keep_values``, ``values_budget``,
    ``value_schedule``, ``grad_value_steps``, ``grad_value_start``, ``trace_steps``, ``trace_mode``,
    ``resume_marks``, ``boundary_after``, ``stop_after``, ``max_steps``, ``divergence``; ``None``: not given),
    mapped onto the objects by :meth:`~.settings.RecorderSettings.build`; ``settings`` holds the result::

        Recorder(run_dir, keep_values=True, max_steps=5)
        Recorder(run_dir, values=ValueSettings(keep=True), stop=StopSettings(max_steps=5))  # the same
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        models: Mapping[str, nn.Module] | None = None,
        values: ValueSettings | None = None,
        trace: TraceSettings | None = None,
        resume: ResumeMarks | None = None,
        stop: StopSettings | None = None,
        timing: bool = False,
        check_ranks_every: int | None = None,
        keep_values: bool | None = None,
        values_budget: int | None = None,
        value_schedule: str | None = None,
        grad_value_steps: int | None = None,
        grad_value_start: int | None = None,
        trace_steps: tuple[int, int] | list[int] | None = None,
        trace_mode: str | None = None,
        resume_marks: bool | None = None,
        boundary_after: int | None = None,
        stop_after: int | None = None,
        max_steps: int | None = None,
        divergence: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings = RecorderSettings.build(
            values=values, trace=trace, resume=resume, stop=stop, timing=timing, check_ranks_every=check_ranks_every,
            keep_values=keep_values, values_budget=values_budget, value_schedule=value_schedule,
            grad_value_steps=grad_value_steps, grad_value_start=grad_value_start, trace_steps=trace_steps,
            trace_mode=trace_mode, resume_marks=resume_marks, boundary_after=boundary_after, stop_after=stop_after,
            max_steps=max_steps, divergence=divergence)
        kept, traced, resume_ = settings.values, settings.trace, settings.resume
        self.trace = TraceWriter(run_dir)
        self.forked = False  # this is a forked child of the recorded process: it records nothing (see _in_child)
        _recorders.add(self)
        # with keep_values: gradient and optimizer-state snapshots of the first N steps (None: $GRAD_VALUES_ENV or 0)
        self.grad_value_steps = _env_int(GRAD_VALUES_ENV) if kept.grad_steps is None else kept.grad_steps
        self.grad_value_start = kept.grad_start  # the snapshots cover steps start .. start + grad_value_steps - 1
        self.resume_marks = resume_.enabled
        self.boundary_after = resume_.boundary_after  # set to None once the boundary is written
        self.stop_after = resume_.stop_after
        self.divergence = settings.stop.divergence  # set to None if the comparison fails
        self._watch: DivergenceWatch | None = None
        self.stopped_diverged: int | None = None  # the step after which the divergence watch stopped the run
        self.marks = ResumeMarker(self) if resume_.enabled else None  # what check --resume-at needs
        self.timing = settings.timing
        self.check_ranks_every = settings.check_ranks_every
        # Op tracing for steps lo..hi (0 = model construction up to the first backward), see optrace.
        self.trace_steps = traced.steps
        self.trace_mode = traced.mode
        self._tracer = OpTracer(models=models, path=self.trace.dir / OPS, keep=False) if traced.steps else None
        self._models = dict(models) if models is not None else None
        self._discovered: dict[str, nn.Module] | None = None
        self.max_steps = settings.stop.max_steps
        self.stopped = False  # MaxStepsReached was raised
        self._optimizers_exist: bool | None = None
        self._warned: set[str] = set()
        self.values = ValueWriter(self.trace.dir / VALUES, kept.budget) if kept.keep else None
        self._layouts = LayoutTracker(constant=True)  # DTensors' placements, mesh, coordinate (as they change)
        self._draws = None if self.timing else DrawWatch.from_env(self)  # torchrun: random draws of the first steps
        # --full-tensors: every DTensor also assembled (a collective on every rank), written by rank 0 (fullview)
        self._full = FullView(self.trace.dir, kept) if kept.full_tensors and not settings.timing else None
        self._snapshot_due = SCHEDULES[kept.schedule]
        self._compile_watch = CompileWatch.from_env()  # torch.compile calls (and graph capture for --locate)
        self.steps = 0
        self.backward_calls = 0
        self._names: dict[int, str] = {}
        self._pending_losses: list[torch.Tensor | None] = []
        self._pending_batches: list[str] = []
        self._batches_since_backward: list[str] = []
        # The data of steps without a DataLoader batch: the inputs of the root modules' outermost forwards.
        self.inputs = ModelInputs(self, self._models, timing=self.timing)
        self._loaders: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._optimizers: dict[Any, int] = {}  # strong refs: the final parameters are read at exit
        self._patches = Patches()  # autograd's backward, the DataLoader iterator's methods, the optimizer hooks
        self._active = False
        self._in_hook = False
        self._t0 = time.perf_counter()
        self.first_step_time: float | None = None
        self.device: str | None = None
        self._fp_mark = usage_mark()  # which fingerprint algorithms this run used goes into the manifest

    # --- naming ----------------------------------------------------------------------------------------
    def _refresh_names(self, models: Mapping[str, nn.Module] | None = None) -> None:
        if models is None:
            models = self._models if self._models is not None else discover_models()
        for prefix, model in models.items():
            for name, p in model.named_parameters(remove_duplicate=True):
                self._names.setdefault(id(p), f"{prefix}.{name}" if prefix else name)

    def _named_params(self, params: Iterable[torch.Tensor], owner: str) -> dict[str, torch.Tensor]:
        params = list(params)
        if any(id(p) not in self._names for p in params):
            self._refresh_names()
        out: dict[str, torch.Tensor] = {}
        for i, p in enumerate(params):
            name = self._names.get(id(p))
            if name is None:
                name = self._names[id(p)] = f"{owner}.param{i}"
            out[name] = p
        return out

    def _all_model_params(self) -> dict[str, torch.Tensor]:
        models = self._models
        if models is None:  # discover once: scripts without an optimizer call this per step
            if self._discovered is None:
                self._discovered = discover_models()
            models = self._discovered
        params = [p for model in models.values() for p in model.parameters() if p.requires_grad]
        if any(id(p) not in self._names for p in params):
            self._refresh_names(models)
        return {self._names[id(p)]: p for p in params}

    # --- fingerprinting helpers -------------------------------------------------------------------------
    def _fps(self, named: Mapping[str, torch.Tensor | None]) -> dict[str, str | None]:
        """Fingerprints by name; a tensor that cannot be read is recorded as ``"unreadable: <reason>"``."""
        if self.timing:
            return dict.fromkeys(named)
        keys = [k for k, v in named.items() if v is not None]
        tensors: list[torch.Tensor] = [named[k] for k in keys]  # type: ignore[misc]
        try:
            fps = fingerprint_many(tensors)
        except Exception:  # find which ones; never let the recorder break the user's backward() or step()
            fps = []
            for k, t in zip(keys, tensors):
                try:
                    fps.append(fingerprint(t))
                except Exception as exc:
                    fps.append(unreadable_text(exc))
                    self._warn_once("tensor", f"could not fingerprint {k.split(':', 1)[-1]!r} "
                                    f"({fps[-1][len(UNREADABLE):]}); it is recorded as unreadable and "
                                    "cannot be compared between runs.")
        out: dict[str, str | None] = dict.fromkeys(named)
        out.update(zip(keys, fps))
        return out

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            _warn(message)

    def _now(self) -> float:
        if self.timing and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # a step ends when its device work does
        return round(time.perf_counter() - self._t0, 6)

    # --- hooks ------------------------------------------------------------------------------------------
    def _on_batch(self, loader: Any, batch: Any, index: str | None = None) -> None:
        if self.timing:
            return
        if self.marks is not None:
            self.marks.on_batch(index)
        idx = self._loaders.setdefault(loader, len(self._loaders))
        try:
            digest = fingerprint_object(batch)
        except Exception as exc:  # UnreadableError names the part; anything else must not break the loop
            fp = unreadable_text(exc)
            self._warn_once("batch", f"could not read a batch of DataLoader {idx} ({fp[len(UNREADABLE):]}); it "
                            "is recorded as unreadable and its data cannot be compared between runs. Return "
                            "tensors, NumPy arrays, numbers, strings, lists, dicts, dataclasses or named "
                            "tuples from the dataset and collate_fn.")
        else:
            fp = hashlib.blake2b(f"loader{idx}|{digest}".encode(), digest_size=16).hexdigest()
        self._pending_batches.append(fp)
        self._batches_since_backward.append(fp)

    def _trace_boundary(self, next_step: int) -> None:
        """Called where step ``next_step`` begins: start or stop the op tracer for the traced range."""
        if self._tracer is None or self.trace_steps is None:
            return
        lo, hi = self.trace_steps
        if lo <= next_step <= hi:
            self._tracer.start()
            self._tracer.step = next_step
            self._tracer.fps.clear()  # writes through .data between steps do not bump version counters
        elif self._tracer.active:
            self._tracer.stop()

    def _stop(self) -> None:
        self.stopped = True
        raise MaxStepsReached()

    def _divergence_stop_due(self, n: int, mode: str) -> bool:
        """With ``divergence``: whether the run stops after its step ``n`` (see :class:`DivergenceWatch`)."""
        if self.divergence is None:
            return False
        try:
            if self._watch is None:
                self._watch = DivergenceWatch.from_options(self.divergence, mode)
            if self._watch.mode != mode or not self._watch.after_step(n):
                return False
        except Exception as exc:  # never break the script for it: the run goes on to its end
            self.divergence = None
            self._warn_once("divergence", f"could not compare this run with the others as it records "
                            f"({type(exc).__name__}: {exc}); it runs to its end.")
            return False
        self.stopped_diverged = n
        return True

    def completed_steps(self) -> int:
        """Steps done so far: optimizer steps, or ``backward()`` calls when no ``torch.optim`` optimizer exists."""
        if self.steps:
            return self.steps
        if self._optimizers_exist is None:
            self._optimizers_exist = optimizers_exist()
        return 0 if self._optimizers_exist else self.backward_calls

    def _on_backward_start(self) -> None:
        self.inputs.depth = 0  # no root forward runs as backward() starts (recomputed checkpoints count afresh)
        if self.stopped or self.stopped_diverged is not None:
            self._stop()  # (a divergence stop without an optimizer: the hand update of the last step is done)
        if self.stop_after is not None and self.completed_steps() >= self.stop_after:
            self._stop()  # the step after ``stop_after`` begins: what the script did in between (a checkpoint) is done
        if self.boundary_after is not None and self.completed_steps() >= self.boundary_after:
            self.boundary_after = None  # once
            self.trace.write({"kind": "boundary", "after_step": self.completed_steps(), "t": self._now(),
                              "rng": rng_fingerprints()})
        if self.max_steps is not None and not self.steps and self.backward_calls >= self.max_steps:
            # Each backward() is a step when the script updates parameters by hand. With an optimizer, the
            # backward() calls before its first step are gradient accumulation: wait for optimizer steps.
            if self._optimizers_exist is None:
                self._optimizers_exist = optimizers_exist()
            if not self._optimizers_exist:
                self._stop()
        if self.backward_calls == 0 and self.steps == 0 and self.trace_steps and self.trace_steps[0] == 0:
            self._trace_boundary(1)  # the init region (step 0) ends where the first backward starts
        if self.backward_calls == 0 and self.steps == 0:
            params = self._all_model_params()
            if params:
                self.device = str(next(iter(params.values())).device)
            self.trace.write({"kind": "init", "t": self._now(), "params": self._fps(params),
                              **self._layouts.fields(params=params)})
            if self.values is not None:
                self.values.submit("init", params)
            if self._full is not None:
                self._full.init(params)

    def _on_backward_end(self, loss: torch.Tensor | None) -> None:
        self.backward_calls += 1
        self._pending_losses.append(loss.detach() if loss is not None else None)
        self.inputs.remove_finder()  # no training forward before the first backward(): none of the script's is hooked
        inputs = self.inputs.to_pending()
        if self.trace_mode == "backward":
            self._trace_boundary(self.backward_calls + 1)
        if self.steps:  # optimizer mode: the loss is fingerprinted with the step, in one batch
            return
        # No optimizer has stepped (yet). Without an optimizer each backward() is a step: record it fully. With
        # one, these are micro-batches of gradient accumulation whose step record will hold the parameters and
        # gradients: record the loss and batches only, and spend none of the values budget.
        if self._optimizers_exist is None:
            self._optimizers_exist = optimizers_exist()
        if not self._optimizers_exist:
            self.inputs.pending = []  # each backward() is a step: its event holds them
        params = {} if self._optimizers_exist else self._all_model_params()
        fps = self._fps({"loss": loss, **{f"p:{k}": v for k, v in params.items()},
                         **{f"g:{k}": v.grad for k, v in params.items()}})
        event: dict[str, Any] = {
            "kind": "backward", "n": self.backward_calls, "t": self._now(),
            "loss": {"fp": fps["loss"], "value": _float_hex(loss) if loss is not None else None},
            **data_fields(self._batches_since_backward, inputs),
            "params": {k[2:]: v for k, v in fps.items() if k.startswith("p:")},
            "grads": {k[2:]: v for k, v in fps.items() if k.startswith("g:")},
            **self._layouts.fields(params=params, grads={k: v.grad for k, v in params.items()}),
        }
        if self.marks is not None:
            event.update(self.marks.backward_marks(rng=not self._optimizers_exist))
        self._batches_since_backward = []
        if self.values is not None and params and self._snapshot_due(self.backward_calls):
            self.values.submit(f"backward_{self.backward_calls:06d}", params)
            self._submit_grads(self.backward_calls, params, {})
        self.trace.write(event)
        if self._full is not None and params:
            self._full_step(self.backward_calls, params, "backward")
        if not self._optimizers_exist:
            self._divergence_stop_due(self.backward_calls, "backward")  # stops as the next backward() starts

    def _losses(self) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor | None]]:
        """Pending losses as trace entries (exact values as float.hex) and as tensors to fingerprint."""
        entries = [{"value": _float_hex(t) if t is not None else None} for t in self._pending_losses]
        return entries, {f"l:{i}": t for i, t in enumerate(self._pending_losses)}

    def _on_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.stopped:  # the script caught MaxStepsReached and went on: record no more
            self._stop()
        if self._tracer is not None:
            self._tracer.settle()
        self.steps += 1
        if self.first_step_time is None:
            self.first_step_time = self._now()
        opt_idx = self._optimizers.setdefault(optimizer, len(self._optimizers))
        self.inputs.remove_finder()
        self.inputs.to_pending()  # forwards without backward() (torch.autograd.grad) belong to this step
        params = self._named_params([p for g in optimizer.param_groups for p in g["params"]], f"opt{opt_idx}")
        state, scalars = optimizer_state(optimizer, params)
        losses, loss_tensors = self._losses()
        fps = self._fps({**loss_tensors, **{f"p:{k}": v for k, v in params.items()},
                         **{f"g:{k}": v.grad for k, v in params.items()},
                         **{f"s:{k}": v for k, v in state.items()}})
        for i, entry in enumerate(losses):
            entry["fp"] = fps[f"l:{i}"]
        event = {
            "kind": "step", "n": self.steps, "opt": opt_idx, "t": self._now(),
            "losses": losses, **data_fields(self._pending_batches, self.inputs.pending),
            "grads": {k[2:]: v for k, v in fps.items() if k.startswith("g:")},
            "params": {k[2:]: v for k, v in fps.items() if k.startswith("p:")},
            "state": {**{k[2:]: v for k, v in fps.items() if k.startswith("s:")}, **scalars},
            "lr": [g.get("lr") if isinstance(g.get("lr"), (int, float)) else None for g in optimizer.param_groups],
            **self._layouts.fields(params=params, grads={k: v.grad for k, v in params.items()}, state=state),
        }
        if self.marks is not None:
            event.update(self.marks.step_marks(optimizer, opt_idx))
        self._pending_losses, self._pending_batches, self._batches_since_backward = [], [], []
        self.inputs.pending = []
        self.trace.write(event)
        if self.values is not None:
            if self._snapshot_due(self.steps):
                self.values.submit(f"step_{self.steps:06d}", params)
            self._submit_grads(self.steps, params, state)
        if self._full is not None:
            self._full_step(self.steps, params, "optimizer")
        if self.trace_mode == "optimizer":
            self._trace_boundary(self.steps + 1)
        if self.check_ranks_every and self.steps % self.check_ranks_every == 0:
            self._check_ranks()
        if self.max_steps is not None and self.steps >= self.max_steps:
            self._stop()
        if self._divergence_stop_due(self.steps, "optimizer"):
            self._stop()

    def _submit_grads(self, n: int, params: Mapping[str, torch.Tensor],
                      state: Mapping[str, torch.Tensor | None]) -> None:
        """Snapshots of gradients and optimizer state for ``grad_value_steps`` steps from ``grad_value_start``
        (values budget)."""
        if self.values is None or not self.grad_value_start <= n < self.grad_value_start + self.grad_value_steps:
            return
        grads = {k: p.grad for k, p in params.items()
                 if isinstance(p.grad, torch.Tensor) and p.grad.layout == torch.strided}
        tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.layout == torch.strided}
        for name, snapshot in ((f"grads_{n:06d}", grads), (f"state_{n:06d}", tensors)):
            size = sum(t.numel() * t.element_size() for t in snapshot.values())
            # taken only when it fits with room for the final parameters (the writer's rule): a snapshot that
            # does not fit is left out here rather than counted among the parameter snapshots skipped
            if snapshot and self.values.used + 2 * size <= self.values.budget:
                self.values.submit(name, snapshot)

    def _full_step(self, n: int, params: Mapping[str, torch.Tensor], mode: str) -> None:
        """The full-tensor view of step ``n`` (every rank: the gathering is a collective)."""
        assert self._full is not None
        grads_due = self.grad_value_start <= n < self.grad_value_start + self.grad_value_steps
        self._full.step(n, params, due=self._snapshot_due(n), grad_values=grads_due, mode=mode)

    def _check_ranks(self) -> None:
        """Compare this step's replicas across ranks (a collective: every rank gets here at the same step)."""
        from ..distributed.ranks import check_consistency

        models = self._models if self._models is not None else (self._discovered or discover_models())
        report = check_consistency(models, list(self._optimizers), step=self.steps)
        self.trace.write({"kind": "ranks", "t": self._now(), **report.to_json()})
        if not report.ok:
            _warn(report.summary())

    # --- install / uninstall ----------------------------------------------------------------------------
    def install(self) -> Recorder:
        """Hook into autograd, optimizers and DataLoaders (process-wide) until :meth:`uninstall`."""
        if self._active:
            return self
        rec = self
        self._compile_watch.install()
        if self.trace_steps is not None:
            self._trace_boundary(0 if self.trace_steps[0] == 0 else 1)
        orig_backward = torch.autograd.backward

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if rec._in_hook or rec.forked:
                return orig_backward(tensors, *args, **kwargs)
            loss = tensors if isinstance(tensors, torch.Tensor) else (
                tensors[0] if isinstance(tensors, (list, tuple)) and tensors else None)
            rec._in_hook = True
            try:
                rec._on_backward_start()
            finally:
                rec._in_hook = False
            result = orig_backward(tensors, *args, **kwargs)
            rec._in_hook = True
            try:
                rec._on_backward_end(loss)
            finally:
                rec._in_hook = False
            return result

        self._patches.set(torch.autograd, "backward", backward)

        it_cls = torch.utils.data.dataloader._BaseDataLoaderIter
        orig_next = it_cls.__next__

        def __next__(it: Any) -> Any:
            batch = orig_next(it)
            if rec.forked:
                return batch
            loader = getattr(it, "_torchrepro_loader", None)
            indices = it.__dict__.get("_torchrepro_indices")
            # loaded to be dropped (a resume's replay), or fetched with autograd off (a validation loop, Lightning's
            # sanity check, which a resumed run does not repeat): not a batch the training sees
            if _unrecorded[0] or not _grad_enabled():
                if indices:
                    indices.popleft()
                return batch
            rec._on_batch(loader if loader is not None else type(it), batch, indices.popleft() if indices else None)
            return batch

        self._patches.set(it_cls, "__next__", __next__)
        orig_init = it_cls.__init__

        def __init__(it: Any, loader: Any) -> None:
            orig_init(it, loader)
            it._torchrepro_loader = loader

        self._patches.set(it_cls, "__init__", __init__)

        def step_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not rec.forked:
                rec._on_step(optimizer)

        self._patches.hook(register_optimizer_step_post_hook(step_hook))
        self.inputs.install()
        if self._draws is not None:
            self._draws.install()
        if self.marks is not None:
            self.marks.install(self._patches, it_cls)
        self._active = True
        _installed.append(self)
        return self

    def uninstall(self) -> None:
        if not self._active:
            return
        self._patches.undo()
        self.inputs.uninstall()
        if self._draws is not None:
            self._draws.uninstall()
        self._active = False
        self._compile_watch.uninstall()
        if self in _installed:
            _installed.remove(self)

    def _compiled(self) -> list[dict[str, Any]]:
        """The torch.compile'd regions (see :mod:`torchrepro.record.compiled`); with graph capture on, measure them."""
        watch = self._compile_watch
        try:
            models = self._models if self._models is not None else (self._discovered or discover_models())
            if watch.capture is not None:
                measure_graphs(watch, self.trace.dir, models)
            return watch.regions(models)
        except Exception as exc:  # never let this break the end of a recording
            self._warn_once("compiled", f"could not describe the compiled regions ({type(exc).__name__}: {exc}).")
            return []

    def log_metric(self, name: str, value: float) -> None:
        """Write a metric the script reports (``torchrepro.log_metric``) into the trace, with the step count."""
        if self.forked:
            return
        self.trace.write({"kind": "metric", "name": name, "value": float(value).hex(),
                          "step": self.steps or self.backward_calls, "t": self._now()})

    def _final_params(self) -> dict[str, torch.Tensor]:
        if not self.steps:
            return self._all_model_params()
        params: dict[str, torch.Tensor] = {}
        for opt, idx in list(self._optimizers.items()):
            params.update(self._named_params([p for g in opt.param_groups for p in g["params"]], f"opt{idx}"))
        return params

    def finish(self) -> dict[str, Any]:
        """Uninstall, record the final parameters, flush everything; return a summary for the manifest.

        In a forked child nothing is written (the run directory is the parent's): only the hooks are removed."""
        if self.forked:
            self.uninstall()
            return {"forked_child": True}
        if self._tracer is not None:
            self._tracer.stop()
        self.uninstall()
        compiled = self._compiled()
        unreplicated: list[str] = []
        if self.steps or self.backward_calls:
            params = self._final_params()
            unreplicated = unreplicated_names(params)  # shards: each rank holds its own (rankcompare skips them)
            self.trace.write({"kind": "final", "t": self._now(), "params": self._fps(params),
                              **self._layouts.fields(params=params)})
            if self.values is not None:
                self.values.submit("final", params, force=True)
        if self.values is not None:
            self.values.close()
        self.trace.close()
        if self._full is not None:
            self._full.finish({"device": self.device, "backward_calls": self.backward_calls,
                               "stopped_at_max_steps": self.stopped})
        return {
            "unreplicated": unreplicated,
            "step_mode": "optimizer" if self.steps else "backward",
            "fingerprint_algorithm": algorithms_since(self._fp_mark),
            "steps": self.steps if self.steps else self.backward_calls,
            "optimizer_steps": self.steps,
            "backward_calls": self.backward_calls,
            "trace_records": self.trace.records,
            "device": self.device,
            "first_step_s": self.first_step_time,
            "record_s": self._now(),
            "values_saved": list(self.values.saved) if self.values else [],
            "values_skipped": self.values.skipped if self.values else 0,
            "values_skipped_busy": self.values.skipped_busy if self.values else 0,
            "values_error": self.values.error if self.values else None,
            "values_failed": self.values.failed if self.values else [],
            "stopped_at_max_steps": self.stopped and self.stopped_diverged is None,
            "stopped": self._watch.facts(self.stopped_diverged) if self._watch is not None else None,
            "traced_steps": list(self.trace_steps) if self.trace_steps else None,
            "traced_ops": self._tracer.count if self._tracer else 0,
            "compiled": compiled,
        }


_installed: list[Recorder] = []  # recorders installed in this process, the latest last
_recorders: weakref.WeakSet[Recorder] = weakref.WeakSet()  # every recorder of this process (for the fork hook)


def _in_child() -> None:
    """A forked child (``os.fork()`` in the script, a DataLoader worker) records nothing: its events, metrics,
    value snapshots and final parameters would be mixed into the parent's run directory."""
    for rec in list(_recorders):
        rec.forked = True
        rec.trace.detach()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)


def current_recorder() -> Recorder | None:
    """The recorder installed last in this process and still installed, or None."""
    return _installed[-1] if _installed else None


class watch:  # noqa: N801 - reads as a function at call sites
    """Record training from code: ``with torchrepro.watch(model, optimizer, run_dir="runs/a"): train()``.

    ``model`` may be one module or a ``{prefix: module}`` dict (several models). ``optimizer`` is accepted for
    symmetry with the CLI and for documentation; every optimizer's steps are recorded. On exit a
    ``manifest.json`` is written, so ``torchrepro diff`` can compare two such directories.

    With ``max_steps=N`` the ``with`` block ends after step N: the step hook raises
    :class:`MaxStepsReached`, which unwinds the training code inside the block (running its ``finally``
    clauses) and is absorbed here, so the code after the ``with`` block runs.

    With ``check_ranks_every=N`` (distributed programs) the replicas are compared across ranks after every N-th
    optimizer step (:func:`torchrepro.distributed.ranks.check_consistency`); the reports go into the trace.
    """

    def __init__(
        self,
        model: nn.Module | Mapping[str, nn.Module],
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
        *,
        run_dir: str | Path,
        keep_values: bool = True,
        max_steps: int | None = None,
        check_ranks_every: int | None = None,
    ) -> None:
        models = {"": model} if isinstance(model, nn.Module) else dict(model)
        self.run_dir = Path(run_dir)
        self.recorder = Recorder(run_dir, models=models, values=ValueSettings(keep=keep_values),
                                 stop=StopSettings(max_steps=max_steps), check_ranks_every=check_ranks_every)
        self.summary: dict[str, Any] | None = None

    def __enter__(self) -> Recorder:
        self._start = time.time()
        return self.recorder.install()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self.summary = self.recorder.finish()
        if self.recorder.forked:  # a forked child leaving the block: the parent writes the manifest
            return False
        ours = isinstance(exc, MaxStepsReached) and self.recorder.stopped
        ok = exc_type is None or ours
        status = ("stopped-at-max-steps" if self.recorder.stopped else "ok") if ok else "failed"
        write_manifest(self.run_dir, {
            "command": ["<watch>"], "exit_code": 0 if ok else 1, "status": status,
            "seed": None, "deterministic": torch.are_deterministic_algorithms_enabled(),
            "max_steps": self.recorder.max_steps, "torch": torch.__version__,
            "started": self._start, "duration_s": round(time.time() - self._start, 3),
            "environment": environment_summary(), **self.summary,
        })
        return ours  # absorb our own stop: the code after the with block runs
