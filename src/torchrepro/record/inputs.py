"""The data of loops without a DataLoader: what the model's forward receives, fingerprinted for the recorder.

Scripts that draw their batches without a DataLoader (nanoGPT's ``get_batch``, any hand-written loop) have their
data fingerprinted where the model receives it: the tensors passed to the outermost ``forward`` of the root
modules (see :meth:`ModelInputs.on_root_call`), recorded in place of the batches of a step that saw no DataLoader
batch (``"batches_source": "model-inputs"``, :func:`data_fields`).

A global forward pre-hook waits for the first training forward (:meth:`ModelInputs.install`) and is removed as it
fires; the root modules (and the wrapper called: DDP, ``torch.compile``) then get hooks of their own. The hooks are
module-level functions bound to a token, not to the recorder, so that a hooked model stays picklable.

Also here: :func:`unrecorded_batches`, the block whose DataLoader batches and forwards are not training data.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import sys
import warnings
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import fields, is_dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from .._core.fingerprint import UNREADABLE
from .._core.modules import discover_models
from .store import MODEL_INPUTS

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


def data_fields(batches: list[str], inputs: list[tuple[str, str]]) -> dict[str, Any]:
    """An event's ``batches``: the DataLoader batches, else the model inputs with where they came from."""
    if batches or not inputs:
        return {"batches": batches}
    return {"batches": [fp for fp, _ in inputs], "batches_source": MODEL_INPUTS,
            "input_modules": [label for _, label in inputs]}


class _Recorder(Protocol):
    """What :class:`ModelInputs` reads of the recorder it serves."""

    @property
    def forked(self) -> bool: ...  # a forked child: records nothing

    @property
    def _loaders(self) -> Mapping[Any, int]: ...  # the DataLoaders seen: their batches are the data

    @property
    def _batches_since_backward(self) -> list[str]: ...

    def _fps(self, named: Mapping[str, torch.Tensor | None]) -> dict[str, str | None]: ...

    def _warn_once(self, what: str, message: str) -> None: ...


class ModelInputs:
    """The model inputs of one recorder: the hooks that see them, and the fingerprints since the last
    ``backward()`` (:attr:`since_backward`) and since the last step (:attr:`pending`), each ``(fp, class)``.

    ``models``: the root modules given to the recorder (None: those alive at the first training forward)."""

    def __init__(self, recorder: _Recorder, models: Mapping[str, nn.Module] | None, *, timing: bool) -> None:
        # weak: the recorder holds this object, and is freed as its last reference goes (no cycle waiting for gc,
        # with its optimizers alive: optimizers_exist() would still see them)
        self._recorder = weakref.ref(recorder)
        self._models = models
        self._timing = timing
        self.since_backward: list[tuple[str, str]] = []
        self.pending: list[tuple[str, str]] = []
        self.depth = 0  # root forwards running (the outermost one's inputs are the data)
        self._outputs: dict[int, StorageWeakRef] = {}  # storages of root outputs since the last backward()
        self._finder: Any = None  # the global forward pre-hook that waits for the first training forward
        self._roots: list[weakref.ref[nn.Module]] = []  # the modules whose forward inputs are recorded
        self._root_handles: list[Any] = []
        self._orig_script: Any = None  # torch.jit.script, while ours (which unhooks the roots) replaces it
        self._filter: Any = None  # the warnings filter installed with it
        self.active = False
        self._token = next(_tokens)
        _by_token[self._token] = self

    @property
    def _rec(self) -> _Recorder:
        rec = self._recorder()
        if rec is None:  # not while this object lives: the recorder holds it
            raise ReferenceError("the recorder of these model inputs is gone")
        return rec

    def install(self) -> None:
        """Wait for the first training forward (a global forward pre-hook, removed as it fires): its module is the
        outermost one called, and the root modules are hooked from then on (:meth:`found_roots`)."""
        self.active = True
        if self._timing or self._finder is not None:
            return
        hook = functools.partial(_find_roots, self._token)
        self._finder = torch.nn.modules.module.register_module_forward_pre_hook(hook)
        # torch warns at every torch.compile'd module call while a global module hook exists: ours is gone
        # before the compiled code runs (the first call of the compiled model is what removes it)
        warnings.filterwarnings("ignore", message=_COMPILE_GLOBAL_HOOK_WARNING, category=UserWarning)
        self._filter = warnings.filters[0]

    def uninstall(self) -> None:
        """Remove every hook, and put ``torch.jit.script`` back if it is still ours."""
        self.active = False
        self.remove_finder()
        self._unhook_roots()
        if self._orig_script is not None:
            if getattr(torch.jit.script, "_torchrepro_token", None) == self._token:  # not replaced since
                torch.jit.script = self._orig_script
            self._orig_script = None
        self.depth = 0

    def remove_finder(self) -> None:
        if self._finder is None:
            return
        self._finder.remove()
        self._finder = None
        with contextlib.suppress(ValueError, AttributeError):
            warnings.filters.remove(self._filter)  # type: ignore[attr-defined]

    def found_roots(self, first: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The first training forward: hook the root modules (those given, else those alive, found once) and
        ``first``, the outermost module called, which may be a wrapper (DDP, ``torch.compile``) around a root;
        then record this call's inputs."""
        self.remove_finder()
        if self._rec._loaders:  # the script feeds a DataLoader's batches: they are its data, the forward is not hooked
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
        self.on_root_call(first, args, kwargs)

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
    def roots_unhooked(self) -> Iterator[None]:
        """``torch.jit.script`` compiles a module's hooks (Python hooks cannot be): ours are off meanwhile."""
        hooked = bool(self._root_handles)
        self._unhook_roots()
        try:
            yield
        finally:
            if hooked and self.active:
                self._hook_roots()

    def on_root_call(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A root module's forward starts. The outermost one (not inside another root's forward) of a training
        forward (autograd on, the module in training mode) in a step that has seen no DataLoader batch has its
        tensor arguments fingerprinted: the data of the step. Eval and ``torch.no_grad`` forwards are not data;
        tensors computed in the autograd graph, or views of an earlier root forward's output (``fake.detach()``,
        a frozen model's features), are the model's own results, not data, and are left out."""
        depth, self.depth = self.depth, self.depth + 1
        if (depth or self._rec.forked or not _grad_enabled() or not module.training or _unrecorded[0]
                or self._rec._batches_since_backward or torch._C._get_tracing_state() is not None):
            return
        found: list[tuple[str, torch.Tensor]] = []
        _tensors_in(args, "args", found, 0)
        _tensors_in(kwargs, "kwargs", found, 0)
        data: dict[str, torch.Tensor | None] = {}
        for path, t in found:
            if (t.requires_grad and t.grad_fn is not None) or self._is_output(t):
                continue
            if _is_transform_wrapper(t) or _is_fake(t):
                return  # inside a torch.func transform or a tracer: not the data itself
            data[path] = t
        if not data or len(self.since_backward) + len(self.pending) >= _MAX_INPUTS_PER_STEP:
            return
        label = _module_label(module)
        fps = self._rec._fps(data)
        bad = next(((k, v) for k, v in fps.items() if v is None or v.startswith(UNREADABLE)), None)
        if bad is not None:
            fp = f"{UNREADABLE}{label}.forward {bad[0]}: {(bad[1] or '?')[len(UNREADABLE):]}"
        else:
            h = hashlib.blake2b(f"model-inputs|{label}".encode(), digest_size=16)
            for k, v in fps.items():
                h.update(f"|{k}={v}".encode())
            fp = h.hexdigest()
        self.since_backward.append((fp, label))

    def on_root_return(self, output: Any) -> None:
        """A root module's forward ends: the outermost one's output storages are noted (see on_root_call)."""
        self.depth = max(0, self.depth - 1)
        if self.depth or self._rec.forked:
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

    def to_pending(self) -> list[tuple[str, str]]:
        """Move the model inputs since the last backward() to the step's; return them."""
        inputs, self.since_backward = self.since_backward, []
        self.pending += inputs
        self._outputs.clear()
        return inputs


# --- the hooks on the root modules (module-level functions with a token: a hooked model stays picklable) -----
_COMPILE_GLOBAL_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"
_WRAPPER_CHILDREN = ("_orig_mod", "module", "_fsdp_wrapped_module")  # torch.compile, DDP/DP, FSDP
_MAX_INPUT_TENSORS = 256
_MAX_INPUT_DEPTH = 4
_tokens = itertools.count(1)
_by_token: weakref.WeakValueDictionary[int, ModelInputs] = weakref.WeakValueDictionary()
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
    """The global forward pre-hook of :meth:`ModelInputs.install`: at the first training forward, hook the root
    modules. It runs before the forward of every module until then, outermost first."""
    if _is_compiling() or _is_exporting():
        return
    watch = _by_token.get(token)
    if (watch is None or watch._finder is None or watch._rec.forked or not _grad_enabled() or not module.training
            or _unrecorded[0] or next(module.parameters(), None) is None):
        return
    try:
        watch.found_roots(module, args, _call_kwargs(module))
    except Exception as exc:  # never break the script's forward for it
        watch.remove_finder()
        watch._rec._warn_once("inputs", f"could not watch the inputs of {type(module).__name__}.forward "
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
    watch = _by_token.get(token)
    if watch is None or not watch.active:
        return
    try:
        watch.on_root_call(module, args, kwargs)
    except Exception as exc:  # never break the script's forward for it
        watch._rec._warn_once("inputs", f"could not fingerprint the inputs of {type(module).__name__}.forward "
                              f"({type(exc).__name__}: {exc}); steps without a DataLoader batch may record no data.")


def _root_post_hook(token: int, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    if _is_compiling() or _is_exporting():
        return
    watch = _by_token.get(token)
    if watch is None or not watch.active:
        return
    with contextlib.suppress(Exception):
        watch.on_root_return(output)


def _script_unhooked(token: int, script: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.jit.script`` while a recorder hooks root modules: their Python hooks cannot be scripted."""
    watch = _by_token.get(token)
    if watch is None:
        return script(obj, *args, **kwargs)
    with watch.roots_unhooked():
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
