"""``torchrepro check --resume-at K``, the side of the recorded script (layer L3): when to checkpoint, stop and
resume, for Lightning and transformers ``Trainer`` scripts (no code change) and for scripts with their own loop.

``check --resume-at K`` runs the script three times: straight through (phase ``straight``), to step K and a
checkpoint (phase ``stop``), and in a fresh process that resumes from that checkpoint (phase ``resume``).

Trainers, with no code change (``Trainer.fit``/``Trainer.train`` are wrapped when their module is imported,
whatever callbacks the trainer already has):

- **Lightning** (``lightning.pytorch`` and ``pytorch_lightning``): in the stop phase a callback calls
  ``trainer.save_checkpoint(path)`` at the end of the batch whose optimizer step is step K, then ends the script;
  in the resume phase ``fit(..., ckpt_path=path)`` is called instead of ``fit(...)``.
- **transformers** ``Trainer``: in the stop phase a callback sets ``control.should_save`` and
  ``control.should_training_stop`` at step K, and points ``args.output_dir`` at torchrepro's checkpoint directory
  for the rest of that ``train()`` call, so the Trainer writes its own ``checkpoint-K`` there (never into the
  script's ``output_dir``, where the user's own ``checkpoint-K`` may already be, and where its checkpoint rotation
  would delete the user's older ones); in the resume phase ``train(resume_from_checkpoint=that directory)`` is
  called, and a ``ReproducibleCallback`` is told that directory (``callback.resume_from``).

Scripts with their own loop read where they are (:func:`resume_point`, or the environment variables):

- stop phase: ``TORCHREPRO_RESUME_AT=K`` and ``TORCHREPRO_CHECKPOINT=PATH``: save the checkpoint to ``PATH``
  (a file or a directory) after step K; torchrepro ends the script as its next step begins (or it exits itself);
- resume phase: ``TORCHREPRO_RESUME_FROM=PATH``: load that checkpoint and train on.

Under torchrun every rank gets the same variables (one ``PATH`` for all: rank 0 writes a file there, or each rank
writes its own file into a folder there) and every rank's recorder ends it as its step K+1 begins, before the
``backward()`` whose gradient all-reduce would wait for the others: the ranks stop at the same point of the
program, and no rank waits in a collective for one that has stopped. In the stop phase the paths the script gives
``torch.save`` are noted (``script_saves``): a script that saves a checkpoint of its own (a minGPT-style
``snapshot.pt``) but not where torchrepro asked is told which file it wrote and what to change.

Sharded training (FSDP2, DTensor) checkpoints with ``torch.distributed.checkpoint`` (DCP): every rank calls
``dcp.save(state, checkpoint_id=rp.checkpoint)`` (a folder: each rank writes its shards there) and ``dcp.load``
from ``rp.resume_from``. DCP's ``get_state_dict``/``set_state_dict`` give a fresh optimizer its state with an
``optimizer.step()`` of learning rate 0 (``_init_optim_state``); in all three phases that call is wrapped so that
the recorder does not count it as a step (:func:`unrecorded_steps`).

Outside ``check --resume-at`` none of the variables is set and nothing is wrapped.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import inspect
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.patches import Patches
from .settings import ResumeMarks, ValueSettings

if TYPE_CHECKING:  # the parent (check) reads the names below without importing torch
    from .recorder import Recorder

RESUME_AT_ENV = "TORCHREPRO_RESUME_AT"
CHECKPOINT_ENV = "TORCHREPRO_CHECKPOINT"
RESUME_FROM_ENV = "TORCHREPRO_RESUME_FROM"
ENV_NAMES = (RESUME_AT_ENV, CHECKPOINT_ENV, RESUME_FROM_ENV)
PHASES = ("straight", "stop", "resume")
FACTS_KEY = "resume_at"  # the child's summary (manifest) field

# module -> (trainer kind, patch); the module is patched as soon as it has been executed
_LIGHTNING = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")
_TRANSFORMERS = ("transformers.trainer",)
_DCP_STATE_DICT = "torch.distributed.checkpoint.state_dict"  # get_state_dict / set_state_dict
_SAVES_SHOWN = 8  # paths given to torch.save noted in the stop phase (the latest step of each)
_ATOMIC_TMP = re.compile(r"\.(.+)\.torchrepro-\d+-\w+\.tmp")  # _core.io.atomic_write's file: the name it becomes


@dataclass(frozen=True)
class ResumePoint:
    """Where a script run by ``torchrepro check --resume-at K`` is: what :func:`resume_point` returns.

    - ``step``: K in the process that is to checkpoint and stop (else ``None``);
    - ``checkpoint``: where that process saves its checkpoint (a file or a directory; else ``None``);
    - ``resume_from``: in the restarted process, the checkpoint to load before training on (else ``None``).

    Outside ``check --resume-at`` all three are ``None`` and :meth:`due` is always False.
    """

    step: int | None = None
    checkpoint: Path | None = None
    resume_from: Path | None = None

    def due(self) -> bool:
        """True once step K is done in the process that is to checkpoint (call it after each optimizer step).

        Counts the steps the way ``check`` does (optimizer steps; ``backward()`` calls when the script has no
        ``torch.optim`` optimizer), so gradient accumulation needs no arithmetic in the script."""
        from .recorder import current_recorder

        rec = current_recorder()
        return self.step is not None and rec is not None and rec.completed_steps() >= self.step


def resume_point() -> ResumePoint:
    """Where ``torchrepro check --resume-at K`` has this process: checkpoint after step K, resume, or neither.

    Outside ``check --resume-at`` there is nothing to do:

    >>> import torchrepro
    >>> rp = torchrepro.resume_point()
    >>> rp.step, rp.checkpoint, rp.resume_from, rp.due()
    (None, None, None, False)

    In a training loop (``load``/``save`` are the script's own)::

        rp = torchrepro.resume_point()
        start = load(rp.resume_from) if rp.resume_from else 0   # the restarted process
        for step in range(start, steps):
            train_step()
            if rp.due():                                          # after step K, in the process that stops
                save(rp.checkpoint)
    """
    step = os.environ.get(RESUME_AT_ENV, "")
    checkpoint = os.environ.get(CHECKPOINT_ENV) or None
    resume_from = os.environ.get(RESUME_FROM_ENV) or None
    return ResumePoint(int(step) if step.isdigit() else None, Path(checkpoint) if checkpoint else None,
                       Path(resume_from) if resume_from else None)


@dataclass
class ResumePlan:
    """What the child of one of ``check --resume-at``'s runs does (from ``LaunchOptions.resume_at``)."""

    phase: str  # straight | stop | resume
    step: int  # K
    checkpoint: str  # stop: where to save (a file for Lightning, a path for scripts); resume: what to load
    trainer: str | None = None  # "lightning" or "transformers" once the script called fit()/train()
    saved: str | None = None  # the checkpoint a trainer wrote (transformers: <checkpoint's folder>/checkpoint-K)
    saved_at_step: int | None = None
    resumed_from: str | None = None  # the checkpoint a trainer was told to resume from
    notes: list[str] = field(default_factory=list)
    recorder: Recorder | None = None
    saves: dict[str, int] = field(default_factory=dict)  # stop phase: path given to torch.save -> the step after
    patches: Patches = field(default_factory=Patches, repr=False)  # what install() replaced (uninstall() puts back)

    @classmethod
    def from_options(cls, config: dict[str, Any]) -> ResumePlan:
        phase, step = config.get("phase"), config.get("step")
        if (phase not in PHASES or not isinstance(step, int) or step < 1
                or phase != "straight" and not config.get("checkpoint")):  # never "": a save into the cwd
            raise ValueError(f"bad resume_at launch option {config!r}")
        return cls(phase=phase, step=step, checkpoint=str(config.get("checkpoint") or ""))

    def recorder_settings(self, values: ValueSettings) -> tuple[ValueSettings, ResumeMarks]:
        """The recorder's settings in this phase: marks everywhere; the RNG boundary where the resume happens; the
        stop after step K in the stop phase; ``values`` with its gradient snapshots from step K+1 in the straight
        run (the steps the resumed run compares), from step 1 in the others.

        >>> values, marks = ResumePlan("straight", 4, "").recorder_settings(ValueSettings(keep=True))
        >>> values.grad_start, marks
        (5, ResumeMarks(enabled=True, boundary_after=4, stop_after=None))
        """
        boundary = {"straight": self.step, "stop": None, "resume": 0}[self.phase]
        marks = ResumeMarks(enabled=True, boundary_after=boundary,
                            stop_after=self.step if self.phase == "stop" else None)
        return replace(values, grad_start=self.step + 1 if self.phase == "straight" else 1), marks

    def install(self, recorder: Recorder | None) -> ResumePlan:
        """Set the script's environment variables and wrap the trainers (now, or when they are imported)."""
        self.recorder = recorder
        for name in ENV_NAMES:
            os.environ.pop(name, None)
        if self.phase == "stop":
            os.environ[RESUME_AT_ENV] = str(self.step)
            os.environ[CHECKPOINT_ENV] = self.checkpoint
            self._watch_saves()
        elif self.phase == "resume":
            os.environ[RESUME_FROM_ENV] = self.checkpoint
        patches = {_DCP_STATE_DICT: self._patch_dcp}  # every phase: the three processes count steps alike
        if self.phase != "straight":
            patches.update({name: self._patch_lightning for name in _LIGHTNING})
            patches.update({name: self._patch_transformers for name in _TRANSFORMERS})
        _PatchOnImport.install(patches, self.patches)
        return self

    def uninstall(self) -> None:
        """Put back what :meth:`install` replaced (``torch.save``, DCP's optimizer-state initialisation, the import
        finder)."""
        self.patches.undo()

    def facts(self) -> dict[str, Any]:
        """What the manifest says about this phase (``resume_at``): the parent finds the checkpoint there."""
        checkpoint = self.saved or (self.checkpoint if self.phase == "stop" else None)
        exists = checkpoint is not None and os.path.exists(checkpoint)
        return {"phase": self.phase, "step": self.step, "trainer": self.trainer or "script",
                "checkpoint": os.path.abspath(checkpoint) if checkpoint else None,
                "checkpoint_written": exists if self.phase == "stop" else None,
                "saved_at_step": self.saved_at_step, "resumed_from": self.resumed_from or
                (self.checkpoint if self.phase == "resume" else None), "notes": self.notes,
                "script_saves": [{"path": p, "step": n} for p, n in self.saves.items()]}

    def _steps(self) -> int:
        return self.recorder.completed_steps() if self.recorder is not None else 0

    def _watch_saves(self) -> None:
        """Note the files the script saves with ``torch.save`` (path and step), outside torchrepro's checkpoint:
        when the checkpoint is not written, the error names the one the script wrote instead (``snapshot.pt``)."""
        import torch

        orig = torch.save
        if getattr(orig, "_torchrepro_saves", False):
            return
        plan, ours = self, os.path.abspath(self.checkpoint)

        @functools.wraps(orig)
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            path = _saved_path(f)
            if path is not None and path != ours and not path.startswith(ours + os.sep) and (
                    path in plan.saves or len(plan.saves) < _SAVES_SHOWN):
                plan.saves[path] = plan._steps()
            return orig(obj, f, *args, **kwargs)

        save._torchrepro_saves = True  # type: ignore[attr-defined]
        self.patches.set(torch, "save", save)
        self.patches.set(torch.serialization, "save", save)

    # --- torch.distributed.checkpoint (DCP) ----------------------------------------------------------------
    def _patch_dcp(self, module: Any) -> None:
        """DCP's ``get_state_dict``/``set_state_dict`` give an optimizer that has no state yet (the restarted
        process's, built afresh) its state by calling ``optimizer.step()`` with zero gradients and the learning rate
        0 (``_init_optim_state``): that is no training step, and the recorder must not count it, else the restarted
        process's steps are off by one and its optimizer's "state before its first step" is the empty one."""
        orig = getattr(module, "_init_optim_state", None)
        if orig is None or getattr(orig, "_torchrepro_unrecorded", False):
            return
        plan = self

        @functools.wraps(orig)
        def init_optim_state(optim: Any) -> Any:
            with unrecorded_steps(plan.recorder):
                return orig(optim)

        init_optim_state._torchrepro_unrecorded = True  # type: ignore[attr-defined]
        self.patches.set(module, "_init_optim_state", init_optim_state)

    # --- Lightning ----------------------------------------------------------------------------------------
    def _patch_lightning(self, module: Any) -> None:
        trainer_cls = getattr(module, "Trainer", None)
        if trainer_cls is None or getattr(trainer_cls.fit, "_torchrepro_resume_at", False):
            return
        package = module.__name__.split(".trainer.")[0]  # lightning.pytorch | pytorch_lightning
        plan, orig = self, trainer_cls.fit

        def fit(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            plan.trainer = "lightning"
            bound = inspect.signature(orig).bind(trainer, *args, **kwargs)
            if plan.phase == "stop":
                if not any(getattr(cb, "_torchrepro_stop", False) for cb in trainer.callbacks):
                    trainer.callbacks.append(plan._lightning_callback(package))
            elif plan.phase == "resume" and plan.resumed_from is None:
                given = bound.arguments.get("ckpt_path")
                if given is not None:
                    plan.notes.append(f"fit(ckpt_path={given!r}) was replaced by the checkpoint of step {plan.step}")
                bound.arguments["ckpt_path"] = plan.resumed_from = plan.checkpoint
            return orig(*bound.args, **bound.kwargs)

        fit._torchrepro_resume_at = True  # type: ignore[attr-defined]
        fit.__wrapped__ = orig  # type: ignore[attr-defined]
        trainer_cls.fit = fit

    def _lightning_callback(self, package: str) -> Any:
        callback_base = importlib.import_module(f"{package}.callbacks").Callback
        plan = self

        class _StopAtStep(callback_base):  # type: ignore[misc, valid-type]
            """Saves the trainer's own checkpoint once step K is done, then ends the script."""

            _torchrepro_stop = True

            def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
                if plan.saved is None and plan._steps() >= plan.step:
                    trainer.save_checkpoint(plan.checkpoint)
                    plan.saved, plan.saved_at_step = plan.checkpoint, plan._steps()
                    plan._stop()

        return _StopAtStep()

    # --- transformers -------------------------------------------------------------------------------------
    def _patch_transformers(self, module: Any) -> None:
        trainer_cls = getattr(module, "Trainer", None)
        if trainer_cls is None or getattr(trainer_cls.train, "_torchrepro_resume_at", False):
            return
        plan, orig = self, trainer_cls.train

        def train(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            plan.trainer = "transformers"
            bound = inspect.signature(orig).bind(trainer, *args, **kwargs)
            if plan.phase == "resume" and plan.resumed_from is None:
                given = bound.arguments.get("resume_from_checkpoint")
                if given not in (None, False):
                    plan.notes.append(f"train(resume_from_checkpoint={given!r}) was replaced by the checkpoint of "
                                      f"step {plan.step}")
                bound.arguments["resume_from_checkpoint"] = plan.resumed_from = plan.checkpoint
                _name_checkpoint(trainer, plan.checkpoint)
                return orig(*bound.args, **bound.kwargs)
            if plan.phase != "stop" or plan.saved is not None:
                return orig(*bound.args, **bound.kwargs)
            callback = plan._transformers_callback()
            trainer.add_callback(callback)
            output_dir = trainer.args.output_dir
            try:
                result = orig(*bound.args, **bound.kwargs)
            finally:
                trainer.remove_callback(callback)
                trainer.args.output_dir = output_dir  # the callback pointed it at torchrepro's folder at step K
            if callback.requested_at is not None:  # the Trainer saved <folder>/checkpoint-<global step> and stopped
                folder = os.path.join(callback.folder, f"checkpoint-{callback.requested_at}")
                plan.saved, plan.saved_at_step = folder, plan._steps()
                plan._stop()
            return result

        train._torchrepro_resume_at = True  # type: ignore[attr-defined]
        train.__wrapped__ = orig  # type: ignore[attr-defined]
        trainer_cls.train = train

    def _transformers_callback(self) -> Any:
        from transformers import TrainerCallback

        plan = self

        class _StopAtStep(TrainerCallback):  # type: ignore[misc]
            """Has the Trainer save its own checkpoint once step K is done, and stop training.

            The Trainer saves into ``args.output_dir/checkpoint-<step>`` (and then rotates the checkpoints there
            when ``save_total_limit`` is set): ``args.output_dir`` is pointed at torchrepro's own folder (new,
            empty) for the save and the rest of ``train()``, so nothing of the user's in the script's
            ``output_dir`` is written over or deleted; the callbacks' ``on_save`` (``ReproducibleCallback``'s
            state file) see the same folder. ``train``'s wrapper puts ``output_dir`` back."""

            requested_at: int | None = None
            folder = str(Path(plan.checkpoint).parent)

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
                if self.requested_at is None and plan._steps() >= plan.step:
                    self.requested_at = state.global_step
                    args.output_dir = self.folder
                    control.should_save = True
                    control.should_training_stop = True
                return control

        return _StopAtStep()

    def _stop(self) -> None:
        """End the script cleanly (as ``--max-steps`` does): the checkpoint of step K is written."""
        from .recorder import MaxStepsReached

        if self.recorder is not None:
            self.recorder.stopped = True
        raise MaxStepsReached()


@contextlib.contextmanager
def unrecorded_steps(recorder: Recorder | None) -> Iterator[None]:
    """Optimizer steps taken inside are not the training's (DCP's state initialisation): the recorder records
    nothing while its ``forked`` switch is on (the switch of a forked child, which records nothing), put back after.

    >>> with unrecorded_steps(None):  # no recorder: nothing to switch
    ...     pass
    """
    if recorder is None or recorder.forked:
        yield
        return
    recorder.forked = True
    try:
        yield
    finally:
        recorder.forked = False


def _saved_path(f: Any) -> str | None:
    """The file ``torch.save`` writes: a path, or an open file's name (``atomic_write``'s temporary file: the file it
    becomes); None for a buffer."""
    name = f if isinstance(f, (str, bytes, os.PathLike)) else getattr(f, "name", None)
    if not isinstance(name, (str, bytes, os.PathLike)):
        return None
    head, tail = os.path.split(os.fsdecode(name))
    found = _ATOMIC_TMP.fullmatch(tail)
    return os.path.abspath(os.path.join(head, found.group(1)) if found else os.path.join(head, tail))


def _name_checkpoint(trainer: Any, checkpoint: str) -> None:
    """Tell the trainer's ``ReproducibleCallback`` (if any) the checkpoint it resumes from: it is in torchrepro's
    folder, not in ``output_dir``, where the callback would look (and might find the user's own ``checkpoint-K``).

    The callback's module is looked up, not imported (a callback of that class means it is already imported)."""
    module = sys.modules.get("torchrepro.integrations.transformers")
    callback_cls = getattr(module, "ReproducibleCallback", None)
    if callback_cls is None:
        return
    for callback in getattr(getattr(trainer, "callback_handler", None), "callbacks", ()):
        if isinstance(callback, callback_cls):
            callback.resume_from(checkpoint)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after the named modules are executed (or now, if they already are)."""

    def __init__(self, patches: dict[str, Any]) -> None:
        self.patches = patches

    @classmethod
    def install(cls, patches: dict[str, Any], installed: Patches) -> None:
        pending = {}
        for name, patch in patches.items():
            module = sys.modules.get(name)
            if module is not None:
                patch(module)
            else:
                pending[name] = patch
        if pending:
            installed.insert(sys.meta_path, 0, cls(pending))

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Any) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package ... of the real loader
        return getattr(self.loader, name)
