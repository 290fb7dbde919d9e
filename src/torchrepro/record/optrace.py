"""An operation tracer: every ATen op with fingerprints of its inputs and outputs, module path, phase and
the user's source line.

Built on one ``TorchDispatchMode`` (one record per ATen op, below autograd). A forward or optimizer op's source
line is the innermost frame outside torch, torchrepro and (where the user's code is further out) the standard
library when the op runs. Autograd gives an op's outputs their node (``grad_fn``) only after the op returns, so
the tracer notes the node, in the node's own metadata, with the op's line and module when the next op starts; a
backward op then points to the forward line that created its node.

Example:
    >>> import collections, torch, torchrepro
    >>> model = torch.nn.Sequential(collections.OrderedDict(fc=torch.nn.Linear(4, 2)))
    >>> with torchrepro.trace_ops(model) as trace:
    ...     loss = model(torch.ones(3, 4)).sum(); loss.backward()
    >>> [(op["op"], op["phase"], op["module"]) for op in trace.ops if op["op"] in ("aten.addmm", "aten.mm")]
    [('aten.addmm', 'forward', 'fc'), ('aten.mm', 'backward', 'fc')]
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import sys
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import IO, Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from .._core.errors import RunDirError, StateFileError
from .._core.fingerprint import (
    UnfingerprintableError,
    check_fingerprintable,
    fingerprint_many,
    plain_cpu_fingerprint,
    small_cpu_fingerprint_at,
)
from .._core.modules import ModuleContext, discover_models
from .._core.ompteam import signals_deferred
from .._core.readjson import open_regular, read_jsonl
from .opvalues import OP_VALUES, OpValues
from .workdir import as_in_original, copy_of_from_env

# Ops that draw random numbers. In-place ones overwrite their first argument, whose old value does not matter.
RNG_OPS = frozenset({
    "aten.rand", "aten.rand_like", "aten.randn", "aten.randn_like", "aten.randint", "aten.randint_like",
    "aten.randperm", "aten.bernoulli", "aten.bernoulli_", "aten.normal", "aten.normal_", "aten.uniform_",
    "aten.random_", "aten.exponential_", "aten.geometric_", "aten.log_normal_", "aten.cauchy_",
    "aten.multinomial", "aten.native_dropout", "aten.poisson", "aten._standard_gamma", "aten.binomial",
    "aten.rrelu_with_noise", "aten._fused_dropout",
})
# Ops whose outputs are uninitialized memory: their bytes mean nothing until something writes them.
EMPTY_OPS = frozenset({"aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
                       "aten.new_empty_strided", "aten.empty_permuted"})
# Ops that resize their first argument in place: uninitialized when its storage grew (or it was before).
RESIZE_OPS = frozenset({"aten.resize_", "aten.resize_as_"})
UNINITIALIZED = "uninitialized"
# The input fingerprint of an ``out=`` argument that was uninitialized: the op writes it without reading it.
OVERWRITTEN = "overwritten"
_SKIP_OPS = frozenset({"aten.detach", "aten.alias", "prim.device", "aten.sym_size", "aten.sym_stride",
                       "aten.sym_numel", "aten.sym_storage_offset", "aten.is_same_size"})

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(__file__))  # the torchrepro package, every subpackage

_COPY_OF = copy_of_from_env()  # a run in a copy of the working directory names files as under the original


_INTERNAL_FILES: dict[str, bool] = {}  # file name -> whether it belongs to torch/torchrepro/the stdlib plumbing


def _is_internal(name: str) -> bool:
    internal = _INTERNAL_FILES.get(name)
    if internal is None:
        internal = (name.startswith(_TORCH_DIR) or name.startswith(_OWN_DIR) or name.startswith("<frozen")
                    or "/contextlib.py" in name or "/runpy.py" in name)
        if len(_INTERNAL_FILES) > 10_000:  # code made by exec() under ever new names: stay bounded
            _INTERNAL_FILES.clear()
        _INTERNAL_FILES[name] = internal
    return internal


_STDLIB_DIR = os.path.join(os.path.dirname(os.__file__), "")
_STDLIB_FILES: dict[str, bool] = {}  # file name -> whether it is in Python's standard library (not site-packages)


def _in_stdlib(name: str) -> bool:
    found = _STDLIB_FILES.get(name)
    if found is None:
        found = name.startswith(_STDLIB_DIR) and "-packages" not in name[len(_STDLIB_DIR):]
        if len(_STDLIB_FILES) > 10_000:  # code made by exec() under ever new names: stay bounded
            _STDLIB_FILES.clear()
        _STDLIB_FILES[name] = found
    return found


def _site_of(frame: FrameType | None) -> tuple[str, int, str] | None:
    """(file, line, code) of the innermost frame, from ``frame`` outwards, outside torch and torchrepro, and
    outside Python's standard library unless no frame further out is the user's (``copy.deepcopy(x)`` runs
    ``x.clone()`` from copy.py: the user's line is the deepcopy call)."""
    f = frame
    stdlib = None
    while f is not None:
        name = f.f_code.co_filename
        if not _is_internal(name):
            if not _in_stdlib(name):
                return name, f.f_lineno, ""
            if stdlib is None:
                stdlib = name, f.f_lineno, ""
        f = f.f_back
    return stdlib


_MAX_SOURCE_BYTES = 16 << 20  # a source file larger than this is not read for its line's text
_MAX_CODE_CHARS = 200  # the stored text of a source line
_MAX_OPS_BYTES = 4 << 30  # an ops.jsonl file (one traced step of a large model stays far below)


def _source_lines(path: str) -> list[str]:
    """The lines of a user's source file, or [] when it is not a readable regular file of sane size."""
    try:
        with open_regular(path) as f:
            data = f.read(_MAX_SOURCE_BYTES + 1)
    except (StateFileError, OSError, ValueError):  # not a regular file, unreadable; ValueError: a NUL in the name
        return []
    return [] if len(data) > _MAX_SOURCE_BYTES else data.decode("utf-8", errors="replace").splitlines()


def _code_line(path: str, line: int, cache: dict[str, list[str]]) -> str:
    """The stripped text of ``path``'s line ``line`` (at most ``_MAX_CODE_CHARS``), "" when unknown."""
    if path not in cache:
        if len(cache) > 10_000:  # code made by exec() under ever new names: stay bounded
            cache.clear()
        cache[path] = _source_lines(path)
    lines = cache[path]
    return lines[line - 1].strip()[:_MAX_CODE_CHARS] if 0 < line <= len(lines) else ""


def _tensors(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    if type(obj) in _LEAF_TYPES:  # most op arguments: numbers, dtypes, None (the hot path skips isinstance)
        return out
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors(x, out)
    elif isinstance(obj, Mapping):
        for x in obj.values():
            _tensors(x, out)
    return out


_LEAF_TYPES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                         torch.memory_format})


def _scalar_repr(value: Any) -> str:
    """A stable text for a non-tensor op result (numbers exactly; other objects by type only)."""
    if isinstance(value, float):
        return value.hex()
    if value is None or isinstance(value, (bool, int, complex, str)):
        return repr(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float)) for v in value):
        return repr([v.hex() if isinstance(v, float) else v for v in value])
    return f"<{type(value).__name__}>"


def _unchanged(t: torch.Tensor, last: list[tuple[torch.Tensor, int, int, str]]) -> str | None:
    """The fingerprint ``t`` had as an output of the previous op, if it is one and its version counter and data
    pointer are the same (an in-place op bumps the version after it returns: its outputs are hashed again)."""
    for held, version, ptr, fp in last:
        if held is t:
            try:
                return fp if t._version == version and t.data_ptr() == ptr else None
            except RuntimeError:
                return None
    return None


def _version(t: torch.Tensor) -> int:
    """The tensor's version counter, or -1 when it has none (inference tensors): never cached."""
    try:
        return t._version
    except RuntimeError:
        return -1


class _FpCache:
    """Fingerprints of tensors, reused while the memory they view is alive and unmodified.

    The key is what the bytes are (device, data pointer, dtype, shape, strides), not the Python object: autograd
    hands the same saved tensor to backward ops through new Python wrappers. An entry is valid while the storage
    is alive (a weak reference, so freed-and-reused memory never matches) and the version counter, which every
    in-place op bumps, is unchanged. The recorder clears the cache at each step boundary, since writes through
    ``.data`` do not bump the version counter.

    Small CPU tensors (``small_cpu_fingerprint_at``) are hashed again each time they are seen: that costs less
    than a lookup, and is never stale. The exception: memory marked uninitialized (``torch.empty``) keeps its
    mark until written, so while marks exist, a small tensor whose key has one is looked up first.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], tuple[Any, int, str]] = {}
        self._pending: list[tuple[torch.Tensor, str]] = []
        # The small outputs of the last op, with their version and data pointer when hashed: the next op's inputs
        # are mostly these very tensors. Emptied by every op once its inputs are hashed (see _Dispatch), so it
        # spans one op: only an op (which empties it) or a write the version counter does not see (through
        # ``.data``, as for the cache) could change them in between.
        self.last: list[tuple[torch.Tensor, int, int, str]] = []
        self._uninitialized: set[tuple[Any, ...]] = set()  # keys marked UNINITIALIZED and maybe not yet written

    @staticmethod
    def _key(t: torch.Tensor) -> tuple[Any, ...]:
        return (t.device, t.data_ptr(), t.dtype, t.shape, t.stride())

    def _marked(self, t: torch.Tensor) -> bool:
        try:
            return self._key(t) in self._uninitialized
        except Exception:  # no data pointer: the checked path says why
            return True

    def get(self, tensors: list[torch.Tensor], *, fresh: bool = False) -> list[str]:
        """Fingerprints of ``tensors``; ``fresh=True`` ignores cached values (for op outputs: an in-place op's
        version counter is bumped only after it returns, so a cached value could be stale)."""
        return self.outputs(tensors) if fresh else self.inputs(tensors)

    def inputs(self, tensors: list[torch.Tensor]) -> list[str]:
        """Fingerprints of an op's input tensors: the previous op's unchanged outputs keep theirs, small CPU
        tensors are hashed again, others are looked up in the cache (see :meth:`_checked`)."""
        out: list[str | None] = []
        todo: list[int] = []
        marks = self._uninitialized
        last = self.last
        for i, t in enumerate(tensors):
            if last:  # an output of the previous op, unchanged since: no need to hash it again
                fp = _unchanged(t, last)
                if fp is not None:
                    out.append(fp)
                    continue
            if not marks or not self._marked(t):
                found = small_cpu_fingerprint_at(t)
                if found is not None:
                    out.append(found[0])
                    continue
            fp = self._checked(t, False)
            if fp is None:
                todo.append(i)
            out.append(fp)
        if todo:
            self._other_devices(tensors, todo, out, False)
        return out  # type: ignore[return-value]

    def outputs(self, tensors: list[torch.Tensor]) -> list[str]:
        """Fingerprints of an op's output tensors, never from the cache; the small ones become :attr:`last`."""
        out: list[str | None] = []
        todo: list[int] = []
        self.last = latest = []
        for i, t in enumerate(tensors):
            found = small_cpu_fingerprint_at(t)
            if found is not None:
                small, ptr = found
                try:
                    latest.append((t, t._version, ptr, small))
                except RuntimeError:  # an inference tensor has no version counter to check: never reused
                    pass
                out.append(small)
                continue
            fp = self._checked(t, True)
            if fp is None:
                todo.append(i)
            out.append(fp)
        if todo:
            self._other_devices(tensors, todo, out, True)
        return out  # type: ignore[return-value]

    def _checked(self, t: torch.Tensor, fresh: bool) -> str | None:
        """The fingerprint of a tensor the small path did not take (cached unless ``fresh``), the reason it has
        none, or ``None`` for a tensor on another device (see :meth:`_other_devices`)."""
        fp = None
        try:
            if t.layout is not torch.strided or t.is_nested or t.is_meta:
                check_fingerprintable(t)  # raises with the reason, or lets a readable tensor through
            if not fresh:
                key = self._key(t)
                hit = self._cache.get(key)
                if hit is not None and hit[1] == _version(t) and not hit[0].expired():
                    return hit[2]
                if key in self._uninitialized:  # written or freed since it was marked
                    self._uninitialized.discard(key)
            fp = plain_cpu_fingerprint(t)  # most tensors: hashed right here
            if fp is not None:
                self._remember(t, fp, fresh)
        except UnfingerprintableError as exc:
            fp = f"unfingerprintable: {exc}"
        except Exception as exc:  # e.g. a tensor subclass without storage: record, never crash the run
            fp = f"unfingerprintable: {type(exc).__name__}"
        return fp

    def _other_devices(self, tensors: list[torch.Tensor], todo: list[int], out: list[str | None],
                       fresh: bool) -> None:
        """Fill ``out[i]`` for ``i`` in ``todo``: one fingerprint_many call copies two words per tensor back, once
        per device."""
        try:
            fps = fingerprint_many([tensors[i] for i in todo])
        except Exception as exc:
            fps = [f"unfingerprintable: {type(exc).__name__}"] * len(todo)
        for i, fp in zip(todo, fps):
            out[i] = fp
            self._remember(tensors[i], fp, fresh)

    def _remember(self, t: torch.Tensor, fp: str, fresh: bool) -> None:
        if fresh:  # an op output: an in-place op's version bump happens after it returns
            self._pending.append((t, fp))
        else:
            self._put(t, fp)

    def commit(self) -> None:
        """Cache the outputs of the previous op, now that any in-place version bump has happened."""
        for t, fp in self._pending:
            self._put(t, fp)
        self._pending.clear()

    def _put(self, t: torch.Tensor, fp: str) -> bool:
        """Cache ``fp`` for ``t``; False when ``t`` cannot be cached (no version counter, no storage)."""
        version = _version(t)
        if version < 0:
            return False
        try:
            self._cache[self._key(t)] = (StorageWeakRef(t.untyped_storage()), version, fp)
        except (RuntimeError, TypeError, NotImplementedError):
            return False
        return True

    def mark_uninitialized(self, tensors: list[torch.Tensor], *, inplace: bool = False) -> list[str]:
        """Give fresh ``torch.empty`` outputs a fixed fingerprint until something writes to them; ``inplace``: the
        outputs of an in-place op (``resize_``), whose version is bumped after it returns (cached on the next op,
        as :meth:`outputs` does)."""
        for t in tensors:
            if inplace:
                try:
                    key = self._key(t)
                except Exception:  # no data pointer: the checked path says why when it is read
                    continue
                self._pending.append((t, UNINITIALIZED))
                self._uninitialized.add(key)
            elif self._put(t, UNINITIALIZED):
                self._uninitialized.add(self._key(t))
        return [UNINITIALIZED] * len(tensors)

    def clear(self) -> None:
        self._cache.clear()
        self._pending.clear()
        self._uninitialized.clear()
        self.last = []


_QUEUE_RECORDS = 512  # records queued before they are encoded and written (see OpTracer.flush)


def _json_encoder() -> Any:
    """One JSON encoder for op records, made once (``json.dumps(separators=)`` makes one per call, and
    ``JSONEncoder.encode`` sets up its C encoder per call): the same text as ``json.dumps(entry,
    separators=(",", ":"))`` for the JSON types a record holds."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # a Python without the C accelerator of json
        return json.JSONEncoder(separators=(",", ":")).encode
    c_encode = make(None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)

    def encode(entry: dict[str, Any]) -> str:
        return "".join(c_encode(entry, 0))

    return encode


_encode = _json_encoder()


def _fps_json(fps: list[str]) -> str:
    """``_encode(fps)`` for a list of strings; plain ones (printable ASCII without quotes or backslashes, such as
    hex digests) are joined as they are, and a single ASCII-alphanumeric one (a digest) is quoted at once."""
    if len(fps) == 1:  # most ops: one output, a hex digest (ASCII letters and digits need no escaping)
        text = fps[0]
        if text.isalnum() and text.isascii():
            return f'["{text}"]'
    elif not fps:
        return "[]"
    text = '","'.join(fps)
    if text.isascii() and text.isprintable() and "\\" not in text and text.count('"') == 2 * len(fps) - 2:
        return f'["{text}"]'
    return _encode(fps)  # type: ignore[no-any-return]

# What the dispatch handler needs to know about an op, looked up once per OpOverload: its name, its kind and
# the names of its ``out=`` arguments (keyword-only: they come in kwargs).
_PLAIN, _SKIP, _EMPTY, _RNG, _RESIZE = 0, 1, 2, 3, 4
_OP_INFO: dict[Any, tuple[str, int, tuple[str, ...]]] = {}
_Tensor = torch.Tensor


def _op_info(func: Any) -> tuple[str, int, tuple[str, ...]]:
    name = str(func.overloadpacket)
    kind = (_SKIP if name in _SKIP_OPS or name.startswith("profiler.") else _EMPTY if name in EMPTY_OPS
            else _RESIZE if name in RESIZE_OPS else _RNG if name in RNG_OPS else _PLAIN)
    try:
        outs = tuple(a.name for a in func._schema.arguments if a.is_out)
    except (AttributeError, RuntimeError):  # not an OpOverload with a schema
        outs = ()
    info = _OP_INFO[func] = (name, kind, outs)
    return info


def _overwritten(in_fps: list[str], ins: list[torch.Tensor], kwargs: dict[str, Any], names: tuple[str, ...]) -> None:
    """Mark the uninitialized ``out=`` arguments among ``ins`` as :data:`OVERWRITTEN` in ``in_fps``: the op writes
    them without reading them (one also passed as an input is read: it keeps its mark)."""
    outs: list[torch.Tensor] = []
    for n in names:
        if n in kwargs:
            _tensors(kwargs[n], outs)
    for i, fp in enumerate(in_fps):
        if fp == UNINITIALIZED and any(ins[i] is o for o in outs) and sum(t is ins[i] for t in ins) == 1:
            in_fps[i] = OVERWRITTEN


def _storage_bytes(t: torch.Tensor) -> int:
    """The size of ``t``'s storage in bytes, -1 when it has none that can be asked."""
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:  # a tensor subclass or layout without storage
        return -1


def _arg_tensors(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[torch.Tensor]:
    """The tensors among an op's arguments, in the order :func:`_tensors` finds them (plain ones inline)."""
    out: list[torch.Tensor] = []
    for a in args:
        kind = type(a)
        if kind is _Tensor:
            out.append(a)
        elif kind not in _LEAF_TYPES:
            _tensors(a, out)
    if kwargs:
        _tensors(kwargs, out)
    return out


def _any_requires_grad(tensors: list[torch.Tensor]) -> bool:
    """Whether autograd can give the op's outputs a node: only when an input requires grad."""
    for t in tensors:
        if t.requires_grad:
            return True
    return False


class _Dispatch(TorchDispatchMode):
    """The tracer's mode on one thread's stack: records each ATen op (see :meth:`OpTracer.record`)."""

    def __init__(self, tracer: OpTracer) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.tracer = tracer
        # The outputs of this thread's last recorded op run with grad enabled, with the op's site and module:
        # autograd sets their grad_fn after the op returns, so their nodes are noted when the next op starts.
        self.made: tuple[list[torch.Tensor], tuple[str, int, str], str] | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        tr = self.tracer
        info = _OP_INFO.get(func) or _op_info(func)
        kind = info[1]
        if not tr.recording or kind == _SKIP:
            if not tr.recording:
                if tr.fps.last:  # ops that run unrecorded may change them
                    tr.fps.last = []
                self.made = None
            return func(*args, **kwargs) if kwargs else func(*args)
        if self.made is not None:
            self.note_nodes()
        fps = tr.fps
        if fps._pending:
            fps.commit()
        ins = _arg_tensors(args, kwargs)
        in_fps = fps.inputs(ins) if ins else []
        fps.last = []  # used up: an op that fails half-way through leaves nothing to trust
        if kwargs and info[2] and UNINITIALIZED in in_fps:
            _overwritten(in_fps, ins, kwargs, info[2])
        values = tr.values
        if values is not None:  # inputs before the op runs (an in-place op overwrites them)
            values.keep(ins, in_fps)
        if kind == _RESIZE:  # the bytes it adds are uninitialized; the ones it keeps are as they were
            before = _storage_bytes(ins[0]) if ins and in_fps[0] != UNINITIALIZED else -1
        out = func(*args, **kwargs) if kwargs else func(*args)
        outs = [out] if type(out) is _Tensor else _tensors(out, [])
        if kind == _RESIZE and (before < 0 or any(_storage_bytes(t) != before for t in outs)):
            out_fps = fps.mark_uninitialized(outs, inplace=True)
            kind = _EMPTY
        elif kind == _EMPTY:
            out_fps = fps.mark_uninitialized(outs)
        elif outs:
            out_fps = fps.outputs(outs)  # the small ones become fps.last
        else:
            out_fps = [_scalar_repr(out)]
        if kind != _EMPTY and values is not None:
            values.keep(outs, out_fps)
        gen = None
        if kind == _RNG:
            gen = "global" if not kwargs or kwargs.get("generator") is None else "private"
        site, module = tr.record(info[0], in_fps, out_fps, gen, sys._getframe(1))
        if outs and site is not None and _grad_enabled() and _any_requires_grad(ins):
            self.made = (outs, site, module)
        return out

    def note_nodes(self) -> None:
        """Note which line and module created the autograd nodes of the last op's outputs (first one wins)."""
        made, self.made = self.made, None
        if made is None:
            return
        outs, site, module = made
        key = self.tracer.node_key
        for t in outs:
            node: Any = t.grad_fn  # Any: torch's stubs type Node.metadata, a property, as a method
            if node is not None:
                meta = node.metadata  # the node's own dict: nothing is kept alive, no id is ever reused
                if key not in meta:
                    meta[key] = (site, module)


_grad_enabled = torch.is_grad_enabled
_current_autograd_node = torch._C._current_autograd_node


_active_tracers: weakref.WeakSet[OpTracer] = weakref.WeakSet()
_TRACER_NUMBERS = itertools.count()
_current_dispatch_mode = getattr(torch.utils._python_dispatch, "_get_current_dispatch_mode", None)
_graph_task_id = getattr(torch._C, "_current_graph_task_id", None)


def _in_backward() -> bool:
    """Whether this thread is inside a backward pass (e.g. in a hook that ``loss.backward()`` runs)."""
    if _graph_task_id is not None:
        return bool(_graph_task_id() != -1)
    return _current_autograd_node() is not None


def _before_fork() -> None:
    for tracer in list(_active_tracers):
        tracer.flush()
        if tracer._file is not None:
            tracer._file.flush()  # nothing buffered may be copied into the child


def _flush_at_exit() -> None:
    """A script that ends (or dies of an exception) while tracing: its queued records still reach the file."""
    for tracer in list(_active_tracers):
        tracer.recording = False  # ops of atexit handlers that run after this one would be counted, never written
        try:
            tracer.flush()
            if tracer._file is not None:
                tracer._file.flush()
        except (OSError, ValueError):  # a closed or failing file at exit: nothing more can be done
            pass


def _after_fork_in_child() -> None:
    """A forked child (e.g. a DataLoader worker) inherits the modes: it must not record or write."""
    for tracer in list(_active_tracers):
        tracer.recording = False
        tracer.keep = False
        tracer._queue = []
        tracer._file = None  # the parent's file object: never written or flushed from here
        tracer.values = None  # nor its op_values.pt


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
atexit.register(_flush_at_exit)


class OpTracer:
    """Records every ATen op between :meth:`start` and :meth:`stop` (``ops`` list and/or a JSONL file)."""

    def __init__(self, *, models: Mapping[str, nn.Module] | None = None, path: str | Path | None = None,
                 keep: bool = True) -> None:
        self.models = models
        self.path = Path(path) if path else None
        self.keep = keep
        self._ops: list[dict[str, Any]] = []
        self._queue: list[tuple[Any, ...]] = []  # records not yet encoded (see flush())
        self.count = 0
        self.step: int | None = None  # set by the recorder: which training step the ops belong to
        self.fps = _FpCache()
        # Where each autograd node was made: (site, module) in the node's metadata under this key (see _Dispatch)
        self.node_key = f"torchrepro.optrace.{next(_TRACER_NUMBERS)}"
        self._names: dict[int, str] = {}
        self._context = ModuleContext(self._module_name)
        self._modes: dict[int, list[Any]] = {}  # thread ident -> the modes entered on that thread's stacks
        self._file: IO[str] | None = None
        self._lines: dict[str, list[str]] = {}
        self._codes: dict[tuple[str, int, str], str] = {}  # site -> the text of its line (see _code)
        self._parts: dict[tuple[Any, ...], tuple[str, str]] = {}  # see _fixed_parts
        self.recording = False  # ops are being recorded
        self.values = OpValues.from_env() if self.path else None  # tensor copies for compare --locate (opvalues)

    # --- context ------------------------------------------------------------------------------------
    def module_path(self) -> str:
        return self._context.path

    def _module_name(self, mod: nn.Module) -> str:
        name = self._names.get(id(mod))
        if name is None:  # a module created after tracing started: look the models up again, once
            self._refresh_names()
            name = self._names.setdefault(id(mod), type(mod).__name__)
        return name

    def record(self, op: str, in_fps: list[str], out_fps: list[str], generator: str | None = None,
               frame: FrameType | None = None) -> tuple[tuple[str, int, str] | None, str]:
        """Queue one op record; ``generator``: for a random op, "global" (torch's default) or "private";
        ``frame``: where the op was called from (its site: see :func:`_site_of`). A backward op gets the site
        and module that created its autograd node.

        Returns the site and module that the autograd nodes of the op's outputs are to be noted with: the op's
        own, or for a backward op that builds a graph (``create_graph=True``) the line that ran the backward."""
        context = self._context
        stack = context.stack
        module = stack[-1] if stack else ""  # self.module_path(), inline (once per op)
        site: tuple[str, int, str] | None
        if context.in_optimizer:
            phase = "optimizer"
            site = _site_of(frame)
            made = site, module
        else:
            node: Any = _current_autograd_node()
            if node is None:
                phase = "forward"
                site = _site_of(frame)
                made = site, module
            else:
                phase = "backward"
                made = (_site_of(frame) if _grad_enabled() else None), module
                found = node.metadata.get(self.node_key)
                site, module = found if found is not None else (None, module)
        self._queue.append((self.count, self.step, op, phase, module, site, in_fps, out_fps, generator))
        self.count += 1
        if len(self._queue) >= _QUEUE_RECORDS:
            self.flush()
        return made

    def flush(self) -> None:
        """Turn the queued records into ``ops`` entries and JSON lines (written to the file's buffer).

        Records are queued as tuples while ops run and encoded here in one go, between ops: Python code that
        runs between large ops is slowed by the caches those ops flushed, so the tracer does as little as it
        can there. Called every ``_QUEUE_RECORDS`` records, on stop, before a fork and at exit.
        """
        if not self._queue:
            return
        if threading.current_thread() is threading.main_thread():  # where Python runs signal handlers
            with signals_deferred():  # a Ctrl-C mid-encoding must not drop the batch: it lands right after
                self._encode_queue()
        else:
            self._encode_queue()

    def _encode_queue(self) -> None:
        queue, self._queue = self._queue, []
        if self.keep:
            for i, step, op, phase, module, site, in_fps, out_fps, generator in queue:
                self._ops.append(self._entry(i, step, op, phase, module, site, in_fps, out_fps, generator))
        if self._file is None:
            return
        # The JSON lines, built from pieces: the part of a record that only its op, phase, module, source line
        # and generator decide is encoded once per such combination (a training step repeats a few hundred),
        # and fingerprint lists of plain hex digests are joined as they are. The text is exactly what
        # ``_encode(self._entry(...))`` gives (tests/record/test_optrace_fast.py holds them side by side).
        parts = self._parts
        lines = []
        for i, step, op, phase, module, site, in_fps, out_fps, generator in queue:
            key = (op, phase, module, site, generator)
            fixed = parts.get(key)
            if fixed is None:
                fixed = self._fixed_parts(key)
            if type(i) is not int or (step is not None and type(step) is not int):
                lines.append(_encode(self._entry(i, step, op, phase, module, site, in_fps, out_fps, generator)))
                continue
            lines.append(f'{{"i":{i},"step":{"null" if step is None else step},{fixed[0]},'
                         f'"in":{_fps_json(in_fps)},"out":{_fps_json(out_fps)},{fixed[1]}}}')
        self._file.write("\n".join(lines) + "\n")

    def _entry(self, i: int, step: int | None, op: str, phase: str, module: str, site: tuple[str, int, str] | None,
               in_fps: list[str], out_fps: list[str], generator: str | None) -> dict[str, Any]:
        """One op record as a dict (the ``ops`` entry; its JSON is the line in ops.jsonl)."""
        entry = {"i": i, "step": step, "op": op, "phase": phase, "module": module,
                 "file": as_in_original(site[0], _COPY_OF) if site else None, "line": site[1] if site else None,
                 "in": in_fps, "out": out_fps, "rng": op in RNG_OPS}
        if generator is not None:
            entry["generator"] = generator
        entry["code"] = self._code(site)  # stored now: readers of ops.jsonl never open the paths a record names
        return entry

    def _code(self, site: tuple[str, int, str] | None) -> str:
        """The text of the source line ``site`` names ("" when none), read once per line."""
        if not site:
            return ""
        codes = self._codes
        code = codes.get(site)
        if code is None:
            if len(codes) > 100_000:  # stay bounded
                codes.clear()
            code = codes[site] = _code_line(site[0], site[1], self._lines)
        return code

    def _fixed_parts(self, key: tuple[str, str, str, tuple[str, int, str] | None, str | None]) -> tuple[str, str]:
        """The JSON text of a record's fields before ``in`` and after ``out`` (without braces), for one
        (op, phase, module, site, generator)."""
        op, phase, module, site, generator = key
        entry = self._entry(0, None, op, phase, module, site, [], [], generator)
        text = _encode(entry)
        head, tail = text.split(',"in":[],"out":[],', 1)
        fixed = (head[len('{"i":0,"step":null,'):], tail[:-1])
        if len(self._parts) > 100_000:  # stay bounded
            self._parts.clear()
        self._parts[key] = fixed
        return fixed

    @property
    def ops(self) -> list[dict[str, Any]]:
        """The op records so far (``keep=True``)."""
        self.flush()
        return self._ops

    def _refresh_names(self) -> None:
        models = self.models if self.models is not None else discover_models()
        for prefix, model in models.items():
            for name, mod in model.named_modules():
                full = ".".join(x for x in (prefix, name) if x)
                self._names.setdefault(id(mod), full or type(mod).__name__)

    # --- start / stop --------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether the modes are on the mode stack of some thread."""
        return bool(self._modes)

    def start(self) -> OpTracer:
        """Record from now on: in this thread and in every thread started while recording (see _traced_run).

        Restarted after a soft stop (modes still on the stacks) it just records again, appending to the file."""
        if not self._modes:
            self._refresh_names()
            self._context.install()
            _active_tracers.add(self)
            _hook_threads()
        if self.path is not None and self._file is None:
            mode = "a" if self.count else "w"  # a new tracer starts a new file; a restarted one appends
            self._file = open(self.path, mode, encoding="utf-8", buffering=1 << 16)  # noqa: SIM115 - closed in _release()
        self._enter_thread()
        self.recording = True
        return self

    def _enter_thread(self) -> None:
        """Put the modes on this thread's mode stacks (they are thread-local), unless they are there."""
        ident = threading.get_ident()
        if ident not in self._modes:
            mode = _Dispatch(self)
            mode.__enter__()  # type: ignore[no-untyped-call]
            self._modes[ident] = [mode]

    def _leave_thread(self) -> None:
        """A traced thread ends: its modes go with it (popped when still on top)."""
        modes = self._modes.pop(threading.get_ident(), None)
        if modes is not None and self._modes_on_top(modes):
            for m in reversed(modes):
                m.__exit__(None, None, None)
        if not self._modes and self in _active_tracers:
            self._release()

    def stop(self) -> None:
        """Stop recording. Called from inside a traced torch call (e.g. a hook run by ``loss.backward()``),
        the modes stay on the stacks, passing ops through, until :meth:`settle` is called from outside."""
        self.recording = False
        for modes in list(self._modes.values()):
            for m in modes:
                m.made = None  # the last op's outputs: not kept alive until the next op
        try:
            self.flush()
            if self._file is not None:  # what was recorded is on disk, even if the script ends with os._exit
                self._file.flush()
        finally:  # a Ctrl-C that arrived while the queue was encoded is raised by flush(): the modes still go
            self.settle()

    def settle(self) -> None:
        """Take the modes off this thread's stacks if recording has stopped and it is safe to do so now; once
        no thread holds them, release everything (the file is closed)."""
        if not self._modes or self.recording or _in_backward():  # popped mid-backward, it would come back after
            return
        ident = threading.get_ident()
        modes = self._modes.get(ident)
        if modes is None or not self._modes_on_top(modes):
            return
        for m in reversed(modes):
            m.__exit__(None, None, None)
        del self._modes[ident]
        if not self._modes:
            self._release()

    def _release(self) -> None:
        """No thread holds the modes any more: drop the hooks and caches, write out and close the file."""
        self._context.remove()
        self.fps.clear()
        try:
            self.flush()
        finally:
            if self._file is not None:
                self._file.close()
            self._file = None
            _active_tracers.discard(self)
            if self.values is not None and self.path is not None:
                self.values.save(self.path.with_name(OP_VALUES))
        for other in list(_active_tracers):  # a tracer stopped earlier under this one can leave the stacks now
            if other.active and not other.recording:
                other.settle()

    @staticmethod
    def _modes_on_top(modes: list[Any]) -> bool:
        """Whether ``modes`` are the innermost ones of this thread: leaving a mode pops the top of the stack, so
        a tracer stopped while another started later is still on is kept (passing ops through) until then."""
        if _current_dispatch_mode is None:
            return True
        return bool(_current_dispatch_mode() is modes[-1])


def _user_code(thread: threading.Thread) -> bool:
    """Whether a thread runs the user's code, not torch's or torchrepro's own (a DataLoader's pin-memory
    thread, torchrepro's value writer): only the user's threads are traced."""
    target = getattr(thread, "_target", None)
    code = getattr(target if target is not None else type(thread).run, "__code__", None)
    return code is None or not _is_internal(code.co_filename)


_thread_hook: dict[str, Any] = {}  # "original": threading.Thread._bootstrap_inner before _hook_threads()


def _hook_threads() -> None:
    """Make threads started while a tracer records trace their own ops: torch's mode stacks are per thread, so
    a script that trains in a ``threading.Thread`` would otherwise run every op untraced. Installed once."""
    original = getattr(threading.Thread, "_bootstrap_inner", None)
    if original is None or _thread_hook:
        return
    _thread_hook["original"] = original

    def _bootstrap_inner(thread: threading.Thread) -> None:
        tracers = [t for t in list(_active_tracers) if t.recording] if _active_tracers else []
        if tracers and _user_code(thread):
            try:
                thread.run = _traced_run(thread.run, tracers)  # type: ignore[method-assign]
            except (AttributeError, TypeError):  # a read-only run (slots, a property): run it untraced
                pass
        original(thread)

    threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]


def _traced_run(run: Any, tracers: list[OpTracer]) -> Any:
    """``run`` with the tracers' modes on the new thread's stacks while it runs (before join() can return)."""

    def traced() -> None:
        for t in tracers:
            t._enter_thread()
        try:
            run()
        finally:
            for t in reversed(tracers):
                t._leave_thread()

    return traced


class trace_ops:  # noqa: N801 - reads as a function at call sites
    """Trace every ATen op in a block: ``with torchrepro.trace_ops() as t: step()``; then ``t.ops``.

    Each op record has ``i``, ``op`` (e.g. ``aten.index_put_``), ``phase`` (forward/backward/optimizer),
    ``module`` (e.g. ``encoder.layers.2.attn``), ``file``/``line``/``code`` (for backward ops: the forward
    line that created the autograd node), ``in``/``out`` fingerprints and ``rng`` (a random op).
    Ops whose tensors cannot be fingerprinted (sparse, nested, meta) get ``"unfingerprintable: ..."``.
    """

    def __init__(self, model: nn.Module | Mapping[str, nn.Module] | None = None, *,
                 path: str | Path | None = None) -> None:
        models = None if model is None else ({"": model} if isinstance(model, nn.Module) else dict(model))
        self.tracer = OpTracer(models=models, path=path)

    def __enter__(self) -> OpTracer:
        return self.tracer.start()

    def __exit__(self, *exc: object) -> None:
        self.tracer.stop()


def read_ops(path: str | Path) -> Iterator[dict[str, Any]]:
    """Op records from an ``ops.jsonl`` file, each checked (:data:`_OP_FIELDS`), with ``code`` as stored.

    The file is untrusted input (a run directory may come from anywhere): the source files its records name are
    never opened, and the file itself is read as :func:`torchrepro._core.readjson.read_jsonl` reads (regular files
    only, bounded, strict UTF-8, bounded nesting). A cut-off last line (a killed run) is ignored. Any other line
    that is not a valid op record raises :class:`RunDirError` naming the file and line: skipping it, or stopping
    there, would shift or shorten the op stream and make two runs' streams look different.
    """
    ops, _cut_off = read_jsonl(path, error=RunDirError, action=_RETRACE, limit=_MAX_OPS_BYTES,
                               check=_op_problems, what="a valid op record")
    return iter([_clean_op(op) for op in ops])


_RETRACE = "Trace the run again (`torchrepro check --locate -- ...`)."
_MAX_INT = 1 << 63


def _is_count(v: Any) -> bool:
    return type(v) is int and 0 <= v < _MAX_INT


def _is_str_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


# field -> (required, check, what it must be); the fields of one op record (docs/formats.md)
_OP_FIELDS: dict[str, tuple[bool, Any, str]] = {
    "op": (True, lambda v: type(v) is str, "a string"),
    "in": (True, _is_str_list, "a list of strings"),
    "out": (True, _is_str_list, "a list of strings"),
    "i": (False, _is_count, "a non-negative integer"),
    "step": (False, lambda v: v is None or _is_count(v), "a non-negative integer or null"),
    "line": (False, lambda v: v is None or _is_count(v), "a non-negative integer or null"),
    "phase": (False, lambda v: v is None or type(v) is str, "a string or null"),
    "module": (False, lambda v: v is None or type(v) is str, "a string or null"),
    "file": (False, lambda v: v is None or type(v) is str, "a string or null"),
    "generator": (False, lambda v: v is None or type(v) is str, "a string or null"),
    "code": (False, lambda v: type(v) is str, "a string"),
    "rng": (False, lambda v: type(v) is bool, "true or false"),
}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _op_problems(op: Any) -> list[str]:
    """:func:`_op_problem` as the list :func:`torchrepro._core.readjson.read_jsonl` takes."""
    problem = _op_problem(op)
    return [problem] if problem else []


def _op_problem(op: Any) -> str | None:
    """What is wrong with a parsed op record, or None when it has the shape :mod:`torchrepro.analysis.locate` reads."""
    if type(op) is not dict:
        return f"it is {'a list' if type(op) is list else 'a ' + type(op).__name__}, expected a JSON object"
    for key, (required, ok, what) in _OP_FIELDS.items():
        if key not in op:
            if required:
                return f"`{key}` is missing"
        elif not ok(op[key]):
            return f"`{key}` is {_shown(op[key])} ({type(op[key]).__name__}), expected {what}"
    return None


def _clean_op(op: dict[str, Any]) -> dict[str, Any]:
    """A checked record with only the known fields (others, of any size or depth, are dropped)."""
    clean = {key: op[key] for key in _OP_FIELDS if key in op}
    clean.setdefault("code", "")
    return clean

