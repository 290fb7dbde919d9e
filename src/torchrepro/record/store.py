"""Run directories: the on-disk record of one training run.

A run directory holds::

    manifest.json      format, command, exit status, seed, flags, torch version, device, step count, timings
    trace.jsonl        one JSON object per event (init, backward, step, final), in order
    values/*.pt        optional parameter values (``torch.save`` of a flat {name: tensor} dict, weights only)
    stdout.txt, stderr.txt   the script's output, when captured by ``torchrepro check``

The manifest is written last, atomically: a directory without one is an incomplete run.
See docs/formats.md for every field.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
import re
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .._core.errors import RunDirError
from .._core.io import atomic_write_json
from .._core.readjson import check_fields, check_regular, describe, field_problems, read_json, read_jsonl

if TYPE_CHECKING:  # torch is imported where values are read: writing a manifest does not need it
    import torch

FORMAT = "torchrepro.run"
VERSION = 1
MANIFEST = "manifest.json"
TRACE = "trace.jsonl"
VALUES = "values"
# `check` also keeps gradients and optimizer state (values/grads_N.pt, values/state_N.pt) of the first steps, within
# the values budget, so that it can say how large their difference is while the parameters are still identical.
GRAD_VALUE_STEPS = 3
COMPARE_GRAD_STEPS = 16  # compare (two commands) keeps gradient and optimizer-state values of more steps
GRAD_VALUES_ENV = "TORCHREPRO_GRAD_VALUE_STEPS"  # how many steps' gradients the launched recorder keeps (default 0)
OPS = "ops.jsonl"
RANK_DIR = re.compile(r"rank\d+")  # one rank's directory in a run of several ranks (manifest 'ranks')


class TraceWriter:
    """Appends events to ``trace.jsonl`` one line at a time (flushed, so a killed run keeps what it had)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / VALUES).mkdir(exist_ok=True)
        self._f: IO[str] | None = open(self.dir / TRACE, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.records = 0

    def write(self, event: dict[str, Any]) -> None:
        if self._f is None:  # detached: a forked child's events never reach the parent's trace
            return
        self._f.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._f.flush()
        self.records += 1

    def detach(self) -> None:
        """Write nothing more, without flushing or closing (in a forked child: the file is the parent's)."""
        self._f = None

    def close(self) -> None:
        if self._f is not None and not self._f.closed:
            self._f.close()


MODEL_INPUTS = "model-inputs"  # an event's "batches_source" when its batches are the inputs of the model's forward

_AGAIN = "Record the run again with `torchrepro run --record DIR -- ...`."

# The JSON types of the event fields that readers use (absent fields pass; see docs/formats.md).
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "kind": ("string",), "t": ("number",), "n": ("int",), "opt": ("int",), "step": ("int",), "name": ("string",),
    "params": ("object of strings or nulls",), "grads": ("object of strings or nulls",),
    "state": ("object of strings or nulls",), "batches": ("list",), "losses": ("list of objects",),
    "loss": ("object",), "lr": ("list",), "value": ("hex float string",),
    # check --resume-at (Recorder(resume_marks=True, boundary_after=N)): RNG states, sample indices, state before
    "rng": ("object of strings or nulls",), "state_before": ("object of strings or nulls",),
    "batch_indices": ("list",), "after_step": ("int",),
    # batches that are the inputs of the model's forward (no DataLoader batch in the step), and whose forward
    "batches_source": ("string",), "input_modules": ("list of strings",),
    # DTensors (FSDP2, tensor parallel): {kind: {name: layout or null}}, written when a layout changes (_core/dtensor)
    "layouts": ("object",),
    # the sharded DTensor parameters whose local shard is constant (_core/dtensor.constant_shards)
    "constant": ("list of strings",),
    # a random draw of a distributed run's first steps (record/draws): "kind": "draw"
    "during_step": ("int",), "op": ("string",), "site": ("string",), "i": ("int",), "fp": ("string",),
    "const": ("bool",), "in": ("string", "null"), "layout": ("object", "null"),
}
# One DTensor's layout (see _core/dtensor.py); lists of ints are checked by _layout_problems.
LAYOUT_FIELDS: dict[str, tuple[str, ...]] = {
    "placements": ("list of strings",), "mesh_shape": ("list",), "mesh_dim_names": ("list of strings", "null"),
    "coordinate": ("list", "null"), "mesh_id": ("string",), "shape": ("list",),
}
LAYOUT_KINDS = ("params", "grads", "state")
LOSS_FIELDS: dict[str, tuple[str, ...]] = {"fp": ("string", "null"), "value": ("hex float string", "null")}
# Fields each kind of event must have (its readers index them).
EVENT_REQUIRED: dict[str, tuple[str, ...]] = {"backward": ("loss",), "metric": ("name", "value")}


def event_problems(event: Any) -> list[str]:
    """What is wrong with one trace event, as sentences (empty when its fields can be trusted)."""
    if not isinstance(event, dict):
        return [f"it holds {describe(event)}, expected an object"]
    problems = field_problems(event, EVENT_FIELDS)
    kind = event.get("kind")
    missing = [name for name in EVENT_REQUIRED.get(kind, ()) if name not in event] if isinstance(kind, str) else []
    problems += [f"a {kind!r} event needs '{name}'" for name in missing]
    losses: list[Any] = event.get("losses") if isinstance(event.get("losses"), list) else []  # type: ignore[assignment]
    loss = [event["loss"]] if isinstance(event.get("loss"), dict) else []
    for entry in [*losses, *loss]:
        if isinstance(entry, dict):
            problems += field_problems(entry, LOSS_FIELDS, prefix="loss.")
    if isinstance(event.get("layouts"), dict):
        problems += _layout_problems(event["layouts"])
    return problems


def _int_list(v: Any) -> bool:
    return isinstance(v, list) and all(type(x) is int for x in v)


def _layout_problems(layouts: dict[str, Any]) -> list[str]:
    """What is wrong with an event's ``layouts`` ({kind: {name: layout or null}}), as sentences."""
    problems: list[str] = []
    for kind, named in layouts.items():
        if kind not in LAYOUT_KINDS or not isinstance(named, dict):
            problems.append(f"'layouts.{kind}' is {describe(named)}, expected an object under one of "
                            f"{', '.join(LAYOUT_KINDS)}")
            continue
        for name, lay in named.items():
            where = f"layouts.{kind}[{name!r}]."
            if lay is None:
                continue
            if not isinstance(lay, dict):
                problems.append(f"'{where[:-1]}' is {describe(lay)}, expected an object or null")
                continue
            problems += field_problems(lay, LAYOUT_FIELDS, prefix=where)
            problems += [f"'{where}{key}' is {describe(lay[key])}, expected a list of ints"
                         for key in ("mesh_shape", "coordinate", "shape")
                         if isinstance(lay.get(key), list) and not _int_list(lay[key])]
            if not isinstance(lay.get("placements"), list) or not isinstance(lay.get("mesh_shape"), list):
                problems.append(f"'{where[:-1]}' needs 'placements' and 'mesh_shape'")
            elif len(lay["placements"]) != len(lay["mesh_shape"]):
                problems.append(f"'{where[:-1]}' has {len(lay['placements'])} placements for a mesh of "
                                f"{len(lay['mesh_shape'])} dimensions")
            if problems:
                return problems[:3]
    return problems


def read_trace_lines(run_dir: str | Path) -> tuple[list[dict[str, Any]], bool]:
    """Events of a trace file and whether its last line was cut off (a killed run); RunDirError if unusable.

    Every event is checked: an object whose fields have the types of :data:`EVENT_FIELDS`.
    """
    path = Path(run_dir) / TRACE
    if not os.path.lexists(path):
        return [], False
    return read_jsonl(path, error=RunDirError, action=_AGAIN, check=event_problems, what="a valid event")


def write_manifest(run_dir: str | Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write ``manifest.json`` (format and version first) atomically; return what was written."""
    full = {"format": FORMAT, "version": VERSION, **manifest}
    atomic_write_json(Path(run_dir) / MANIFEST, full)
    return full


@dataclass
class Run:
    """A loaded, validated run directory."""

    path: Path
    manifest: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == kind]

    @property
    def step_mode(self) -> str:
        return str(self.manifest.get("step_mode", "optimizer"))

    def steps(self) -> list[dict[str, Any]]:
        """The step records: optimizer steps, or backward calls when the script has no optimizer."""
        return self.of_kind("step" if self.step_mode == "optimizer" else "backward")

    def values(self, name: str, *, mmap: bool = False) -> dict[str, torch.Tensor] | None:
        """Saved parameter values ``values/<name>.pt`` (e.g. ``init``, ``step_000003``, ``final``) or None.

        With ``mmap=True`` the tensors are memory-mapped, not read: cheap when only shapes and dtypes are needed.
        """
        path = self.path / VALUES / f"{name}.pt"
        if not path.exists():
            return None
        return load_values(path, mmap=mmap)


_WHOLE_DTENSORS = ("holds DTensors (FSDP2 or tensor-parallel tensors pickled whole), which values files do not hold: "
                   "it was recorded by a torchrepro that saved DTensors as they are; this one saves each rank's local "
                   "shard as a plain tensor.")
_AGAIN_DTENSORS = "Record the run again with this torchrepro."


def load_values(path: Path, *, mmap: bool = False) -> dict[str, torch.Tensor]:
    """A values file as ``{name: tensor}``, loaded without running pickled code; RunDirError if unusable."""
    import torch

    check_regular(path, error=RunDirError, action="Record the run again.")  # a FIFO would block, /dev/zero not end
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols it then refuses anyway
            warnings.simplefilter("ignore")
            # str: torch 2.1 memory-maps only a file given by name
            data = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
    except pickle.UnpicklingError:
        imports = _code_imports(path)
        if imports is None:  # not even a well-formed pickle stream: cut off or overwritten
            raise RunDirError(path, "cannot be read: it is not a valid torch.save file; it may be truncated or "
                              "corrupt.", "Record the run again.") from None
        if any(name.startswith("torch.distributed.tensor") for name in imports):
            raise RunDirError(path, _WHOLE_DTENSORS, _AGAIN_DTENSORS) from None
        imports = [name for name in imports if not name.startswith("torch.")]
        if not imports:
            raise RunDirError(path, "holds pickle data that the safe loader refused: it is not a plain dict of "
                              "tensors.", "Record the run again.") from None
        shown = ", ".join(imports[:3]) + (" ..." if len(imports) > 3 else "")
        raise RunDirError(path, f"holds pickle data that would import and call {shown} when loaded, i.e. run "
                          "code: torchrepro refused to load it (values files hold only plain dicts of tensors).",
                          "Do not open this file with pickle or any loader that runs code; delete it and record "
                          "the run again from a trusted source.") from None
    except Exception as exc:
        text = str(exc) if "weights_only" not in str(exc) else ""  # never repeat torch's advice to unpickle code
        detail = f" ({type(exc).__name__}: {text})" if text else f" ({type(exc).__name__})"
        raise RunDirError(path, f"cannot be read{detail}; it may be truncated or corrupt.",
                          "Record the run again.") from None
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        got = type(data).__name__ if not isinstance(data, dict) else "dict with non-tensor values"
        raise RunDirError(path, f"holds a {got}, expected a dict of tensors.", "Record the run again.")
    if any(type(v).__name__ == "DTensor" for v in data.values()):  # loaded where torch.distributed.tensor is imported
        raise RunDirError(path, _WHOLE_DTENSORS, _AGAIN_DTENSORS)
    for name, t in data.items():  # a sparse gradient (nn.Embedding(sparse=True)) is compared as the dense tensor
        if t.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
            data[name] = t.to_dense()
    odd = {name: why for name, why in ((k, _not_dense(v)) for k, v in data.items()) if why}
    if odd:
        shown = ", ".join(f"{name} ({why})" for name, why in list(odd.items())[:3]) + (" ..." if len(odd) > 3 else "")
        raise RunDirError(path, f"holds tensors that cannot be compared by value: {shown}; values files hold dense "
                          "tensors with data (the recorder saves parameters that way).",
                          "Record the run again with torchrepro, or leave this file out of the run directory.")
    return data


def _not_dense(t: torch.Tensor) -> str | None:
    """Why ``t`` is not a dense tensor with data (another layout, meta, quantized), or None."""
    import torch

    if t.layout != torch.strided:
        return f"{str(t.layout).replace('torch.', '')} layout"
    if t.is_meta:
        return "a meta tensor, which holds no data"
    if t.is_quantized:
        return "quantized"
    return None


# Globals that torch.save writes for plain tensors; anything else in a refused file is code to run on load.
_TENSOR_GLOBAL_PREFIXES = ("torch.", "collections.OrderedDict", "_codecs.encode")
# torch's own, but refused by the safe loader: DTensors (and their meshes) pickled whole
_SUBCLASS_GLOBAL_PREFIXES = ("torch.distributed.tensor", "torch.distributed.device_mesh")


def _code_imports(path: Path) -> list[str] | None:
    """The non-tensor globals a refused pickle would import, read with ``pickletools`` (which executes nothing).

    None when the file holds no well-formed pickle stream (truncated or corrupt rather than unsafe).
    """
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                member = next((n for n in zf.namelist() if n.endswith("data.pkl")), None)
                if member is None:
                    return None
                data = zf.read(member)
        else:
            data = path.read_bytes()
    except (OSError, zipfile.BadZipFile, RuntimeError):
        return None
    stream = io.BytesIO(data)
    found: list[str] = []
    parsed = False
    while stream.tell() < len(data):  # the legacy format holds several pickles in a row, then raw bytes
        strings: list[str] = []
        try:
            for op, arg, _ in pickletools.genops(stream):
                if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                    strings.append(str(arg))
                elif op.name in ("GLOBAL", "INST"):
                    found.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL":
                    found.append(f"{strings[-2]}.{strings[-1]}" if len(strings) >= 2 else "an unnamed global")
        except Exception:  # noqa: BLE001 - any parse failure means: not a well-formed pickle from here on
            break
        parsed = True
    if not parsed:
        return None
    return list(dict.fromkeys(g for g in found if not g.startswith(_TENSOR_GLOBAL_PREFIXES)
                              or g.startswith(_SUBCLASS_GLOBAL_PREFIXES)))


def load_run(run_dir: str | Path, *, allow_ranks: bool = False) -> Run:
    """Read and validate a run directory; raise :class:`RunDirError` naming the problem.

    The directory of a run of several ranks (``RUN/manifest.json`` lists ``ranks``, each recorded in ``RUN/rankR``)
    is refused unless ``allow_ranks``; :func:`load_ranks` loads its ranks.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise RunDirError(path, "is not a directory.", "Pass a directory written by `torchrepro run --record DIR`.")
    mpath = path / MANIFEST
    if not os.path.lexists(mpath):
        raise RunDirError(path, f"has no {MANIFEST}: it is not a run directory, or the run did not finish.",
                          "Pass a directory written by `torchrepro run --record DIR`.")
    manifest = read_manifest(mpath)
    if manifest.get("ranks") and not allow_ranks:
        first = path / str(manifest["ranks"][0])
        raise RunDirError(path, f"is a run of {len(manifest['ranks'])} ranks (torchrun); each rank's recording is "
                          f"in its own directory ({', '.join(map(str, manifest['ranks'][:4]))}).",
                          f"Pass one rank's directory, e.g. {first}.")
    events, _ = read_trace_lines(path)
    expected = manifest.get("trace_records")
    if expected != len(events):
        raise RunDirError(path / TRACE, f"has {len(events)} complete records but the manifest lists {expected}; "
                          "the trace is truncated or was modified.", "Record the run again.")
    return Run(path=path, manifest=manifest, events=events)


# The JSON types of the manifest fields that readers use (absent fields pass; see docs/formats.md).
MANIFEST_FIELDS: dict[str, tuple[str, ...]] = {
    "format": ("string",), "version": ("int",), "command": ("list of strings",), "trace_records": ("int",),
    "step_mode": ("string",), "steps": ("int",), "fingerprint_algorithm": ("string", "null"),
    "device": ("string", "null"), "environment": ("object",), "audit_probe": ("object", "null"),
    "ranks": ("list of strings",), "rank_status": ("object",), "failed_rank": ("int", "null"),
    "unreplicated": ("list of strings",), "values_error": ("string", "null"), "values_failed": ("list",),
    "compiled": ("list of objects",), "stopped": ("object", "null"),
}
STEP_MODES = ("optimizer", "backward")
# Each ``compiled`` region (see compiled.py): the fields that compare.region_text and the compile checks index.
COMPILED_FIELDS: dict[str, tuple[str, ...]] = {
    "index": ("int",), "target": ("string",), "param_prefix": ("string", "null"), "module_path": ("string", "null"),
    "file": ("string", "null"), "line": ("int", "null"),
}


def read_manifest(mpath: Path) -> dict[str, Any]:
    """A run's ``manifest.json``, checked: format, version, and the types of :data:`MANIFEST_FIELDS`."""
    manifest = read_json(mpath, error=RunDirError, action="Record the run again.")
    got = manifest.get("format") if isinstance(manifest, dict) else manifest
    if got != FORMAT:
        what: int | str = repr(got) if isinstance(got, str) and len(got) <= 40 else describe(got)
        raise RunDirError(mpath, f"has format {what}, expected {FORMAT!r}.",
                          "Pass a directory written by `torchrepro run --record DIR`.")
    version = manifest.get("version")
    if not (type(version) is int and version == VERSION):
        what = version if type(version) is int and len(str(version)) <= 24 else describe(version)
        raise RunDirError(mpath, f"has format version {what}; this torchrepro reads version {VERSION}.",
                          "Use the torchrepro version that recorded it, or record again.")
    action = "The manifest is corrupt or was edited: record the run again."
    check_fields(manifest, MANIFEST_FIELDS, source=mpath, error=RunDirError, action=action)
    problems = _manifest_value_problems(manifest)
    if problems:
        raise RunDirError(mpath, f"has fields of the wrong value: {'; '.join(problems[:3])}.", action)
    return manifest


def _manifest_value_problems(manifest: dict[str, Any]) -> list[str]:
    """Values of the right JSON type that readers still cannot use: rank names, step modes, compiled regions."""
    problems = [f"'ranks' names {describe(r)}, expected rank0, rank1, ..." for r in manifest.get("ranks") or []
                if not RANK_DIR.fullmatch(r)][:1]
    if manifest.get("step_mode", STEP_MODES[0]) not in STEP_MODES:
        problems.append(f"'step_mode' is {describe(manifest['step_mode'])}, expected one of {', '.join(STEP_MODES)}")
    for i, region in enumerate(manifest.get("compiled") or []):
        problems += [f"'compiled[{i}]' has no '{name}'" for name in ("index", "target") if name not in region]
        problems += field_problems(region, COMPILED_FIELDS, prefix=f"compiled[{i}].")
    return problems


def load_ranks(run_dir: str | Path) -> tuple[Run, list[Run]]:
    """A run of several ranks: its own manifest (as a :class:`Run` without events) and each rank's run.

    A run of several nodes is read from its node manifests (``nodeN/manifest.json``, one per node): from one
    directory that every node recorded into (a shared file system), or from each node's own directory, given
    joined by ``os.pathsep`` (``A_node0:A_node1``); every rank of the run must be found."""
    paths = split_run_dirs(run_dir)
    runs = [load_run(p, allow_ranks=True) for p in paths]
    run = runs[0]
    for r in runs:
        if not isinstance(r.manifest.get("ranks"), list) or not r.manifest["ranks"]:
            raise RunDirError(r.path, "is not a run of several ranks (its manifest lists no ranks).",
                              "Pass a directory written by `torchrepro run --nproc-per-node N --record DIR`.")
    if len(runs) == 1 and int(run.manifest.get("nnodes") or 1) == 1:
        return run, [load_run(run.path / str(name)) for name in run.manifest["ranks"]]
    found: dict[str, Path] = {}
    nnodes = run.manifest.get("nnodes")
    for r in runs:
        for name in node_ranks(r.path, nnodes) or r.manifest["ranks"]:
            if name in found and found[name] != r.path:
                raise RunDirError(r.path, f"holds {name}, which {found[name]} holds too.",
                                  "Pass each node's directory once.")
            found[name] = r.path
    world = run.manifest.get("world_size")
    missing = [f"rank{i}" for i in range(world)] if isinstance(world, int) else []
    missing = [name for name in missing if name not in found]
    if missing:
        given = os.pathsep.join(str(p) for p in paths)
        raise RunDirError(Path(given), f"is part of a run of {run.manifest.get('nnodes')} nodes ({world} ranks): "
                          f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} not found in it.",
                          "Record every node into one shared directory, or pass every node's directory joined by "
                          f"'{os.pathsep}' (e.g. A_node0{os.pathsep}A_node1).")
    names = sorted(found, key=lambda name: int(name[4:]))
    nodes = sorted({m.parent.name for r in runs for m in r.path.glob("node*/" + MANIFEST)
                    if re.fullmatch(r"node\d+", m.parent.name)
                    and (not isinstance(nnodes, int) or int(m.parent.name[4:]) < nnodes)}, key=lambda n: int(n[4:]))
    merged = Run(path=run.path, manifest={**run.manifest, "ranks": names, **({"nodes": nodes} if nodes else {})},
                 events=run.events)
    return merged, [load_run(found[name] / name) for name in names]


def split_run_dirs(run_dir: str | Path) -> list[Path]:
    """``A`` or ``A_node0:A_node1`` (``os.pathsep``) as directories; a path that exists is never split."""
    text = str(run_dir)
    if os.pathsep not in text or os.path.exists(text):
        return [Path(text)]
    return [Path(p) for p in text.split(os.pathsep) if p]


def node_ranks(path: Path, nnodes: Any = None) -> list[str]:
    """The ranks that the node manifests (``nodeN/manifest.json``) in run directory ``path`` list (only nodes
    ``N < nnodes`` when given: a node manifest of an earlier, larger run recorded there is not this run's)."""
    names: list[str] = []
    for mpath in sorted(path.glob("node*/" + MANIFEST)):
        found = re.fullmatch(r"node(\d+)", mpath.parent.name)
        if found and (not isinstance(nnodes, int) or int(found.group(1)) < nnodes):
            names += [str(r) for r in read_manifest(mpath).get("ranks") or []]
    return list(dict.fromkeys(names))
