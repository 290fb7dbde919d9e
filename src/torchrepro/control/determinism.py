"""Deterministic mode as a call, a context manager and a decorator (layer L1).

Example:
    >>> import torch, torchrepro
    >>> with torchrepro.deterministic():
    ...     torch.are_deterministic_algorithms_enabled()
    True
    >>> torch.are_deterministic_algorithms_enabled()
    False
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from .._core.compat import fill_uninitialized_memory_get, fill_uninitialized_memory_set
from .._core.errors import ReproWarning

CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
_VALID_CUBLAS = (":4096:8", ":16:8")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class DeterminismConfig:
    """A complete determinism setting. ``current_config()`` reads the live one."""

    use_deterministic_algorithms: bool = False
    warn_only: bool = False
    cudnn_deterministic: bool = False
    cudnn_benchmark: bool = False
    cublas_workspace_config: str | None = None
    fill_uninitialized_memory: bool | None = None

    @property
    def is_deterministic(self) -> bool:
        """True when this setting asks for deterministic kernels everywhere it can."""
        return self.use_deterministic_algorithms and self.cudnn_deterministic and not self.cudnn_benchmark

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def current_config() -> DeterminismConfig:
    """The determinism setting in force in this process now."""
    return DeterminismConfig(
        use_deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        cublas_workspace_config=os.environ.get(CUBLAS_ENV),
        fill_uninitialized_memory=fill_uninitialized_memory_get(),
    )


def apply_config(config: DeterminismConfig) -> None:
    """Put ``config`` in force (flags and the cuBLAS env var; None unsets the variable)."""
    torch.use_deterministic_algorithms(config.use_deterministic_algorithms, warn_only=config.warn_only)
    torch.backends.cudnn.deterministic = config.cudnn_deterministic
    torch.backends.cudnn.benchmark = config.cudnn_benchmark
    if config.cublas_workspace_config is None:
        os.environ.pop(CUBLAS_ENV, None)
    else:
        os.environ[CUBLAS_ENV] = config.cublas_workspace_config
    if config.fill_uninitialized_memory is not None:
        fill_uninitialized_memory_set(config.fill_uninitialized_memory)


def _cuda_initialized() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


class deterministic:  # noqa: N801 - reads as a function at call sites
    """Switch PyTorch's deterministic mode on (or off), as a call, a context manager or a decorator.

    * call: ``torchrepro.deterministic()`` applies the setting now and leaves it on.
    * context: ``with torchrepro.deterministic(): ...`` restores every flag and env var on exit.
    * decorator: ``@torchrepro.deterministic()`` applies it around each call of the function only.

    It sets ``torch.use_deterministic_algorithms(enabled, warn_only=...)``, ``cudnn.deterministic``,
    ``cudnn.benchmark = False``, ``CUBLAS_WORKSPACE_CONFIG`` (``None`` leaves it alone) and the
    uninitialized-memory fill. ``enabled=False`` switches deterministic algorithms and cuDNN determinism off.
    The setting now in force is ``self.config``; the one it replaced is ``self.previous``.
    """

    def __init__(
        self,
        enabled: bool = True,
        *,
        warn_only: bool = False,
        cublas_workspace: str | None = ":4096:8",
        fill_uninitialized_memory: bool = True,
    ) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {enabled!r}")
        if cublas_workspace is not None and cublas_workspace not in _VALID_CUBLAS:
            raise ValueError(
                f"cublas_workspace must be one of {_VALID_CUBLAS} or None, got {cublas_workspace!r}."
            )
        self.previous = current_config()
        env = self.previous.cublas_workspace_config
        if enabled:
            self.config = DeterminismConfig(
                use_deterministic_algorithms=True,
                warn_only=warn_only,
                cudnn_deterministic=True,
                cudnn_benchmark=False,
                cublas_workspace_config=cublas_workspace if cublas_workspace is not None else env,
                fill_uninitialized_memory=fill_uninitialized_memory,
            )
        else:
            self.config = DeterminismConfig(
                use_deterministic_algorithms=False,
                warn_only=False,
                cudnn_deterministic=False,
                cudnn_benchmark=self.previous.cudnn_benchmark,
                cublas_workspace_config=env,
                fill_uninitialized_memory=self.previous.fill_uninitialized_memory,
            )
        self._warn_if_too_late()
        apply_config(self.config)

    def _warn_if_too_late(self) -> None:
        wanted = self.config.cublas_workspace_config
        if wanted and self.previous.cublas_workspace_config is None and _cuda_initialized():
            warnings.warn(
                f"CUDA is already initialised in this process, so {CUBLAS_ENV}={wanted} cannot take effect "
                "for cuBLAS here and cuBLAS matmuls may stay nondeterministic. Set it before CUDA starts: "
                f"`{CUBLAS_ENV}={wanted} python train.py`, or `torchrepro run --deterministic -- python "
                "train.py`, or call torchrepro.deterministic() before any CUDA work.",
                ReproWarning,
                stacklevel=3,
            )

    def restore(self) -> None:
        """Put back the setting that was in force before this object was created."""
        apply_config(self.previous)

    def __enter__(self) -> deterministic:
        apply_config(self.config)  # idempotent; re-applies when the object is entered again
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def __call__(self, func: F) -> F:
        # Used as a decorator: undo the immediate application and apply around each call instead.
        self.restore()
        config = self.config

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            before = current_config()
            apply_config(config)
            try:
                return func(*args, **kwargs)
            finally:
                apply_config(before)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"deterministic(config={self.config!r})"
