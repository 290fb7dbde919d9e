"""The ``nn.Module`` objects alive in this process, known without scanning the heap at each lookup.

Naming parameters and module paths needs the models a script made. A scan of every object the garbage collector
tracks (``gc.get_objects()``) finds them, but costs time in proportion to the heap (~0.1 s per million objects),
and the op tracer looked them up at every start. A :class:`ModuleRegistry` instead wraps
``nn.Module.__init__`` and ``nn.Module.__setstate__`` (``copy.deepcopy``, ``pickle`` and ``torch.load`` of a whole
module go through ``__setstate__``, not ``__init__``) so that each module made is noted as a weak reference, and
scans the heap once, on :meth:`~ModuleRegistry.install`, for the modules made before. Asking for the modules then
costs time in proportion to the modules alive. PyTorch's own ``torch._dynamo`` wraps the same two methods to tag
the modules it sees made; it traces torch's own ``__init__`` in compiled code, never the registry's wrapper, even
when imported after it (:class:`_DynamoSeesTorchInit`).

:func:`live_modules` installs the process's registry on its first call (one scan) and keeps it for the life of
the process; a :class:`ModuleRegistry` of one's own is a context manager that undoes its wrappers on exit.

>>> from torch import nn
>>> with ModuleRegistry() as registry:
...     made = nn.Linear(2, 2)
...     [type(m).__name__ for m in registry.modules() if m is made]
['Linear']
"""

from __future__ import annotations

import functools
import gc
import importlib.abc
import importlib.machinery
import sys
import threading
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import nn

from .patches import Patches

# torch.compiler.is_compiling: torch >= 2.3 (torch._utils.is_compiling before it)
_is_compiling: Callable[[], bool] = (getattr(torch.compiler, "is_compiling", None)
                                     or getattr(torch._utils, "is_compiling", None) or (lambda: False))


class ModuleRegistry:
    """Weak references to the modules alive when it was installed (in the order the heap scan met them), then to
    those made while it is installed (in the order their ``nn.Module.__init__`` returned: a module before the
    submodules its own ``__init__`` makes after ``super().__init__()``); see the module docs."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.KeyedRef[int, nn.Module]] = {}  # id(module) -> its weak ref, in order
        self._patches = Patches()

    @property
    def active(self) -> bool:
        return self._patches.active

    def install(self) -> ModuleRegistry:
        """Wrap ``nn.Module.__init__`` and ``__setstate__``, then note the modules alive now (one heap scan).
        Installing an installed registry does nothing."""
        if self.active:
            return self
        for name in ("__init__", "__setstate__"):
            self._patches.wrap(nn.Module, name, self._noting)
        if _DYNAMO_GUARD not in sys.modules:  # imported later, dynamo must still see torch's own __init__
            self._patches.insert(sys.meta_path, 0, _DynamoSeesTorchInit())
        # after the wrappers: a module made by another thread during the scan is noted either way (add() dedups).
        # type(), not isinstance(): no __class__ lookup on every object of the heap
        for obj in gc.get_objects():
            if issubclass(type(obj), nn.Module):
                self.add(obj)
        return self

    def uninstall(self) -> None:
        """Put ``nn.Module``'s methods back (unless replaced again since) and forget every module."""
        self._patches.undo()
        self._refs.clear()

    def __enter__(self) -> ModuleRegistry:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _noting(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` (a method of ``nn.Module`` whose call makes a module usable), then the module noted."""
        registry = self

        @functools.wraps(method)
        def noting(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            out = method(module, *args, **kwargs)
            # not once uninstalled (a wrapper installed over this one keeps it in the chain), nor while
            # torch.compile traces (a module made inside a compiled region lives in its graph)
            if not _is_compiling() and registry.active:
                registry.add(module)
            return out

        noting._torchrepro_noting = True  # type: ignore[attr-defined]  # see _torch_init
        return noting

    def add(self, module: nn.Module) -> None:
        """Note ``module`` (once: a module noted again keeps its place)."""
        key = id(module)
        ref = self._refs.get(key)
        if ref is not None:
            if ref() is module:
                return
            del self._refs[key]  # a dead module's entry whose callback has not run yet: the new one goes last
        self._refs[key] = weakref.KeyedRef(module, self._forget, key)

    def _forget(self, ref: weakref.KeyedRef[int, nn.Module]) -> None:
        if self._refs.get(ref.key) is ref:
            del self._refs[ref.key]

    def modules(self) -> list[nn.Module]:
        """The modules alive that were noted, in the order they were noted (see the class docs)."""
        alive = [ref() for ref in list(self._refs.values())]  # list(): another thread may add meanwhile
        return [m for m in alive if m is not None]


_DYNAMO_GUARD = "torch._dynamo.mutation_guard"


def _torch_init(init: Callable[..., Any]) -> Callable[..., Any]:
    """``init`` without the registries' wrappers around it (``__wrapped__``, as ``functools.wraps`` keeps it)."""
    while getattr(init, "_torchrepro_noting", False):
        init = init.__wrapped__  # type: ignore[attr-defined]
    return init


class _DynamoSeesTorchInit(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Torch's compiler traces ``nn.Module.__init__`` as it was when it was imported (its
    ``unpatched_nn_module_init``, put in place of the current one, so as not to trace its own wrapper). Imported
    after a registry was installed, it would take the registry's wrapper for torch's own and trace it into every
    module made inside a compiled function: a graph break there, an error with ``fullgraph=True``. Right after that
    module is executed, this puts torch's own ``__init__`` back in it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _DYNAMO_GUARD:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        self.loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        init = getattr(module, "unpatched_nn_module_init", None)
        if init is not None:
            module.unpatched_nn_module_init = _torch_init(init)  # type: ignore[attr-defined]


_PROCESS = ModuleRegistry()
_INSTALLING = threading.Lock()


def live_modules() -> list[nn.Module]:
    """Every ``nn.Module`` alive in this process, in the order :class:`ModuleRegistry` gives. The first call scans
    the heap once and installs the process's registry, which notes every module made from then on."""
    if not _PROCESS.active:
        with _INSTALLING:  # two threads' first lookups: one scan, one pair of wrappers
            _PROCESS.install()
    return _PROCESS.modules()
