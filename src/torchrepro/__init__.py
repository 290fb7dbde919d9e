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
from typing import TYPE_CHECKING, Any

from ._core import (
    launchenv as _launchenv,  # noqa: F401 - records PYTHONHASHSEED as it was at start-up, before user code runs
)
from ._core import (
    ompteam as _ompteam,  # noqa: F401 - registers its fork guard before the script can fork (stdlib only)
)
from ._version import __version__

if TYPE_CHECKING:  # for type checkers and IDEs; at run time names are imported on first use
    from ._core.errors import (
        BatchInvarianceError,
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
    from ._core.fingerprint import fingerprint, fingerprint_many
    from .analysis.envdiff import EnvChange, EnvDiff, diff_environments
    from .analysis.invariance import BatchInvarianceResult, assert_batch_invariant, check_batch_invariance
    from .analysis.scan import ScanFinding, ScanReport, scan
    from .control.determinism import DeterminismConfig, current_config, deterministic
    from .control.policy import DeterminismPolicy, mark_deterministic
    from .control.registry import OpEntry, nondeterministic_ops
    from .control.rng import (
        RNGState,
        isolate_rng,
        load_rng_state,
        register_generator,
        save_rng_state,
        unregister_generator,
    )
    from .control.seeding import derive_seed, seed_everything
    from .distributed.ranks import ConsistencyReport, check_consistency, sync_rng_states
    from .env.audit import AuditItem, AuditReport, audit
    from .env.info import Environment, environment, environment_summary
    from .measure.assertdet import TOLERANCES, assert_deterministic
    from .measure.nondeterminism import NondeterminismReport, measure_nondeterminism
    from .nn.invariant import batch_invariant
    from .record.metrics import log_metric
    from .record.optrace import trace_ops
    from .record.recorder import watch
    from .record.resumeat import ResumePoint, resume_point
    from .resume.checkpoint import load_checkpoint, save_checkpoint
    from .resume.data import ResumableLoader, make_generator, seed_worker
    from .resume.verify import ResumeReport, verify_resume

_EXPORTS: dict[str, str] = {
    "AuditItem": "env.audit",
    "AuditReport": "env.audit",
    "audit": "env.audit",
    "load_checkpoint": "resume.checkpoint",
    "save_checkpoint": "resume.checkpoint",
    "ResumableLoader": "resume.data",
    "make_generator": "resume.data",
    "seed_worker": "resume.data",
    "DeterminismConfig": "control.determinism",
    "current_config": "control.determinism",
    "deterministic": "control.determinism",
    "ConsistencyReport": "distributed.ranks",
    "check_consistency": "distributed.ranks",
    "sync_rng_states": "distributed.ranks",
    "EnvChange": "analysis.envdiff",
    "EnvDiff": "analysis.envdiff",
    "diff_environments": "analysis.envdiff",
    "Environment": "env.info",
    "environment": "env.info",
    "environment_summary": "env.info",
    "BatchInvarianceError": "_core.errors",
    "CheckpointError": "_core.errors",
    "CollectiveError": "_core.errors",
    "DeviceMismatchError": "_core.errors",
    "EnvFileError": "_core.errors",
    "MissingGeneratorError": "_core.errors",
    "NondeterministicOpError": "_core.errors",
    "RankMismatchError": "_core.errors",
    "ReproError": "_core.errors",
    "ReproWarning": "_core.errors",
    "RunDirError": "_core.errors",
    "ScriptError": "_core.errors",
    "StateFileError": "_core.errors",
    "fingerprint": "_core.fingerprint",
    "fingerprint_many": "_core.fingerprint",
    "TOLERANCES": "measure.assertdet",
    "NondeterminismReport": "measure.nondeterminism",
    "assert_deterministic": "measure.assertdet",
    "measure_nondeterminism": "measure.nondeterminism",
    "log_metric": "record.metrics",
    "trace_ops": "record.optrace",
    "DeterminismPolicy": "control.policy",
    "mark_deterministic": "control.policy",
    "watch": "record.recorder",
    "ResumePoint": "record.resumeat",
    "resume_point": "record.resumeat",
    "OpEntry": "control.registry",
    "nondeterministic_ops": "control.registry",
    "ResumeReport": "resume.verify",
    "verify_resume": "resume.verify",
    "RNGState": "control.rng",
    "isolate_rng": "control.rng",
    "load_rng_state": "control.rng",
    "register_generator": "control.rng",
    "save_rng_state": "control.rng",
    "unregister_generator": "control.rng",
    "ScanFinding": "analysis.scan",
    "ScanReport": "analysis.scan",
    "scan": "analysis.scan",
    "BatchInvarianceResult": "analysis.invariance",
    "assert_batch_invariant": "analysis.invariance",
    "check_batch_invariance": "analysis.invariance",
    "batch_invariant": "nn.invariant",
    "derive_seed": "control.seeding",
    "seed_everything": "control.seeding",
}

__all__ = [
    "AuditItem",
    "AuditReport",
    "BatchInvarianceError",
    "BatchInvarianceResult",
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
    "ResumePoint",
    "ResumeReport",
    "RunDirError",
    "ScanFinding",
    "ScanReport",
    "ScriptError",
    "StateFileError",
    "TOLERANCES",
    "__version__",
    "assert_batch_invariant",
    "assert_deterministic",
    "audit",
    "batch_invariant",
    "check_batch_invariance",
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
    "resume_point",
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
