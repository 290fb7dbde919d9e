"""torchrepro: make PyTorch training bitwise reproducible, prove it, and find where it is not.

>>> import torchrepro
>>> seed = torchrepro.seed_everything(0)
>>> with torchrepro.deterministic():
...     pass
"""

from ._version import __version__
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
from .record import watch
from .resume import ResumeReport, verify_resume
from .rng import (
    RNGState,
    isolate_rng,
    load_rng_state,
    register_generator,
    save_rng_state,
    unregister_generator,
)
from .seeding import derive_seed, seed_everything

__all__ = [
    "AuditItem",
    "AuditReport",
    "CheckpointError",
    "CollectiveError",
    "ConsistencyReport",
    "DeterminismConfig",
    "DeviceMismatchError",
    "EnvChange",
    "EnvDiff",
    "EnvFileError",
    "Environment",
    "MissingGeneratorError",
    "NondeterminismReport",
    "RNGState",
    "RankMismatchError",
    "ReproError",
    "ReproWarning",
    "ResumableLoader",
    "ResumeReport",
    "RunDirError",
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
    "measure_nondeterminism",
    "register_generator",
    "save_checkpoint",
    "save_rng_state",
    "seed_everything",
    "seed_worker",
    "sync_rng_states",
    "trace_ops",
    "unregister_generator",
    "verify_resume",
    "watch",
]
