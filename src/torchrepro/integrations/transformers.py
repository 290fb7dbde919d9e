"""Bitwise resume for ``transformers.Trainer`` (layer L6): :class:`ReproducibleCallback`.

``Trainer.train(resume_from_checkpoint=...)`` restores the weights, the optimizer, the scheduler and the
main-process RNGs, and skips the batches already trained in the epoch by dropping their indices from the batch
sampler. The DataLoader workers never load those batches, so each worker's RNG stream (augmentation in
``__getitem__`` or in the data collator) starts where the uninterrupted run's started, not where it was; and
the workers' base seed of a resumed epoch after the first is drawn from the RNG as it is after ``Trainer()``,
not as it was when that epoch began. The callback makes the resumed run continue bit for bit:

* each worker seeds ``random``, NumPy and torch from (seed, epoch, stream, rank): batch ``b`` of an epoch is
  always loaded by stream ``b % num_workers``, whichever worker runs it;
* on resume, each worker first loads and discards its stream's share of the batches already trained in the
  epoch (the replay), so its RNGs (and any state the dataset keeps) are where they were;
* the RNGs are put back to their state at the start of the epoch before the epoch's iterator is made (same
  worker base seed, same draws of a sampler without its own generator), and to their state at the checkpoint
  right before the first resumed step (dropout);
* every checkpoint gets ``torchrepro_state_rank{R}.json`` (atomic, checksummed JSON, one per rank), and a
  resume checks it loudly: a missing or corrupt file, another configuration, or weights, optimizer or scheduler
  that Trainer did not restore as saved stop the run before its first step.

Example:
    >>> from torchrepro.integrations.transformers import ReproducibleCallback  # doctest: +SKIP
    >>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[ReproducibleCallback()])  # doctest: +SKIP
    >>> trainer.train(resume_from_checkpoint=True)  # doctest: +SKIP

A checkpoint outside ``args.output_dir`` is named through the callback (Trainer does not tell callbacks which
checkpoint it resumes): ``trainer.train(resume_from_checkpoint=callback.resume_from(path))``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import random
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._core.compat import np
from .._core.errors import CheckpointError, StateFileError
from .._core.fingerprint import UnreadableError, fingerprint_object
from .._core.io import atomic_write_bytes
from .._core.readjson import check_fields, file_kind, read_json
from ..control.rng import RNGState, isolate_rng
from ..control.seeding import derive_seed, validate_seed

try:  # absolute imports: the real transformers package, not this module
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without transformers
    raise ImportError(
        f"torchrepro.integrations.transformers needs the transformers package ({exc}). Install it with: "
        "pip install torchrepro[transformers]"
    ) from exc

__all__ = ["STATE_FORMAT", "ReproducibleCallback", "state_file_name"]

STATE_FORMAT = "torchrepro.transformers-state"
STATE_VERSION = 1
_AGAIN = ("Resume from a checkpoint saved with ReproducibleCallback in callbacks=, or remove the callback to resume "
          "as Trainer alone does (not bit for bit).")


def state_file_name(rank: int) -> str:
    """The name of rank ``rank``'s state file in a checkpoint directory.

    >>> state_file_name(0)
    'torchrepro_state_rank0.json'
    """
    return f"torchrepro_state_rank{rank}.json"


# --- inside the DataLoader workers -------------------------------------------------------------------------
def _seed_worker_globals(seed: int) -> None:
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)
    torch.manual_seed(seed)


def _fetch(dataset: Any, indices: Sequence[int], collate_fn: Callable[[Any], Any] | None) -> Any:
    """Load one batch as a worker does (``__getitems__`` when the dataset has it, then the collate function)."""
    getitems = getattr(dataset, "__getitems__", None)
    samples = getitems(list(indices)) if getitems else [dataset[i] for i in indices]
    return collate_fn(samples) if collate_fn is not None else samples


@dataclass(frozen=True, eq=False)
class _WorkerStreams:
    """The ``worker_init_fn`` the callback installs: seed the worker's stream, then replay its skipped batches.

    ``start`` is the number of batches of the epoch the loader skips (0 outside a resumed epoch), so worker
    ``w`` carries stream ``(start + w) % num_workers``; ``replay[stream]`` are the index lists of that stream's
    skipped batches, in order. Picklable, for the ``spawn`` start method.
    """

    original: Callable[[int], Any] | None
    seed: int
    epoch: int
    rank: int
    start: int
    num_workers: int
    replay: tuple[tuple[tuple[int, ...], ...], ...]
    collate_fn: Callable[[Any], Any] | None
    replayed: Any = None  # a multiprocessing Event, set once a worker has replayed

    def __call__(self, worker_id: int) -> None:
        if self.original is not None:
            self.original(worker_id)
        stream = (self.start + worker_id) % self.num_workers
        _seed_worker_globals(derive_seed(self.seed, "transformers-worker", self.epoch, stream, "rank", self.rank))
        info = torch.utils.data.get_worker_info()
        if info is not None and self.replay:
            for indices in self.replay[stream]:
                _fetch(info.dataset, indices, self.collate_fn)
        if self.replayed is not None:
            self.replayed.set()


# --- the DataLoader Trainer built ----------------------------------------------------------------------------
def _batch_sampler(loader: Any) -> Any:
    """The batch sampler Trainer's ``skip_first_batches`` skips in (the sampler when it yields batches)."""
    sampler = getattr(loader, "sampler", None)
    return sampler if isinstance(sampler, torch.utils.data.BatchSampler) else getattr(loader, "batch_sampler", None)


def _generators(batch_sampler: Any) -> dict[str, torch.Generator]:
    """The torch generators the samplers under ``batch_sampler`` own (restored after the plan is read)."""
    found: dict[str, torch.Generator] = {}
    for i, obj in enumerate((batch_sampler, getattr(batch_sampler, "sampler", None),
                             getattr(batch_sampler, "batch_sampler", None),
                             getattr(getattr(batch_sampler, "batch_sampler", None), "sampler", None))):
        gen = getattr(obj, "generator", None)
        if isinstance(gen, torch.Generator):
            found[f"sampler{i}"] = gen
    return found


def _set_epoch(loader: Any, epoch: int) -> None:
    """What Trainer calls before it iterates an epoch, called early so that the plan sees the same order."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    inner: Any = getattr(getattr(loader, "batch_sampler", None), "batch_sampler", None)
    if hasattr(inner, "set_epoch"):
        inner.set_epoch(epoch)


def skipped_batches(loader: Any, epoch: int, count: int) -> list[tuple[int, ...]]:
    """The index lists of the first ``count`` batches of ``epoch``, read without disturbing any RNG.

    A DataLoader iterator draws its workers' base seed (from the loader's generator, else the global torch
    RNG) before it first asks the sampler for indices; the same draw is made here first, so that a sampler
    drawing its order from the global RNG gives the order the iterator will see. :class:`_Recorder` checks it.

    >>> loader = torch.utils.data.DataLoader(range(6), batch_size=2)
    >>> skipped_batches(loader, 0, 2)
    [(0, 1), (2, 3)]
    """
    _set_epoch(loader, epoch)
    sampler = _batch_sampler(loader)
    generators = _generators(sampler)
    base = getattr(loader, "generator", None)
    if isinstance(base, torch.Generator):
        generators["loader"] = base
    with isolate_rng(generators):
        torch.empty((), dtype=torch.int64).random_(generator=base)  # the iterator's base seed
        return [tuple(int(i) for i in batch) for batch in itertools.islice(iter(sampler), count)]


class _Recorder:
    """Stands in for the batch sampler Trainer skips in during a resumed epoch: notes the first ``count``
    batches it yields (the batches skipped), so that the replay plan can be checked against them.
    """

    def __init__(self, inner: Any, count: int) -> None:
        self.inner, self.count = inner, count
        self.seen: list[Any] = []

    def __iter__(self) -> Any:
        for batch in self.inner:
            if len(self.seen) < self.count:
                self.seen.append(tuple(int(i) for i in batch))
            yield batch

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:  # batch_size, sampler, set_epoch...: the real batch sampler's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _install_recorder(loader: Any, count: int) -> tuple[str, _Recorder] | None:
    """Put a :class:`_Recorder` where ``skip_first_batches`` reads the batch sampler; None where it cannot be
    (a plain DataLoader refuses a new batch sampler; an accelerate DataLoaderShard takes it as an attribute).
    """
    name = "sampler" if isinstance(getattr(loader, "sampler", None), torch.utils.data.BatchSampler) else "batch_sampler"
    recorder = _Recorder(getattr(loader, name), count)
    try:
        setattr(loader, name, recorder)
    except (ValueError, AttributeError):
        return None
    return name, recorder


def _remove_recorder(loader: Any, name: str) -> None:
    if isinstance(vars(loader).get(name), _Recorder):
        delattr(loader, name)


def _replay_plan(batches: list[tuple[int, ...]], start: int,
                 num_workers: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per stream, the skipped batches it loaded in the uninterrupted run (batch ``b``: stream ``b % W``)."""
    return tuple(tuple(batches[b] for b in range(s, start, num_workers)) for s in range(num_workers))


def _targets(loader: Any) -> list[Any]:
    """The loader and, for an accelerate ``DataLoaderShard``, the DataLoader it iterates."""
    inner = getattr(loader, "base_dataloader", None)
    return [loader] if inner is None or inner is loader else [loader, inner]


def _set_worker_init(loader: Any, fn: Callable[[int], Any] | None) -> None:
    for target in _targets(loader):
        target.worker_init_fn = fn


def _original_worker_init(loader: Any) -> Callable[[int], Any] | None:
    fn = getattr(loader, "worker_init_fn", None)
    return fn.original if isinstance(fn, _WorkerStreams) else fn


def _unsupported(args: Any, loader: Any) -> list[str]:
    """Why an exact resume cannot be promised for this Trainer (each with what to change); empty when it can."""
    if loader is None:
        return ["Trainer passed no train_dataloader to the callback"]
    problems = []
    if _batch_sampler(loader) is None or isinstance(getattr(loader, "dataset", None),
                                                    torch.utils.data.IterableDataset):
        problems.append("the training dataset is an IterableDataset; only map-style datasets (with __len__ and "
                        "__getitem__) resume exactly")
    if getattr(loader, "num_workers", 0) > 0 and getattr(loader, "persistent_workers", False):
        problems.append("dataloader_persistent_workers=True keeps each worker's RNG across epochs; set it False")
    if getattr(loader, "in_order", True) is False:
        problems.append("dataloader_in_order=False hands batches to whichever worker is free; set it True")
    if getattr(args, "save_only_model", False):
        problems.append("save_only_model=True saves no optimizer, scheduler or RNG state; set it False")
    if getattr(getattr(args, "accelerator_config", None), "dispatch_batches", None) is True:
        problems.append("accelerator_config dispatch_batches=True loads every batch on rank 0; leave it unset")
    return problems


# --- what a checkpoint holds --------------------------------------------------------------------------------
# must match the saving run; the first names are what a user most often changes
_CONFIG_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "world_size", "seed",
                "training_seed", "data_seed", "dataset_len", "batches_per_epoch", "num_workers",
                "dataloader_drop_last", "train_sampling_strategy", "rank")


def _config(args: Any, loader: Any, seed: int) -> dict[str, Any]:
    return {
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps, "world_size": args.world_size,
        "seed": seed, "training_seed": args.seed, "data_seed": args.data_seed,
        "dataset_len": len(loader.dataset), "batches_per_epoch": len(loader), "num_workers": loader.num_workers,
        "dataloader_drop_last": args.dataloader_drop_last,
        "train_sampling_strategy": str(getattr(args, "train_sampling_strategy", None)),
        "rank": args.process_index,
    }


def _trainer_state_digest(state: Any) -> str:
    """A digest of the parts of ``TrainerState`` that identify a checkpoint (its step and its log)."""
    keys = ("global_step", "log_history", "total_flos", "num_input_tokens_seen", "best_metric", "best_global_step")
    return hashlib.sha256(json.dumps({k: getattr(state, k, None) for k in keys}, sort_keys=True,
                                     default=repr).encode()).hexdigest()


def _component_digests(kwargs: Mapping[str, Any]) -> dict[str, str | None]:
    """Fingerprints of the model, optimizer and scheduler states (None for one that is absent or unreadable)."""
    out: dict[str, str | None] = {}
    for name, key in (("model", "model"), ("optimizer", "optimizer"), ("scheduler", "lr_scheduler")):
        obj = kwargs.get(key)
        try:
            out[name] = None if obj is None else fingerprint_object(obj.state_dict())
        except (UnreadableError, AttributeError, TypeError):
            out[name] = None
    return out


def _digest(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_state(path: str | Path, payload: Mapping[str, Any]) -> None:
    """Write a state document atomically: format, version, checksum and ``payload``."""
    doc = {"format": STATE_FORMAT, "version": STATE_VERSION, "sha256": _digest(payload), "state": payload}
    atomic_write_bytes(path, json.dumps(doc).encode())


_STATE_FIELDS = {"config": ("object",), "position": ("object",), "trainer_state": ("string",),
                 "components": ("object",), "rng": ("object",), "epoch_rng": ("object",)}
_POSITION_FIELDS = {"global_step": ("int",), "epoch": ("int",), "batches": ("int",)}


@dataclass(frozen=True)
class SavedState:
    """A checkpoint's state file, read and fully checked: nothing is restored until every part is valid."""

    path: Path
    config: dict[str, Any]
    global_step: int
    epoch: int
    batches: int
    trainer_state: str
    components: dict[str, Any]
    rng: RNGState
    epoch_rng: RNGState


def read_state(path: str | Path) -> SavedState:
    """Read and check ``path`` (a state file); :class:`CheckpointError` naming what is wrong.

    >>> read_state("out/checkpoint-4/torchrepro_state_rank0.json").global_step  # doctest: +SKIP
    4
    """
    path = Path(path)
    action = "Nothing was restored. Use another checkpoint, or start the run again."
    doc = check_fields(read_json(path, error=CheckpointError, action=action),
                       {"format": ("string",), "version": ("int",), "sha256": ("string",), "state": ("object",)},
                       source=path, error=CheckpointError, action=action)
    if doc.get("format") != STATE_FORMAT or doc.get("version") != STATE_VERSION:
        raise CheckpointError(path, f"is not a torchrepro Trainer state of version {STATE_VERSION} (format "
                              f"{doc.get('format')!r}, version {doc.get('version')!r}).", action)
    state = doc.get("state")
    if state is None or _digest(state) != doc.get("sha256"):
        raise CheckpointError(path, "is corrupt: its content does not match its checksum.", action)
    check_fields(state, _STATE_FIELDS, source=path, error=CheckpointError, action=action, where="'state' ")
    position = check_fields(state.get("position", {}), _POSITION_FIELDS, source=path, error=CheckpointError,
                            action=action, where="'position' ")
    missing = [k for k in _STATE_FIELDS if k not in state] + [f"position.{k}" for k in _POSITION_FIELDS
                                                               if k not in position]
    if missing:
        raise CheckpointError(path, f"is incomplete: it lacks {', '.join(missing)}.", action)
    negative = [f"position.{k}={position[k]}" for k in _POSITION_FIELDS if position[k] < 0]
    if negative:
        raise CheckpointError(path, f"is corrupt: {', '.join(negative)} (expected a non-negative integer).", action)
    try:
        rng, epoch_rng = (RNGState.from_dict(state[k], source=f"{path} ({k})") for k in ("rng", "epoch_rng"))
        for k, value in (("rng", rng), ("epoch_rng", epoch_rng)):
            value.check(source=f"{path} ({k})")
    except StateFileError as exc:  # a CheckpointError, with the checkpoint's advice, as for every other field
        raise CheckpointError(path, f"holds damaged RNG states ({exc.problem}).", action) from None
    return SavedState(path, state["config"], position["global_step"], position["epoch"], position["batches"],
                      state["trainer_state"], state["components"], rng, epoch_rng)


def _not_a_regular_file(path: Path) -> str | None:
    """What lies at ``path`` when it is not a regular file (a FIFO, a device, a directory, a link to one of them or
    to nothing), found with ``lstat``/``stat`` only: it is never opened (a FIFO would block, ``/dev/zero`` would never
    end). None when it is a regular file (or a link to one) or when nothing is there."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be examined ({exc.strerror or exc})"
    if not stat.S_ISLNK(mode):
        return None if stat.S_ISREG(mode) else f"is {file_kind(mode)}"
    link = f"is a symbolic link to {os.readlink(path)}"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{link}, which does not exist"
    except OSError as exc:
        return f"{link}, which cannot be examined ({exc.strerror or exc})"
    return None if stat.S_ISREG(mode) else f"{link}, which is {file_kind(mode)}"


def config_differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Each setting that differs between a checkpoint's configuration and this run's, as ``name: saved X, now Y``.

    >>> config_differences({"seed": 0}, {"seed": 1})
    ['seed: saved 0, now 1']
    """
    return [f"{k}: saved {saved.get(k)!r}, now {now.get(k)!r}" for k in _CONFIG_KEYS if saved.get(k) != now.get(k)]


def _check_replay(resume: _Resume) -> None:
    """Refuse to train on when the resumed epoch's workers did not replay, or replayed other batches than the
    ones Trainer skipped (a transformers, accelerate or torch that builds or iterates the loader differently)."""
    report = "please report it with your transformers, accelerate and torch versions."
    if resume.replayed is not None and not resume.replayed.is_set():
        raise RuntimeError("ReproducibleCallback: the DataLoader workers of the resumed epoch did not run the "
                           "callback's worker_init_fn, so their RNG streams were not replayed: Trainer built the "
                           f"resumed loader in a way torchrepro does not expect; {report}")
    if resume.recorder is None:
        return
    name, recorder = resume.recorder
    _remove_recorder(resume.loader, name)
    if recorder.seen != resume.plan:
        raise RuntimeError(f"ReproducibleCallback: Trainer skipped {len(recorder.seen)} batches starting "
                           f"{recorder.seen[:1]}, but the workers replayed {len(resume.plan)} starting "
                           f"{resume.plan[:1]}: the sampler gave another order than torchrepro computed; {report}")


# --- the callback -------------------------------------------------------------------------------------------
@dataclass
class _Resume:
    """What a resumed run still has to put back (at the epoch's start, then right before the first step) and
    check (that the workers replayed, and replayed the batches Trainer skipped)."""

    saved: SavedState
    epoch_pending: bool = True
    step_pending: bool = True
    plan: list[tuple[int, ...]] = field(default_factory=list)
    replayed: Any = None  # a multiprocessing Event the workers set
    recorder: tuple[str, _Recorder] | None = None
    loader: Any = None


class ReproducibleCallback(TrainerCallback):
    """Make ``Trainer.train(resume_from_checkpoint=...)`` continue bit for bit, mid-epoch, with workers.

    ``seed`` (default: ``TrainingArguments.seed``) seeds the DataLoader workers' streams. Records nothing: it
    writes one small JSON file per rank into each checkpoint Trainer saves, and reads it back on resume.

    >>> cb = ReproducibleCallback()  # doctest: +SKIP
    >>> Trainer(model, args, train_dataset=ds, callbacks=[cb]).train(resume_from_checkpoint=True)  # doctest: +SKIP
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = None if seed is None else validate_seed(seed, what="ReproducibleCallback seed")
        self._output_dir: str | None = None
        self._resume_from: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._epoch, self._batches = -1, 0
        self._epoch_rng: RNGState | None = None
        self._resume: _Resume | None = None
        self._config: dict[str, Any] = {}
        self._stream_seed = 0

    # -- the one extra line for a checkpoint outside output_dir ------------------------------------------
    def resume_from(self, checkpoint: str | os.PathLike[str] | bool) -> str:
        """Tell the callback which checkpoint ``train`` resumes; returns the path to pass to ``train``.

        >>> trainer.train(resume_from_checkpoint=callback.resume_from("elsewhere/checkpoint-500"))  # doctest: +SKIP
        """
        if checkpoint is True:
            if self._output_dir is None:
                raise ValueError("resume_from(True) needs the Trainer: build Trainer(callbacks=[callback]) first.")
            last = get_last_checkpoint(self._output_dir) if os.path.isdir(self._output_dir) else None
            if last is None:
                raise ValueError(f"No checkpoint found in output directory ({self._output_dir}).")
            checkpoint = last
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise TypeError(f"resume_from() takes a checkpoint directory or True, got {checkpoint!r}.")
        self._resume_from = os.fspath(checkpoint)
        return self._resume_from

    # -- Trainer events ---------------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._output_dir = args.output_dir

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._reset()
        self._output_dir = args.output_dir
        loader = kwargs.get("train_dataloader")
        problems = _unsupported(args, loader)
        if problems:
            raise ValueError("ReproducibleCallback cannot make this training resume exactly: "
                             + "; ".join(problems) + ".")
        self._stream_seed = args.seed if self.seed is None else self.seed
        self._config = _config(args, loader, self._stream_seed)
        explicit, self._resume_from = self._resume_from, None
        if explicit is not None and state.global_step == 0:
            raise ValueError(f"callback.resume_from({explicit!r}) was called, but Trainer starts from step 0: pass "
                             "what it returns to trainer.train(resume_from_checkpoint=...).")
        if state.global_step > 0:
            saved = self._locate(args, state, explicit)
            self._check(saved, args, state, kwargs)
            self._resume = _Resume(saved)
            self._epoch = saved.epoch - 1

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._epoch += 1
        loader, resume, start = kwargs["train_dataloader"], self._resume, 0
        if resume is not None and resume.epoch_pending:
            resume.epoch_pending = False
            start = resume.saved.batches
            (resume.saved.epoch_rng if start else resume.saved.rng).restore(source=str(resume.saved.path))
            resume.step_pending = start > 0
        self._batches = start
        self._epoch_rng = RNGState.capture()
        if loader.num_workers == 0:
            return
        replay: tuple[tuple[tuple[int, ...], ...], ...] = ()
        replayed = None
        if start:
            assert resume is not None  # start > 0 only when resuming
            resume.plan = skipped_batches(loader, self._epoch, start)
            replay = _replay_plan(resume.plan, start, loader.num_workers)
            replayed = resume.replayed = (loader.multiprocessing_context or multiprocessing.get_context()).Event()
            resume.recorder, resume.loader = _install_recorder(loader, start), loader
        _set_worker_init(loader, _WorkerStreams(
            _original_worker_init(loader), self._stream_seed, self._epoch, self._config["rank"], start,
            loader.num_workers, replay, loader.collate_fn, replayed))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        resume = self._resume
        if resume is None or not resume.step_pending:
            return
        resume.step_pending = False
        _check_replay(resume)
        resume.saved.rng.restore(source=str(resume.saved.path))

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._batches += 1

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._batches += 1

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        directory = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if not directory.is_dir():
            raise CheckpointError(directory, "does not exist, but Trainer has just saved this checkpoint there.",
                                  "ReproducibleCallback supports checkpoints in args.output_dir only (not "
                                  "hyperparameter search runs).")
        epoch, batches = self._epoch, self._batches
        if batches >= self._config["batches_per_epoch"]:
            epoch, batches = epoch + 1, 0
        payload = {
            "config": self._config,
            "position": {"global_step": state.global_step, "epoch": epoch, "batches": batches},
            "trainer_state": _trainer_state_digest(state),
            "components": _component_digests(kwargs),
            "rng": RNGState.capture().to_json(),
            "epoch_rng": (self._epoch_rng or RNGState.capture()).to_json(),
        }
        write_state(directory / state_file_name(args.process_index), payload)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        if loader is not None and isinstance(getattr(loader, "worker_init_fn", None), _WorkerStreams):
            _set_worker_init(loader, _original_worker_init(loader))

    # -- helpers --------------------------------------------------------------------------------------------
    def _locate(self, args: Any, state: Any, explicit: str | None) -> SavedState:
        """The state file of the checkpoint Trainer resumed from, checked to belong to it."""
        name = state_file_name(args.process_index)
        how = ("name it with trainer.train(resume_from_checkpoint=callback.resume_from(PATH)) when it is outside "
               "output_dir")
        if explicit is None:
            guess = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            if not (guess / "trainer_state.json").is_file():
                raise CheckpointError(guess, f"does not exist, so ReproducibleCallback cannot tell which checkpoint "
                                      f"Trainer resumed at step {state.global_step}.", f"Resume from a checkpoint "
                                      f"in output_dir ({args.output_dir}), or {how}.")
            directory = guess
        else:
            directory = Path(explicit)
        path = directory / name
        found = _not_a_regular_file(path)
        if found is not None:
            raise CheckpointError(path, f"{found}, expected a regular file: the JSON state ReproducibleCallback "
                                  "writes into each checkpoint Trainer saves.", "Nothing was read from it or restored. "
                                  "Remove it and resume from a checkpoint saved with ReproducibleCallback (or put back "
                                  f"the {name} that Trainer saved with this checkpoint).")
        if not path.is_file():
            others = sorted(p.name for p in directory.glob("torchrepro_state_rank*.json"))
            saved_by = (f" (it holds {', '.join(others)}: saved by another number of processes)" if others else
                        ": it was saved without ReproducibleCallback, so the workers' position and RNG streams and "
                        "the RNG state to resume from are unknown")
            raise CheckpointError(directory, f"has no torchrepro state {name}{saved_by}.", _AGAIN)
        saved = read_state(path)
        if saved.trainer_state != _trainer_state_digest(state) or saved.global_step != state.global_step:
            raise CheckpointError(path, f"belongs to another checkpoint than the one Trainer resumed (step "
                                  f"{saved.global_step} vs {state.global_step}, or another trainer_state.json).",
                                  f"Pass the same directory to train() and callback.resume_from(); {how}.")
        return saved

    def _check(self, saved: SavedState, args: Any, state: Any, kwargs: Mapping[str, Any]) -> None:
        """Refuse a resume that would not continue bit for bit, naming each difference."""
        where = saved.path.parent
        diffs = config_differences(saved.config, self._config)
        if diffs:
            raise CheckpointError(where, "was saved with another configuration: " + "; ".join(diffs) + ".",
                                  "Training stopped before its first step: resume with the settings it was "
                                  "saved with, or start a new run.")
        expect = self._trainer_position(args, state.global_step)
        if expect != (saved.epoch, saved.batches):
            hint = " (ignore_data_skip=True restarts the epoch; remove it)" if args.ignore_data_skip else ""
            raise CheckpointError(where, f"was saved at epoch {saved.epoch} after {saved.batches} batches, but "
                                  f"Trainer resumes at epoch {expect[0]} after {expect[1]} batches{hint}.",
                                  "Remove ignore_data_skip=True." if hint else
                                  "Its torchrepro state does not belong to this checkpoint (copied from another one?) "
                                  "or is damaged: resume from an intact checkpoint saved with ReproducibleCallback.")
        now = _component_digests(kwargs)
        wrong = [k for k, v in saved.components.items() if v is not None and now.get(k) != v]
        if wrong:
            raise CheckpointError(where, f"holds {' and '.join(wrong)} state that Trainer did not restore as saved "
                                  "(a file missing from the checkpoint?); training stopped before its first step.",
                                  "Resume from a complete checkpoint (save_only_model=False).")

    def _trainer_position(self, args: Any, global_step: int) -> tuple[int, int]:
        """Where Trainer resumes: (epoch, batches of it it skips), from its steps per epoch."""
        accumulation = args.gradient_accumulation_steps
        per_epoch = max(-(-self._config["batches_per_epoch"] // accumulation), 1)
        skipped = 0 if args.ignore_data_skip else (global_step % per_epoch) * accumulation
        return global_step // per_epoch, skipped
