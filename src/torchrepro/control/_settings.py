"""The settings deterministic mode switches, as a table (no torch import: the CLI builds its options from it).

>>> without(["fill-uninitialized-memory"])
{'fill_uninitialized_memory': False}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"


@dataclass(frozen=True)
class Setting:
    """One setting that :class:`deterministic` switches, and how to leave it out.

    ``name`` is its CLI spelling (``--deterministic-except NAME``), ``off`` the keyword argument of
    :class:`deterministic` that leaves it out, ``scope`` where it acts (``"all"``, ``"cuda"``: CUDA devices only,
    ``"compile"``: code compiled by ``torch.compile`` only), ``within`` the setting it acts under (the memory fill
    acts only under deterministic algorithms).
    """

    name: str
    title: str
    off: tuple[str, Any]
    scope: str
    within: str | None = None


SETTINGS: tuple[Setting, ...] = (
    Setting("algorithms", "deterministic algorithms (torch.use_deterministic_algorithms)",
            ("use_deterministic_algorithms", False), "all"),
    Setting("fill-uninitialized-memory", "uninitialized-memory fill (torch.utils.deterministic)",
            ("fill_uninitialized_memory", False), "all", within="algorithms"),
    Setting("cudnn-deterministic", "cudnn.deterministic = True", ("cudnn_deterministic", False), "cuda"),
    Setting("cudnn-benchmark", "cudnn.benchmark off", ("cudnn_benchmark", True), "cuda"),
    Setting("cublas-workspace", f"{CUBLAS_ENV}=:4096:8", ("cublas_workspace", None), "cuda"),
    Setting("inductor", "inductor's deterministic mode (torch._inductor.config.deterministic)",
            ("inductor", False), "compile"),
)
SETTING_NAMES = tuple(s.name for s in SETTINGS)


def setting(name: str) -> Setting:
    """The :class:`Setting` called ``name``; ValueError naming the known ones otherwise."""
    for s in SETTINGS:
        if s.name == name:
            return s
    raise ValueError(f"unknown deterministic-mode setting {name!r}; known: {', '.join(SETTING_NAMES)}")


def without(names: Any) -> dict[str, Any]:
    """The keyword arguments of :class:`deterministic` that leave out the settings ``names`` (a setting that acts
    only under another one left out needs no argument of its own).
    """
    left_out = {setting(n).name for n in names}
    return dict(s.off for s in SETTINGS if s.name in left_out and s.within not in left_out)


def call_text(kwargs: dict[str, Any]) -> str:
    """``torchrepro.deterministic(...)`` as code, with these keyword arguments."""
    return f"torchrepro.deterministic({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
