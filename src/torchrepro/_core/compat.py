"""Version and optional-dependency shims."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch


def optional_import(name: str) -> ModuleType | None:
    """Import a module if installed, else return None (e.g. ``numpy``)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


np: Any = optional_import("numpy")


def fill_uninitialized_memory_get() -> bool | None:
    mod = getattr(torch.utils, "deterministic", None)
    return None if mod is None else bool(getattr(mod, "fill_uninitialized_memory", False))


def fill_uninitialized_memory_set(value: bool) -> None:
    mod = getattr(torch.utils, "deterministic", None)
    if mod is not None and hasattr(mod, "fill_uninitialized_memory"):
        mod.fill_uninitialized_memory = value


def accelerator_modules() -> dict[str, Any]:
    """Accelerator backends present in this torch build and available now, by device type."""
    found: dict[str, Any] = {}
    for name in ("cuda", "xpu", "mps"):
        mod = getattr(torch, name, None)
        try:
            if mod is not None and mod.is_available():
                found[name] = mod
        except Exception:  # a backend that fails to probe is treated as absent
            continue
    return found


def device_problem(name: str) -> str | None:
    """Why ``torch.device(name)`` cannot be used in this process, in words; None when it can.

    >>> device_problem("cpu") is None
    True
    """
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        return f"{name!r} is not a device name torch knows (expected cpu, cuda, cuda:N, mps or xpu)"
    module = getattr(torch, device.type, None) if device.type in ("cuda", "mps", "xpu") else None
    if module is None:
        return None
    try:
        available = bool(module.is_available())
        count = int(module.device_count()) if available and hasattr(module, "device_count") else 1
    except Exception:  # noqa: BLE001 - a backend that fails to probe cannot be used
        available, count = False, 0
    if not available:
        return f"{device.type.upper()} is not available here ({_why_unavailable(device.type)})"
    if device.index is not None and device.index >= count:
        return f"this machine has {count} {device.type.upper()} device(s), so there is no {name}"
    return None


def _why_unavailable(kind: str) -> str:
    built = getattr(getattr(torch.backends, kind, None), "is_built", None)
    if kind == "cuda" and callable(built) and not built():
        return f"torch {torch.__version__} was built without CUDA"
    return f"torch {torch.__version__} finds no {kind.upper()} device"


def best_device_name() -> str:
    """``"cuda"``, ``"mps"`` or ``"cpu"``: the best device this process can use."""
    for name in ("cuda", "mps"):
        if device_problem(name) is None:
            return name
    return "cpu"
