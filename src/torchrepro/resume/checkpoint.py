"""Checkpoints that resume training bit for bit, and say so loudly when they cannot.

A checkpoint is one ``torch.save`` file holding only tensors and plain Python values, so it loads with
``torch.load(weights_only=True)`` (no arbitrary unpickling)::

    {"format": "torchrepro.checkpoint", "version": 1, "step": int, "extra": ...,
     "model": state_dict, "optimizer": state_dict | None, "scheduler": state_dict | None,
     "scaler": state_dict | None, "data": loader.state_dict() | None,
     "classes": {"optimizer": "module:QualName", ...},  # the class of each component saved (optional)
     "rng": RNGState.to_json() as a JSON string, "env": {"torch": ..., "device_kind": ...}}

Example:
    >>> torchrepro.save_checkpoint("ckpt.pt", model=model, optimizer=opt, loader=loader, step=100)  # doctest: +SKIP
    >>> torchrepro.load_checkpoint("ckpt.pt", model=model, optimizer=opt, loader=loader)["step"]  # doctest: +SKIP
    100

Sharded training (FSDP2, tensor parallel: parameters and optimizer state that are DTensors) is checkpointed per
rank: each rank saves its own file (``ckpt/rank{R}.pt``) holding its DTensors (each its local shard and its
placements) and their layouts (``"layouts"``: placements, mesh shape, this rank's coordinate, global shape), and
loads its own file back on the same mesh. Before anything is restored every DTensor's saved layout is checked
against the model's: another rank's file, another mesh or world size, a sharded file into an unsharded model (or
the reverse) is refused by name (:class:`ShardedStateError`), saying to load each rank's own file on the same mesh
or to checkpoint with ``torch.distributed.checkpoint`` (DCP), which reshards (:data:`DCP_RECIPE`).
"""

from __future__ import annotations

import importlib
import io
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch

from .._core.dtensor import describe_layout, dtensor_type, layout
from .._core.errors import CheckpointError, MissingGeneratorError, ReproWarning, StateFileError
from .._core.io import atomic_write, disk_error, disk_problem
from ..control.rng import RNGState, parse_state
from .data import ResumableLoader

FORMAT = "torchrepro.checkpoint"
VERSION = 1
COMPONENTS = ("model", "optimizer", "scheduler", "scaler", "data")
_WHAT = {"optimizer": "optimizer state", "scheduler": "LR-scheduler state", "scaler": "GradScaler state",
         "data": "data position (loader state)", "model": "model state"}


DCP_RECIPE = (
    "checkpoint with torch.distributed.checkpoint (DCP), which reshards, on every rank: "
    "`from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict`; to save, "
    "`model_sd, optim_sd = get_state_dict(model, optimizer)` and `dcp.save({\"model\": model_sd, \"optimizer\": "
    "optim_sd}, checkpoint_id=FOLDER)` (each rank writes its shards into FOLDER); to resume, build the model and "
    "optimizer as before, `state = dict(zip((\"model\", \"optimizer\"), get_state_dict(model, optimizer)))`, "
    "`dcp.load(state, checkpoint_id=FOLDER)`, `set_state_dict(model, optimizer, model_state_dict=state[\"model\"], "
    "optim_state_dict=state[\"optimizer\"])`. Keep each rank's RNG state and data position in the same state under a "
    "key of its own (f\"rank{rank}\": DCP keeps one copy of a key every rank saves). See docs/distributed.md, "
    "\"Checkpoint and resume\".")


class ShardedStateError(CheckpointError):
    """A checkpoint whose DTensors (FSDP2, tensor parallel) are not this rank's shards of the model passed to
    load_checkpoint (another rank's file, another mesh, a sharded file into an unsharded model or the reverse):
    refused before anything is restored; the message says what to load, or how to use DCP instead."""


def _dtensors(state: Any, prefix: str, found: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``(name, DTensor)`` of every DTensor in a (nested) state dict, depth first."""
    cls = dtensor_type()
    if cls is None:
        return found
    if isinstance(state, cls):
        found.append((prefix, state))
    elif isinstance(state, Mapping):
        for key, value in state.items():
            _dtensors(value, f"{prefix}.{key}" if prefix else str(key), found)
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            _dtensors(value, f"{prefix}.{i}" if prefix else str(i), found)
    return found


def _layouts(states: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{name: layout}`` of every DTensor in ``states`` (``{"model": ..., "optimizer": ...}``), names such as
    ``model.fc1.weight`` and ``optimizer.state.0.exp_avg``."""
    return {name: layout(t) or {} for name, t in _dtensors({k: v for k, v in states.items() if v is not None}, "", [])}


_LAYOUT_KEYS = ("placements", "mesh_shape", "coordinate", "shape")  # what makes a shard the same shard


def _layout_text(lay: Mapping[str, Any] | None) -> str:
    return "a plain tensor" if lay is None else f"{describe_layout(lay)}, global shape {list(lay.get('shape') or [])}"


def _sharding_problems(data: dict[str, Any], model: torch.nn.Module, optimizer: Any) -> list[str]:
    """Every DTensor whose saved layout is not the one it would be loaded into: another rank's shard, another mesh
    or placements, a shard where the model holds a plain tensor or the reverse. The optimizer's DTensors need their
    saved layout too; they are not compared one by one (a fresh optimizer has none): they follow their parameters',
    which the model's are."""
    given: dict[str, Any] = {"model": model.state_dict()}
    saved_states: dict[str, Any] = {"model": data.get("model")}
    if optimizer is not None:
        saved_states["optimizer"] = data.get("optimizer")
    saved = {name for name, _ in _dtensors({k: v for k, v in saved_states.items() if v is not None}, "", [])}
    recorded = data.get("layouts")
    recorded = recorded if isinstance(recorded, Mapping) else {}
    mine = _layouts(given)
    problems = []
    for name in sorted(set(saved) | set(mine), key=lambda n: (not n.startswith("model."), n)):
        if name in saved and not isinstance(recorded.get(name), Mapping):
            problems.append(f"{name}: a DTensor saved without its layout (not by this torchrepro's save_checkpoint): "
                            "which shard it holds is unknown")
            continue
        if name.startswith("optimizer."):
            continue  # no layout to compare with in a fresh optimizer: its parameter's (the model's) is compared
        want, have = recorded.get(name) if name in saved else None, mine.get(name)
        a, b = ({k: lay.get(k) for k in _LAYOUT_KEYS} if lay is not None else None for lay in (want, have))
        if a != b:
            other = (" (another rank's shard)" if a and b and a["coordinate"] != b["coordinate"]
                     and all(a[k] == b[k] for k in ("placements", "mesh_shape", "shape")) else "")
            problems.append(f"{name}: {_layout_text(want)} in the checkpoint, {_layout_text(have)} in the model"
                            f"{other}")
    return problems


def _device_kind() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _state_of(name: str, obj: Any) -> dict[str, Any] | None:
    if obj is None:
        return None
    fn = getattr(obj, "state_dict", None)
    if fn is None:
        hint = " Wrap your data in torchrepro.ResumableLoader." if name == "data" else ""
        raise TypeError(f"{name}={type(obj).__name__} has no state_dict(); it cannot be checkpointed.{hint}")
    return cast("dict[str, Any]", fn())


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
    generators: Mapping[str, Any] | None = None,
) -> Path:
    """Save everything needed to continue training bit for bit; atomic (a crash leaves the old file intact).

    ``loader`` must have ``state_dict()`` (use :class:`torchrepro.ResumableLoader`). ``extra`` must hold only
    tensors and plain Python values, so that the checkpoint loads with ``weights_only=True``. ``generators``
    (by name) are saved with the registered ones; pass the same names to :func:`load_checkpoint`. A model or
    optimizer whose state holds DTensors (FSDP2, tensor parallel) is saved per rank: call it on every rank with a
    file of that rank's own (``ckpt/rank{R}.pt``); the layouts of its shards are saved with them.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    _check_safe_extra(extra)
    model_state, optimizer_state = model.state_dict(), _state_of("optimizer", optimizer)
    layouts = _layouts({"model": model_state, "optimizer": optimizer_state})  # this rank's shards: which they are
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "extra": extra,
        "model": model_state,
        "optimizer": optimizer_state,
        "scheduler": _state_of("scheduler", scheduler),
        "scaler": _state_of("scaler", scaler),
        "data": _state_of("data", loader),
        "classes": {name: _class_name(obj) for name, obj in
                    (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler), ("data", loader))
                    if obj is not None},
        "rng": json.dumps(RNGState.capture(generators).to_json()),
        "env": {"torch": str(torch.__version__), "device_kind": _device_kind()},
    }
    if layouts:
        payload["layouts"] = layouts
    path = Path(path)
    existed = path.is_file()
    try:
        atomic_write(path, lambda f: torch.save(payload, f), clean_stale=True)
    except OSError as exc:
        raise _write_error(path, exc, existed) from exc
    return path


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint that could not be written (no space, a size limit, a quota...); the old file is intact.

    Also an :class:`OSError` with the ``errno`` of the failed write.
    """


def _write_error(path: Path, exc: OSError, existed: bool) -> CheckpointWriteError:
    written = getattr(exc, "bytes_written", None)
    after = f" (the write failed after {written} bytes of the new checkpoint)" if written is not None else ""
    kept = f"The previous checkpoint at {path} is intact." if existed else f"Nothing was written at {path}."
    action = ("Free space on that disk (or raise the file-size limit or quota), or save elsewhere, then save "
              "again." if disk_error(exc) else "Check that the directory exists and is writable, then save again.")
    err = CheckpointWriteError(path, f"could not be saved: {disk_problem(exc)}{after}. {kept}", action)
    err.errno = exc.errno
    return err


def _load(path: Path) -> Any:
    """``torch.load(weights_only=True)``; a rank's file of sharded training holds DTensors, which the safe loader
    reads only once ``torch.distributed.tensor`` is imported: imported then (not before: it is slow to import)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        if "torch.distributed.tensor" not in str(exc) or not torch.distributed.is_available():
            raise
    importlib.import_module("torch.distributed.tensor")
    return torch.load(path, map_location="cpu", weights_only=True)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load and validate a checkpoint file safely (``weights_only=True``) without applying it."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(path, "is a directory, not a checkpoint file.",
                              "Pass the path of a file written by save_checkpoint().")
    if not path.is_file():
        raise CheckpointError(path, "does not exist.", "Check the path, or save one with save_checkpoint().")
    try:
        data = _load(path)
    except Exception as exc:  # a corrupt archive fails anywhere in torch.load (KeyError, AttributeError...)
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        unsafe = [ln for ln in lines if "Unsupported global" in ln]
        first = (unsafe or lines or [type(exc).__name__])[0]
        raise CheckpointError(path, f"cannot be read: it is corrupt, truncated, or holds objects that are not safe "
                              f"to load ({first[:200]}).",
                              "Use an earlier checkpoint; a checkpoint interrupted mid-write never replaces "
                              "the previous one.") from None
    fmt = data.get("format") if isinstance(data, dict) else None
    if not isinstance(fmt, str) or fmt != FORMAT:
        got = _short(fmt) if isinstance(data, dict) else type(data).__name__
        keys = f" (keys: {sorted(map(str, data))[:6]})" if isinstance(data, dict) else ""
        raise CheckpointError(path, f"is not a torchrepro checkpoint: format {got}{keys}, expected {FORMAT!r}.",
                              "Save it with torchrepro.save_checkpoint() to get RNG and data state too.")
    version = data.get("version")
    if type(version) is not int or version != VERSION:
        raise CheckpointError(path, f"has checkpoint format version {_short(version)}; this torchrepro "
                              f"reads version {VERSION}.", "Upgrade torchrepro or re-create the checkpoint.")
    problem = _metadata_problem(data)
    if problem:
        raise CheckpointError(path, f"has a corrupt {problem}; nothing was restored.",
                              "Use an earlier checkpoint, or re-create it with save_checkpoint().")
    return cast("dict[str, Any]", data)


def _short(value: Any) -> str:
    """``repr(value)``, bounded: a huge integer or a long text must not flood (or break) a message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (str, int, float, type(None))):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    return _a(type(value).__name__)


def _a(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _metadata_problem(data: dict[str, Any]) -> str | None:
    """The first of ``step``, ``env`` and ``classes`` whose type is wrong, as "'field' field: ..."; or None."""
    step = data.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        got = _short(step) if isinstance(step, int) and not isinstance(step, bool) else _a(type(step).__name__)
        return f"'step' field: {got}, expected a non-negative integer"
    for name in ("env", "classes"):
        value = data.get(name)
        if value is not None and not isinstance(value, Mapping):
            return f"{name!r} field: {_a(type(value).__name__)}, expected a dict"
    for component, cls in (data.get("classes") or {}).items():
        if not isinstance(cls, str):
            return (f"'classes' field: the class of {_short(component)} is {_a(type(cls).__name__)}, expected a "
                    "'module:QualName' string")
    return None


def _shown(value: Any) -> str:
    return value[:80] if isinstance(value, str) else _short(value)


def _class_name(obj: Any) -> str:
    return f"{type(obj).__module__}:{type(obj).__qualname__}"


def _model_problems(saved: Any, model: torch.nn.Module) -> list[str]:
    """Every key, shape and dtype by which the saved model state differs from ``model``'s, in full."""
    if not isinstance(saved, Mapping):
        return [f"model: the saved state is a {type(saved).__name__}, expected a state_dict"]
    mine = model.state_dict()
    problems = []
    missing = [k for k in mine if k not in saved]
    unexpected = [k for k in saved if k not in mine]
    if missing:
        problems.append(f"model: {len(missing)} key(s) of the model missing from the checkpoint: {missing}")
    if unexpected:
        problems.append(f"model: {len(unexpected)} unexpected key(s) in the checkpoint: {unexpected}")
    for key, mine_t in mine.items():
        saved_t = saved.get(key)
        if not isinstance(mine_t, torch.Tensor) or key not in saved:
            continue
        if not isinstance(saved_t, torch.Tensor):
            problems.append(f"model: {key!r} is a {type(saved_t).__name__} in the checkpoint, a tensor in the model")
        elif isinstance(mine_t, torch.nn.parameter.UninitializedTensorMixin):  # type: ignore[attr-defined]
            continue  # a lazy module takes the saved shape
        elif saved_t.shape != mine_t.shape:
            problems.append(f"model: shape of {key!r} is {list(saved_t.shape)} in the checkpoint, "
                            f"{list(mine_t.shape)} in the model")
        elif saved_t.dtype != mine_t.dtype:
            problems.append(f"model: dtype of {key!r} is {saved_t.dtype} in the checkpoint, {mine_t.dtype} in the "
                            "model (loading would round the values)")
    return problems


_BOOKKEEPING = {"params", "param_names", "initial_lr"}  # param-group keys that are not the optimizer's settings


# per-parameter optimizer state that has the parameter's shape (torch.optim's names; most others reuse them)
_PARAM_SHAPED = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "exp_inf", "sum", "square_avg",
                 "acc_delta", "grad_avg", "prev", "step_size", "ax"}
_SCALAR_STATE = {"step", "eta", "mu", "mu_product"}  # per-parameter state that is one number


def _optimizer_problems(saved: Any, saved_class: str | None, optimizer: Any, model: torch.nn.Module,
                        saved_model: Any) -> list[str]:
    """Class, parameter groups, settings and per-parameter state by which ``saved`` does not fit ``optimizer``."""
    if saved_class and saved_class.split(":")[-1] != type(optimizer).__qualname__:
        return [f"optimizer: the checkpoint holds the state of a {saved_class.replace(':', '.')} but a "
                f"{_class_name(optimizer).replace(':', '.')} was passed (loading it would change its settings)"]
    groups = saved.get("param_groups") if isinstance(saved, Mapping) else None
    if not isinstance(groups, list) or not isinstance(saved.get("state"), Mapping) or \
            not all(isinstance(g, Mapping) and isinstance(g.get("params"), list) for g in groups):
        return ["optimizer: the saved state is not an optimizer state_dict (state and param_groups)"]
    mine = optimizer.state_dict()["param_groups"]
    problems = _group_problems(groups, mine)
    if not saved_class:  # a checkpoint from before classes were saved: foreign settings betray another class
        known = set().union(*(g.keys() for g in mine)) | _BOOKKEEPING
        foreign = sorted({str(k) for g in groups for k in g if k not in known})
        if foreign:
            problems.append(f"optimizer: the checkpoint's parameter groups have settings {foreign} that a "
                            f"{type(optimizer).__name__} does not have; it was saved from another optimizer class")
    bad_ids = [i for i, g in enumerate(groups) if not all(type(p) is int for p in g["params"])]
    problems += [f"optimizer: group {i} lists parameter ids {_listing(groups[i]['params'])}, expected integers"
                 for i in bad_ids]
    if bad_ids:
        return problems
    ids = {p for g in groups for p in g["params"]}
    strays = sorted((k for k in saved["state"] if k not in ids), key=str)
    if strays:
        problems.append(f"optimizer: the checkpoint has state for parameter ids {_listing(strays)} that are in no "
                        "group")
    if not problems:  # groups line up: each saved id has the parameter it would load into
        problems += _param_state_problems(groups, saved["state"], optimizer, model, saved_model)
    return problems


def _listing(values: list[Any]) -> str:
    text = repr(values) if all(isinstance(v, (int, list)) for v in values) else f"{len(values)} value(s)"
    return text if len(text) <= 200 else text[:197] + "..."


def _group_problems(groups: list[Any], mine: list[dict[str, Any]]) -> list[str]:
    """Group count, parameters per group, and settings of another kind (``lr`` a string...)."""
    if len(groups) != len(mine):
        return [f"optimizer: {len(groups)} parameter group(s) in the checkpoint, {len(mine)} in the optimizer"]
    problems = []
    saved_sizes, my_sizes = [len(g["params"]) for g in groups], [len(g["params"]) for g in mine]
    if saved_sizes != my_sizes:
        problems.append(f"optimizer: parameters per group are {saved_sizes} in the checkpoint, {my_sizes} in "
                        "the optimizer")
    for i, (group, my_group) in enumerate(zip(groups, mine)):
        problems += [f"optimizer: group {i} setting {p}" for p in _kind_problems(group, my_group, "optimizer")
                     if not p.startswith(tuple(map(repr, _BOOKKEEPING)))]
    return problems


def _param_state_problems(groups: list[Any], state: Mapping[Any, Any], optimizer: Any, model: torch.nn.Module,
                          saved_model: Any) -> list[str]:
    """Per-parameter state whose shape or type does not fit the parameter it would be loaded into.

    State that has the shape of the checkpoint's own tensor for that parameter, when the model's shape differs,
    is not listed: the model's mismatch already is.
    """
    names = {id(p): name for name, p in model.named_parameters()}
    saved_model = saved_model if isinstance(saved_model, Mapping) else {}
    problems = []
    for gi, (group, my_group) in enumerate(zip(groups, optimizer.param_groups)):
        for j, (pid, param) in enumerate(zip(group["params"], my_group["params"])):
            entry = state.get(pid)
            if entry is None:
                continue
            label = f"group {gi}, parameter {j}"
            named = f"{label} ({names[id(param)]!r})" if id(param) in names else label
            if not isinstance(entry, Mapping):
                problems.append(f"optimizer: {named}: saved state is {_a(type(entry).__name__)}, expected a dict")
                continue
            wrong, shapes = _entry_problems(entry, param)
            problems += [f"optimizer: {named}: {w}" for w in wrong]
            own = saved_model.get(names.get(id(param)))
            if isinstance(own, torch.Tensor) and own.shape != param.shape and \
                    all(sh.endswith(f" {list(own.shape)}") for sh in shapes):
                continue
            if shapes:
                who = f"{label} is {names[id(param)]!r}" if id(param) in names else label
                problems.append(f"optimizer: {who} of shape {list(param.shape)} but its saved state has "
                                f"{', '.join(shapes)}")
    return problems


def _entry_problems(entry: Mapping[Any, Any], param: torch.Tensor) -> tuple[list[str], list[str]]:
    """(type problems, "key [shape]" of param-shaped state whose shape is not the parameter's)."""
    wrong, shapes = [], []
    for key, value in entry.items():
        if key in _SCALAR_STATE:
            if isinstance(value, torch.Tensor) and value.numel() != 1:
                wrong.append(f"saved state {key!r} has shape {list(value.shape)}, expected a single number")
            elif not isinstance(value, (int, float, torch.Tensor)):
                wrong.append(f"saved state {key!r} is {_a(type(value).__name__)}, expected a number")
        elif key in _PARAM_SHAPED and value is not None:
            if not isinstance(value, torch.Tensor):
                wrong.append(f"saved state {key!r} is {_a(type(value).__name__)}, expected a tensor")
            elif value.shape != param.shape:
                shapes.append(f"{key} {list(value.shape)}")
    return wrong, shapes


def _kind(value: Any) -> str | None:
    """A value's kind for comparing settings: numbers (bool, int, float, one-element tensor) are alike."""
    if value is None:
        return None
    if isinstance(value, (bool, int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        return "number"
    if isinstance(value, (list, tuple)):
        return "sequence"
    return "dict" if isinstance(value, Mapping) else type(value).__name__


def _kind_problems(saved: Mapping[Any, Any], mine: Mapping[str, Any], where: str) -> list[str]:
    """Keys both have whose values are of another kind in the checkpoint (a string where a number belongs)."""
    problems = []
    for key, value in mine.items():
        if key not in saved or value is None or (saved[key] is None and isinstance(value, bool)):
            continue
        theirs = saved[key]
        if _kind(theirs) != _kind(value):
            problems.append(f"{key!r} is {_a(type(theirs).__name__)} in the checkpoint, {_a(type(value).__name__)} "
                            f"in the {where}")
    return problems


def _component_problems(name: str, saved: Any, saved_class: str | None, obj: Any,
                        model: torch.nn.Module, saved_model: Any) -> list[str]:
    if name == "optimizer":
        return _optimizer_problems(saved, saved_class, obj, model, saved_model)
    if saved_class and saved_class.split(":")[-1] != type(obj).__qualname__:
        return [f"{name}: the checkpoint holds the state of a {saved_class.replace(':', '.')} but a "
                f"{_class_name(obj).replace(':', '.')} was passed"]
    if name == "data" and isinstance(obj, ResumableLoader):
        return _loader_problems(saved, obj)
    if not isinstance(saved, Mapping):
        return [f"{name}: the saved state is {_a(type(saved).__name__)}, expected a state_dict"]
    mine = obj.state_dict()
    if name == "scaler":
        missing = [k for k in mine if k not in saved]
        if missing:
            return [f"scaler: the saved state lacks {missing} (was it saved from a disabled GradScaler?)"]
    return [f"{name}: {p}" for p in _kind_problems(saved, mine, name)]


def _loader_problems(saved: Any, loader: ResumableLoader) -> list[str]:
    try:
        return [f"data: {p}" for p in loader.state_dict_problems(saved)]
    except (TypeError, ValueError, RuntimeError) as exc:  # e.g. a tensor where a number belongs
        return [f"data: the saved loader state is malformed ({type(exc).__name__}: {str(exc)[:120]})"]


def _fit_problems(data: dict[str, Any], given: dict[str, Any], rng: RNGState,
                  generators: Mapping[str, Any] | None, path: Path) -> list[str]:
    """Every way in which the checkpoint does not fit the objects passed (all checked, none restored)."""
    classes: Mapping[str, Any] = data.get("classes") if isinstance(data.get("classes"), Mapping) else {}  # type: ignore[assignment]
    problems = _model_problems(data["model"], given["model"])
    for name in ("optimizer", "scheduler", "scaler", "data"):
        if given[name] is not None:
            problems += _component_problems(name, data[name], classes.get(name), given[name], given["model"],
                                            data["model"])
    try:
        rng.check(generators, source=str(path))
    except (StateFileError, MissingGeneratorError) as exc:
        problems.append(f"RNG: {str(exc).removeprefix(f'{path}: ')}")
    return problems


def _apply(data: dict[str, Any], given: dict[str, Any], path: Path) -> None:
    """Load each component; if one still fails, put back the components already loaded."""
    done: list[tuple[Any, Any]] = []
    name = ""
    try:
        for name in ("data", "scheduler", "scaler", "optimizer"):  # cheap to snapshot, so they go first
            obj = given[name]
            if obj is not None:
                before = obj.state_dict()
                obj.load_state_dict(data[name])
                done.append((obj, before))
        name = "model"  # last: its old values are not kept (that would double its memory)
        given["model"].load_state_dict(data["model"])
    except Exception as exc:
        for obj, before in reversed(done):
            obj.load_state_dict(before)
        undone = "The model may be partly overwritten." if name == "model" else "Nothing was changed."
        raise CheckpointError(path, f"could not be loaded into the {name} passed ({type(exc).__name__}: {exc}).",
                              f"{undone} Build the objects exactly as in the run that saved it.") from exc


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    loader: Any = None,
    generators: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Restore model, optimizer, scheduler, scaler, data position and every RNG; return ``{"step", "extra"}``.

    Everything is checked before anything is restored: model keys, shapes and dtypes, the optimizer's class
    and parameter groups, the scheduler's and scaler's class, the loader's configuration and the RNG payload
    (including named ``generators``, see :func:`torchrepro.register_generator`). When anything does not fit,
    :class:`CheckpointError` names every mismatch and nothing is changed; it is also raised when the file is
    corrupt, foreign, or lacks a component the caller passed. Warns (:class:`ReproWarning`) when the torch
    version or device kind differs from the saving run, since bitwise equality is then not expected.
    """
    path = Path(path)
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
        rng = parse_state(json.loads(data["rng"]))
    except (TypeError, ValueError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
        raise CheckpointError(path, f"has a corrupt RNG state ({exc}); nothing was restored.",
                              "Use an earlier checkpoint.") from None
    sharding = _sharding_problems(data, model, optimizer)
    if sharding:
        listing = "".join(f"\n  - {p}" for p in sharding)
        raise ShardedStateError(path, f"does not hold this rank's shards of the model passed; nothing was restored. "
                                f"{len(sharding)} problem(s):{listing}\nLoad each rank's own file (saved by that "
                                "rank: rank{R}.pt) on the same device mesh, placements and number of ranks. To resume "
                                f"on another mesh or number of ranks: {DCP_RECIPE}")
    problems = _fit_problems(data, given, rng, generators, path)
    if problems:
        listing = "".join(f"\n  - {p}" for p in problems)
        raise CheckpointError(path, f"does not fit the objects passed; nothing was restored. {len(problems)} "
                              f"problem(s):{listing}\nBuild the model, optimizer, scheduler, scaler and loader "
                              "exactly as in the run that saved it, or do not pass the ones that differ.")
    env = data.get("env") or {}
    here = {"torch": str(torch.__version__), "device_kind": _device_kind()}
    changed = [f"{k} {_shown(env.get(k))} -> {v}" for k, v in here.items()
               if not isinstance(env.get(k), str) or env.get(k) != v]
    if changed:
        warnings.warn(f"{path}: saved with a different environment ({'; '.join(changed)}); training resumes, "
                      "but bitwise equality with the original run is not expected.", ReproWarning, stacklevel=2)
    _apply(data, given, path)
    rng.restore(generators, source=str(path))
    return {"step": data["step"], "extra": data.get("extra")}
