"""Finding the models of a running script and naming their parameters and submodules (layer L2)."""

from __future__ import annotations

import gc

from torch import nn


def discover_models() -> dict[str, nn.Module]:
    """Root modules alive in this process (modules that are not a submodule of another), named for prefixes.

    One root gets the empty prefix, so its parameters keep their own names (``layer1.0.conv1.weight``).
    """
    mods = [o for o in gc.get_objects() if issubclass(type(o), nn.Module)]
    inner: set[int] = set()
    for m in mods:
        for sub in m.modules():
            if sub is not m:
                inner.add(id(sub))
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
