"""The reproducibility checklist, evaluated on a live process or on a script at its first step.

The checklist follows the areas where reproducibility is usually lost: RNG seeds, DataLoader workers, the
choice of cuDNN/cuBLAS algorithms, collective communication, mixed precision, and the hardware. Each item
says its state, whether it threatens reproducibility, and the fix. :data:`CHECKS` is the checklist as data.

* :func:`audit` judges the calling process now (flags, environment variables, the environment it started with).
* ``torchrepro audit -- python train.py`` runs the script to its first step under the launcher, which watches
  what the script does before that step (:class:`~torchrepro.env.info.ScriptProbe`); :func:`audit_recorded`
  judges that record.

>>> report = audit()                      # doctest: +SKIP
>>> [(i.id, i.severity) for i in report.findings]     # doctest: +SKIP
[('deterministic-mode', 'threat'), ('pythonhashseed', 'threat')]
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._core.errors import RunDirError
from .info import NOT_AVAILABLE, environment, launch_environ

SCHEMA = "torchrepro.audit/1"
OK, INFO, ADVICE, THREAT = "ok", "info", "advice", "threat"
FINDINGS = (ADVICE, THREAT)

# torch releases before this one need CUBLAS_WORKSPACE_CONFIG for deterministic cuBLAS on CUDA >= 10.2; from it
# on, torch gives each cuBLAS handle its own workspace and no longer asks for the variable (pytorch#161749).
CUBLAS_NOT_NEEDED_FROM = (2, 10)
_CUBLAS_VALUE = re.compile(r"(:\d+:\d+)+")
# NCCL variables that change the order in which all-reduce adds up gradients.
NCCL_ORDER_VARS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NTHREADS",
                   "NCCL_MIN_CTAS", "NCCL_MAX_CTAS")


@dataclass(frozen=True)
class Facts:
    """What a check can look at: the environment, what the probe saw (script mode), the launch environment."""

    env: dict[str, Any]
    context: str  # "process" (torchrepro.audit()) or "script" (torchrepro audit -- python train.py)
    probe: dict[str, Any] | None = None
    launch_env: dict[str, str] | None = None  # variables where the process (or the script) was launched
    launch_seed: int | None = None  # torchrepro's --seed

    def var(self, name: str) -> str | None:
        return (self.env.get("env") or {}).get(name)

    def launched_with(self, name: str) -> str | None:
        return (self.launch_env if self.launch_env is not None else os.environ).get(name)

    @property
    def cuda_available(self) -> bool:
        return bool((self.env.get("cuda") or {}).get("available"))

    @property
    def seeding_calls(self) -> list[dict[str, Any]]:
        return list((self.probe or {}).get("seeding_calls") or [])


@dataclass(frozen=True)
class AuditItem:
    """One checklist item, judged: ``severity`` is ok, info, advice (a fix is due) or threat."""

    id: str
    area: str
    title: str
    severity: str
    state: str
    fix: str | None

    @property
    def finding(self) -> bool:
        return self.severity in FINDINGS

    @property
    def threatens(self) -> bool:
        return self.severity == THREAT

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "area": self.area, "title": self.title, "severity": self.severity,
                "threatens_reproducibility": self.threatens, "finding": self.finding, "state": self.state,
                "fix": self.fix}


@dataclass
class AuditReport:
    """The judged checklist; exit code 1 when any item is a finding (advice or threat)."""

    context: str
    items: list[AuditItem]
    command: list[str] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def findings(self) -> list[AuditItem]:
        return [i for i in self.items if i.finding]

    @property
    def clean(self) -> bool:
        return not self.findings

    @property
    def exit_code(self) -> int:
        return 0 if self.clean else 1

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "context": self.context, "command": self.command, "clean": self.clean,
                "exit_code": self.exit_code, "findings": len(self.findings),
                "items": [i.to_json() for i in self.items], "notes": self.notes}


Verdict = tuple[str, str, "str | None"]  # severity, state, fix (None: the check's default fix)


# --- the checks ----------------------------------------------------------------------------------------
def _seeds(f: Facts) -> Verdict:
    if f.context == "process":
        seed = f.var("TORCHREPRO_SEED")
        if seed is not None:
            return OK, f"seeded through torchrepro (TORCHREPRO_SEED={seed})", None
        return INFO, ("not visible in a running process; `torchrepro audit -- python train.py` watches the "
                      "script's seeding calls"), None
    calls = sorted({c["function"] for c in f.seeding_calls})
    seeded_by = ([f"torchrepro --seed {f.launch_seed}"] if f.launch_seed is not None else []) + calls
    if seeded_by:
        return OK, f"seeded before the first step by {', '.join(seeded_by)}", None
    return THREAT, ("no seeding call before the first step (random.seed, numpy.random.seed, torch.manual_seed, "
                    "torchrepro.seed_everything): initial weights, shuffling and dropout differ in every run"), None


def _pythonhashseed(f: Facts) -> Verdict:
    value = f.launched_with("PYTHONHASHSEED")
    where = "where the script is launched" if f.context == "script" else "when this process started"
    if value is not None and value.isdigit():
        return OK, f"PYTHONHASHSEED={value} {where}", None
    what = "unset" if value is None else f"{value!r}"
    return THREAT, (f"PYTHONHASHSEED is {what} {where}: each run hashes str differently, so iterating a set of "
                    "strings (and anything built from one) changes order between runs"
                    + (" (torchrepro run/check fix it for their runs)" if f.context == "script" else "")), None


def _dataloaders(f: Facts) -> Verdict:
    if f.context == "process":
        return INFO, "not visible in a running process; `torchrepro audit -- python train.py` watches them", None
    loaders = list((f.probe or {}).get("dataloaders") or [])
    if not loaders:
        return OK, "no DataLoader was created before the first step", None
    torch_seeded = f.launch_seed is not None or any(c["function"].startswith("torch") for c in f.seeding_calls)
    risky, parts = [], []
    for i, loader in enumerate(loaders, start=1):
        random_order = loader["shuffle"] or loader["num_workers"] > 0
        at_risk = random_order and not loader["generator"] and not torch_seeded
        risky += [i] if at_risk else []
        parts.append(f"#{i}: {'shuffled' if loader['shuffle'] else 'in order'}, {loader['num_workers']} workers, "
                     f"generator {'yes' if loader['generator'] else 'no'}, worker_init_fn "
                     f"{loader['worker_init_fn'] or 'no'}")
    state = f"{len(loaders)} DataLoader(s): " + "; ".join(parts)
    if risky:
        return THREAT, (state + f". Loader(s) {risky} draw their shuffle order and worker seeds from torch's "
                        "global RNG, which was not seeded"), None
    return OK, state, None


def _deterministic_mode(f: Facts) -> Verdict:
    det = f.env.get("determinism") or {}
    if not det.get("use_deterministic_algorithms"):
        return THREAT, ("off: ops with nondeterministic kernels (scatter/index_put_ accumulation, atomicAdd on "
                        "GPU, some cuDNN backward passes) may give other bits in every run"), None
    if det.get("warn_only"):
        return THREAT, "on, but warn_only=True: ops without a deterministic kernel only warn and stay "\
                       "nondeterministic", "torch.use_deterministic_algorithms(True) without warn_only"
    return OK, "on (torch.use_deterministic_algorithms(True))", None


def _cudnn_benchmark(f: Facts) -> Verdict:
    det = f.env.get("determinism") or {}
    if det.get("cudnn_benchmark"):
        where = "" if f.cuda_available else " (no effect without a GPU, but the same script autotunes on one)"
        return THREAT, ("torch.backends.cudnn.benchmark = True: cuDNN times several convolution algorithms and "
                        f"keeps the fastest, which can differ from run to run{where}"), None
    return OK, "off", None


def _torch_version(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _cublas_workspace(f: Facts) -> Verdict:
    value = f.var("CUBLAS_WORKSPACE_CONFIG")
    build_cuda = (f.env.get("torch_build") or {}).get("cuda", NOT_AVAILABLE)
    if build_cuda == NOT_AVAILABLE:
        return OK, f"not needed: this torch has no CUDA{f' (set to {value})' if value else ''}", None
    needed = _torch_version(str(f.env.get("torch"))) < CUBLAS_NOT_NEEDED_FROM
    if value is not None and not _CUBLAS_VALUE.fullmatch(value):
        return THREAT, f"CUBLAS_WORKSPACE_CONFIG={value!r} is not a valid value", None
    late = _cublas_too_late(f)
    if late:
        return (THREAT if needed else INFO), late, None
    if value is None:
        if needed:
            return THREAT, (f"unset, and torch {f.env.get('torch')} needs it for deterministic cuBLAS matmuls "
                            "(deterministic mode raises an error for them without it)"), None
        return OK, f"unset; not needed by torch {f.env.get('torch')}", None
    return OK, f"CUBLAS_WORKSPACE_CONFIG={value}, set before CUDA started", None


def _cublas_too_late(f: Facts) -> str | None:
    """Why the variable may have been set too late to take effect, or None."""
    if f.probe is not None:
        late = [s for s in f.probe.get("cublas_sets") or [] if s.get("cuda_initialized")]
        if late and not f.probe.get("cublas_at_start"):
            return (f"set by the script to {late[0]['value']!r} after CUDA had started: cuBLAS may already "
                    "have made its workspaces and then ignores it")
        return None
    value, at_launch = f.var("CUBLAS_WORKSPACE_CONFIG"), f.launched_with("CUBLAS_WORKSPACE_CONFIG")
    initialized = torch.cuda.is_available() and torch.cuda.is_initialized()
    if value is not None and at_launch is None and f.launch_env is not None and initialized:
        return ("set after this process started, and CUDA is running: if CUDA started before it was set, "
                "cuBLAS ignores it")
    return None


def _cuda_launch_blocking(f: Facts) -> Verdict:
    value = f.var("CUDA_LAUNCH_BLOCKING")
    if value is not None and value not in ("0", ""):
        return ADVICE, (f"CUDA_LAUNCH_BLOCKING={value}: every kernel launch waits for the GPU, which is slow and "
                        "does not make results deterministic"), None
    return OK, "unset", None


def _nccl(f: Facts) -> Verdict:
    env = f.env.get("env") or {}
    if env.get("NCCL_DETERMINISTIC") is not None:
        return ADVICE, ("NCCL_DETERMINISTIC is set, but it is not an NCCL variable and has no effect"),\
            "Unset it; pin NCCL_ALGO and NCCL_PROTO (same values on every run you compare) instead."
    pinned = {k: env[k] for k in NCCL_ORDER_VARS if env.get(k) is not None}
    if pinned:
        listed = ", ".join(f"{k}={v}" for k, v in pinned.items())
        return ADVICE, (f"{listed}: these change the order in which all-reduce adds gradients, so runs with "
                        "other values (or none) give other bits"), None
    gpus = (f.env.get("cuda") or {}).get("device_count") or 0
    if isinstance(gpus, int) and gpus > 1:
        return INFO, (f"{gpus} GPUs and NCCL chooses its algorithm per message size and topology; the order is "
                      "fixed on one machine, but another topology sums in another order"), None
    return OK, "no multi-GPU communication on this machine", None


def _tf32(f: Facts) -> Verdict:
    prec = f.env.get("precision") or {}
    on = []
    if prec.get("cuda_matmul_allow_tf32"):
        on.append("torch.backends.cuda.matmul.allow_tf32 = True")
    if prec.get("float32_matmul_precision", "highest") != "highest":
        on.append(f"float32_matmul_precision = {prec.get('float32_matmul_precision')!r}")
    if f.var("NVIDIA_TF32_OVERRIDE") not in (None, "0"):
        on.append(f"NVIDIA_TF32_OVERRIDE={f.var('NVIDIA_TF32_OVERRIDE')}")
    if prec.get("cudnn_allow_tf32") and f.cuda_available:
        on.append("torch.backends.cudnn.allow_tf32 = True (torch's default)")
    if on:
        return THREAT, (", ".join(on) + ": float32 matmuls/convolutions round inputs to TF32 (10-bit mantissa) "
                        "on Ampere and newer GPUs, so results differ from FP32 and between GPU generations"), None
    note = "; cuDNN's TF32 default has no effect without a GPU" if prec.get("cudnn_allow_tf32") else ""
    return OK, f"off for matmuls (float32_matmul_precision 'highest'){note}", None


def _mixed_precision(f: Facts) -> Verdict:
    if f.probe is not None:
        uses = [f"autocast({a['dtype']}) on {a['device']}" for a in f.probe.get("autocast") or [] if a["enabled"]]
        uses = sorted(set(uses)) + (["GradScaler"] if f.probe.get("grad_scalers") else [])
    else:
        uses = [f"autocast on {d}" for d in ("cpu", "cuda") if _autocast_enabled(d)]
    if uses:
        return INFO, (", ".join(uses) + ": reduced precision is reproducible on one GPU model in deterministic "
                      "mode, but its results differ from FP32 and across GPU generations"), None
    return OK, "no autocast" + (" or GradScaler before the first step" if f.probe is not None else " active"), None


def _autocast_enabled(device: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device))
    except TypeError:  # torch < 2.4 takes no device
        return bool(torch.is_autocast_enabled()) if device == "cuda" else False


def _hardware(f: Facts) -> Verdict:
    cpu, threads = f.env.get("cpu") or {}, f.env.get("threads") or {}
    gpus = [f"{a.get('name')} (compute capability {a.get('capability')})" for a in f.env.get("accelerators") or []]
    state = (f"CPU {cpu.get('model')} with {cpu.get('capability')} kernels, {threads.get('intra_op')} intra-op "
             f"threads; " + (", ".join(gpus) if gpus else "no GPU"))
    return INFO, (state + ". Bitwise equality holds only for the same GPU model, CPU instruction set and thread "
                  "count"), None


@dataclass(frozen=True)
class Check:
    """One checklist row: its id, area, how it is judged, the usual fix, and its title for each outcome.

    The title states what was found, so a row reads right at a glance: ``title`` when the check passes,
    ``problem`` when it is a finding (advice or threat), ``unknown`` when it cannot be judged here (info).
    """

    id: str
    area: str
    title: str
    judge: Callable[[Facts], Verdict]
    fix: str
    problem: str = ""
    unknown: str = ""

    def title_for(self, severity: str) -> str:
        if severity in FINDINGS:
            return self.problem or self.title
        return (self.unknown or self.title) if severity == INFO else self.title


CHECKS: tuple[Check, ...] = (
    Check("rng-seeds", "RNG seeds", "every random-number generator seeded", _seeds,
          "Call torchrepro.seed_everything(SEED) at the top of the script, or run it with "
          "`torchrepro run --seed SEED -- python train.py`.",
          problem="random-number generators not seeded", unknown="seeding not visible from here"),
    Check("pythonhashseed", "RNG seeds", "PYTHONHASHSEED fixed at launch", _pythonhashseed,
          "Launch with PYTHONHASHSEED=0 (`PYTHONHASHSEED=0 python train.py`; setting it inside the script is "
          "too late), or launch through `torchrepro run`.", problem="PYTHONHASHSEED not fixed at launch"),
    Check("dataloader-workers", "DataLoader workers", "shuffling and worker seeds reproducible", _dataloaders,
          "Seed torch before building loaders, or pass generator=torchrepro.make_generator(SEED); add "
          "worker_init_fn=torchrepro.seed_worker so every library's RNG in the workers is seeded.",
          problem="shuffling and worker seeds from an unseeded RNG", unknown="DataLoaders not visible from here"),
    Check("deterministic-mode", "cuDNN/cuBLAS algorithm choice", "deterministic algorithms on",
          _deterministic_mode, "Call torchrepro.deterministic() before training, or run with "
          "`torchrepro run --deterministic -- python train.py`.",
          problem="deterministic algorithms off (or warn-only)"),
    Check("cudnn-benchmark", "cuDNN/cuBLAS algorithm choice", "cuDNN autotuning off", _cudnn_benchmark,
          "Set torch.backends.cudnn.benchmark = False (torchrepro.deterministic() does).",
          problem="cuDNN autotuning on"),
    Check("cublas-workspace", "cuDNN/cuBLAS algorithm choice", "CUBLAS_WORKSPACE_CONFIG as cuBLAS needs it",
          _cublas_workspace, "Export CUBLAS_WORKSPACE_CONFIG=:4096:8 before launching "
          "(`torchrepro run --deterministic` does), not inside the script after CUDA work.",
          problem="CUBLAS_WORKSPACE_CONFIG missing, invalid or set too late",
          unknown="CUBLAS_WORKSPACE_CONFIG set after CUDA started"),
    Check("cuda-launch-blocking", "cuDNN/cuBLAS algorithm choice", "no CUDA_LAUNCH_BLOCKING for determinism",
          _cuda_launch_blocking, "Unset CUDA_LAUNCH_BLOCKING (keep it only to debug where a CUDA error is "
          "raised); use torchrepro.deterministic() for determinism.",
          problem="CUDA_LAUNCH_BLOCKING set (slow, and not a determinism measure)"),
    Check("nccl", "collective communication", "all-reduce order the same in runs you compare", _nccl,
          "Keep NCCL_ALGO/NCCL_PROTO/channel settings identical in every run you compare "
          "(`torchrepro env diff` shows them), or unset them everywhere.",
          problem="NCCL settings that change the all-reduce order",
          unknown="all-reduce order depends on this machine's topology"),
    Check("tf32", "mixed precision", "float32 math in float32 (no TF32)", _tf32,
          "torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False; "
          "torch.set_float32_matmul_precision('highest') - or compare only runs on the same GPU model.",
          problem="TF32 on: float32 math rounded to TF32"),
    Check("mixed-precision", "mixed precision", "no autocast or GradScaler", _mixed_precision,
          "Compare mixed-precision runs with tolerances across GPU models; bitwise only on the same model.",
          unknown="autocast or GradScaler in use"),
    Check("hardware", "hardware", "same hardware for runs you compare", _hardware,
          "Keep `torchrepro env -o env.json` with your results and compare machines with "
          "`torchrepro env diff A B`.", unknown="bitwise equality only on the same hardware"),
)


def evaluate(facts: Facts) -> list[AuditItem]:
    """Judge every row of :data:`CHECKS` on ``facts``."""
    items = []
    for check in CHECKS:
        severity, state, fix = check.judge(facts)
        items.append(AuditItem(check.id, check.area, check.title_for(severity), severity, state,
                               (fix or check.fix) if severity != OK else None))
    return items


def audit() -> AuditReport:
    """Audit this process now: flags, environment variables, and the environment it was started with."""
    facts = Facts(env=environment().to_json(), context="process", launch_env=launch_environ())
    return AuditReport("process", evaluate(facts))


def audit_recorded(manifest: dict[str, Any], *, launch_env: dict[str, str],
                   source: str = "manifest.json") -> AuditReport:
    """Judge a script from its run manifest (recorded with the launcher's probe up to its first step).

    ``launch_env`` is the environment the user launches the script from (for PYTHONHASHSEED); ``source`` names
    the manifest in errors (RunDirError when it lacks the recorded environment).
    """
    env = manifest.get("environment")
    if not isinstance(env, dict):
        raise RunDirError(source, "has no 'environment' (the script ended before torchrepro could record it, e.g. "
                          "killed or crashed in C code, or the manifest was edited).",
                          "Make sure the script runs to its first step on its own, then audit it again.")
    probe = manifest.get("audit_probe")
    facts = Facts(env=env, context="script", probe=probe if isinstance(probe, dict) else {},
                  launch_env=launch_env, launch_seed=manifest.get("seed"))
    report = AuditReport("script", evaluate(facts), command=list(manifest.get("command") or []))
    if not manifest.get("steps"):
        report.notes.append("The script ended before its first training step; it was audited at its end.")
    return report
