"""Version and optional-dependency shims (layer L0)."""

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
