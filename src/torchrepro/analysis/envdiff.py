"""Risk-ranked differences between two environments.

Every difference between two :mod:`~torchrepro.env.info` fingerprints (and, for recorded runs, their launch
options: seed, deterministic mode, hash seed) gets one of three ranks from :data:`RANK_TABLE`, a list of
``(pattern, rank, reason)`` rows matched in order against the dotted key of the difference
(``torch``, ``cpu.features.avx512f``, ``env.OMP_NUM_THREADS``, ``packages.numpy``):

* ``breaks-bitwise``: can break bitwise equality (other kernels, reduction orders or random numbers); whether it
  did is for the runs to show: a script whose ops do not depend on it stays bitwise identical;
* ``may-change-numerics``: can change results, depending on what the script uses;
* ``benign``: does not change what is computed -- also a setting that matters on CUDA only, when neither side can
  use CUDA (``cuda.available`` false in both: a CPU-only torch, or no GPU): ``CUBLAS_WORKSPACE_CONFIG`` on two
  CPU-only builds changes nothing (:data:`CUDA_ONLY`).

>>> diff = diff_environments(env_a, env_b)                      # doctest: +SKIP
>>> [(c.key, c.rank) for c in diff.changes]                     # doctest: +SKIP
[('threads.intra_op', 'breaks-bitwise'), ('packages.rich', 'benign')]
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._core.errors import EnvFileError, RunDirError, TracesNotComparableError
from .._core.readjson import read_json
from .._core.table import printable
from ..env.info import CPU_FEATURES, SCHEMA, Environment
from ..record.opsfile import read_ops
from ..record.store import FORMAT as RUN_FORMAT
from ..record.store import MANIFEST, OPS, Run, load_run
from .comparable import command_key
from .locate import locate_ops

DIFF_SCHEMA = "torchrepro.env-diff/1"
BREAKS, MAY, BENIGN = "breaks-bitwise", "may-change-numerics", "benign"
RANKS = (BREAKS, MAY, BENIGN)
RANK_TITLES = {BREAKS: "can break bitwise equality", MAY: "may change numerics", BENIGN: "benign"}
ABSENT = "absent"  # the value shown for a key that one side does not have


@dataclass(frozen=True)
class RankRule:
    """One row of the rank table: keys matching ``pattern`` (fnmatch, ``*`` crosses dots) get ``rank``."""

    pattern: str
    rank: str
    reason: str


_COMPUTE_PACKAGES = ("scipy", "torchvision", "torchaudio", "torchtext", "timm", "transformers", "accelerate",
                     "deepspeed", "apex", "flash-attn", "xformers", "transformer-engine*", "bitsandbytes",
                     "pillow", "pillow-simd", "opencv-python*", "albumentations", "kornia", "numba", "einops",
                     "lightning", "pytorch-lightning", "torchmetrics", "peft", "safetensors", "mkl*",
                     "intel-openmp", "onednn*", "nvidia-*")
_PACKAGE_REASON = ("a library in the compute or data path: a new version can change kernels, defaults, "
                   "initialisation or augmentation")

# First matching row wins: specific rows come before the catch-alls of their section. Within a rank, differences
# are listed in the order of their rows (the torch version before thread counts before seeds).
RANK_TABLE: tuple[RankRule, ...] = (
    # torch and the CUDA stack
    RankRule("torch", BREAKS, "another torch version ships other kernels and reduction orders"),
    RankRule("torch_build.git_version", BREAKS, "another torch build ships other kernels"),
    RankRule("torch_build.cuda", BREAKS, "torch built for another CUDA version uses other CUDA libraries"),
    RankRule("torch_build.hip", BREAKS, "torch built for another ROCm version uses other GPU libraries"),
    RankRule("torch_build.*", MAY, "a build option of torch"),
    RankRule("cuda.runtime", BREAKS, "another CUDA runtime brings other library kernels"),
    RankRule("cuda.cudnn", BREAKS, "another cuDNN version has other convolution algorithms"),
    RankRule("cuda.cublas", BREAKS, "another cuBLAS version has other matmul kernels and heuristics"),
    RankRule("cuda.nccl", BREAKS, "another NCCL version can change the all-reduce algorithm and order"),
    RankRule("cuda.available", BREAKS, "GPU kernels in one run, CPU kernels in the other"),
    RankRule("cuda.driver", MAY, "another driver can JIT-compile PTX differently and change library heuristics"),
    RankRule("cuda.device_count", MAY, "another number of GPUs changes data-parallel reductions when all are used"),
    RankRule("cuda.*", MAY, "a CUDA stack difference"),
    RankRule("device_kind", BREAKS, "computation runs on another kind of device"),
    RankRule("accelerators.*.name", BREAKS, "another GPU model selects other kernels (SM count, tensor cores)"),
    RankRule("accelerators.*.capability", BREAKS, "another GPU architecture runs other kernels"),
    RankRule("accelerators.*.multiprocessors", BREAKS, "another SM count changes split-K and reduction splits"),
    RankRule("accelerators.*.type", BREAKS, "another kind of accelerator runs other kernels"),
    RankRule("accelerators.*.memory_bytes", MAY, "memory limits can change cuDNN/cuBLAS algorithm choice"),
    RankRule("accelerators*", BREAKS, "another set of accelerators"),
    # CPU
    RankRule("cpu.capability", BREAKS, "ATen dispatches its vectorised CPU kernels by this ISA level"),
    RankRule("cpu.features.*", BREAKS, "MKL, oneDNN and ATen pick kernels by the CPU's instruction-set features"),
    RankRule("cpu.features", BREAKS, "MKL, oneDNN and ATen pick kernels by the CPU's instruction-set features"),
    RankRule("cpu.model", MAY, "another CPU model: MKL and oneDNN may pick other code paths (cache sizes, "
             "vendor) even with the same features"),
    RankRule("cpu.*", BENIGN, "the thread count itself is compared under threads.intra_op"),
    RankRule("config.*", MAY, "another BLAS/LAPACK/oneDNN/OpenMP build can use other kernels"),
    # threads, flags, precision
    RankRule("threads.intra_op", BREAKS, "CPU reductions are split by thread count, so sums are added in "
             "another order"),
    RankRule("threads.inter_op", MAY, "inter-op threads run independent ops concurrently; only order-sensitive "
             "ops notice"),
    RankRule("determinism.cublas_workspace_config", BREAKS, "decides whether cuBLAS uses deterministic workspaces"),
    RankRule("determinism.*", BREAKS, "deterministic mode and cuDNN's algorithm choice select other kernels"),
    RankRule("precision.*", BREAKS, "TF32/reduced precision changes the bits of every matmul/convolution"),
    RankRule("backends.*", BREAKS, "other kernels (cuDNN/oneDNN on or off, another attention backend)"),
    # environment variables
    RankRule("env.PYTHONHASHSEED", BREAKS, "another str hash seed changes set and dict-of-str iteration order"),
    RankRule("env.TORCHREPRO_SEED", BREAKS, "another seed gives other random numbers"),
    RankRule("env.CUBLAS_WORKSPACE_CONFIG", BREAKS, "decides whether cuBLAS uses deterministic workspaces"),
    RankRule("env.NVIDIA_TF32_OVERRIDE", BREAKS, "switches TF32 on or off for every CUDA library"),
    RankRule("env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", BREAKS, "switches TF32 on for cuBLAS matmuls"),
    RankRule("env.OMP_NUM_THREADS", BREAKS, "sets the CPU thread count, and with it the reduction order"),
    RankRule("env.MKL_NUM_THREADS", BREAKS, "sets MKL's thread count, and with it the reduction order"),
    RankRule("env.OPENBLAS_NUM_THREADS", BREAKS, "sets OpenBLAS's thread count, and with it the reduction order"),
    RankRule("env.ATEN_CPU_CAPABILITY", BREAKS, "forces ATen's CPU kernels to another ISA level"),
    RankRule("env.MKL_CBWR", BREAKS, "MKL's conditional numerical reproducibility mode picks the code path"),
    RankRule("env.MKL_ENABLE_INSTRUCTIONS", BREAKS, "limits the instructions MKL's kernels use"),
    RankRule("env.ONEDNN_MAX_CPU_ISA", BREAKS, "limits the instructions oneDNN's kernels use"),
    RankRule("env.DNNL_MAX_CPU_ISA", BREAKS, "limits the instructions oneDNN's kernels use"),
    RankRule("env.NCCL_ALGO", BREAKS, "another all-reduce algorithm adds gradients in another order"),
    RankRule("env.NCCL_PROTO", BREAKS, "another NCCL protocol changes how reductions are split"),
    RankRule("env.NCCL_*CHANNELS*", BREAKS, "the channel count changes how all-reduce splits the reduction"),
    RankRule("env.NCCL_NTHREADS", BREAKS, "changes how NCCL splits the reduction"),
    RankRule("env.NCCL_DEBUG*", BENIGN, "logging only"),
    RankRule("env.NCCL_*", MAY, "an NCCL setting: can change topology, transport or algorithm choice"),
    RankRule("env.NVTE_ALLOW_NONDETERMINISTIC_ALGO", BREAKS, "lets Transformer Engine use nondeterministic "
             "kernels"),
    RankRule("env.NVTE_*ATTN*", BREAKS, "selects Transformer Engine's attention backend"),
    RankRule("env.NVTE_DEBUG*", BENIGN, "logging only"),
    RankRule("env.NVTE_*", MAY, "a Transformer Engine setting"),
    RankRule("env.CUDA_LAUNCH_BLOCKING", BENIGN, "serialises kernel launches for debugging; results do not "
             "change"),
    RankRule("env.*CACHE*", BENIGN, "where compiled kernels are cached, not what they compute"),
    RankRule("env.CUDA_VISIBLE_DEVICES", MAY, "another GPU (or another number of GPUs) is used"),
    RankRule("env.*", MAY, "a variable read by torch or its libraries"),
    # what the two runs were launched with
    RankRule("launch.seed", BREAKS, "another seed gives other random numbers: initial weights, data order, "
             "dropout masks"),
    RankRule("launch.pythonhashseed", BREAKS, "another str hash seed changes set and dict-of-str iteration order"),
    RankRule("launch.deterministic", BREAKS, "deterministic mode selects other kernels (and raises for some ops)"),
    RankRule("launch.command", BREAKS, "another command line: other script arguments"),
    RankRule("launch.*", BENIGN, "does not change what each step computes"),
    # software around torch
    RankRule("packages.torch", BREAKS, "another torch version ships other kernels and reduction orders"),
    RankRule("packages.nvidia-cublas*", BREAKS, "another cuBLAS version has other matmul kernels"),
    RankRule("packages.nvidia-cudnn*", BREAKS, "another cuDNN version has other convolution algorithms"),
    RankRule("packages.nvidia-nccl*", BREAKS, "another NCCL version can change the all-reduce order"),
    RankRule("packages.numpy", MAY, "NumPy draws np.random numbers (data, augmentation) and computes "
             "preprocessing"),
    RankRule("packages.triton", MAY, "another Triton compiles torch.compile's kernels differently"),
    *(RankRule(f"packages.{name}", MAY, _PACKAGE_REASON) for name in _COMPUTE_PACKAGES),
    RankRule("packages.*", BENIGN, "not in the compute path"),
    RankRule("python.version", MAY, "some random-module functions and hashing details change between Python "
             "versions"),
    RankRule("python.hash_randomization", BREAKS, "str hashing (set and dict-of-str order) is randomised in one "
             "run only"),
    RankRule("git.commit", MAY, "another commit of the code"),
    RankRule("git.changes_sha256", MAY, "other uncommitted changes to the code"),
    RankRule("*", BENIGN, "does not change what is computed"),
)


# Settings read by the CUDA stack only (cuBLAS, cuDNN, NCCL, Transformer Engine, the GPUs' TF32 switches, the GPU
# packages): when neither environment can use CUDA, a difference in them changes nothing that is computed.
CUDA_ONLY = ("env.CUBLAS_WORKSPACE_CONFIG", "determinism.cublas_workspace_config", "determinism.cudnn_*",
             "env.NVIDIA_TF32_OVERRIDE", "env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "env.NCCL_*", "env.NVTE_*",
             "env.CUDA_VISIBLE_DEVICES", "precision.cuda_*", "precision.cudnn_*", "precision.fp16_reduced_*",
             "precision.bf16_reduced_*", "backends.cudnn_*", "cuda.*", "packages.nvidia-*", "packages.triton")


def _cuda_unusable(flat: dict[str, Any]) -> bool:
    """The environment cannot run CUDA: ``cuda.available`` recorded false (a CPU-only torch, or no GPU)."""
    return flat.get("cuda.available") is False


def _no_cuda_reason(reason: str, fa: dict[str, Any], fb: dict[str, Any]) -> str:
    builds = {str(f.get("torch_build.cuda")) for f in (fa, fb)}
    why = ("both torch builds are CPU-only (torch_build.cuda: not available)" if builds == {"not available"} else
           "neither environment can use CUDA (cuda.available false in both)")
    return f"no effect here: {why}; on CUDA: {reason}"


def _order(change: EnvChange) -> tuple[int, int]:
    """Rank first, then the row of the table (stable sort keeps keys alphabetical within a row)."""
    return RANKS.index(change.rank), RANK_TABLE.index(rank_of(change.key))


def rank_of(key: str) -> RankRule:
    """The first row of :data:`RANK_TABLE` that matches ``key``."""
    for rule in RANK_TABLE:
        if fnmatch.fnmatchcase(key, rule.pattern):
            return rule
    raise AssertionError("RANK_TABLE ends with a catch-all row")


_FEATURE_LABELS = {f"cpu.features.{flag}": label for table in CPU_FEATURES.values() for flag, label in table.items()}
_LABELS = {"torch": "torch", "threads.intra_op": "intra-op threads", "launch.seed": "seed",
           "launch.deterministic": "deterministic mode", "launch.pythonhashseed": "PYTHONHASHSEED (launch)",
           **_FEATURE_LABELS}


def _fmt(value: Any) -> str:
    if value is _MISSING:
        return ABSENT
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return printable(value) if isinstance(value, str) else json.dumps(value)


_MISSING = object()


@dataclass(frozen=True)
class EnvChange:
    """One difference: the dotted key, the value in A and in B (:data:`ABSENT` where missing), rank, reason."""

    key: str
    a: Any
    b: Any
    rank: str
    reason: str

    @property
    def label(self) -> str:
        return _LABELS.get(self.key) or printable(self.key.removeprefix("env."))

    def short(self) -> str:
        """``torch 2.12.0 → 2.13.0``, ``AVX-512 off``, ``OMP_NUM_THREADS 1 → 2``."""
        if isinstance(self.a, bool) and isinstance(self.b, bool):
            return f"{self.label} {_fmt(self.b)}"
        return f"{self.label} {_fmt(self.a)} → {_fmt(self.b)}"

    def as_in_a(self) -> str:
        """``OMP_NUM_THREADS 1``: the setting as A has it."""
        return f"{self.label} {_fmt(self.a)}"

    def values(self) -> str:
        """``1 → 2``, ``on → off``, ``absent → 2.1.0``."""
        return f"{_fmt(self.a)} → {_fmt(self.b)}"

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "a": None if self.a is _MISSING else self.a,
                "b": None if self.b is _MISSING else self.b, "only_in": self.only_in, "rank": self.rank,
                "reason": self.reason}

    @property
    def only_in(self) -> str | None:
        return "b" if self.a is _MISSING else "a" if self.b is _MISSING else None


@dataclass
class EnvDiff:
    """All differences between environment A and B, ordered by rank then key."""

    a: str
    b: str
    changes: list[EnvChange] = field(default_factory=list)

    def of_rank(self, rank: str) -> list[EnvChange]:
        return [c for c in self.changes if c.rank == rank]

    @property
    def breaks_bitwise(self) -> bool:
        return any(c.rank == BREAKS for c in self.changes)

    @property
    def exit_code(self) -> int:
        """1 when anything can break bitwise equality, else 0."""
        return 1 if self.breaks_bitwise else 0

    def summary(self, rank: str = BREAKS, limit: int = 6) -> str:
        """``torch 2.12.0 → 2.13.0, AVX-512 off`` for the changes of ``rank`` (at most ``limit``)."""
        items = [c.short() for c in self.of_rank(rank)]
        more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
        return ", ".join(items[:limit]) + more

    def to_json(self) -> dict[str, Any]:
        return {"schema": DIFF_SCHEMA, "a": self.a, "b": self.b,
                "verdict": "breaks-bitwise" if self.breaks_bitwise else ("differs" if self.changes else "same"),
                "exit_code": self.exit_code,
                "counts": {rank: len(self.of_rank(rank)) for rank in RANKS},
                "changes": [c.to_json() for c in self.changes]}


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """``{"cpu": {"features": {"avx2": True}}}`` -> ``{"cpu.features.avx2": True}``; list items by index
    (``accelerators.0.name``)."""
    out: dict[str, Any] = {}
    if isinstance(doc, dict) and doc:
        for k, v in doc.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(doc, list) and doc:
        for i, v in enumerate(doc):
            out.update(flatten(v, f"{prefix}.{i}"))
    else:
        out[prefix] = doc
    return out


# Sections that describe where and by whom a fingerprint was taken, not what computes: never compared.
_NOT_COMPARED = ("schema", "host")
# (key, source): ``key`` follows from ``source`` (the launcher sets it, or it is the same fact); when it holds the
# source's value on both sides, only the source's difference is listed (a seed is one difference, not four).
IMPLIED = (("env.PYTHONHASHSEED", "launch.pythonhashseed"), ("env.TORCHREPRO_SEED", "launch.seed"),
           ("launch.pythonhashseed", "launch.seed"), ("packages.torch", "torch"))


def _implied(key: str, fa: dict[str, Any], fb: dict[str, Any]) -> bool:
    for derived, source in IMPLIED:
        if key == derived and source in fa and source in fb and fa[source] != fb[source]:
            return all(str(side.get(derived)) == str(side.get(source)) for side in (fa, fb))
    return False


EnvironmentLike = Environment | dict[str, Any] | str | Path


def diff_environments(a: EnvironmentLike, b: EnvironmentLike, *, label_a: str = "A",
                      label_b: str = "B") -> EnvDiff:
    """Rank every difference between two environments.

    Each of ``a`` and ``b`` is an :class:`~torchrepro.Environment` (``torchrepro.environment()``), its JSON
    document (``Environment.to_json()``, plus ``launch`` for a recorded run), or the path of an env file or run
    directory (read as ``torchrepro env diff`` reads it). Launch options are compared only when both have them
    (two recorded runs).

    >>> diff = diff_environments(torchrepro.environment(), "machine-b.json")   # doctest: +SKIP
    >>> diff.breaks_bitwise, diff.summary()                                     # doctest: +SKIP
    """
    a, b = _document(a, "a"), _document(b, "b")
    if "launch" not in a or "launch" not in b:
        a, b = {k: v for k, v in a.items() if k != "launch"}, {k: v for k, v in b.items() if k != "launch"}
    fa = {k: v for k, v in flatten(a).items() if k.split(".")[0] not in _NOT_COMPARED}
    fb = {k: v for k, v in flatten(b).items() if k.split(".")[0] not in _NOT_COMPARED}
    changes = []
    no_cuda = _cuda_unusable(fa) and _cuda_unusable(fb)
    for key in sorted(set(fa) | set(fb)):
        unset = None if key.startswith("env.") else _MISSING  # a variable not recorded was not set
        va, vb = fa.get(key, unset), fb.get(key, unset)
        if (va != vb or type(va) is not type(vb)) and not _implied(key, fa, fb):
            rule = rank_of(key)
            if no_cuda and rule.rank != BENIGN and any(fnmatch.fnmatchcase(key, p) for p in CUDA_ONLY):
                changes.append(EnvChange(key, va, vb, BENIGN, _no_cuda_reason(rule.reason, fa, fb)))
                continue
            changes.append(EnvChange(key, va, vb, rule.rank, rule.reason))
    changes.sort(key=_order)
    return EnvDiff(label_a, label_b, changes)


def _document(env: Any, name: str) -> dict[str, Any]:
    """The JSON document of an Environment, a document, or a path (:func:`load_environment`)."""
    if isinstance(env, Environment):
        return env.to_json()
    if isinstance(env, dict):
        return env
    if isinstance(env, (str, Path)):
        return load_environment(env)
    raise TypeError(f"diff_environments: {name} is of type {type(env).__name__}; expected a torchrepro.Environment "
                    "(torchrepro.environment()), its to_json() document, or the path of an env file or run directory.")


# --- reading environments from files and run directories ----------------------------------------------
_WHAT = ("Pass an environment file (`torchrepro env --json -o FILE`) or a run directory "
         "(`torchrepro run --record DIR -- ...`).")


def launch_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The launch options of a recorded run that change numerics (compared beside its environment)."""
    command = manifest.get("command")
    return {"seed": manifest.get("seed"), "deterministic": manifest.get("deterministic"),
            "pythonhashseed": manifest.get("pythonhashseed"),
            "command": " ".join(command_key(command)) if isinstance(command, list) else None}


def run_environment(run: Run) -> dict[str, Any]:
    """The environment of a recorded run, validated, with its ``launch`` options added."""
    env = run.manifest.get("environment")
    source = str(run.path / MANIFEST)
    if not isinstance(env, dict) or "schema" not in env:
        raise EnvFileError(source, f"has no environment in the {SCHEMA!r} format (the run was recorded by an "
                           "older torchrepro, or the manifest was edited).", "Record the run again.")
    doc = Environment.from_json(env, source=f"{source} (its 'environment')").to_json()
    return doc | {"launch": launch_of(run.manifest)}


def load_environment(path: str | Path) -> dict[str, Any]:
    """An environment document from an env JSON file, a run directory, or a run's ``manifest.json``."""
    p = Path(path)
    if p.is_dir():
        return run_environment(load_run(p))
    doc = read_json(p, error=EnvFileError, action=_WHAT)  # a regular file, bounded, strict JSON
    if isinstance(doc, dict) and doc.get("format") == RUN_FORMAT:
        if p.name != MANIFEST:
            raise RunDirError(p, "is a run manifest outside a run directory.", "Pass the run directory itself.")
        return run_environment(load_run(p.parent))
    return Environment.from_json(doc, source=str(p)).to_json()


# --- environment differences of recorded runs (diff, check, diff --locate) ------------------------------
def diff_runs(runs: list[Run]) -> EnvDiff:
    """Run 1's environment and launch options against every other run's (the first value that differs)."""
    base = run_environment(runs[0])
    merged: dict[str, EnvChange] = {}
    for i, other in enumerate(runs[1:], start=2):
        for change in diff_environments(base, run_environment(other), label_a="run 1", label_b=f"run {i}").changes:
            merged.setdefault(change.key, change)
    label_b = "run 2" if len(runs) == 2 else f"runs 2-{len(runs)}"
    return EnvDiff("run 1", label_b, sorted(merged.values(), key=_order))


def verdict_note(verdict: str, diff: EnvDiff, *, locate_hint: bool = True) -> str | None:
    """What the environment differences mean for a comparison's verdict (None when nothing can break bitwise equality).

    ``locate_hint``: end a divergence's note with how to find the op that computes differently.
    """
    if not diff.breaks_bitwise:
        return None
    what = diff.summary()
    if verdict == "identical":
        return (f"The runs are bitwise identical although they differ in settings that can break bitwise equality "
                f"({what}): this script's results do not depend on them (e.g. it seeds itself).")
    note = (f"The runs also differ in settings that can break bitwise equality ({what}): the divergence may come "
            "from them rather than from nondeterminism.")
    return note + (" Record both with `torchrepro run --record DIR --trace-steps K` (K = the first divergent step) "
                   "and run `torchrepro diff --locate` to name the first operation that computes differently."
                   if locate_hint else "")


def locate_between(run_a: Run, run_b: Run, diff: EnvDiff | None, *, first_step: int | None) -> dict[str, Any]:
    """The first op whose inputs were identical in two recorded runs while its outputs differed, explained by
    the environment differences that break bitwise equality (``diff``)."""
    ops = []
    for run in (run_a, run_b):
        if not (run.path / OPS).exists():
            raise RunDirError(run.path, "has no op trace (ops.jsonl), so --locate has nothing to compare.",
                              "Record both runs with `torchrepro run --record DIR --trace-steps N -- ...` (the same "
                              "N for both; N = the first divergent step), then run `torchrepro diff --locate` again.")
        ops.append(list(read_ops(run.path / OPS)))
    steps = [sorted({op.get("step") for op in stream if op.get("step") is not None}) for stream in ops]  # type: ignore[type-var]
    if steps[0] != steps[1]:
        raise TracesNotComparableError(f"the op traces hold different steps: {run_a.path} traced {steps[0]}, "
                                       f"{run_b.path} traced {steps[1]}. Record both with the same "
                                       "`--trace-steps N`.")
    device = str(run_a.manifest.get("device") or "cpu").split(":")[0]
    loc = locate_ops(ops[0], ops[1], device=device)
    doc = loc.to_json() | {"traced_in": "the two recorded runs"}
    breaks = diff.of_rank(BREAKS) if diff is not None else []
    doc["environment_breaks"] = [c.short() for c in breaks]
    if diff is not None and breaks and loc.verdict == "origin" and loc.op_a:
        op = loc.op_a
        where = f" ({op['file']}:{op['line']})" if op.get("file") else ""
        module = f" in `{op['module']}`" if op.get("module") else ""
        doc["title"] = "an operation computes differently in B's environment"
        doc["explanation"] = (f"the kernel of `{op['op']}`{module}{where} gives other bits in run B from identical "
                              f"inputs; B differs by: {diff.summary()}")
        doc["deterministic_kernel"] = None
        settings = ", ".join(c.as_in_a() for c in breaks)
        doc["fix"] = (f"Give B the settings of A ({settings}) to get A's bits, or accept the "
                      "difference: these environments are not expected to agree bit for bit. Deterministic mode "
                      "does not help here: it makes each environment repeat itself, not agree with the other.")
    if loc.verdict == "not-reproduced" and any(loc.ops_traced):
        doc["title"] = "every traced op agrees in the two recorded runs"
        doc["fix"] = ("The difference arises outside the traced ops: in a step that was not traced (record both runs "
                      "with `torchrepro run --record DIR --trace-steps N`, N = the first divergent step), in code "
                      "compiled with torch.compile (its kernels are not traced), or in data that does not come from "
                      "a torch op.")
    if first_step is not None and steps[0] and first_step not in steps[0]:
        doc["note"] = (f"the runs first diverge at step {first_step}, but the traces hold step(s) "
                       f"{', '.join(map(str, steps[0]))}; record with `--trace-steps {first_step}` to look at the "
                       "first divergence.")
    return doc
