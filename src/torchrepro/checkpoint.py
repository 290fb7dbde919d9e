"""Checkpoints that resume training bit for bit, and say so loudly when they cannot (layer L1).

A checkpoint is one ``torch.save`` file holding only tensors and plain Python values, so it loads with
``torch.load(weights_only=True)`` (no arbitrary unpickling)::

    {"format": "torchrepro.checkpoint", "version": 1, "step": int, "extra": ...,
     "model": state_dict, "optimizer": state_dict | None, "scheduler": state_dict | None,
     "scaler": state_dict | None, "data": loader.state_dict() | None,
     "rng": RNGState.to_dict() as a JSON string, "env": {"torch": ..., "device_kind": ...}}

Example:
    >>> torchrepro.save_checkpoint("ckpt.pt", model=model, optimizer=opt, loader=loader, step=100)  # doctest: +SKIP
    >>> torchrepro.load_checkpoint("ckpt.pt", model=model, optimizer=opt, loader=loader)["step"]  # doctest: +SKIP
    100
"""

from __future__ import annotations

import io
import json
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from ._io import atomic_write
from .errors import CheckpointError, ReproWarning
from .rng import RNGState

FORMAT = "torchrepro.checkpoint"
VERSION = 1
COMPONENTS = ("model", "optimizer", "scheduler", "scaler", "data")
_WHAT = {"optimizer": "optimizer state", "scheduler": "LR-scheduler state", "scaler": "GradScaler state",
         "data": "data position (loader state)", "model": "model state"}


def _device_kind() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _state_of(name: str, obj: Any) -> dict[str, Any] | None:
    if obj is None:
        return None
    fn = getattr(obj, "state_dict", None)
    if fn is None:
        hint = " Wrap your data in torchrepro.ResumableLoader." if name == "data" else ""
        raise TypeError(f"{name}={type(obj).__name__} has no state_dict(); it cannot be checkpointed.{hint}")
    return fn()


def _check_safe_extra(extra: Any) -> None:
    """Refuse ``extra`` values that a ``weights_only`` load would reject, before anything is written."""
    if extra is None:
        return
    buf = io.BytesIO()
    torch.save(extra, buf)
    buf.seek(0)
    try:
        torch.load(buf, weights_only=True)
    except Exception as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "Unsupported global" in ln] or [type(exc).__name__]
        raise TypeError(f"extra={type(extra).__name__} holds objects that cannot be loaded safely ({lines[0][:160]}); "
                        "keep extra to tensors, numbers, strings, lists and dicts.") from None


def save_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    loader: Any = None,
    step: int,
    extra: Any = None,
) -> Path:
    """Save everything needed to continue training bit for bit; atomic (a crash leaves the old file intact).

    ``loader`` must have ``state_dict()`` (use :class:`torchrepro.ResumableLoader`). ``extra`` must hold only
    tensors and plain Python values, so that the checkpoint loads with ``weights_only=True``.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    _check_safe_extra(extra)
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "extra": extra,
        "model": model.state_dict(),
        "optimizer": _state_of("optimizer", optimizer),
        "scheduler": _state_of("scheduler", scheduler),
        "scaler": _state_of("scaler", scaler),
        "data": _state_of("data", loader),
        "rng": json.dumps(RNGState.capture().to_dict()),
        "env": {"torch": str(torch.__version__), "device_kind": _device_kind()},
    }
    path = Path(path)
    atomic_write(path, lambda f: torch.save(payload, f))
    return path


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load and validate a checkpoint file safely (``weights_only=True``) without applying it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "does not exist.", "Check the path, or save one with save_checkpoint().")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, ValueError, OSError) as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        unsafe = [ln for ln in lines if "Unsupported global" in ln]
        first = (unsafe or lines or [type(exc).__name__])[0]
        raise CheckpointError(path, f"cannot be read: it is corrupt, truncated, or holds objects that are not safe "
                              f"to load ({first[:200]}).",
                              "Use an earlier checkpoint; a checkpoint interrupted mid-write never replaces "
                              "the previous one.") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        keys = f" (keys: {sorted(map(str, data))[:6]})" if isinstance(data, dict) else ""
        raise CheckpointError(path, f"is not a torchrepro checkpoint: format {got!r}{keys}, expected {FORMAT!r}.",
                              "Save it with torchrepro.save_checkpoint() to get RNG and data state too.")
    if data.get("version") != VERSION:
        raise CheckpointError(path, f"has checkpoint format version {data.get('version')!r}; this torchrepro "
                              f"reads version {VERSION}.", "Upgrade torchrepro or re-create the checkpoint.")
    return data


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    loader: Any = None,
) -> dict[str, Any]:
    """Restore model, optimizer, scheduler, scaler, data position and every RNG; return ``{"step", "extra"}``.

    Raises :class:`CheckpointError` when the file is corrupt, foreign, or lacks a component the caller
    passed; everything is checked before anything is restored. Warns (:class:`ReproWarning`) when the torch
    version or device kind differs from the saving run, since bitwise equality is then not expected.
    """
    data = read_checkpoint(path)
    given = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler, "data": loader}
    for name, obj in given.items():
        if obj is not None and data.get(name) is None:
            raise CheckpointError(path, f"has no {_WHAT[name]}, but a {name} was passed to load_checkpoint.",
                                  f"Save it with save_checkpoint(..., {'loader' if name == 'data' else name}=...), "
                                  "or do not pass it when loading.")
    if not data.get("rng"):
        raise CheckpointError(path, "has no RNG state, so training cannot continue bit for bit.",
                              "Save checkpoints with torchrepro.save_checkpoint().")
    try:
        rng = RNGState.from_dict(json.loads(data["rng"]), source=str(path))
    except json.JSONDecodeError as exc:
        raise CheckpointError(path, f"has a corrupt RNG state ({exc}).", "Use an earlier checkpoint.") from None
    env = data.get("env") or {}
    here = {"torch": str(torch.__version__), "device_kind": _device_kind()}
    changed = [f"{k} {env.get(k)} -> {v}" for k, v in here.items() if env.get(k) != v]
    if changed:
        warnings.warn(f"{path}: saved with a different environment ({'; '.join(changed)}); training resumes, "
                      "but bitwise equality with the original run is not expected.", ReproWarning, stacklevel=2)
    try:
        model.load_state_dict(data["model"])
        for name in ("optimizer", "scheduler", "scaler", "data"):
            if given[name] is not None:
                given[name].load_state_dict(data[name])
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(path, f"does not fit the objects passed ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:300]}).",
                              "Build the model/optimizer exactly as in the run that saved it.") from None
    rng.restore(source=str(path))
    return {"step": data["step"], "extra": data.get("extra")}
