"""What the recorder writes for ``check --resume-at`` (``ResumeMarks(enabled=True)``), so that the comparison
can say what a resume did not restore: the RNG states after every step (:func:`rng_fingerprints`), the sample
indices of each batch (from the sampler of a map-style DataLoader) and the optimizer state before each
optimizer's first step (``state_before``). :class:`ResumeMarker` keeps them for one recorder.

Also here, as the step events need it too: :func:`optimizer_state`, an optimizer's per-parameter state.
"""

from __future__ import annotations

import array
import collections
import hashlib
import random
import sys
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .._core.fingerprint import fingerprint, fingerprint_object, unreadable_text
from .._core.patches import Patches


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


def optimizer_state(optimizer: Any, params: Mapping[str, torch.Tensor]
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


class _Recorder(Protocol):
    """What :class:`ResumeMarker` reads of the recorder it serves."""

    @property
    def forked(self) -> bool: ...  # a forked child: records nothing

    @property
    def _optimizers(self) -> Mapping[Any, int]: ...  # optimizer -> its index, once it has stepped

    def _named_params(self, params: Iterable[torch.Tensor], owner: str) -> dict[str, torch.Tensor]: ...

    def _fps(self, named: Mapping[str, torch.Tensor | None]) -> dict[str, str | None]: ...


class ResumeMarker:
    """The resume marks of one recorder: what goes into its ``backward`` and ``step`` events besides the rest."""

    def __init__(self, recorder: _Recorder) -> None:
        self._recorder = weakref.ref(recorder)  # weak: the recorder holds this object (no cycle waiting for gc)
        self.pending_indices: list[str | None] = []  # the sample indices of the batches since the last step
        self.indices_since_backward: list[str | None] = []
        self.state_before: dict[Any, dict[str, str | None]] = {}  # optimizer -> its state before its first step
        self.stepped: set[int] = set()  # indices of the optimizers that have stepped

    @property
    def _rec(self) -> _Recorder:
        rec = self._recorder()
        if rec is None:  # not while this object lives: the recorder holds it
            raise ReferenceError("the recorder of these resume marks is gone")
        return rec

    def install(self, patches: Patches, it_cls: Any) -> None:
        """The sample indices of each batch (map-style datasets: what the sampler gave the iterator, in order,
        also when worker processes load them; the recorder's ``__next__`` takes them) and the optimizer state
        before each optimizer's first step."""
        rec = self._rec
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

        patches.set(it_cls, "_next_index", _next_index)

        def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not rec.forked:
                self.on_step_start(optimizer)

        patches.hook(register_optimizer_step_pre_hook(pre_hook))

    def on_batch(self, index: str | None) -> None:
        self.pending_indices.append(index)
        self.indices_since_backward.append(index)

    def backward_marks(self, *, rng: bool) -> dict[str, Any]:
        """A ``backward`` event's marks: the batches' indices since the last one, and (``rng``: the backward is a
        step, no optimizer exists) the RNG states."""
        marks: dict[str, Any] = {"batch_indices": self.indices_since_backward}
        if rng:
            marks["rng"] = rng_fingerprints()
        self.indices_since_backward = []
        return marks

    def step_marks(self, optimizer: Any, opt_idx: int) -> dict[str, Any]:
        """A ``step`` event's marks: the batches' indices since the last step, the RNG states, and the optimizer
        state before its first step."""
        self.stepped.add(opt_idx)
        marks: dict[str, Any] = {"batch_indices": self.pending_indices, "rng": rng_fingerprints()}
        before = self.state_before.pop(optimizer, None)
        if before is not None:
            marks["state_before"] = before
        self.pending_indices, self.indices_since_backward = [], []
        return marks

    def on_step_start(self, optimizer: Any) -> None:
        """The optimizer state before each optimizer's first step (what a resume restored)."""
        opt_idx = self._rec._optimizers.get(optimizer)
        if (opt_idx is not None and opt_idx in self.stepped) or optimizer in self.state_before:
            return
        params = self._rec._named_params([p for g in optimizer.param_groups for p in g["params"]],
                                         f"opt{opt_idx if opt_idx is not None else len(self._rec._optimizers)}")
        state, scalars = optimizer_state(optimizer, params)
        self.state_before[optimizer] = {**self._rec._fps(state), **scalars}
