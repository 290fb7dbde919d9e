"""The environment fingerprint: every fact of this process and machine that can change numerics.

:func:`environment` collects, in well under a second without CUDA and without starting a subprocess other than
``git`` (only inside a git checkout, with a timeout): Python; torch's version and build; CUDA runtime, driver,
cuDNN, cuBLAS and NCCL versions; accelerators (name, compute capability, memory; never serial numbers or
UUIDs); the CPU model and the instruction-set features that select kernels; BLAS/oneDNN/OpenMP configuration;
thread counts; every determinism and precision flag; the environment variables that matter; installed
distributions; and the git commit with a digest of uncommitted changes. Host name, user name and home paths
are left out unless ``include_host=True``.

A CUDA field that cannot be read here (no GPU, a CPU-only build) holds :data:`NOT_AVAILABLE`.

>>> env = environment()
>>> env.torch, env.threads["intra_op"]                   # doctest: +SKIP
('2.13.0', 2)
>>> Environment.from_json(env.to_json()) == env
True
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import hashlib
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from .._core.errors import EnvFileError
from .._version import __version__
from ..control.determinism import current_config

SCHEMA = "torchrepro.env/1"
NOT_AVAILABLE = "not available"
GIT_TIMEOUT_S = 2.0

# Variables read whether set or not (None when unset): they change seeds, kernels, precision or threads.
ENV_VARS = ("PYTHONHASHSEED", "TORCHREPRO_SEED", "CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING",
            "CUDA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
# Families of variables recorded when set (NCCL_ALGO, NVTE_FUSED_ATTN, KMP_AFFINITY, TORCHINDUCTOR_*, ...).
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "NVTE_", "OMP_", "KMP_", "MKL_", "CUBLAS", "CUDNN_", "TORCH_CUDNN_",
                "DNNL_", "ONEDNN_", "TORCHINDUCTOR_", "PYTORCH_", "TORCH_")
_ENV_SKIP_PREFIXES = ("TORCHREPRO_LAUNCH", "TORCHREPRO_PARENT")

# CPU instruction-set features that select different kernels (MKL, oneDNN, ATen's vectorised code), per
# architecture family: /proc/cpuinfo flag -> the name people know it by.
CPU_FEATURES: dict[str, dict[str, str]] = {
    "x86": {"sse4_2": "SSE4.2", "avx": "AVX", "avx2": "AVX2", "fma": "FMA", "f16c": "F16C",
            "avx512f": "AVX-512", "avx512bw": "AVX-512BW", "avx512vl": "AVX-512VL", "avx512_vnni": "AVX-512 VNNI",
            "avx512_bf16": "AVX-512 BF16", "avx512_fp16": "AVX-512 FP16", "avx_vnni": "AVX-VNNI",
            "amx_tile": "AMX", "amx_bf16": "AMX-BF16", "amx_int8": "AMX-INT8"},
    "arm": {"asimd": "NEON", "asimdhp": "NEON FP16", "sve": "SVE", "sve2": "SVE2", "bf16": "BF16",
            "i8mm": "I8MM", "sme": "SME"},
}

# Components named in torch.__config__.show(): (field, regex whose group 1 is the version text).
_CONFIG_COMPONENTS = (
    ("mkl", r"Math Kernel Library Version (.+)"),
    ("onednn", r"(?:MKL-DNN|oneDNN) (v[\w.]+(?: \(Git Hash \w+\))?)"),
    ("openmp", r"OpenMP (\d+)"),
    ("cpu_capability_usage", r"CPU capability usage: (\w+)"),
    ("lapack", r"(LAPACK is enabled.*)"),
    ("nnpack", r"(NNPACK is enabled)"),
    ("compiler", r"^(GCC [\d.]+|clang [\d.]+|MSVC \d+)"),
)
# Build settings of torch.__config__.show() that matter for numerics (compiler flags are left out).
_BUILD_KEYS = ("BLAS_INFO", "LAPACK_INFO", "BUILD_TYPE", "USE_MKL", "USE_MKLDNN", "USE_OPENMP", "USE_CUDA",
               "USE_CUDNN", "USE_NCCL", "USE_ROCM", "CUDA_VERSION", "CUDNN_VERSION", "TORCH_VERSION")


def _safe(read: Callable[[], Any], default: Any = NOT_AVAILABLE) -> Any:
    """``read()``, or ``default`` when the backend cannot be queried here (never fails the fingerprint)."""
    try:
        return read()
    except Exception:  # noqa: BLE001 - a backend that cannot answer is recorded as such
        return default


def device_kind() -> str:
    """'cuda', 'mps', 'xpu' or 'cpu': the accelerator a default script would use."""
    if _safe(torch.cuda.is_available, False):
        return "cuda"
    for name in ("xpu", "mps"):
        mod = getattr(torch, name, None)
        if mod is not None and _safe(getattr(mod, "is_available", lambda: False), False):  # not in torch 2.1's mps
            return name
    return "cpu"


# --- sections ------------------------------------------------------------------------------------------
def _python() -> dict[str, Any]:
    return {"version": platform.python_version(), "implementation": platform.python_implementation(),
            "hash_randomization": bool(sys.flags.hash_randomization)}


def _platform() -> dict[str, Any]:
    return {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
            "libc": " ".join(platform.libc_ver()).strip() or NOT_AVAILABLE}


def _torch_build() -> dict[str, Any]:
    return {"git_version": getattr(torch.version, "git_version", NOT_AVAILABLE),
            "debug": bool(getattr(torch.version, "debug", False)),
            "cuda": torch.version.cuda or NOT_AVAILABLE,
            "hip": getattr(torch.version, "hip", None) or NOT_AVAILABLE}


def _nvml_driver() -> str:
    """The NVIDIA driver version through NVML (ctypes; no nvidia-smi subprocess)."""
    import ctypes

    nvml = ctypes.CDLL("libnvidia-ml.so.1" if sys.platform != "win32" else "nvml.dll")
    if nvml.nvmlInit_v2() != 0:
        return NOT_AVAILABLE
    try:
        buf = ctypes.create_string_buffer(96)
        return buf.value.decode() if nvml.nvmlSystemGetDriverVersion(buf, 96) == 0 else NOT_AVAILABLE
    finally:
        nvml.nvmlShutdown()


def _package_version(*names: str) -> str:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return NOT_AVAILABLE


def _cuda() -> dict[str, Any]:
    available = bool(_safe(torch.cuda.is_available, False))
    info: dict[str, Any] = {"available": available, "runtime": torch.version.cuda or NOT_AVAILABLE,
                            "driver": NOT_AVAILABLE, "cudnn": NOT_AVAILABLE, "cublas": NOT_AVAILABLE,
                            "nccl": NOT_AVAILABLE, "device_count": 0}
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return info
    # cuBLAS has no version query in torch; the pip wheels name it (conda installs: not available).
    info["cublas"] = _package_version("nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cublas-cu11",
                                      "nvidia-cublas")
    if not available:
        return info
    version = _safe(torch.backends.cudnn.version, None)
    info["cudnn"] = str(version) if version is not None else NOT_AVAILABLE
    nccl = _safe(torch.cuda.nccl.version)
    info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    info["driver"] = _safe(_nvml_driver)
    info["device_count"] = _safe(torch.cuda.device_count, 0)
    return info


def _accelerators() -> list[dict[str, Any]]:
    """Name, type, compute capability, memory and multiprocessor count of each device (no serials or UUIDs)."""
    found: list[dict[str, Any]] = []
    for kind in ("cuda", "xpu"):
        mod = getattr(torch, kind, None)
        if mod is None or not _safe(getattr(mod, "is_available", lambda: False), False):
            continue
        for i in range(_safe(mod.device_count, 0)):
            props = _safe(lambda m=mod, i=i: m.get_device_properties(i), None)  # type: ignore[misc]
            major, minor = getattr(props, "major", None), getattr(props, "minor", None)
            found.append({"type": kind, "index": i, "name": getattr(props, "name", NOT_AVAILABLE),
                          "capability": f"{major}.{minor}" if major is not None else NOT_AVAILABLE,
                          "memory_bytes": getattr(props, "total_memory", NOT_AVAILABLE),
                          "multiprocessors": getattr(props, "multi_processor_count", NOT_AVAILABLE)})
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and _safe(mps.is_available, False):
        found.append({"type": "mps", "index": 0, "name": "Apple MPS", "capability": NOT_AVAILABLE,
                      "memory_bytes": NOT_AVAILABLE, "multiprocessors": NOT_AVAILABLE})
    return found


def _cpuinfo() -> tuple[str | None, set[str] | None]:
    """The CPU model name and feature flags from /proc/cpuinfo (its first processor only); Nones elsewhere."""
    model, flags = None, None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Hardware", "cpu model") and model is None:
                    model = value.strip()
                elif key in ("flags", "Features") and flags is None:
                    flags = set(value.split())
                if model is not None and flags is not None:
                    break
    except OSError:
        pass
    return model, flags


def cpu_family(machine: str | None = None) -> str:
    """'x86', 'arm' or the machine name: which table of :data:`CPU_FEATURES` applies."""
    machine = (machine or platform.machine()).lower()
    if machine in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "x86"
    if machine.startswith(("arm", "aarch64")):
        return "arm"
    return machine


def _cpu() -> dict[str, Any]:
    model, flags = _cpuinfo()
    table = CPU_FEATURES.get(cpu_family(), {})
    affinity = _safe(lambda: len(os.sched_getaffinity(0)), None)
    return {"model": model or platform.processor() or NOT_AVAILABLE, "count": os.cpu_count(),
            "affinity": affinity if affinity is not None else NOT_AVAILABLE,
            "capability": _safe(torch.backends.cpu.get_cpu_capability),
            "features": {flag: flag in flags for flag in table} if flags is not None else NOT_AVAILABLE}


def _parse_config(show: str) -> dict[str, Any]:
    """BLAS/LAPACK/oneDNN/OpenMP versions and the numerics-relevant build settings of ``torch.__config__``."""
    out: dict[str, Any] = {name: NOT_AVAILABLE for name, _ in _CONFIG_COMPONENTS}
    settings: dict[str, str] = {}
    for raw in show.splitlines():
        line = raw.strip().removeprefix("- ")
        if line.startswith("Build settings:"):
            for item in line.removeprefix("Build settings:").split(","):
                key, sep, value = item.strip().partition("=")
                if sep and key in _BUILD_KEYS:
                    settings[key] = value.strip()
            continue
        for name, pattern in _CONFIG_COMPONENTS:
            m = re.search(pattern, line)
            if m and out[name] == NOT_AVAILABLE:
                out[name] = m.group(1).strip()
    out["build"] = {key: settings.get(key, NOT_AVAILABLE) for key in _BUILD_KEYS}
    return out


def _config() -> dict[str, Any]:
    doc = _parse_config(_safe(torch.__config__.show, ""))
    parallel = _safe(torch.__config__.parallel_info, "")
    m = re.search(r"ATen parallel backend: (.+)", parallel)
    doc["parallel_backend"] = m.group(1).strip() if m else NOT_AVAILABLE
    doc["mkl_available"] = bool(_safe(torch.backends.mkl.is_available, False))
    doc["mkldnn_available"] = bool(_safe(torch.backends.mkldnn.is_available, False))
    doc["openmp_available"] = bool(_safe(torch.backends.openmp.is_available, False))
    return doc


def _threads() -> dict[str, Any]:
    return {"intra_op": torch.get_num_threads(), "inter_op": _safe(torch.get_num_interop_threads)}


def _backends() -> dict[str, Any]:
    """Switches that select other kernels: cuDNN/oneDNN on or off, and the SDPA (attention) backends."""
    cuda = torch.backends.cuda
    return {"cudnn_enabled": bool(torch.backends.cudnn.enabled),
            "mkldnn_enabled": bool(_safe(lambda: torch.backends.mkldnn.enabled, False)),
            "sdpa_flash": _safe(cuda.flash_sdp_enabled), "sdpa_mem_efficient": _safe(cuda.mem_efficient_sdp_enabled),
            "sdpa_math": _safe(cuda.math_sdp_enabled), "sdpa_cudnn": _safe(lambda: cuda.cudnn_sdp_enabled())}  # 2.2+


def _resolved_precision(*levels: Any) -> str | None:
    """The first ``fp32_precision`` that is not ``"none"`` (``"none"`` inherits the next level), or None."""
    for level in levels:
        value = _safe(functools.partial(getattr, level, "fp32_precision"), None)
        if isinstance(value, str) and value != "none":
            return value
    return None


def _tf32_allowed(legacy: Callable[[], Any], *levels: Any) -> bool:
    """Whether TF32 is allowed, read without failing whichever of PyTorch's two TF32 APIs the script used.

    The legacy getter (``torch.backends.cudnn.allow_tf32``) raises on torch >= 2.9 once the new
    ``fp32_precision`` API has set an op's precision (a "mix of the legacy and new APIs"), so it is read only
    while it answers; otherwise the answer is derived from the new API: ``"tf32"`` on any op level means allowed.
    """
    try:
        return bool(legacy())
    except RuntimeError:
        return any(_resolved_precision(*chain) == "tf32" for chain in levels)


def _precision() -> dict[str, Any]:
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    conv, rnn = getattr(cudnn, "conv", None), getattr(cudnn, "rnn", None)
    root = torch.backends
    return {"cuda_matmul_allow_tf32": _tf32_allowed(lambda: matmul.allow_tf32, (matmul, root)),
            "cudnn_allow_tf32": _tf32_allowed(lambda: cudnn.allow_tf32, (conv, cudnn, root), (rnn, cudnn, root)),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_fp32_precision": _safe(lambda: matmul.fp32_precision),
            "cudnn_fp32_precision": _safe(lambda: torch.backends.cudnn.fp32_precision),
            "mkldnn_fp32_precision": _safe(lambda: torch.backends.mkldnn.fp32_precision),
            "fp16_reduced_precision_reduction": _safe(lambda: bool(matmul.allow_fp16_reduced_precision_reduction)),
            "bf16_reduced_precision_reduction": _safe(lambda: bool(matmul.allow_bf16_reduced_precision_reduction))}


def _env(scrub: Callable[[str], str]) -> dict[str, str | None]:
    found: dict[str, str | None] = {name: os.environ.get(name) for name in ENV_VARS}
    for name in sorted(os.environ):
        if name.startswith(ENV_PREFIXES) and not name.startswith(_ENV_SKIP_PREFIXES):
            found.setdefault(name, os.environ[name])
    return {k: scrub(v) if v is not None else None for k, v in found.items()}


def normalize_name(name: str) -> str:
    """A distribution name as pip compares it (PEP 503): ``Typing_Extensions`` -> ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _packages() -> dict[str, str]:
    """Installed distributions and versions; the first on ``sys.path`` wins, as for ``import``."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            found.setdefault(normalize_name(name), dist.version)
    return dict(sorted(found.items()))


def git_checkout(start: Path) -> Path | None:
    """The root of the git checkout that holds ``start``, or None."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def _git_output(root: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True,
                          timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL).stdout


def _git(start: Path, include_host: bool) -> dict[str, Any]:
    """The commit and a digest of uncommitted changes (tracked diffs and untracked file names)."""
    root = git_checkout(start)
    if root is None:
        return {"checkout": False}
    info: dict[str, Any] = {"checkout": True}
    if include_host:
        info["root"] = str(root)
    try:
        info["commit"] = _git_output(root, "rev-parse", "HEAD").decode().strip()
        status = _git_output(root, "status", "--porcelain=v1", "-z", "--untracked-files=normal")
        diff = _git_output(root, "diff", "HEAD", "--binary")
    except (OSError, subprocess.SubprocessError) as exc:
        return info | {"error": f"git failed: {type(exc).__name__}"}
    entries = [e for e in status.split(b"\0") if e]
    untracked = sorted(e[3:] for e in entries if e.startswith(b"?? "))
    info["dirty"] = bool(entries)
    info["changed_files"] = len(entries)
    info["changes_sha256"] = (hashlib.sha256(diff + b"\0untracked\0" + b"\0".join(untracked)).hexdigest()
                              if entries else None)
    return info


def _host() -> dict[str, Any]:
    user = _safe(getpass.getuser)
    return {"hostname": socket.gethostname(), "user": user, "home": str(Path.home()), "cwd": os.getcwd(),
            "python_executable": sys.executable}


def _scrubber(include_host: bool) -> Callable[[str], str]:
    """Hides the home directory (as ``~``), the user name and the host name in recorded variable values.

    Names are replaced where they stand as a word or path part (``/tmp/torchinductor_alice`` ->
    ``/tmp/torchinductor_<user>``), so that a fingerprint can be shared without saying who or where made it.
    """
    if include_host:
        return lambda value: value
    home = str(Path.home())
    names = [(re.compile(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])"), tag)
             for name, tag in ((_safe(getpass.getuser, ""), "<user>"), (_safe(socket.gethostname, ""), "<host>"))
             if name]

    def scrub(value: str) -> str:
        if home and home != os.sep:
            value = value.replace(home, "~")
        for pattern, tag in names:
            value = pattern.sub(tag, value)
        return value

    return scrub


@dataclass(frozen=True)
class Environment:
    """A snapshot of everything about this process and machine that can change numerics (see the module doc).

    ``to_json()`` / ``from_json()`` round-trip exactly; ``schema`` versions the format. Fields are sections
    of plain JSON values; :data:`NOT_AVAILABLE` marks what could not be read here (e.g. CUDA without a GPU).
    """

    schema: str
    torchrepro: str
    torch: str
    device_kind: str
    python: dict[str, Any]
    platform: dict[str, Any]
    torch_build: dict[str, Any]
    cuda: dict[str, Any]
    accelerators: list[dict[str, Any]]
    cpu: dict[str, Any]
    config: dict[str, Any]
    threads: dict[str, Any]
    determinism: dict[str, Any]
    precision: dict[str, Any]
    backends: dict[str, Any]
    env: dict[str, Any]
    packages: dict[str, str]
    git: dict[str, Any]
    host: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (schema first; ``host`` only when it was collected)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        if doc["host"] is None:
            del doc["host"]
        return doc

    @classmethod
    def from_json(cls, doc: Any, *, source: str = "<environment>") -> Environment:
        """Validate and load a document written by :meth:`to_json`; raise :class:`EnvFileError` naming the problem."""
        action = "Write it with `torchrepro env --json -o FILE` (or record a run with `torchrepro run --record DIR`)."
        if not isinstance(doc, Mapping):
            raise EnvFileError(source, f"holds a JSON {type(doc).__name__}, expected an object with schema "
                               f"{SCHEMA!r}.", action)
        schema = doc.get("schema")
        if schema != SCHEMA:
            what = ("has no 'schema' field" if schema is None else f"has schema {schema!r}")
            raise EnvFileError(source, f"{what}; expected {SCHEMA!r} (a torchrepro environment).", action)
        problems = []
        for f in fields(cls):
            kind = _FIELD_TYPES[f.name]
            if f.name not in doc:
                if f.name != "host":
                    problems.append(f"'{f.name}' is missing")
            elif not isinstance(doc[f.name], kind) and not (f.name == "host" and doc[f.name] is None):
                problems.append(f"'{f.name}' is a {type(doc[f.name]).__name__}, expected a {kind.__name__}")
        if problems:
            raise EnvFileError(source, f"is not a complete environment ({'; '.join(problems)}): it is truncated "
                               "or was edited.", action)
        return cls(**{f.name: doc.get(f.name) for f in fields(cls)})  # type: ignore[arg-type]


# The JSON type of each field, checked by Environment.from_json.
_NOT_DICT: dict[str, type] = {"schema": str, "torchrepro": str, "torch": str, "device_kind": str, "accelerators": list}
_FIELD_TYPES: dict[str, type] = {f.name: _NOT_DICT.get(f.name, dict) for f in fields(Environment)}

# Sections in the order they are collected and printed: (field, collector). The collectors that need an
# argument (env, git, host) are called in environment().
SECTIONS: tuple[tuple[str, Callable[[], Any]], ...] = (
    ("python", _python), ("platform", _platform), ("torch_build", _torch_build), ("cuda", _cuda),
    ("accelerators", _accelerators), ("cpu", _cpu), ("config", _config), ("threads", _threads),
    ("determinism", lambda: current_config().to_json()), ("precision", _precision), ("backends", _backends),
    ("packages", _packages),
)


def environment(*, include_host: bool = False, git_dir: str | Path | None = None) -> Environment:
    """Collect the :class:`Environment` of this process now.

    Args:
        include_host: also record host name, user name, home directory, working directory and interpreter
            path (left out by default; in recorded variables the home directory is written as ``~`` and the
            user and host names as ``<user>`` and ``<host>``).
        git_dir: where to look for a git checkout (default: the working directory).
    """
    collected = {name: collect() for name, collect in SECTIONS}
    return Environment(
        schema=SCHEMA, torchrepro=__version__, torch=str(torch.__version__), device_kind=device_kind(),
        env=_env(_scrubber(include_host)), git=_git(Path(git_dir or os.getcwd()).resolve(), include_host),
        host=_host() if include_host else None, **collected,
    )


def environment_summary() -> dict[str, Any]:
    """:func:`environment` as a JSON-able dict (what run manifests embed under ``environment``)."""
    return environment().to_json()


# --- what a script does before its first step (for `torchrepro audit -- python train.py`) ---------------
SEEDING_FUNCTIONS = (("random", "seed"), ("numpy.random", "seed"), ("torch", "manual_seed"),
                     ("torch.random", "manual_seed"), ("torch.cuda", "manual_seed"),
                     ("torch.cuda", "manual_seed_all"))


class ScriptProbe:
    """Watches a script from its start for what ``torchrepro audit`` judges but cannot see afterwards.

    Records seeding calls (``random.seed``, ``numpy.random.seed``, ``torch.manual_seed``, ...), each
    DataLoader made (workers, ``worker_init_fn``, generator, shuffling), autocast and GradScaler use, and each
    time ``CUBLAS_WORKSPACE_CONFIG`` is set (with whether CUDA had already started). It patches module
    attributes and installs a ``sys.addaudithook`` hook, so it is meant for the launcher's child process,
    which ends with the script.
    """

    def __init__(self) -> None:
        self.seeding: list[dict[str, Any]] = []
        self.loaders: list[dict[str, Any]] = []
        self.autocast: list[dict[str, Any]] = []
        self.grad_scalers = 0
        self.cublas_sets: list[dict[str, Any]] = []
        self.cublas_at_start = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        self._lock = threading.Lock()

    def install(self) -> ScriptProbe:
        for module_name, attr in SEEDING_FUNCTIONS:
            module = sys.modules.get(module_name)
            if module is None and module_name == "numpy.random":
                module = _safe(lambda: __import__("numpy.random", fromlist=["seed"]), None)
            if module is not None and callable(getattr(module, attr, None)):
                setattr(module, attr, self._seed_wrapper(f"{module_name}.{attr}", getattr(module, attr)))
        self._wrap_init(torch.utils.data.DataLoader, self._on_loader)
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is not None:
            self._wrap_init(scaler, lambda obj, *a, **k: setattr(self, "grad_scalers", self.grad_scalers + 1))
        enter = torch.autocast.__enter__

        def autocast_enter(ctx: Any) -> Any:
            with self._lock:
                if len(self.autocast) < 20:
                    self.autocast.append({"device": str(getattr(ctx, "device", "?")),
                                          "dtype": str(getattr(ctx, "fast_dtype", "?")).removeprefix("torch."),
                                          "enabled": bool(getattr(ctx, "_enabled", True))})
            return enter(ctx)  # type: ignore[no-untyped-call]

        torch.autocast.__enter__ = autocast_enter  # type: ignore[method-assign]
        sys.addaudithook(self._audit_hook)
        return self

    def _seed_wrapper(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seed = args[0] if args else kwargs.get("seed", kwargs.get("a"))
            with self._lock:
                if len(self.seeding) < 50:
                    self.seeding.append({"function": name, "seed": seed if isinstance(seed, int) else repr(seed)})
            return func(*args, **kwargs)

        wrapper.__wrapped__ = func  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(func, "__name__", name)
        wrapper.__doc__ = getattr(func, "__doc__", None)
        return wrapper

    @staticmethod
    def _wrap_init(cls: type, record: Callable[..., None]) -> None:
        original = cls.__init__  # type: ignore[misc]

        def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - replaces __init__
            original(obj, *args, **kwargs)
            with contextlib.suppress(Exception):
                record(obj, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]

    def _on_loader(self, loader: Any, *args: Any, **kwargs: Any) -> None:
        if len(self.loaders) >= 20:
            return
        init_fn = getattr(loader, "worker_init_fn", None)
        self.loaders.append({
            "num_workers": int(getattr(loader, "num_workers", 0)),
            "worker_init_fn": getattr(init_fn, "__qualname__", repr(type(init_fn))) if init_fn else None,
            "generator": getattr(loader, "generator", None) is not None,
            "shuffle": isinstance(getattr(loader, "sampler", None), torch.utils.data.RandomSampler),
        })

    def _audit_hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "os.putenv" or not args:
            return
        key = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
        if key == "CUBLAS_WORKSPACE_CONFIG" and len(self.cublas_sets) < 20:
            value = args[1].decode() if isinstance(args[1], bytes) else str(args[1])
            initialized = bool(torch.cuda.is_available() and torch.cuda.is_initialized())
            self.cublas_sets.append({"value": value, "cuda_initialized": initialized})

    def facts(self) -> dict[str, Any]:
        """What was seen, as JSON (the manifest's ``audit_probe``)."""
        return {"seeding_calls": list(self.seeding), "dataloaders": list(self.loaders),
                "autocast": list(self.autocast), "grad_scalers": self.grad_scalers,
                "cublas_at_start": self.cublas_at_start, "cublas_sets": list(self.cublas_sets),
                "cuda_initialized": bool(_safe(torch.cuda.is_initialized, False))}


def launch_environ() -> dict[str, str] | None:
    """The environment this process started with (Linux: ``/proc/self/environ``), or None where unknown."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out

