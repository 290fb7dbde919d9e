"""A ``TorchDispatchMode`` base class that leaves ``torch._dynamo`` unimported until the program imports it.

Recent torch wraps the ``__torch_dispatch__`` of every ``TorchDispatchMode`` subclass in ``torch._disable_dynamo``,
whose first call imports ``torch._dynamo`` (and with it much of ``torch._inductor``): about 1 CPU second, once per
process, in every process that enters such a mode. torchrepro's modes (the op tracer of
``--locate``, ``scan``, the row tracer, the draw watch, per-op policies) run in scripts that never compile
anything, so :class:`QuietDispatchMode` wraps the handler itself, the same way, but lazily: Dynamo traces frames
only once it is imported, so until then the handler runs as written; from its first call after ``torch._dynamo``
is imported it runs under ``torch._dynamo.disable`` exactly as torch's own wrapper would run it.

Example:
    >>> import sys, torch
    >>> class Count(QuietDispatchMode):
    ...     def __torch_dispatch__(self, func, types, args=(), kwargs=None):
    ...         return func(*args, **(kwargs or {}))
    >>> with Count():
    ...     _ = torch.ones(2) + 1
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["QuietDispatchMode"]


def _disabled_once_dynamo_is_loaded(cls: type, handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` as is while ``torch._dynamo`` is not (fully) imported; from the first call after, ``cls``'s handler
    becomes the one torch would have made (``torch._disable_dynamo(handler)``), with no wrapper of ours left."""

    @functools.wraps(handler)
    def run(*args: Any, **kwargs: Any) -> Any:
        if getattr(sys.modules.get("torch._dynamo"), "disable", None) is None:
            return handler(*args, **kwargs)  # not imported, or being imported now (an op of its own import)
        wrap = getattr(torch, "_disable_dynamo", None)  # what torch itself wraps handlers in (recent torch)
        disabled = wrap(handler, recursive=True) if wrap is not None else handler
        cls.__torch_dispatch__ = disabled  # type: ignore[attr-defined]
        return disabled(*args, **kwargs)

    return run


class QuietDispatchMode(TorchDispatchMode):
    """A ``TorchDispatchMode`` whose ``__torch_dispatch__`` does not import ``torch._dynamo`` (see the module)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # torch's own switch: leave the handler unwrapped (wrapped below instead)
        return False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)  # type: ignore[no-untyped-call]
        handler = cls.__dict__.get("__torch_dispatch__")
        if handler is not None and not isinstance(handler, classmethod):
            cls.__torch_dispatch__ = _disabled_once_dynamo_is_loaded(cls, handler)  # type: ignore[method-assign]
