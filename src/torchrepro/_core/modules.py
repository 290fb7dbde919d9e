"""Finding the models of a running script and naming their parameters and submodules."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .livemodules import live_modules


def discover_models(*, scan: bool = False) -> dict[str, nn.Module]:
    """Root modules alive in this process (modules that are not a submodule of another), named for prefixes.

    One root gets the empty prefix, so its parameters keep their own names (``layer1.0.conv1.weight``); several
    are named by class, the larger first among roots of one class (``Net``, ``Linear``, ``Linear2``), and roots
    of one class and size in the registry's order: those alive at its first use as the heap scan met them, then
    the others in the order they were made. The modules alive come from the process's registry of modules
    (``_core/livemodules``: one heap scan at the first call, then nothing in proportion to the heap);
    ``scan=True`` scans the heap instead, at each call (``gc.get_objects()``: ~0.1 s per million objects), as
    discovery did before the registry (ties then follow the garbage collector's generations).

    >>> net = nn.Sequential(nn.Linear(2, 2))
    >>> any(m is net for m in discover_models().values())
    True
    """
    if scan:
        mods = [o for o in gc.get_objects() if issubclass(type(o), nn.Module)]  # type(): no __class__ lookups
    else:
        # not one whose __class__ was set to a non-module since
        mods = [m for m in live_modules() if issubclass(type(m), nn.Module)]
    return named_roots(mods)


def named_roots(mods: list[nn.Module]) -> dict[str, nn.Module]:
    """The roots among ``mods`` (those with parameters that are no other module's submodule), named as
    :func:`discover_models` says; ties (same class, same size) keep the order of ``mods``.

    >>> body = nn.Linear(2, 2)
    >>> sorted(named_roots([nn.Sequential(body), body, nn.ReLU(), nn.Linear(3, 3)]))
    ['Linear', 'Sequential']
    """
    inner: set[int] = set()  # every module below another, each visited once (not each module's whole subtree)
    below = [sub for m in mods for sub in m._modules.values() if sub is not None and sub is not m]
    while below:
        sub = below.pop()
        if id(sub) not in inner:
            inner.add(id(sub))
            below.extend(s for s in sub._modules.values() if s is not None)
    roots = [m for m in mods if id(m) not in inner and any(True for _ in m.parameters())]
    if len(roots) == 1:
        return {"": roots[0]}
    roots.sort(key=lambda m: (type(m).__name__, -sum(p.numel() for p in m.parameters())))
    named: dict[str, nn.Module] = {}
    for m in roots:
        base = type(m).__name__
        name, i = base, 1
        while name in named:
            i += 1
            name = f"{base}{i}"
        named[name] = m
    return named


def optimizers_exist() -> bool:
    """Whether any ``torch.optim.Optimizer`` is alive in this process (a gc scan: call it rarely)."""
    from torch.optim import Optimizer

    return any(issubclass(type(o), Optimizer) for o in gc.get_objects())  # type(): no __class__ lookups


_IN_OPTIMIZER_STEP: list[ModuleContext] = []  # the installed contexts, told when an optimizer step starts and ends
_optimizer_hooks: list[Any] = []


def _optimizer_hooks_once() -> None:
    """Register, once per process, the global optimizer-step hooks that tell every installed
    :class:`ModuleContext` when a step starts and ends.

    A context is installed and removed where a traced range starts and ends, which can be inside an optimizer
    step's post hooks (the recorder's step boundary). Torch iterates the dict of global optimizer hooks lazily
    there, so registering or removing one then fails with "OrderedDict mutated during iteration"; a context only
    joins or leaves the list these two hooks read."""
    if _optimizer_hooks:
        return

    def opt_pre(opt: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        changed = None
        for ctx in list(_IN_OPTIMIZER_STEP):
            new = ctx._opt_pre(args, kwargs)
            if new is not None:
                changed = new
                args, kwargs = new
        return changed

    def opt_post(opt: Any, args: Any, kwargs: Any) -> None:
        for ctx in list(_IN_OPTIMIZER_STEP):
            ctx._opt_post()

    _optimizer_hooks.extend([register_optimizer_step_pre_hook(opt_pre), register_optimizer_step_post_hook(opt_post)])


class ModuleContext:
    """Global hooks that say, while an op runs, which module's forward it is in and whether an optimizer step is.

    Used by the op tracer and the scanner. ``name_of(module)`` gives a module's path for :attr:`path`.

    >>> ctx = ModuleContext(lambda m: type(m).__name__).install()
    >>> _ = nn.Linear(2, 2)(torch.ones(2)); ctx.path   # outside any forward again
    ''
    >>> ctx.remove()
    """

    def __init__(self, name_of: Callable[[nn.Module], str]) -> None:
        _optimizer_hooks_once()  # now, outside any optimizer step (install may run inside one)
        self.name_of = name_of
        self.stack: list[str] = []
        self.in_optimizer = 0
        self._handles: list[Any] = []

    @property
    def path(self) -> str:
        """The innermost running module's path, "" outside every forward."""
        return self.stack[-1] if self.stack else ""

    def install(self) -> ModuleContext:
        def pre(mod: nn.Module, args: Any) -> None:
            self.stack.append(self.name_of(mod))

        def post(mod: nn.Module, args: Any, out: Any) -> None:
            if self.stack:
                self.stack.pop()

        mm = torch.nn.modules.module
        self._handles = [mm.register_module_forward_pre_hook(pre),
                         mm.register_module_forward_hook(post, always_call=True)]  # pops after an exception too
        _optimizer_hooks_once()
        _IN_OPTIMIZER_STEP.append(self)
        return self

    def _opt_pre(self, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        self.in_optimizer += 1
        return self._closure_outside(args, kwargs)

    def _opt_post(self) -> None:
        self.in_optimizer = max(0, self.in_optimizer - 1)

    def _closure_outside(self, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """``optimizer.step(closure)``'s arguments with the closure run outside the optimizer step: the forward
        and backward it runs (Lightning's ``training_step`` runs there) are not the optimizer's update. None
        when there is no closure. ``args`` starts with the optimizer itself (torch's step wrapper passes it)."""
        if kwargs.get("closure") is not None:
            closure = kwargs["closure"]
            if not callable(closure):
                return None
            return args, {**kwargs, "closure": self._outside(closure)}
        if len(args) > 1 and args[1] is not None and callable(args[1]):
            return (args[0], self._outside(args[1]), *args[2:]), kwargs
        return None

    def _outside(self, closure: Callable[..., Any]) -> Callable[..., Any]:
        def outside_optimizer(*a: Any, **kw: Any) -> Any:
            saved, self.in_optimizer = self.in_optimizer, 0
            try:
                return closure(*a, **kw)
            finally:
                self.in_optimizer = saved

        return outside_optimizer

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self in _IN_OPTIMIZER_STEP:
            _IN_OPTIMIZER_STEP.remove(self)
        self.stack.clear()
        self.in_optimizer = 0
