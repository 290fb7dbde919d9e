"""The step recorder: fingerprints what a training script does, step by step, with no code change.

It hooks three global places: ``torch.autograd.backward`` (the loss), the optimizer step post-hook (every
``optimizer.step()``), and the DataLoader iterator (each batch). Per optimizer step it records the losses that
``backward()`` was called on since the previous step, the batches yielded since then, and fingerprints of each
named parameter, its gradient and its optimizer state. Scripts that update parameters by hand (no
``torch.optim``) get one step per ``backward()`` call instead.

Scripts that draw their batches without a DataLoader (nanoGPT's ``get_batch``, any hand-written loop) have their
data fingerprinted where the model receives it: the tensors passed to the outermost ``forward`` of the root
modules (see :meth:`Recorder._on_root_call`), recorded in place of the batches of a step that saw no DataLoader
batch (``"batches_source": "model-inputs"``).

Recording never breaks the script: a tensor that cannot be fingerprinted, a batch that cannot be read and a
value file that cannot be written are recorded as such (``"unreadable: <reason>"``, ``values_error``), with a
:class:`~torchrepro._core.errors.ReproWarning`, and ``compare`` reports them.

From code::

    with torchrepro.watch(model, optimizer, run_dir="runs/a"):
        train()
"""

from __future__ import annotations

import array
import collections
import contextlib
import functools
import hashlib
import itertools
import os
import queue
import random
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

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
from .._core.io import atomic_write
from .._core.modules import discover_models, optimizers_exist
from .._core.patches import Patches
from ..distributed.ranks import unreplicated_names
from ..env.info import environment_summary
from .compiled import CompileWatch, measure_graphs
from .divergence import DivergenceWatch
from .optrace import OpTracer
from .store import GRAD_VALUE_STEPS, GRAD_VALUES_ENV, MODEL_INPUTS, OPS, VALUES, TraceWriter, write_manifest  # noqa: F401

DEFAULT_VALUES_BUDGET = 1 << 30  # bytes of parameter values kept per run


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


def sampled_step(n: int) -> bool:
    """Whether step ``n`` gets a value snapshot under ``value_schedule="sampled"`` (what ``check`` uses).

    Every step up to 16, then 8 steps per doubling (17, 18, 20, ..., 32, 36, ..., 64, 72, ...): the same steps in
    every run, so compared runs have the same snapshots; a long run costs O(log steps) snapshots.

    >>> [n for n in range(1, 65) if sampled_step(n)][14:]
    [15, 16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60, 64]
    """
    return n <= 16 or n % (1 << (n.bit_length() - 4)) == 0


_SCHEDULES = {"every": lambda n: True, "sampled": sampled_step}


def _env_int(name: str) -> int:
    try:
        return max(0, int(os.environ.get(name, "0") or 0))
    except ValueError:
        return 0


def _warn(message: str) -> None:
    warnings.warn(f"torchrepro: {message}", ReproWarning, stacklevel=4)


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part)
    return h.hexdigest()


def rng_fingerprints() -> dict[str, str | None]:
    """Fingerprints of the global random-number states: torch's CPU generator, the CUDA generators (``None``
    unless CUDA is initialised), Python's ``random`` and NumPy's legacy global ``RandomState`` (``None`` unless
    NumPy is imported). About 20 µs; what ``check --resume-at`` records at step boundaries."""
    out: dict[str, str | None] = {"torch": fingerprint(torch.get_rng_state()), "cuda": None, "random": None,
                                  "numpy": None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = _digest(*(bytes(s.numpy()) for s in torch.cuda.get_rng_state_all()))
    version, internal, gauss = random.getstate()
    out["random"] = _digest(array.array("q", internal).tobytes(), repr((version, gauss)).encode())
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
            out["numpy"] = _digest(str(name).encode(), keys.tobytes(), repr((pos, has_gauss, cached)).encode())
        except Exception as exc:  # never break the step for it
            out["numpy"] = unreadable_text(exc)
    return out


class _ValueWriter:
    """Writes parameter value snapshots in a background thread; the copy itself is taken synchronously.

    Memory: at most one extra host copy of the parameters exists at any time. A snapshot is written straight
    from that copy into its file (no serialised buffer in between); while the writer is still busy with an
    earlier snapshot, a new one is skipped (counted in ``skipped_busy``) unless the two together stay under
    ``SMALL`` bytes -- small models never skip, a 7B model never holds two copies. The final snapshot waits.

    A write that fails (a full disk, a permission error) never blocks or stops training: the first failure is
    kept in ``error`` and warned about, that snapshot and every later one are dropped (listed in ``failed``),
    and ``saved`` lists only the files that were written.
    """

    SMALL = 64 << 20  # bytes in flight that never cause a skip

    def __init__(self, directory: Path, budget: int) -> None:
        self.dir = directory
        self.budget = budget
        self.used = 0
        self.saved: list[str] = []
        self._failed: list[tuple[int, str]] = []  # (submission number, name): both threads append
        self._submitted = 0
        self.skipped = 0  # over the budget
        self.skipped_busy = 0  # the writer was still busy with a large earlier snapshot
        self.error: str | None = None
        self._warned = False
        self._inflight = 0  # bytes copied but not yet written
        self._idle = threading.Condition()
        self._q: queue.SimpleQueue[tuple[int, str, dict[str, torch.Tensor], int] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="torchrepro-values", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> list[str]:
        """Snapshots not written (after a failure), in the order they were submitted."""
        return [name for _, name in sorted(self._failed)]

    def _fail(self, n: int, name: str, exc: BaseException) -> None:
        self._failed.append((n, name))
        if self.error is None:
            self.error = f"{self.dir / name}.pt: {type(exc).__name__}: {exc}"

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            n, name, values, size = item
            try:
                if self.error is not None:  # after a failure nothing more is written: the values have a gap
                    self._failed.append((n, name))
                    continue
                try:  # durable=False: a rename is atomic; fsync per step would cost more than the write
                    atomic_write(self.dir / f"{name}.pt", lambda f, v=values: torch.save(v, f),  # type: ignore[misc]
                                 durable=False)
                except Exception as exc:
                    self._fail(n, name, exc)
                else:
                    self.saved.append(name)
            finally:
                del values, item
                with self._idle:
                    self._inflight -= size
                    self._idle.notify_all()

    def _wait_idle(self) -> bool:
        """Wait until every queued snapshot is written; False if the writer thread has ended."""
        with self._idle:
            while self._inflight and self._thread.is_alive():
                self._idle.wait(0.1)
        return self._thread.is_alive()

    def _warn_once(self) -> None:
        if self.error is not None and not self._warned:
            self._warned = True
            _warn(f"could not save parameter values ({self.error}); training goes on, but values from "
                  f"{self.failed[0]!r} on are not recorded, so comparisons of this run cannot report "
                  f"max |Δ weight|. Free space or fix permissions in {self.dir}, or record without values.")

    def submit(self, name: str, params: Mapping[str, torch.Tensor], *, force: bool = False) -> None:
        self._warn_once()
        n = self._submitted = self._submitted + 1
        if self.error is not None:
            self._failed.append((n, name))
            return
        size = sum(p.numel() * p.element_size() for p in params.values())
        # The budget covers every snapshot, the initial one included; each leaves room for the final snapshot
        # (``force=True``, the same parameters), so the last values are kept whenever one snapshot fits.
        reserve = 0 if force else size
        if self.used + size + reserve > self.budget:
            self.skipped += 1
            return
        if force:
            if not self._wait_idle():
                self._fail(n, name, RuntimeError("the value writer thread has stopped"))
                return
        elif self._inflight and self._inflight + size > self.SMALL:
            self.skipped_busy += 1
            return
        self.used += size
        try:
            values = {k: v.detach().to("cpu", copy=True) for k, v in params.items()}
        except Exception as exc:
            self._fail(n, name, exc)
            return
        if not self._thread.is_alive():
            self._fail(n, name, RuntimeError("the value writer thread has stopped"))
            return
        with self._idle:
            self._inflight += size
        self._q.put((n, name, values, size))

    def close(self) -> None:
        """Write what is queued and stop the thread; returns once it has ended."""
        self._q.put(None)
        self._thread.join()
        self._warn_once()


class Recorder:
    """Records a training run into a run directory. Use :func:`watch`, or ``torchrepro run`` for scripts.

    Args:
        run_dir: where ``trace.jsonl`` and ``values/`` go.
        models: ``{prefix: module}`` giving parameter names; None discovers the root modules at the first step.
        keep_values: also save parameter values per step (needed for max |Δ weight| and ULP distances).
        value_schedule: ``"every"`` step, or ``"sampled"`` (:func:`sampled_step`: steps 1-16, then 8 per doubling;
            what ``check`` uses, so that value snapshots stay a small share of a long run's time).
        max_steps: raise :class:`MaxStepsReached` (a clean ``SystemExit(0)``) after this many steps: optimizer
            steps, or, when no ``torch.optim`` optimizer exists, ``backward()`` calls (raised as the next
            ``backward()`` starts, so the hand update of the last step is done and recorded in ``final``).
        timing: record only step boundaries (``t`` of each event, taken after synchronising CUDA), no
            fingerprints: what ``torchrepro bench`` times.
        check_ranks_every: in a distributed program, run :func:`torchrepro.distributed.ranks.check_consistency`
            after every N-th optimizer step on every rank, write its report into the trace (``"kind": "ranks"``)
            and warn when replicas differ.
        resume_marks: what ``check --resume-at`` needs to say what a resume did not restore: the RNG states
            after every step (``rng``), the sample indices of each batch (``batch_indices``, from the sampler of
            a map-style DataLoader) and the optimizer state before each optimizer's first step
            (``state_before``).
        boundary_after: write a ``boundary`` event (the RNG states) as the first ``backward()`` after step N
            starts (0: the first one of the process).
        stop_after: end the script (:class:`MaxStepsReached`) as the first ``backward()`` after step N starts:
            what the script does between step N and the next step (saving a checkpoint) is done.
        divergence: compare each step with other runs as they record, and end the script ``after`` steps after
            the first divergence from run 1 (``{"runs": [dir, ...], "me": i, "after": K}``, see
            :class:`~torchrepro.record.divergence.DivergenceWatch`): what ``check`` gives its runs.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        models: Mapping[str, nn.Module] | None = None,
        keep_values: bool = False,
        max_steps: int | None = None,
        values_budget: int = DEFAULT_VALUES_BUDGET,
        trace_steps: tuple[int, int] | None = None,
        trace_mode: str = "optimizer",
        timing: bool = False,
        check_ranks_every: int | None = None,
        grad_value_steps: int | None = None,
        value_schedule: str = "every",
        grad_value_start: int = 1,
        resume_marks: bool = False,
        boundary_after: int | None = None,
        stop_after: int | None = None,
        divergence: dict[str, Any] | None = None,
    ) -> None:
        self.trace = TraceWriter(run_dir)
        self.forked = False  # this is a forked child of the recorded process: it records nothing (see _in_child)
        _recorders.add(self)
        # with keep_values: gradient and optimizer-state snapshots of the first N steps (None: $GRAD_VALUES_ENV or 0)
        self.grad_value_steps = _env_int(GRAD_VALUES_ENV) if grad_value_steps is None else grad_value_steps
        self.grad_value_start = grad_value_start  # the snapshots cover steps start .. start + grad_value_steps - 1
        self.resume_marks = resume_marks
        self.boundary_after = boundary_after
        self.stop_after = stop_after
        self.divergence = divergence
        self._watch: DivergenceWatch | None = None
        self.stopped_diverged: int | None = None  # the step after which the divergence watch stopped the run
        self._state_before: dict[Any, dict[str, str | None]] = {}  # optimizer -> its state before its first step
        self._stepped: set[int] = set()  # indices of the optimizers that have stepped (resume_marks)
        self.timing = timing
        self.check_ranks_every = check_ranks_every
        # Op tracing for steps lo..hi (0 = model construction up to the first backward), see optrace.
        self.trace_steps = trace_steps
        self.trace_mode = trace_mode
        self._tracer = OpTracer(models=models, path=self.trace.dir / OPS, keep=False) if trace_steps else None
        self._models = dict(models) if models is not None else None
        self._discovered: dict[str, nn.Module] | None = None
        self.max_steps = max_steps
        self.stopped = False  # MaxStepsReached was raised
        self._optimizers_exist: bool | None = None
        self._warned: set[str] = set()
        self.values = _ValueWriter(self.trace.dir / VALUES, values_budget) if keep_values else None
        if value_schedule not in _SCHEDULES:
            raise ValueError(f"value_schedule must be one of {sorted(_SCHEDULES)}, got {value_schedule!r}")
        self._snapshot_due = _SCHEDULES[value_schedule]
        self._compile_watch = CompileWatch.from_env()  # torch.compile calls (and graph capture for --locate)
        self.steps = 0
        self.backward_calls = 0
        self._names: dict[int, str] = {}
        self._pending_losses: list[torch.Tensor | None] = []
        self._pending_batches: list[str] = []
        self._pending_indices: list[str | None] = []
        self._indices_since_backward: list[str | None] = []
        self._batches_since_backward: list[str] = []
        # The data of steps without a DataLoader batch: the inputs of the root modules' outermost forwards
        # (fingerprints, and the class each went to), since the last backward() and since the last step.
        self._inputs_since_backward: list[tuple[str, str]] = []
        self._pending_inputs: list[tuple[str, str]] = []
        self._fwd_depth = 0  # root forwards running (the outermost one's inputs are the data)
        self._outputs: dict[int, StorageWeakRef] = {}  # storages of root outputs since the last backward()
        self._finder: Any = None  # the global forward pre-hook that waits for the first training forward
        self._roots: list[weakref.ref[nn.Module]] = []  # the modules whose forward inputs are recorded
        self._root_handles: list[Any] = []
        self._orig_script: Any = None  # torch.jit.script, while ours (which unhooks the roots) replaces it
        self._filter: Any = None  # the warnings filter installed with it
        self._token = next(_tokens)
        _by_token[self._token] = self
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
        if models is None:  # discover once (a gc scan): scripts without an optimizer call this per step
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
        if self.resume_marks:
            self._pending_indices.append(index)
            self._indices_since_backward.append(index)
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

    # --- the data of loops without a DataLoader: what the model's forward receives ---------------------------
    def _install_finder(self) -> None:
        """Wait for the first training forward (a global forward pre-hook, removed as it fires): its module is the
        outermost one called, and the root modules are hooked from then on (:meth:`_found_roots`)."""
        if self.timing or self._finder is not None:
            return
        hook = functools.partial(_find_roots, self._token)
        self._finder = torch.nn.modules.module.register_module_forward_pre_hook(hook)
        # torch warns at every torch.compile'd module call while a global module hook exists: ours is gone
        # before the compiled code runs (the first call of the compiled model is what removes it)
        warnings.filterwarnings("ignore", message=_COMPILE_GLOBAL_HOOK_WARNING, category=UserWarning)
        self._filter = warnings.filters[0]

    def _remove_finder(self) -> None:
        if self._finder is None:
            return
        self._finder.remove()
        self._finder = None
        with contextlib.suppress(ValueError, AttributeError):
            warnings.filters.remove(self._filter)  # type: ignore[attr-defined]

    def _found_roots(self, first: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The first training forward: hook the root modules (those given, else those alive: a gc scan, once) and
        ``first``, the outermost module called, which may be a wrapper (DDP, ``torch.compile``) around a root;
        then record this call's inputs."""
        self._remove_finder()
        if self._loaders:  # the script feeds a DataLoader's batches: they are its data, the forward is not hooked
            return
        try:
            roots = list(self._models.values()) if self._models is not None else list(discover_models().values())
        except Exception:  # never break the forward for it: hook the module called
            roots = []
        if not any(m is first for m in roots):
            roots.append(first)
        self._roots = [weakref.ref(m) for m in roots]
        self._hook_roots()
        # this call's own hooks were picked before ours existed: its pre-hook does not run, its post-hook does
        self._on_root_call(first, args, kwargs)

    def _hook_roots(self) -> None:
        for ref in self._roots:
            module = ref()
            if module is None:
                continue
            self._root_handles.append(module.register_forward_pre_hook(functools.partial(_root_pre_hook, self._token),
                                                                       with_kwargs=True, prepend=True))
            self._root_handles.append(module.register_forward_hook(functools.partial(_root_post_hook, self._token),
                                                                   always_call=True))
        if self._orig_script is None and self._root_handles:
            self._orig_script = orig = torch.jit.script
            token = self._token

            @functools.wraps(orig)
            def script(obj: Any, *args: Any, **kwargs: Any) -> Any:
                return _script_unhooked(token, orig, obj, *args, **kwargs)

            script._torchrepro_token = token  # type: ignore[attr-defined]
            torch.jit.script = script

    def _unhook_roots(self) -> None:
        for h in self._root_handles:
            h.remove()
        self._root_handles.clear()

    @contextlib.contextmanager
    def _roots_unhooked(self) -> Iterator[None]:
        """``torch.jit.script`` compiles a module's hooks (Python hooks cannot be): ours are off meanwhile."""
        hooked = bool(self._root_handles)
        self._unhook_roots()
        try:
            yield
        finally:
            if hooked and self._active:
                self._hook_roots()

    def _on_root_call(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A root module's forward starts. The outermost one (not inside another root's forward) of a training
        forward (autograd on, the module in training mode) in a step that has seen no DataLoader batch has its
        tensor arguments fingerprinted: the data of the step. Eval and ``torch.no_grad`` forwards are not data;
        tensors computed in the autograd graph, or views of an earlier root forward's output (``fake.detach()``,
        a frozen model's features), are the model's own results, not data, and are left out."""
        depth, self._fwd_depth = self._fwd_depth, self._fwd_depth + 1
        if (depth or self.forked or not _grad_enabled() or not module.training or _unrecorded[0]
                or self._batches_since_backward or torch._C._get_tracing_state() is not None):
            return
        found: list[tuple[str, torch.Tensor]] = []
        _tensors_in(args, "args", found, 0)
        _tensors_in(kwargs, "kwargs", found, 0)
        data: dict[str, torch.Tensor] = {}
        for path, t in found:
            if (t.requires_grad and t.grad_fn is not None) or self._is_output(t):
                continue
            if _is_transform_wrapper(t) or _is_fake(t):
                return  # inside a torch.func transform or a tracer: not the data itself
            data[path] = t
        if not data or len(self._inputs_since_backward) + len(self._pending_inputs) >= _MAX_INPUTS_PER_STEP:
            return
        label = _module_label(module)
        fps = self._fps(data)
        bad = next(((k, v) for k, v in fps.items() if v is None or v.startswith(UNREADABLE)), None)
        if bad is not None:
            fp = f"{UNREADABLE}{label}.forward {bad[0]}: {(bad[1] or '?')[len(UNREADABLE):]}"
        else:
            h = hashlib.blake2b(f"model-inputs|{label}".encode(), digest_size=16)
            for k, v in fps.items():
                h.update(f"|{k}={v}".encode())
            fp = h.hexdigest()
        self._inputs_since_backward.append((fp, label))

    def _on_root_return(self, output: Any) -> None:
        """A root module's forward ends: the outermost one's output storages are noted (see _on_root_call)."""
        self._fwd_depth = max(0, self._fwd_depth - 1)
        if self._fwd_depth or self.forked:
            return
        found: list[tuple[str, torch.Tensor]] = []
        _tensors_in(output, "", found, 0)
        if len(self._outputs) > _MAX_INPUTS_PER_STEP:  # forwards without backward(): keep those still alive
            self._outputs = {k: ref for k, ref in self._outputs.items() if not ref.expired()}
        for _, t in found:
            with contextlib.suppress(Exception):  # a tensor without storage: nothing to recognise later
                ref = StorageWeakRef(t.untyped_storage())
                self._outputs[ref.cdata] = ref

    def _is_output(self, t: torch.Tensor) -> bool:
        if not self._outputs:
            return False
        try:
            ref = self._outputs.get(t.untyped_storage()._cdata)
        except Exception:
            return False
        return ref is not None and not ref.expired()

    def _inputs_to_pending(self) -> list[tuple[str, str]]:
        """Move the model inputs since the last backward() to the step's; return them."""
        inputs, self._inputs_since_backward = self._inputs_since_backward, []
        self._pending_inputs += inputs
        self._outputs.clear()
        return inputs

    @staticmethod
    def _data_fields(batches: list[str], inputs: list[tuple[str, str]]) -> dict[str, Any]:
        """An event's ``batches``: the DataLoader batches, else the model inputs with where they came from."""
        if batches or not inputs:
            return {"batches": batches}
        return {"batches": [fp for fp, _ in inputs], "batches_source": MODEL_INPUTS,
                "input_modules": [label for _, label in inputs]}

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
        self._fwd_depth = 0  # no root forward runs as backward() starts (recomputed checkpoints count afresh)
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
            self.trace.write({"kind": "init", "t": self._now(), "params": self._fps(params)})
            if self.values is not None:
                self.values.submit("init", params)

    def _on_backward_end(self, loss: torch.Tensor | None) -> None:
        self.backward_calls += 1
        self._pending_losses.append(loss.detach() if loss is not None else None)
        self._remove_finder()  # no training forward before the first backward(): none of the script's is hooked
        inputs = self._inputs_to_pending()
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
            self._pending_inputs = []  # each backward() is a step: its event holds them
        params = {} if self._optimizers_exist else self._all_model_params()
        fps = self._fps({"loss": loss, **{f"p:{k}": v for k, v in params.items()},
                         **{f"g:{k}": v.grad for k, v in params.items()}})
        event: dict[str, Any] = {
            "kind": "backward", "n": self.backward_calls, "t": self._now(),
            "loss": {"fp": fps["loss"], "value": _float_hex(loss) if loss is not None else None},
            **self._data_fields(self._batches_since_backward, inputs),
            "params": {k[2:]: v for k, v in fps.items() if k.startswith("p:")},
            "grads": {k[2:]: v for k, v in fps.items() if k.startswith("g:")},
        }
        if self.resume_marks:
            event["batch_indices"] = self._indices_since_backward
            if not self._optimizers_exist:
                event["rng"] = rng_fingerprints()
        self._batches_since_backward, self._indices_since_backward = [], []
        if self.values is not None and params and self._snapshot_due(self.backward_calls):
            self.values.submit(f"backward_{self.backward_calls:06d}", params)
            self._submit_grads(self.backward_calls, params, {})
        self.trace.write(event)
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
        self._stepped.add(opt_idx)
        self._remove_finder()
        self._inputs_to_pending()  # forwards without backward() (torch.autograd.grad) belong to this step
        params = self._named_params([p for g in optimizer.param_groups for p in g["params"]], f"opt{opt_idx}")
        state, scalars = _optimizer_state(optimizer, params)
        losses, loss_tensors = self._losses()
        fps = self._fps({**loss_tensors, **{f"p:{k}": v for k, v in params.items()},
                         **{f"g:{k}": v.grad for k, v in params.items()},
                         **{f"s:{k}": v for k, v in state.items()}})
        for i, entry in enumerate(losses):
            entry["fp"] = fps[f"l:{i}"]
        event = {
            "kind": "step", "n": self.steps, "opt": opt_idx, "t": self._now(),
            "losses": losses, **self._data_fields(self._pending_batches, self._pending_inputs),
            "grads": {k[2:]: v for k, v in fps.items() if k.startswith("g:")},
            "params": {k[2:]: v for k, v in fps.items() if k.startswith("p:")},
            "state": {**{k[2:]: v for k, v in fps.items() if k.startswith("s:")}, **scalars},
            "lr": [g.get("lr") if isinstance(g.get("lr"), (int, float)) else None for g in optimizer.param_groups],
        }
        if self.resume_marks:
            event["batch_indices"] = self._pending_indices
            event["rng"] = rng_fingerprints()
            before = self._state_before.pop(optimizer, None)
            if before is not None:
                event["state_before"] = before
        self._pending_losses, self._pending_batches, self._batches_since_backward = [], [], []
        self._pending_inputs = []
        self._pending_indices, self._indices_since_backward = [], []
        self.trace.write(event)
        if self.values is not None:
            if self._snapshot_due(self.steps):
                self.values.submit(f"step_{self.steps:06d}", params)
            self._submit_grads(self.steps, params, state)
        if self.trace_mode == "optimizer":
            self._trace_boundary(self.steps + 1)
        if self.check_ranks_every and self.steps % self.check_ranks_every == 0:
            self._check_ranks()
        if self.max_steps is not None and self.steps >= self.max_steps:
            self._stop()
        if self._divergence_stop_due(self.steps, "optimizer"):
            self._stop()

    def _on_step_start(self, optimizer: torch.optim.Optimizer) -> None:
        """``resume_marks``: the optimizer state before each optimizer's first step (what a resume restored)."""
        opt_idx = self._optimizers.get(optimizer)
        if (opt_idx is not None and opt_idx in self._stepped) or optimizer in self._state_before:
            return
        params = self._named_params([p for g in optimizer.param_groups for p in g["params"]],
                                    f"opt{opt_idx if opt_idx is not None else len(self._optimizers)}")
        state, scalars = _optimizer_state(optimizer, params)
        self._state_before[optimizer] = {**self._fps(state), **scalars}

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
        self._install_finder()
        if self.resume_marks:
            self._install_resume_marks(it_cls)
        self._active = True
        _installed.append(self)
        return self

    def _install_resume_marks(self, it_cls: Any) -> None:
        """The sample indices of each batch (map-style datasets: what the sampler gave the iterator, in order,
        also when worker processes load them) and the optimizer state before each optimizer's first step."""
        rec = self
        orig_next_index = it_cls._next_index

        def _next_index(it: Any) -> Any:
            index = orig_next_index(it)
            if not rec.forked and it._dataset_kind == torch.utils.data.dataloader._DatasetKind.Map:
                try:
                    fp = fingerprint_object(index)
                except Exception as exc:
                    fp = unreadable_text(exc)
                it.__dict__.setdefault("_torchrepro_indices", collections.deque()).append(fp)
            return index

        self._patches.set(it_cls, "_next_index", _next_index)

        def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not rec.forked:
                rec._on_step_start(optimizer)

        self._patches.hook(register_optimizer_step_pre_hook(pre_hook))

    def uninstall(self) -> None:
        if not self._active:
            return
        self._patches.undo()
        self._remove_finder()
        self._unhook_roots()
        if self._orig_script is not None:
            if getattr(torch.jit.script, "_torchrepro_token", None) == self._token:  # not replaced since
                torch.jit.script = self._orig_script
            self._orig_script = None
        self._fwd_depth = 0
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
            self.trace.write({"kind": "final", "t": self._now(), "params": self._fps(params)})
            if self.values is not None:
                self.values.submit("final", params, force=True)
        if self.values is not None:
            self.values.close()
        self.trace.close()
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


_unrecorded = [0]  # > 0 inside unrecorded_batches()
_grad_enabled = torch.is_grad_enabled


@contextlib.contextmanager
def unrecorded_batches() -> Iterator[None]:
    """Batches taken from a DataLoader inside this block are not recorded as batches of the training.

    For code that loads batches only to drop them, such as a trainer integration replaying the batches an
    interrupted epoch had consumed, so that a recorded resume compares the batches training really used:

    >>> with unrecorded_batches():
    ...     pass
    """
    _unrecorded[0] += 1
    try:
        yield
    finally:
        _unrecorded[0] -= 1


# --- the hooks on the root modules (module-level functions with a token: a hooked model stays picklable) -----
_COMPILE_GLOBAL_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"
_WRAPPER_CHILDREN = ("_orig_mod", "module", "_fsdp_wrapped_module")  # torch.compile, DDP/DP, FSDP
_MAX_INPUT_TENSORS = 256
_MAX_INPUT_DEPTH = 4
_tokens = itertools.count(1)
_by_token: weakref.WeakValueDictionary[int, Recorder] = weakref.WeakValueDictionary()
_MAX_INPUTS_PER_STEP = 1024  # forwards recorded per step at most (a forward-only loop does not grow without end)
_is_compiling: Any = (getattr(torch.compiler, "is_compiling", None) or getattr(torch._utils, "is_compiling", None)
                      or (lambda: False))
_is_exporting: Any = getattr(torch.compiler, "is_exporting", None) or (lambda: False)
_is_transform_wrapper: Any = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor",
                                     lambda t: False)


def _is_fake(t: torch.Tensor) -> bool:
    """A tensor without values of its own (a meta or fake tensor of a tracer): nothing to fingerprint."""
    return t.is_meta or type(t).__name__ in ("FakeTensor", "FunctionalTensor")


def _find_roots(token: int, module: nn.Module, args: tuple[Any, ...]) -> None:
    """The global forward pre-hook of :meth:`Recorder._install_finder`: at the first training forward, hook the
    root modules. It runs before the forward of every module until then, outermost first."""
    if _is_compiling() or _is_exporting():
        return
    rec = _by_token.get(token)
    if (rec is None or rec._finder is None or rec.forked or not _grad_enabled() or not module.training
            or _unrecorded[0] or next(module.parameters(), None) is None):
        return
    try:
        rec._found_roots(module, args, _call_kwargs(module))
    except Exception as exc:  # never break the script's forward for it
        rec._remove_finder()
        rec._warn_once("inputs", f"could not watch the inputs of {type(module).__name__}.forward "
                       f"({type(exc).__name__}: {exc}); steps without a DataLoader batch record no data.")


def _call_kwargs(module: nn.Module) -> dict[str, Any]:
    """The keyword arguments of the ``module(...)`` call whose global pre-hook runs (global forward pre-hooks
    get only the positional ones): read from ``Module._call_impl``'s frame; {} if it cannot be found."""
    frame = sys._getframe(1)
    for _ in range(4):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            break
        local = frame.f_locals
        if local.get("self") is module and isinstance(local.get("kwargs"), dict):
            return dict(local["kwargs"])
    return {}


def _root_pre_hook(token: int, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if _is_compiling() or _is_exporting():  # traced into compiled code: nothing runs there
        return
    rec = _by_token.get(token)
    if rec is None or not rec._active:
        return
    try:
        rec._on_root_call(module, args, kwargs)
    except Exception as exc:  # never break the script's forward for it
        rec._warn_once("inputs", f"could not fingerprint the inputs of {type(module).__name__}.forward "
                       f"({type(exc).__name__}: {exc}); steps without a DataLoader batch may record no data.")


def _root_post_hook(token: int, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    if _is_compiling() or _is_exporting():
        return
    rec = _by_token.get(token)
    if rec is None or not rec._active:
        return
    with contextlib.suppress(Exception):
        rec._on_root_return(output)


def _script_unhooked(token: int, script: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.jit.script`` while a recorder hooks root modules: their Python hooks cannot be scripted."""
    rec = _by_token.get(token)
    if rec is None:
        return script(obj, *args, **kwargs)
    with rec._roots_unhooked():
        return script(obj, *args, **kwargs)


def _tensors_in(obj: Any, path: str, out: list[tuple[str, torch.Tensor]], depth: int) -> None:
    """The tensors in a forward's arguments (or output), with their paths (``args[0]``, ``kwargs[labels]``), through
    lists, tuples, mappings and dataclasses, at most ``_MAX_INPUT_DEPTH`` deep and ``_MAX_INPUT_TENSORS`` in all."""
    if len(out) >= _MAX_INPUT_TENSORS:
        return
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        return
    if depth >= _MAX_INPUT_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, complex)):
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _tensors_in(value, f"{path}[{i}]", out, depth + 1)
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            name = key if isinstance(key, (str, int)) else type(key).__name__
            _tensors_in(value, f"{path}[{name}]", out, depth + 1)
    elif is_dataclass(obj) and not isinstance(obj, type):
        for f in fields(obj):
            _tensors_in(getattr(obj, f.name, None), f"{path}.{f.name}", out, depth + 1)


def _module_label(module: nn.Module) -> str:
    """The class whose forward gets the data: a wrapper's (DDP, ``torch.compile``, FSDP) inner module's."""
    for _ in range(4):
        children = module._modules
        inner = children.get(next((n for n in _WRAPPER_CHILDREN if n in children), ""), None) \
            if len(children) == 1 else None
        if not isinstance(inner, nn.Module):
            break
        module = inner
    return type(module).__name__


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


def _optimizer_state(optimizer: Any, params: Mapping[str, torch.Tensor]
                     ) -> tuple[dict[str, torch.Tensor | None], dict[str, str]]:
    """An optimizer's per-parameter state as ``{"name.key": tensor}`` and ``{"name.key": repr}`` (non-tensors)."""
    state: dict[str, torch.Tensor | None] = {}
    scalars: dict[str, str] = {}
    for name, p in params.items():
        for key, value in optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor):
                state[f"{name}.{key}"] = value
            elif value is None or isinstance(value, (bool, int, float, str)):
                scalars[f"{name}.{key}"] = repr(value)
            else:  # never a repr of an object (it may hold a memory address)
                scalars[f"{name}.{key}"] = _object_fp(value)
    return state, scalars


def _object_fp(value: Any) -> str:
    try:
        return fingerprint_object(value)
    except Exception as exc:
        return unreadable_text(exc)


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
        self.recorder = Recorder(run_dir, models=models, keep_values=keep_values, max_steps=max_steps,
                                 check_ranks_every=check_ranks_every)
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
