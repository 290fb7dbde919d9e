"""Deterministic mode as a call, a context manager and a decorator.

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
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from .._core.compat import fill_uninitialized_memory_get, fill_uninitialized_memory_set
from .._core.errors import ReproWarning
from .._core.naming import renamed

CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
INDUCTOR_ENV = "TORCHINDUCTOR_DETERMINISTIC"  # read by torch._inductor.config when it is first imported
_INDUCTOR_CONFIG = "torch._inductor.config"
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
    inductor_deterministic: bool | None = None

    @property
    def is_deterministic(self) -> bool:
        """True when this setting asks for deterministic kernels everywhere it can."""
        return self.use_deterministic_algorithms and self.cudnn_deterministic and not self.cudnn_benchmark

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}
    as_dict = renamed("to_json", "as_dict")


def current_config() -> DeterminismConfig:
    """The determinism setting in force in this process now."""
    return DeterminismConfig(
        use_deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        cublas_workspace_config=os.environ.get(CUBLAS_ENV),
        fill_uninitialized_memory=fill_uninitialized_memory_get(),
        inductor_deterministic=_inductor_get(),
    )


def _inductor_get() -> bool:
    """``torch._inductor.config.deterministic``; before inductor is imported, what it will read from the env."""
    config = sys.modules.get(_INDUCTOR_CONFIG)
    if config is not None and hasattr(config, "deterministic"):
        return bool(config.deterministic)
    return os.environ.get(INDUCTOR_ENV) == "1"


def _inductor_set(on: bool) -> None:
    """Inductor's deterministic mode (no on-device autotuning). Importing inductor takes seconds, so before it is
    imported the setting goes into the variable it reads at import (``TORCHINDUCTOR_DETERMINISTIC``)."""
    config: Any = sys.modules.get(_INDUCTOR_CONFIG)
    if config is not None and hasattr(config, "deterministic"):
        config.deterministic = on
    if on:
        os.environ[INDUCTOR_ENV] = "1"
    else:
        os.environ.pop(INDUCTOR_ENV, None)


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
    if config.inductor_deterministic is not None:
        _inductor_set(config.inductor_deterministic)


def _cuda_initialized() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


class deterministic:  # noqa: N801 - reads as a function at call sites
    """Switch PyTorch's deterministic mode on (or off), as a call, a context manager or a decorator.

    * call: ``torchrepro.deterministic()`` applies the setting now and leaves it on.
    * context: ``with torchrepro.deterministic(): ...`` restores every flag and env var on exit.
    * decorator: ``@torchrepro.deterministic()`` applies it around each call of the function only.

    By default it switches on every setting below; each keyword turns one of them off, for the cheapest
    configuration that is still bitwise reproducible (``torchrepro bench --explain`` measures what each costs and
    verifies the cheapest one with a check). What each gives up when turned off:

    * ``use_deterministic_algorithms=False``: ``torch.use_deterministic_algorithms`` stays off, so ops with a
      nondeterministic kernel (``index_add_``, ``scatter_add_``, ``index_put_(accumulate=True)`` on CUDA,
      atomics-based backward passes) may give different bits run to run, and none raises. The uninitialized-memory
      fill acts only under deterministic algorithms, so it goes too.
    * ``fill_uninitialized_memory=False``: ``torch.empty`` and other uninitialised outputs are not filled (with NaN,
      or the largest integer). A script that reads memory it never wrote may then differ run to run; one that
      does not loses nothing. On CPU this fill is most of deterministic mode's cost.
    * ``cudnn_deterministic=False``: cuDNN may pick nondeterministic convolution algorithms (CUDA only).
    * ``cudnn_benchmark=True``: cuDNN autotunes, and the algorithm it times fastest can differ between runs
      (CUDA only).
    * ``cublas_workspace=None``: ``CUBLAS_WORKSPACE_CONFIG`` is left as it is; unset, cuBLAS matmuls may split their
      reductions differently run to run on CUDA >= 10.2 (CUDA only; it must be set before CUDA starts).
    * ``inductor=False``: inductor's deterministic mode stays off, so ``torch.compile`` may autotune kernels on the
      device and pick different ones between runs (only for compiled code).

    ``warn_only=True`` makes ops without a deterministic kernel warn instead of raise. ``enabled=False`` switches
    deterministic algorithms and cuDNN determinism off. The setting now in force is ``self.config``; the one it
    replaced is ``self.previous``.
    """

    def __init__(
        self,
        enabled: bool = True,
        *,
        warn_only: bool = False,
        cublas_workspace: str | None = ":4096:8",
        fill_uninitialized_memory: bool = True,
        use_deterministic_algorithms: bool = True,
        cudnn_deterministic: bool = True,
        cudnn_benchmark: bool = False,
        inductor: bool = True,
    ) -> None:
        flags = {"enabled": enabled, "warn_only": warn_only, "fill_uninitialized_memory": fill_uninitialized_memory,
                 "use_deterministic_algorithms": use_deterministic_algorithms,
                 "cudnn_deterministic": cudnn_deterministic, "cudnn_benchmark": cudnn_benchmark, "inductor": inductor}
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        if cublas_workspace is not None and cublas_workspace not in _VALID_CUBLAS:
            raise ValueError(
                f"cublas_workspace must be one of {_VALID_CUBLAS} or None, got {cublas_workspace!r}."
            )
        self.previous = current_config()
        env = self.previous.cublas_workspace_config
        if enabled:
            self.config = DeterminismConfig(
                use_deterministic_algorithms=use_deterministic_algorithms,
                warn_only=warn_only and use_deterministic_algorithms,
                cudnn_deterministic=cudnn_deterministic,
                cudnn_benchmark=cudnn_benchmark,
                cublas_workspace_config=cublas_workspace if cublas_workspace is not None else env,
                fill_uninitialized_memory=(fill_uninitialized_memory if use_deterministic_algorithms
                                           else self.previous.fill_uninitialized_memory),
                inductor_deterministic=inductor,
            )
        else:
            self.config = DeterminismConfig(
                use_deterministic_algorithms=False,
                warn_only=False,
                cudnn_deterministic=False,
                cudnn_benchmark=self.previous.cudnn_benchmark,
                cublas_workspace_config=env,
                fill_uninitialized_memory=self.previous.fill_uninitialized_memory,
                inductor_deterministic=False,
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


# the table of settings lives in _settings (no torch: the CLI builds its options from it); re-exported here
from ._settings import SETTING_NAMES as SETTING_NAMES  # noqa: E402
from ._settings import SETTINGS as SETTINGS  # noqa: E402
from ._settings import Setting as Setting  # noqa: E402
from ._settings import call_text as call_text  # noqa: E402
from ._settings import setting as setting  # noqa: E402
from ._settings import without as without  # noqa: E402
