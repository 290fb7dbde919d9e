"""torchrepro: make PyTorch training bitwise reproducible, prove it, and find where it is not.

>>> import torchrepro
>>> seed = torchrepro.seed_everything(0)
>>> with torchrepro.deterministic():
...     pass

Public names are imported on first use (PEP 562), so ``import torchrepro`` -- and ``torchrepro lint`` -- do
not pay for importing torch until something needs it.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from . import (
    _launchenv,  # noqa: F401 - records PYTHONHASHSEED as it was at start-up, before user code runs
    _ompteam,  # noqa: F401 - registers its fork guard before the script can fork (stdlib only)
)
from ._version import __version__

if TYPE_CHECKING:  # for type checkers and IDEs; at run time names are imported on first use
    from .audit import AuditItem, AuditReport, audit
    from .checkpoint import load_checkpoint, save_checkpoint
    from .data import ResumableLoader, make_generator, seed_worker
    from .determinism import DeterminismConfig, current_config, deterministic
    from .distributed import ConsistencyReport, check_consistency, sync_rng_states
    from .envdiff import EnvChange, EnvDiff, diff_environments
    from .envinfo import Environment, environment, environment_summary
    from .errors import (
        CheckpointError,
        CollectiveError,
        DeviceMismatchError,
        EnvFileError,
        MissingGeneratorError,
        NondeterministicOpError,
        RankMismatchError,
        ReproError,
        ReproWarning,
        RunDirError,
        ScriptError,
        StateFileError,
    )
    from .fingerprint import fingerprint, fingerprint_many
    from .measure import TOLERANCES, NondeterminismReport, assert_deterministic, measure_nondeterminism
    from .metrics import log_metric
    from .optrace import trace_ops
    from .policy import DeterminismPolicy, mark_deterministic
    from .record import watch
    from .registry import OpEntry, nondeterministic_ops
    from .resume import ResumeReport, verify_resume
    from .rng import RNGState, isolate_rng, load_rng_state, register_generator, save_rng_state, unregister_generator
    from .scan import ScanFinding, ScanReport, scan
    from .seeding import derive_seed, seed_everything

_EXPORTS: dict[str, str] = {
    "AuditItem": "audit",
    "AuditReport": "audit",
    "audit": "audit",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "ResumableLoader": "data",
    "make_generator": "data",
    "seed_worker": "data",
    "DeterminismConfig": "determinism",
    "current_config": "determinism",
    "deterministic": "determinism",
    "ConsistencyReport": "distributed",
    "check_consistency": "distributed",
    "sync_rng_states": "distributed",
    "EnvChange": "envdiff",
    "EnvDiff": "envdiff",
    "diff_environments": "envdiff",
    "Environment": "envinfo",
    "environment": "envinfo",
    "environment_summary": "envinfo",
    "CheckpointError": "errors",
    "CollectiveError": "errors",
    "DeviceMismatchError": "errors",
    "EnvFileError": "errors",
    "MissingGeneratorError": "errors",
    "NondeterministicOpError": "errors",
    "RankMismatchError": "errors",
    "ReproError": "errors",
    "ReproWarning": "errors",
    "RunDirError": "errors",
    "ScriptError": "errors",
    "StateFileError": "errors",
    "fingerprint": "fingerprint",
    "fingerprint_many": "fingerprint",
    "TOLERANCES": "measure",
    "NondeterminismReport": "measure",
    "assert_deterministic": "measure",
    "measure_nondeterminism": "measure",
    "log_metric": "metrics",
    "trace_ops": "optrace",
    "DeterminismPolicy": "policy",
    "mark_deterministic": "policy",
    "watch": "record",
    "OpEntry": "registry",
    "nondeterministic_ops": "registry",
    "ResumeReport": "resume",
    "verify_resume": "resume",
    "RNGState": "rng",
    "isolate_rng": "rng",
    "load_rng_state": "rng",
    "register_generator": "rng",
    "save_rng_state": "rng",
    "unregister_generator": "rng",
    "ScanFinding": "scan",
    "ScanReport": "scan",
    "scan": "scan",
    "derive_seed": "seeding",
    "seed_everything": "seeding",
}

__all__ = [
    "AuditItem",
    "AuditReport",
    "CheckpointError",
    "CollectiveError",
    "ConsistencyReport",
    "DeterminismConfig",
    "DeterminismPolicy",
    "DeviceMismatchError",
    "EnvChange",
    "EnvDiff",
    "EnvFileError",
    "Environment",
    "MissingGeneratorError",
    "NondeterminismReport",
    "NondeterministicOpError",
    "OpEntry",
    "RNGState",
    "RankMismatchError",
    "ReproError",
    "ReproWarning",
    "ResumableLoader",
    "ResumeReport",
    "RunDirError",
    "ScanFinding",
    "ScanReport",
    "ScriptError",
    "StateFileError",
    "TOLERANCES",
    "__version__",
    "assert_deterministic",
    "audit",
    "check_consistency",
    "current_config",
    "derive_seed",
    "deterministic",
    "diff_environments",
    "environment",
    "environment_summary",
    "fingerprint",
    "fingerprint_many",
    "isolate_rng",
    "load_checkpoint",
    "load_rng_state",
    "log_metric",
    "make_generator",
    "mark_deterministic",
    "measure_nondeterminism",
    "nondeterministic_ops",
    "register_generator",
    "save_checkpoint",
    "save_rng_state",
    "scan",
    "seed_everything",
    "seed_worker",
    "sync_rng_states",
    "trace_ops",
    "unregister_generator",
    "verify_resume",
    "watch",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchrepro' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | {name for name in globals() if name.startswith("__")})


class _Package(types.ModuleType):
    """Importing the submodules ``fingerprint`` and ``audit`` must not hide the functions of the same name."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name:
            return  # the import system binds a submodule to its package: keep the public function instead
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
