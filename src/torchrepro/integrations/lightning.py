"""Bit-for-bit mid-epoch resume for Lightning: ``ReproducibleCallback`` (layer L6).

Added to ``Trainer(callbacks=[...])`` of an otherwise unchanged script, ``trainer.save_checkpoint`` (or a
``ModelCheckpoint``) in the middle of an epoch and ``fit(ckpt_path=...)`` continue exactly as the uninterrupted run
would: the same batches (order and the workers' augmentation randomness), the same dropout masks, the same
optimizer and scheduler state (those Lightning restores itself). See docs/integrations.md.

Example:
    >>> import lightning.pytorch as pl                                     # doctest: +SKIP
    >>> from torchrepro.integrations.lightning import ReproducibleCallback  # doctest: +SKIP
    >>> trainer = pl.Trainer(max_steps=8, callbacks=[ReproducibleCallback(seed=0)])  # doctest: +SKIP

How (the Lightning names it relies on are listed in ``LIGHTNING_API``):

* When Lightning prepares the train DataLoader (``Strategy.process_dataloader``, after it has injected its
  ``DistributedSampler``), the loader is wrapped: its shuffle order and its workers' base seed come from two
  ``torch.Generator`` objects reseeded from (seed, epoch[, rank]) at the start of every epoch, so they are the
  same in every process and never draw from (or shift) the global RNGs.
* The wrapper has ``state_dict``/``load_state_dict``, so Lightning stores the data position (epoch, batches
  consumed) in the checkpoint itself. On a resume it replays the consumed batches of the epoch (loads and drops
  them), which leaves every worker's RNG stream where it was.
* The callback's own state holds every rank's RNG states (Python, NumPy, torch CPU and CUDA) taken at the save;
  they are put back right before the first batch after the resume, once the replay is done.
* Several train loaders (a dict or list, or a ``CombinedLoader``) are each wrapped: each keeps its own position
  (a short loader that Lightning cycles starts a new pass of its own), and the resume is checked against the
  number of batches Lightning had fetched, saved beside the RNG states.
* A fingerprint of a few samples of each train dataset (read in the training process under fixed seeds, every
  RNG put back after) is saved too, so a resume on other data of the same length is refused.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable, Iterator, Sized
from typing import Any, cast

try:
    import lightning.pytorch as pl
except ModuleNotFoundError as _exc:  # fall back to the older namespace, then fail with the extra to install
    if not (_exc.name or "").startswith("lightning"):
        raise
    try:
        import pytorch_lightning as pl
    except ModuleNotFoundError as _exc2:
        if not (_exc2.name or "").startswith("pytorch_lightning"):
            raise
        raise ImportError(
            "torchrepro.integrations.lightning needs Lightning (lightning.pytorch or pytorch_lightning), which is "
            "not installed. Install it with: pip install torchrepro[lightning]"
        ) from None

import torch

from .._core.compat import np
from .._core.errors import CheckpointError, StateFileError
from .._core.fingerprint import fingerprint_object
from ..control._seeds import derive_seed, seed_from_env, validate_seed
from ..control.rng import RNGState, isolate_rng
from ..record.recorder import unrecorded_batches

__all__ = ["LIGHTNING_API", "ReproducibleCallback", "ResumeMismatchError"]

Loader = torch.utils.data.DataLoader[Any]

log = logging.getLogger("torchrepro")

FORMAT = "torchrepro.lightning"
LOADER_FORMAT = "torchrepro.lightning-loader"
VERSION = 1

# Everything of Lightning's beyond the public Callback hooks that this module uses; each is checked where it is
# used, with an error naming it if a Lightning version lacks it.
LIGHTNING_API = (
    "Trainer.strategy.process_dataloader (public method; replaced on the instance for the duration of fit)",
    "Trainer.fit_loop.epoch_loop.batch_progress.current.ready (batches Lightning counts as fetched this epoch)",
    "Trainer.training, .current_epoch, .num_training_batches, .ckpt_path, .global_rank, .world_size (public)",
    "Strategy.all_gather (public; gathers every rank's RNG states at a save)",
)

# the loader settings a resume must share with the saving run, and the callback's own
_LOADER_KEYS = ("batch_size", "dataset_len", "batches_per_epoch", "drop_last", "sampler", "num_workers")

DATA_SAMPLES = 4  # samples of each train dataset fingerprinted (spread over it: the first, the last, between)
_DATA_SEED = 0  # the seed of every RNG while they are read (a dataset that augments draws the same numbers)


_DAMAGED = ("Resume from an intact checkpoint saved with ReproducibleCallback (an earlier one, or save again), or "
            "start a new run without ckpt_path.")


class ResumeMismatchError(CheckpointError):
    """A Lightning checkpoint that ReproducibleCallback cannot continue bit for bit: its state is missing, or it
    was saved by a run with another configuration (seed, world size, batch size, dataset). The message names
    the checkpoint, every difference and what to do."""


def _resume_error(trainer: Any, problem: str, action: str) -> ResumeMismatchError:
    return ResumeMismatchError(str(trainer.ckpt_path), problem, action)


# --- the train loader ----------------------------------------------------------------------------------------
def _samplers(loader: Loader) -> list[Any]:
    """The distinct sampler objects of ``loader``: its sampler, batch sampler and the batch sampler's sampler."""
    found: dict[int, Any] = {}
    batch_sampler = getattr(loader, "batch_sampler", None)
    for obj in (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        if obj is not None:
            found[id(obj)] = obj
    return list(found.values())


def _unsupported(loader: Any) -> str | None:
    """Why ReproducibleCallback cannot make ``loader`` resumable, or None when it can."""
    if not isinstance(loader, torch.utils.data.DataLoader):
        return (f"the train dataloader is a {type(loader).__name__}, not a torch.utils.data.DataLoader (wrapped by "
                "the strategy, or another iterable)")
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return (f"its dataset is iterable-style ({type(loader.dataset).__name__}): its order cannot be rebuilt from "
                "outside; use a map-style dataset (__getitem__/__len__)")
    if loader.num_workers > 0 and loader.persistent_workers:
        return ("it has persistent_workers=True: the workers' RNG streams then run on across epochs, which a resume "
                "could only rebuild by replaying every earlier epoch; set persistent_workers=False")
    for obj in _samplers(loader):
        plain = isinstance(obj, (torch.utils.data.SequentialSampler, torch.utils.data.BatchSampler))
        if not plain and not hasattr(obj, "generator") and not callable(getattr(obj, "set_epoch", None)):
            return (f"its sampler {type(obj).__name__} has neither a `generator` attribute nor set_epoch(), so its "
                    "order cannot be tied to the epoch; give it a generator= attribute that it draws from")
    return None


def _loader_config(loader: Loader) -> dict[str, Any]:
    """The settings of ``loader`` that a resumed run must share with the saving run."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    index_sampler = getattr(batch_sampler, "sampler", None) or loader.sampler
    batch_size = loader.batch_size if loader.batch_size is not None else getattr(batch_sampler, "batch_size", None)
    return {"batch_size": batch_size, "dataset_len": len(cast(Sized, loader.dataset)), "batches_per_epoch": len(loader),
            "drop_last": bool(loader.drop_last), "sampler": type(index_sampler).__name__,
            "num_workers": loader.num_workers}  # each worker has its own RNG stream


class _ResumableTrainLoader:
    """The train DataLoader as Lightning sees it under ReproducibleCallback: each epoch's shuffle order and worker
    seeds come from (seed, epoch, rank), and ``state_dict()`` holds the position (epoch, batches consumed).

    Every other attribute is the DataLoader's (``loader.dataset``, ``.sampler``, ``.worker_init_fn`` ...).

    >>> loader = _ResumableTrainLoader(torch.utils.data.DataLoader(range(8), batch_size=2, shuffle=True),
    ...                                seed=0, rank=0, first_epoch=0, before_first_batch=lambda: None)
    >>> first = next(iter(loader)); loader.state_dict()["batches_consumed"]
    1
    """

    _OWN = frozenset({"loader", "seed", "rank", "epoch", "batches_consumed", "pending", "started", "data",
                      "_before_first_batch", "_order_gen", "_worker_gen", "_replayed", "_stream"})

    def __init__(self, loader: Loader, *, seed: int, rank: int, first_epoch: int,
                 before_first_batch: Callable[[], None], index: int = 0, data_samples: int = 0) -> None:
        self.loader, self.seed, self.rank = loader, seed, rank
        # train loader 0 keeps the seeds of a single loader; each further one draws its own order and worker seeds
        self._stream: tuple[int | str, ...] = () if index == 0 else ("loader", index)
        self.data = _data_fingerprint(loader.dataset, _sample_indices(len(cast(Sized, loader.dataset)),
                                                                      data_samples))
        self._before_first_batch = before_first_batch
        self.epoch, self.batches_consumed = first_epoch, 0
        self.started = False  # whether an epoch has begun: the next iteration is then epoch + 1
        self.pending: dict[str, Any] | None = None  # a position from a checkpoint, not yet replayed
        self._replayed: Iterator[Any] | None = None
        self._order_gen, self._worker_gen = torch.Generator(), torch.Generator()
        loader.generator = self._worker_gen  # the workers' base seed is drawn from loader.generator
        for obj in _samplers(loader):
            if hasattr(obj, "generator"):
                obj.generator = self._order_gen

    # the DataLoader's attributes, for Lightning and for user code (trainer.train_dataloader.dataset)
    def __getattr__(self, name: str) -> Any:
        loader = self.__dict__.get("loader")
        if loader is None:
            raise AttributeError(name)
        return getattr(loader, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.loader, name, value)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        self._before_first_batch()  # after a resume: replay every train loader, then restore the RNG states
        batches = self._replayed
        if batches is None:  # a new pass: Lightning's next epoch, or a short loader that it cycles
            batches = self._start_epoch(self.epoch + 1 if self.started else self.epoch)
        self._replayed = None
        for batch in batches:
            self.batches_consumed += 1
            yield batch

    def _start_epoch(self, epoch: int) -> Iterator[Any]:
        """A new iterator over ``epoch`` from its first batch, its order and worker seeds fixed by the epoch."""
        self.epoch, self.batches_consumed, self.started = epoch, 0, True
        self._order_gen.manual_seed(derive_seed(self.seed, "lightning", "order", epoch, *self._stream))
        self._worker_gen.manual_seed(derive_seed(self.seed, "lightning", "workers", epoch, "rank", self.rank,
                                                 *self._stream))
        for obj in _samplers(self.loader):
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)  # DistributedSampler; Lightning calls it too, but after a resume too late
        return iter(self.loader)

    def replay(self, *, epoch_over: bool) -> int:
        """Continue the pending position: start its epoch and drop the batches consumed; return how many.

        ``epoch_over``: the checkpoint was saved at the end of Lightning's epoch; nothing is replayed and the next
        iteration starts the next epoch. Otherwise the position is replayed even when it is the end of this
        loader's pass (a loader shorter than the epoch): the iterator is then exhausted, as it was in the saving
        run, and Lightning cycles it (``max_size_cycle``: a new pass starts) or leaves it (``max_size``).
        """
        if self.pending is None:
            return 0
        epoch, consumed = int(self.pending["epoch"]), int(self.pending["batches_consumed"])
        self.pending = None
        if epoch_over:  # the next iteration starts epoch + 1
            self.epoch, self.batches_consumed, self.started = epoch, consumed, True
            return 0
        batches = self._start_epoch(epoch)
        with unrecorded_batches():  # dropped, so a recorded resume (check --resume-at) does not count them
            for done in range(consumed):
                try:
                    next(batches)
                except StopIteration:
                    raise RuntimeError(f"the train loader ran out after {done} batches while replaying the "
                                       f"{consumed} consumed in epoch {epoch} before the checkpoint") from None
        self.batches_consumed, self._replayed = consumed, batches
        return consumed

    def position(self) -> tuple[int, int]:
        """(epoch, batches consumed in it): the pending position until it is replayed."""
        if self.pending is not None:
            return self.pending["epoch"], self.pending["batches_consumed"]
        return self.epoch, self.batches_consumed

    def state_dict(self) -> dict[str, Any]:
        epoch, consumed = self.position()
        return {"format": LOADER_FORMAT, "version": VERSION, "epoch": epoch, "batches_consumed": consumed,
                **_loader_config(self.loader)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep ``state`` until the resume is checked (at ``on_train_start``) and replayed (at the first batch)."""
        problem = _loader_state_problem(state)
        if problem:
            raise ValueError(f"the train loader state in the checkpoint {problem}; it was not written by "
                             "torchrepro's ReproducibleCallback (or is damaged). Resume from a checkpoint saved with "
                             "ReproducibleCallback.")
        self.pending = dict(state)


def _loader_state_problem(state: Any) -> str | None:
    """What is wrong with a saved loader state, or None."""
    if not isinstance(state, dict) or state.get("format") != LOADER_FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        return f"has format {got!r}, expected {LOADER_FORMAT!r}"
    if state.get("version") != VERSION:
        return f"has version {state.get('version')!r}, this torchrepro reads version {VERSION}"
    for key in ("epoch", "batches_consumed"):
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"has {key}={value!r}, expected a non-negative integer"
    return None


# --- which data: a fingerprint of a few samples of each train dataset ---------------------------------------------
def _sample_indices(length: int, count: int) -> list[int]:
    """``count`` indices spread over a dataset of ``length`` samples: the first, the last and evenly between.

    >>> _sample_indices(12, 4), _sample_indices(2, 4), _sample_indices(12, 0)
    ([0, 4, 7, 11], [0, 1], [])
    """
    count = min(count, length)
    if count <= 0:
        return []
    if count == 1:
        return [0]
    return sorted({round(i * (length - 1) / (count - 1)) for i in range(count)})


def _data_fingerprint(dataset: Any, indices: list[int]) -> dict[str, Any]:
    """``{"indices", "digest", "note"}``: the digest of ``dataset[i]`` for ``indices``, or None and why not.

    The samples are read twice, each time with every RNG seeded with ``_DATA_SEED`` (so augmentation drawn from
    torch, NumPy or ``random`` is the same in every run) and put back after: training draws the same numbers as
    without the check. Samples that differ between the two reads (randomness from elsewhere) or that cannot be
    read or digested give no digest: the note says why, and a resume then does not compare the data.
    """
    if not indices:
        return {"indices": [], "digest": None, "note": "no samples are fingerprinted (data_samples=0)"}
    digests = []
    try:
        for _ in range(2):
            with isolate_rng():
                random.seed(_DATA_SEED)
                if np is not None:
                    np.random.seed(_DATA_SEED)
                torch.manual_seed(_DATA_SEED)
                digests.append(fingerprint_object([dataset[i] for i in indices]))
    except Exception as exc:  # a dataset's own error (not int-indexable, a file, ...) or a sample not digestible
        text = str(exc).split("\n")[0][:200]
        return {"indices": indices, "digest": None,
                "note": f"its samples {_listed(indices)} could not be read and digested ({type(exc).__name__}: {text})"}
    if digests[0] != digests[1]:
        return {"indices": indices, "digest": None,
                "note": f"its samples {_listed(indices)} differ between two reads under the same seeds (the dataset "
                        "draws randomness from elsewhere than torch, NumPy and random: the clock, os.urandom, a file)"}
    return {"indices": indices, "digest": digests[0], "note": None}


def _listed(indices: list[int]) -> str:
    return ", ".join(map(str, indices))


def _data_entry_problem(entry: Any) -> str | None:
    """What is wrong with one saved data fingerprint, or None."""
    if not isinstance(entry, dict) or set(entry) != {"indices", "digest", "note"}:
        return "is not a dict of indices, digest and note"
    indices, digest, note = entry["indices"], entry["digest"], entry["note"]
    if not isinstance(indices, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                for i in indices):
        return "has indices that are not a list of non-negative integers"
    if digest is not None and (not isinstance(digest, str) or len(digest) != 32):
        return "has a digest that is not 32 hex digits"
    if digest is None and not isinstance(note, str):
        return "has neither a digest nor a note"
    return None


# --- RNG states of every rank --------------------------------------------------------------------------------
def _gather_text(trainer: Any, text: str) -> list[str]:
    """``text`` from every rank, in rank order (a collective: every rank must call it)."""
    if trainer.world_size <= 1:
        return [text]
    device = trainer.strategy.root_device
    data = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8).to(device)
    sizes = trainer.strategy.all_gather(torch.tensor([data.numel()], device=device)).reshape(-1).tolist()
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    padded[: data.numel()] = data
    rows = trainer.strategy.all_gather(padded).reshape(len(sizes), -1).cpu()
    return [bytes(rows[r, :n].tolist()).decode() for r, n in enumerate(sizes)]


def _epoch_loop_ready(trainer: Any) -> int:
    """How many batches of this epoch Lightning counts as fetched (guarded: a loop internal)."""
    try:
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.ready)
    except AttributeError as exc:
        raise RuntimeError(f"ReproducibleCallback reads trainer.fit_loop.epoch_loop.batch_progress.current.ready, "
                           f"which this Lightning ({pl.__version__}) lacks ({exc}); it supports Lightning 2.1 to "
                           "2.6. Please report this at torchrepro's issue tracker.") from None


def _resolve_seed(seed: int | None) -> int:
    """``seed``, else Lightning's ``PL_GLOBAL_SEED`` (set by ``seed_everything``), else ``TORCHREPRO_SEED``."""
    if seed is not None:
        return validate_seed(seed)
    raw = os.environ.get("PL_GLOBAL_SEED", "").strip()
    if raw.isdigit():
        return validate_seed(int(raw), what="PL_GLOBAL_SEED")
    found = seed_from_env()
    if found is None:
        raise ValueError("ReproducibleCallback needs a seed: pass ReproducibleCallback(seed=...), or call "
                         "lightning.pytorch.seed_everything(SEED) (or torchrepro.seed_everything) before fit.")
    return found


class ReproducibleCallback(pl.Callback):
    """Makes a mid-epoch ``save_checkpoint`` + ``fit(ckpt_path=...)`` continue bit for bit.

    ``seed`` fixes each epoch's shuffle order and DataLoader worker seeds (default: the seed of Lightning's
    ``seed_everything``). The callback stores the data position and every rank's RNG states in the checkpoint;
    resuming a checkpoint without them, or from a run with another seed, world size, batch size, dataset length
    or data, raises :class:`ResumeMismatchError` naming each difference. It records nothing else and writes no
    files.

    ``data_samples`` (default 4): how many samples of each train dataset are read when ``fit`` starts, in the
    training process, to fingerprint the data (spread over the dataset, the first and the last included); 0
    turns the data check off (for a dataset that must not be read before its workers start, such as one opening
    an HDF5 file on first access).

    >>> trainer = pl.Trainer(callbacks=[ReproducibleCallback(seed=0)])  # doctest: +SKIP
    >>> trainer.fit(model, ckpt_path="mid-epoch.ckpt")                   # doctest: +SKIP
    """

    def __init__(self, seed: int | None = None, *, data_samples: int = DATA_SAMPLES) -> None:
        if isinstance(data_samples, bool) or not isinstance(data_samples, int) or data_samples < 0:
            raise ValueError(f"ReproducibleCallback(data_samples=...) takes a non-negative integer (how many samples "
                             f"of each train dataset to fingerprint; 0 turns the data check off), got "
                             f"{data_samples!r}.")
        self.data_samples = data_samples
        self._given_seed = None if seed is None else validate_seed(seed)
        self.seed: int | None = self._given_seed
        self._trainer: Any = None
        self._in_fit = False
        self._loaders: list[_ResumableTrainLoader] = []
        self._saved: dict[str, Any] | None = None  # this callback's state from the checkpoint resumed from
        self._rng_to_restore: RNGState | None = None
        self._resume_pending = False
        self._saved_position: tuple[int, int] | None = None  # (epoch, batches Lightning had fetched) at the save
        self._original_process: Any = None
        self._rng_outside_validation: RNGState | None = None

    # --- taking over the train loader ------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        self.seed = _resolve_seed(self._given_seed)
        self._trainer, self._loaders, self._in_fit = trainer, [], True
        strategy = trainer.strategy
        original = getattr(strategy, "process_dataloader", None)
        if not callable(original):
            raise RuntimeError(f"ReproducibleCallback wraps Strategy.process_dataloader, which this Lightning "
                               f"({pl.__version__}) lacks on {type(strategy).__name__}; it supports Lightning 2.1 "
                               "to 2.6.")
        if getattr(original, "_torchrepro_callback", None) is self:
            return  # still installed from a fit that ended in an exception
        self._original_process = strategy.__dict__.get("process_dataloader")

        def process_dataloader(dataloader: object) -> object:
            return self._process(trainer, original(dataloader))

        process_dataloader._torchrepro_callback = self  # type: ignore[attr-defined]
        strategy.process_dataloader = process_dataloader

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        self._in_fit = False  # the trainer stays known: save_checkpoint after fit still needs the state
        strategy = trainer.strategy
        if getattr(strategy.__dict__.get("process_dataloader"), "_torchrepro_callback", None) is self:
            if self._original_process is None:
                del strategy.process_dataloader
            else:
                strategy.process_dataloader = self._original_process

    def _process(self, trainer: Any, dataloader: object) -> object:
        """The train loader, made resumable; evaluation loaders get their own generator (see `_quiet`)."""
        if not trainer.training:
            _quiet(dataloader, self.seed)
            return dataloader
        problem = _unsupported(dataloader)
        if problem:
            raise TypeError(f"ReproducibleCallback cannot make this train dataloader resumable bit for bit: {problem}.")
        assert isinstance(dataloader, torch.utils.data.DataLoader) and self.seed is not None  # checked; setup()
        if any(loader.started for loader in self._loaders):  # a reload: these replace the loaders of last time
            self._loaders = []
        wrapped = _ResumableTrainLoader(dataloader, seed=self.seed, rank=trainer.global_rank,
                                        first_epoch=trainer.current_epoch,
                                        before_first_batch=self._before_first_batch, index=len(self._loaders),
                                        data_samples=self.data_samples)
        self._loaders.append(wrapped)
        return wrapped

    # --- validation inside fit draws nothing from the training run's RNG streams ------------------------------
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self._in_fit:
            self._rng_outside_validation = RNGState.capture()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        rng, self._rng_outside_validation = self._rng_outside_validation, None
        if rng is not None:
            rng.restore()

    # --- saving ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every rank's RNG states and data fingerprints (gathered: Lightning writes rank 0's checkpoint), where
        Lightning's epoch was, and the configuration."""
        trainer = self._trainer
        if trainer is None:
            return {}
        state = self._rng_to_restore or RNGState.capture()  # not yet restored after a resume: the saved one
        mine = {"rng": state.to_json(), "data": [loader.data for loader in self._loaders]}
        ranks = [json.loads(t) for t in _gather_text(trainer, json.dumps(mine))]
        # not yet replayed after a resume: the position that was resumed, else how many batches Lightning fetched
        epoch, batches = self._saved_position or (trainer.current_epoch, _epoch_loop_ready(trainer))
        return {"format": FORMAT, "version": VERSION, "seed": self.seed, "world_size": trainer.world_size,
                "train_loaders": len(self._loaders), "rng": [r["rng"] for r in ranks],
                "data": [r["data"] for r in ranks], "fit_epoch": epoch, "fit_batches": batches,
                "accumulate_grad_batches": trainer.accumulate_grad_batches}

    # --- resuming ----------------------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = dict(state_dict)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not self._loaders and trainer.num_training_batches:
            raise RuntimeError(f"ReproducibleCallback did not see the train dataloader: this Lightning "
                               f"({pl.__version__}) did not pass it through Strategy.process_dataloader. It supports "
                               "Lightning 2.1 to 2.6.")
        saved, self._saved = self._saved, None
        if trainer.ckpt_path is None:
            return
        if saved is None:
            raise _resume_error(trainer, "holds no ReproducibleCallback state: it was saved without torchrepro's "
                                "ReproducibleCallback in Trainer(callbacks=[...]) (or with weights_only=True), so "
                                "the RNG states and the data position needed to continue bit for bit are missing.",
                                "Resume from a checkpoint saved with the callback, or remove ReproducibleCallback "
                                "to resume the way Lightning does without it (not bit for bit).")
        damaged = _state_problems(saved) or self._damaged_positions()
        if damaged:
            raise _resume_error(trainer, "holds a ReproducibleCallback state that is damaged or was written by "
                                "another version: " + "; ".join(damaged) + ".", _DAMAGED)
        source = f"{trainer.ckpt_path} (RNG states)"
        try:
            states = [RNGState.from_dict(entry, source=source) for entry in saved["rng"]]
            for state in states:
                state.check(source=source)
        except StateFileError as exc:
            raise _resume_error(trainer, f"holds damaged RNG states in its ReproducibleCallback state ({exc.problem})"
                                ".", _DAMAGED) from None
        data = self._data_problems(trainer, saved)  # a collective under DDP: before any rank's own refusal
        problems = self._config_problems(trainer, saved) + data
        if problems:
            action = ("Resume with the settings of the run that saved it (seed, devices, batch size, gradient "
                      "accumulation, dataset), or start a new run without ckpt_path.")
            if data:
                action = ("Resume with the data the checkpoint was trained on (the same samples and transforms); to "
                          "train these weights on other data, load them without ckpt_path (e.g. "
                          "YourModule.load_from_checkpoint(path)) and start a new fit. " + action)
            raise _resume_error(trainer, "cannot be continued bit for bit by this run: " + "; ".join(problems) + ".",
                                action)
        self._rng_to_restore, self._resume_pending = states[trainer.global_rank], True
        self._saved_position = self._position_at_save(saved)

    def _position_at_save(self, saved: dict[str, Any]) -> tuple[int, int]:
        """(Lightning's epoch, batches it had fetched in it) at the save; from train loader 0 in older states."""
        if "fit_batches" in saved:
            return saved["fit_epoch"], saved["fit_batches"]
        pending = self._loaders[0].pending if self._loaders else None
        return (pending["epoch"], pending["batches_consumed"]) if pending else (0, 0)

    def _data_problems(self, trainer: Any, saved: dict[str, Any]) -> list[str]:
        """Every train dataset whose fingerprinted samples differ from the saving run's (every rank's, so that
        all ranks refuse together). A dataset fingerprinted in neither run is logged, not compared."""
        saved_data = saved.get("data")
        if self.data_samples == 0 or saved["world_size"] != trainer.world_size:  # off; or refused for the latter
            return []
        if saved_data is None:  # a state written before data fingerprints
            log.warning("torchrepro: %s holds no data fingerprints (saved by an older torchrepro): the data of this "
                        "run are not compared with the checkpoint's", trainer.ckpt_path)
            return []
        mine = []
        for loader, then in zip(self._loaders, saved_data[trainer.global_rank]):
            indices = then["indices"]  # the samples the saving run read (it may have read more or fewer)
            fits = bool(indices) and max(indices) < len(cast(Sized, loader.dataset))
            mine.append(_data_fingerprint(loader.dataset, indices) if fits and indices != loader.data["indices"]
                        else loader.data)
        now = [json.loads(t) for t in _gather_text(trainer, json.dumps(mine))]
        problems = []
        for rank, (then_rank, now_rank) in enumerate(zip(saved_data, now)):
            where = f" on rank {rank}" if trainer.world_size > 1 else ""
            for i, (then, current) in enumerate(zip(then_rank, now_rank)):
                if then["digest"] is None or current["digest"] is None:
                    if rank == trainer.global_rank:
                        log.warning("torchrepro: the data of train dataloader %d%s are not compared with the "
                                    "checkpoint's: %s", i, where, then["note"] or current["note"])
                elif then["indices"] == current["indices"] and then["digest"] != current["digest"]:
                    problems.append(f"train dataloader {i}{where} data: samples {_listed(then['indices'])} of its "
                                    f"dataset differ from the saving run's (fingerprint saved {then['digest']}, this "
                                    f"run {current['digest']})")
        return problems

    def _damaged_positions(self) -> list[str]:
        """Saved positions that no run could have written (more batches consumed than an epoch has)."""
        problems = []
        for i, loader in enumerate(self._loaders):
            pending = loader.pending
            if pending is None:
                continue
            per_epoch = pending.get("batches_per_epoch")
            if isinstance(per_epoch, int) and pending["batches_consumed"] > per_epoch:
                problems.append(f"train dataloader {i} consumed {pending['batches_consumed']} batches of an epoch of "
                                f"{per_epoch}")
        return problems

    def _config_problems(self, trainer: Any, saved: dict[str, Any]) -> list[str]:
        """Every difference between the saving run and this one."""
        problems = []
        if saved["seed"] != self.seed:
            problems.append(f"seed: saved {saved['seed']!r}, this run {self.seed!r}")
        if saved["world_size"] != trainer.world_size:
            problems.append(f"world size: saved {saved['world_size']!r}, this run {trainer.world_size!r}")
        if saved["train_loaders"] != len(self._loaders):
            problems.append(f"train dataloaders: saved {saved['train_loaders']!r}, this run {len(self._loaders)}")
        accumulate = saved.get("accumulate_grad_batches", trainer.accumulate_grad_batches)  # absent: older state
        if accumulate != trainer.accumulate_grad_batches:
            problems.append(f"accumulate_grad_batches: saved {accumulate!r}, this run "
                            f"{trainer.accumulate_grad_batches!r}")
        for i, loader in enumerate(self._loaders):
            if loader.pending is None:
                problems.append(f"train dataloader {i}: Lightning did not hand back the data position the checkpoint "
                                "holds (it restores a loader's position only when it resumes an unfinished epoch; a "
                                "fit that stopped at max_steps in the middle of an epoch is resumed as finished "
                                "unless this fit runs under max_steps too: pass max_steps, and a max_epochs large "
                                "enough)")
                continue
            mine = _loader_config(loader.loader)
            problems += [f"train dataloader {i} {key}: saved {loader.pending.get(key)!r}, this run {mine[key]!r}"
                         for key in _LOADER_KEYS if loader.pending.get(key) != mine[key]]
        return problems

    def _before_first_batch(self) -> None:
        """At the first batch after a resume: replay every train loader's consumed batches, restore the RNGs.

        Whether the save fell between two training steps is judged on Lightning's count of the batches it had
        fetched in its epoch (saved with the RNG states), not on a loader's own position: with several train
        loaders a short one is cycled (``max_size_cycle``) or exhausted (``max_size``) and counts otherwise.
        """
        if not self._resume_pending:
            return
        self._resume_pending = False
        trainer = self._trainer
        ready = _epoch_loop_ready(trainer)
        (epoch, fetched), self._saved_position = self._saved_position or (0, ready), None
        mid_epoch = fetched < trainer.num_training_batches
        # Lightning resumes after the batches it had completed: all it had fetched, or (saved at the end of the
        # epoch, from on_train_batch_end) none of the next epoch. A save inside a step, the epoch's last included,
        # leaves that step's batch fetched but not completed.
        if fetched != ready and (mid_epoch or ready != 0):
            raise _resume_error(trainer, f"was saved after batch {fetched} of epoch {epoch} had been fetched, but "
                                f"Lightning resumes after batch {ready}: the checkpoint was saved in the middle of a "
                                "training step.",
                                "Save from on_train_batch_end (as ModelCheckpoint does) or after fit returns.")
        accumulate = trainer.accumulate_grad_batches
        if mid_epoch and fetched % accumulate:
            raise _resume_error(trainer, f"was saved after batch {fetched} of epoch {epoch}, in the middle of a "
                                f"gradient accumulation (accumulate_grad_batches={accumulate}): the gradients of "
                                f"the last {fetched % accumulate} batch(es) are not in the checkpoint, so the "
                                "resumed run would step without them.",
                                "Save at an optimizer step (ModelCheckpoint(every_n_train_steps=...) does), "
                                "or resume from such a checkpoint.")
        for i, loader in enumerate(self._loaders):
            loader_epoch, _ = loader.position()
            replayed = loader.replay(epoch_over=not mid_epoch)
            log.info("torchrepro: train dataloader %d resumes its pass %d after %d replayed batches", i, loader_epoch,
                     replayed)
        rng, self._rng_to_restore = self._rng_to_restore, None
        if rng is not None:
            rng.restore(source=f"{trainer.ckpt_path} (RNG states)")


def _state_problems(saved: Any) -> list[str]:
    """What is wrong with the callback state of a checkpoint (format, version, fields), as sentences."""
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        got = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        return [f"its ReproducibleCallback state has format {got!r}, expected {FORMAT!r}"]
    if saved.get("version") != VERSION:
        return [f"its ReproducibleCallback state has version {saved.get('version')!r}; this torchrepro reads "
                f"version {VERSION}"]
    missing = [k for k in ("seed", "world_size", "train_loaders", "rng") if k not in saved]
    if missing:
        return [f"its ReproducibleCallback state lacks {', '.join(missing)}"]
    if not isinstance(saved["rng"], list) or len(saved["rng"]) != saved["world_size"]:
        return [f"its ReproducibleCallback state holds RNG states for {len(saved['rng'])} rank(s), expected "
                f"{saved['world_size']}" if isinstance(saved["rng"], list) else
                "its ReproducibleCallback rng field is not a list"]
    problems = []
    if "fit_batches" in saved or "fit_epoch" in saved:
        for key in ("fit_epoch", "fit_batches"):
            value = saved.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"its ReproducibleCallback state has {key}={value!r}, expected a non-negative integer")
    data = saved.get("data")
    if data is not None:
        if not isinstance(data, list) or len(data) != saved["world_size"] or not all(
                isinstance(rank, list) and len(rank) == saved["train_loaders"] for rank in data):
            problems.append(f"its ReproducibleCallback data field is not one list of {saved['train_loaders']!r} data "
                            f"fingerprint(s) per rank for {saved['world_size']!r} rank(s)")
        else:
            problems += [f"its ReproducibleCallback data fingerprint of train dataloader {i} on rank {r} {problem}"
                         for r, rank in enumerate(data) for i, entry in enumerate(rank)
                         if (problem := _data_entry_problem(entry))]
    return problems


def _quiet(dataloader: object, seed: int | None) -> None:
    """Give an evaluation DataLoader its own generator, so that iterating it (validation in the middle of
    training) draws nothing from the global torch RNG, which would shift dropout after a resume."""
    if not isinstance(dataloader, torch.utils.data.DataLoader) or dataloader.generator is not None:
        return
    gen = torch.Generator().manual_seed(derive_seed(seed or 0, "lightning", "evaluation"))
    dataloader.generator = gen
    for obj in _samplers(dataloader):
        if hasattr(obj, "generator") and obj.generator is None:
            obj.generator = gen
