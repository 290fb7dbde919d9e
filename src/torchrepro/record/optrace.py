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
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO, Any

import torch
from torch import nn

from .._core.dispatchmode import QuietDispatchMode
from .._core.modules import ModuleContext, discover_models
from .._core.ompteam import signals_deferred
from .opfps import _LEAF_TYPES, OVERWRITTEN, UNINITIALIZED, _FpCache, _scalar_repr, _tensors
from .opsfile import read_ops as read_ops  # re-exported: where the op records are read back
from .opsite import _code_line, _is_internal, _site_of
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
_SKIP_OPS = frozenset({"aten.detach", "aten.alias", "prim.device", "aten.sym_size", "aten.sym_stride",
                       "aten.sym_numel", "aten.sym_storage_offset", "aten.is_same_size"})

_COPY_OF = copy_of_from_env()  # a run in a copy of the working directory names files as under the original


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
_PLAIN, _SKIP, _EMPTY, _RNG, _RESIZE, _COLLECTIVE = 0, 1, 2, 3, 4, 5
# Collectives (FSDP2, DTensor, functional collectives): their outputs are written by the process group after the op
# returns, so they are waited for before they are fingerprinted (a second wait by the script is a no-op).
COLLECTIVE_PREFIXES = ("c10d.", "_c10d_functional.")
_OP_INFO: dict[Any, tuple[str, int, tuple[str, ...]]] = {}
_Tensor = torch.Tensor


def _op_info(func: Any) -> tuple[str, int, tuple[str, ...]]:
    name = str(func.overloadpacket)
    kind = (_SKIP if name in _SKIP_OPS or name.startswith("profiler.") else _EMPTY if name in EMPTY_OPS
            else _RESIZE if name in RESIZE_OPS else _RNG if name in RNG_OPS
            else _COLLECTIVE if name.startswith(COLLECTIVE_PREFIXES) and name != "_c10d_functional.wait_tensor"
            else _PLAIN)
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


def _wait_collective(out: Any) -> None:
    """Wait for a collective's result before its outputs are read: a ``c10d`` op returns its in-place outputs with
    a ``Work`` that the script waits on later (FSDP2's all-gather and reduce-scatter), a ``_c10d_functional`` op a
    tensor that ``wait_tensor`` completes. Read before that, their bytes are whatever the buffer held (a false
    difference between runs); waiting here only moves the wait earlier."""
    items = out if isinstance(out, (tuple, list)) else [out]
    for item in items:
        if isinstance(item, torch._C.ScriptObject) and hasattr(item, "wait"):
            item.wait()
        elif type(item) is _Tensor:
            torch.ops._c10d_functional.wait_tensor(item)


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


class _Dispatch(QuietDispatchMode):
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
        if kind == _COLLECTIVE:
            _wait_collective(out)
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
