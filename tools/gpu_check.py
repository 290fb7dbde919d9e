"""One prepared GPU check: everything torchrepro needs to learn from a lent CUDA GPU, in one command of <= 8 minutes.

Parts (run in this order, each step with its own time limit; issue 41 item 5):

1. ``registry``: the registry verification, ``tools/verify_cuda_registry.py --json`` (without
   ``CUBLAS_WORKSPACE_CONFIG``, so that the cuDNN RNN rows can be observed), its JSON kept whole;
2. ``check``: ``torchrepro check``, ``check --locate`` and ``check --deterministic`` on
   ``tools/cuda_nondet_train.py`` (``index_add_`` on CUDA); expected: DIVERGED, DIVERGED with the op named,
   IDENTICAL;
4. ``invariance``: the batch-invariance checker on a cuBLAS matmul: ``tools/batch_invariance_cuda.py`` (an
   ``nn.Linear(4096, 4096)`` in fp32 and bf16, then a tiny GPT-2), each verdict captured as JSON;
5. ``fingerprint``: the device fingerprint path's throughput against ``tensor.sum()`` on a 1 GiB CUDA tensor
   (timed as ``benchmarks/bench_fingerprint.py`` does), its peak temporary memory, and three checks of its
   digests (repeatable, a one-bit flip seen, equal to the same algorithm run on the CPU);
3. ``bench``: ``torchrepro bench --explain --builtin resnet18`` in fp32, then bf16, beside the figures this project
   started from (+16.5% / +15.6%, docs/measure.md); last, because it takes what time is left (fp32 half of it).

Every part runs in a child process: a step that runs over its limit is stopped and recorded as "skipped: out of
time", one that would start with under 5 s of the budget left is not started, a failing step never stops the
others. After each part ``gpu_check.json`` (schema ``torchrepro.gpu-check/1``) and ``gpu_check.txt`` (the readable
summary, also printed at the end) are rewritten atomically in ``--out`` (default ``$OUT``, the device tool's
output folder, else ``torchrepro-runs/gpu-check``); the run directories go to a temporary folder, removed at the end.

    python3 tools/gpu_check.py --out "$OUT"          # on the GPU machine (see docs/development.md)
    python tools/gpu_check.py --dry-run --out DIR    # every part on the CPU, smallest sizes: the plumbing
    python tools/gpu_check.py --parts bench --budget 200   # rerun one part

Exit status: 0 when every step that ran passed (skipped steps do not count), 1 when one failed or its output could
not be read, 2 for a usage error. Without a CUDA device (and without ``--dry-run``) it prints "no CUDA device:
nothing checked", writes the JSON saying so and exits 0. torchrepro is imported from this checkout's ``src/``, so
the machine's own Python with a CUDA build of torch needs no install.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
SRC = ROOT / "src"
if (SRC / "torchrepro").is_dir() and str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))  # this checkout's torchrepro, installed or not
from torchrepro._core.errors import Interrupted  # noqa: E402 - after the path above
from torchrepro.record.child import die_with_parent  # noqa: E402
from torchrepro.record.launcher import signals_as_interrupts  # noqa: E402

SCHEMA = "torchrepro.gpu-check/1"
NO_CUDA = "no CUDA device: nothing checked"
SCRIPT = "tools/cuda_nondet_train.py"
PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"
BUDGET_S = {"gpu": 480.0, "dry": 1200.0}  # the whole check; the device tool's command limit is 600 s
MIN_START_S = 5.0  # a step with less time than this left is not started
# seconds per step (times --time-factor); bench's two steps share what is left instead (fp32 half of it)
LIMITS = {
    "gpu": {"registry": 100, "check": 45, "check --locate": 75, "check --deterministic": 45, "invariance": 45,
            "fingerprint": 40},
    "dry": {"registry": 180, "check": 120, "check --locate": 180, "check --deterministic": 120, "invariance": 180,
            "fingerprint": 90},
}
# the figures bench's overheads are printed beside: a ResNet-18 step on one GPU, default -> deterministic (ms)
EARLIER = {"fp32": (17.94, 20.90, 0.165), "bf16": (12.42, 14.37, 0.156)}
EARLIER_SOURCE = "docs/measure.md (the figures this project started from; the GPU model was not recorded)"


@dataclass(frozen=True)
class Sizes:
    """What each part runs, on a GPU or in the dry run (the smallest that still exercise every path)."""

    device: str
    registry_runs: int
    script_args: tuple[str, ...]
    bench_args: tuple[str, ...]
    builtin_args: tuple[str, ...]
    invariance_sizes: str
    fingerprint_numel: int
    cross_device_numel: int
    timing_rounds: int
    timing_inner: int


SIZES = {
    "gpu": Sizes("cuda", 8, ("--nodes", "1000", "--edges", "500000"),
                 ("--steps", "20", "--warmup", "5", "--rounds", "1"), (), "2,3,7,64,256", 1 << 28, 1 << 22, 15, 3),
    "dry": Sizes("cpu", 2, ("--nodes", "2000", "--edges", "150000"),
                 ("--steps", "2", "--warmup", "1", "--rounds", "1"), ("--batch-size", "2", "--image-size", "32"),
                 "2,3", 1 << 20, 1 << 16, 3, 1),
}


def say(msg: str) -> None:
    print(f"gpu_check: {msg}", file=sys.stderr, flush=True)


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_json(text: str) -> Any:
    """The JSON document a command printed on stdout (anything printed before its first ``{`` is skipped)."""
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        start = text.find("{")
        if start < 0:
            raise ValueError(f"no JSON document in its output ({text[:200]!r})") from None
        return json.JSONDecoder().raw_decode(text[start:])[0]


def _tail(text: str, n: int = 1500) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


def _ci(ci: Sequence[float] | None) -> str:
    return "" if not ci else f" (95% CI {_pct(ci[0])} to {_pct(ci[1])})"


# --- running a step ------------------------------------------------------------------------------------------------
@dataclass
class Clock:
    """The budget of the whole check, and each step's limit within it."""

    budget: float
    factor: float = 1.0
    start: float = 0.0

    def __post_init__(self) -> None:
        self.start = time.monotonic()

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def limit(self, base: float | None, share: float = 1.0) -> float:
        """``base`` seconds (times the factor), or ``share`` of what is left when ``base`` is None; never more
        than what is left."""
        left = self.left()
        return min(base * self.factor, left) if base is not None else left * share


@dataclass
class Ran:
    rc: int | None  # None: stopped at its limit
    elapsed: float
    stdout: str
    stderr: str


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the step's process group (it started it: start_new_session), politely first."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(argv: Sequence[str], *, limit: float, logs: Path, name: str,
                env: dict[str, str] | None = None) -> Ran:
    """Run ``argv`` in the repository root with its output in files under ``logs``; stop it after ``limit`` s, on
    Ctrl-C, SIGTERM or SIGHUP (inside ``signals_as_interrupts``), and when this script dies (the step leads a
    session of its own, which nothing else would reach: it gets SIGTERM when this process dies, even by SIGKILL)."""
    slug = "".join(c if c.isalnum() else "-" for c in name)
    out_path, err_path = logs / f"{slug}.stdout", logs / f"{slug}.stderr"
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True, preexec_fn=functools.partial(die_with_parent, os.getpid()))
        try:
            rc: int | None = proc.wait(timeout=max(limit, 0.1))
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc = None
        except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: leave nothing running
            _stop(proc)
            raise
    elapsed = time.monotonic() - t0
    return Ran(rc, elapsed, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"))


Parse = Callable[[str, int], "tuple[str, str | None, dict[str, Any]]"]  # (stdout, rc) -> (status, reason, result)


@dataclass
class Step:
    name: str
    argv: list[str]
    parse: Parse
    base_limit: float | None = None
    share: float = 1.0
    env: dict[str, str] | None = None


def run_step(step: Step, clock: Clock, logs: Path) -> dict[str, Any]:
    limit = clock.limit(step.base_limit, step.share)
    record: dict[str, Any] = {"command": _shown(step.argv), "limit_s": round(max(limit, 0.0), 1), "status": SKIPPED,
                              "reason": None, "elapsed_s": None, "exit_code": None, "result": None,
                              "stderr_tail": None}
    if clock.left() < MIN_START_S:
        record["reason"] = (f"out of time: not started, {max(clock.left(), 0):.0f} s of the {clock.budget:.0f} s "
                            "budget were left")
        say(f"{step.name}: skipped ({record['reason']})")
        return record
    say(f"{step.name} (limit {limit:.0f} s) ...")
    ran = run_command(step.argv, limit=limit, logs=logs, name=step.name, env=step.env)
    record.update(elapsed_s=round(ran.elapsed, 1), exit_code=ran.rc, stderr_tail=_tail(ran.stderr))
    if ran.rc is None:
        record["reason"] = f"out of time: ran over its {limit:.0f} s limit and was stopped"
    else:
        try:
            status, reason, result = step.parse(ran.stdout, ran.rc)
        except Exception as exc:  # its output is the finding: keep it
            status, reason, result = ERROR, f"could not read its output: {type(exc).__name__}: {exc}", {
                "stdout_tail": _tail(ran.stdout)}
        record.update(status=status, reason=reason, result=result)
    say(f"{step.name}: {record['status']} in {ran.elapsed:.1f} s" + (f" ({record['reason']})" if record["reason"]
                                                                      else ""))
    return record


def _shown(argv: Sequence[str]) -> str:
    parts = [("python" if a == sys.executable else os.path.relpath(a, ROOT) if a.startswith(str(ROOT)) else a)
             for a in argv]
    return " ".join(parts)


def aggregate(steps: dict[str, dict[str, Any]]) -> tuple[str, str | None]:
    """A part's status from its steps': failed > error > passed; skipped only when every step was skipped."""
    statuses = [s["status"] for s in steps.values()]
    status = (FAILED if FAILED in statuses else ERROR if ERROR in statuses
              else SKIPPED if all(s == SKIPPED for s in statuses) else PASSED)
    reasons = [f"{name}: {s['status']}: {s['reason']}" if len(steps) > 1 else s["reason"]
               for name, s in steps.items() if s["reason"]]
    return status, "; ".join(reasons) or None


# --- reading each part's output ------------------------------------------------------------------------------------
def parse_registry(dry: bool) -> Parse:
    def parse(stdout: str, rc: int) -> tuple[str, str | None, dict[str, Any]]:
        doc = read_json(stdout)
        if doc.get("gpu") is None:
            return FAILED, doc.get("message") or "it found no GPU", {"document": doc}
        rows = doc["rows"]
        bad = [r for r in rows if r["verdict"] not in ("ok", "not observed")]
        counts = Counter(r["verdict"] for r in rows)
        summary = (f"{len(rows) - len(bad)} of {len(rows)} CUDA rows hold on {doc['gpu']}, torch {doc['torch']}, "
                   f"{doc['runs']} calls per observation (" + ", ".join(f"{k}: {v}" for k, v in counts.items())
                   + ")" + ("; on the CPU the CUDA claims are not expected to hold: the rows are only read" if dry
                            else ""))
        result = {"summary": [summary] + [f"  does not hold: {r['op']} [{r['condition']}]: {r['verdict']}"
                                          for r in bad][:12 if not dry else 3],
                  "gpu": doc["gpu"], "rows": len(rows), "holding": len(rows) - len(bad), "verdicts": dict(counts),
                  "document": doc}
        if not rows:
            return ERROR, "no rows in its output", result
        if dry:  # CUDA claims observed on the CPU mean nothing: the plumbing is what is checked
            return PASSED, None, result
        if bad or rc != 0:
            return FAILED, f"{len(bad)} of {len(rows)} rows do not hold (exit {rc})", result
        return PASSED, None, result

    return parse


def parse_check(expect: str, op: str | None, dry: bool) -> Parse:
    """``check --json``: the verdict against ``expect``, and with ``op`` the op that --locate names."""

    def parse(stdout: str, rc: int) -> tuple[str, str | None, dict[str, Any]]:
        if rc not in (0, 1):
            return FAILED, f"check exited {rc} (the script failed or a usage error)", {"stdout_tail": _tail(stdout)}
        doc = read_json(stdout)
        verdict = doc["verdict"]
        loc = doc.get("locate") or None
        found = (loc or {}).get("op") or {}
        line = verdict.upper() + (f" at step {doc.get('first_divergent_step')} (cause {doc.get('cause')}; first: "
                                  + ", ".join(d["kind"] for d in doc.get("diverged_first") or []) + ")"
                                  if verdict == "diverged" else "")
        summary = [line]
        located = None
        if loc is not None:
            located = {"verdict": loc.get("verdict"), "op": found.get("op"), "file": found.get("file"),
                       "line": found.get("line"), "module": found.get("module"), "phase": found.get("phase"),
                       "code": found.get("code"), "deterministic_kernel": loc.get("deterministic_kernel"),
                       "fix": loc.get("fix"), "device": loc.get("device")}
            summary.append(f"  --locate: {loc.get('verdict')}: {found.get('op') or loc.get('title')} at "
                           f"{found.get('file')}:{found.get('line')} ({found.get('module')}, {found.get('phase')})")
            if found.get("code"):
                summary.append(f"    {found['code']}")
        problems = []
        if verdict != expect:
            problems.append(f"verdict {verdict}, expected {expect}")
        if op is not None and (found.get("op") or "").rstrip("_") != op.rstrip("_"):
            problems.append(f"--locate named {found.get('op') or (loc or {}).get('verdict') or 'nothing'}, "
                            f"expected {op}")
        expected = f"{expect}" + (f" with {op} named" if op else "")
        summary[0] += "  [as expected]" if not problems else f"  [expected {expected}]"
        result = {"summary": summary, "verdict": verdict, "first_divergent_step": doc.get("first_divergent_step"),
                  "cause": doc.get("cause"), "diverged_first": [d["kind"] for d in doc.get("diverged_first") or []],
                  "locate": located, "expected": expected, "as_expected": not problems, "exit_code": rc}
        if problems and not dry:
            return FAILED, "; ".join(problems), result
        return PASSED, ("dry run, not a verdict on a GPU: " + "; ".join(problems)) if problems else None, result

    return parse


def parse_bench(precision: str) -> Parse:
    def parse(stdout: str, rc: int) -> tuple[str, str | None, dict[str, Any]]:
        if rc != 0:
            return FAILED, f"bench exited {rc}", {"stdout_tail": _tail(stdout)}
        doc = read_json(stdout)
        results = {r["config"]: r for r in doc["results"]}
        explain = next(e for e in doc.get("explain") or [] if e["precision"] == precision)
        default, full = results[explain["default"]], results[explain["full"]]
        before, after, overhead = EARLIER[precision]
        settings = [{k: s.get(k) for k in ("setting", "applicable", "reason", "overhead", "overhead_ci")}
                    for s in explain["settings"]]
        checks = [{k: c.get(k) for k in ("left_out", "verdict", "detail")} for c in explain.get("checks") or []]
        rec = explain.get("recommended") or {}
        summary = [f"{precision} on {doc['device']} ({doc['steps']} steps after {doc['warmup']} warm-up, "
                   f"{doc['rounds']} round(s)): default {default['median_ms']:.2f} ms -> deterministic "
                   f"{full['median_ms']:.2f} ms: {_pct(full['overhead'])}{_ci(full['overhead_ci'])}",
                   f"  earlier figure: {before:.2f} -> {after:.2f} ms, {_pct(overhead)}"]
        summary += [f"  {s['setting']:<27} " + (_pct(s["overhead"]) + _ci(s["overhead_ci"]) if s["applicable"]
                                                 else str(s["reason"])) for s in settings]
        summary += [f"  check without {', '.join(c['left_out']) or 'nothing'}: {c['verdict']}" for c in checks]
        summary.append(f"  cheapest still bitwise: {rec.get('summary') or 'none recommended'}"
                       + (f" ({' '.join(rec['flags'])})" if rec.get("flags") else ""))
        result = {"summary": summary, "device": doc["device"], "torch": doc["torch"], "steps": doc["steps"],
                  "warmup": doc["warmup"], "rounds": doc["rounds"], "default_ms": default["median_ms"],
                  "deterministic_ms": full["median_ms"], "overhead": full["overhead"],
                  "overhead_ci": full["overhead_ci"], "peak_memory": full.get("peak_memory"),
                  "earlier": {"default_ms": before, "deterministic_ms": after, "overhead": overhead,
                              "source": EARLIER_SOURCE},
                  "settings": settings, "checks": checks, "recommended": rec, "notes": doc.get("notes")}
        return PASSED, None, result

    return parse


def parse_worker(stdout: str, rc: int) -> tuple[str, str | None, dict[str, Any]]:
    doc = read_json(stdout)
    return doc["status"], doc.get("reason"), doc["result"]


# --- the parts -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Part:
    key: str
    number: int
    title: str
    steps: Callable[[argparse.Namespace, Sizes, dict[str, float], dict[str, str], Path], list[Step]]


def _registry_steps(args: argparse.Namespace, sizes: Sizes, limits: dict[str, float], env: dict[str, str],
                    work: Path) -> list[Step]:
    child_env = {k: v for k, v in env.items() if k != "CUBLAS_WORKSPACE_CONFIG"}  # the cuDNN RNN rows need it unset
    argv = [sys.executable, str(TOOLS / "verify_cuda_registry.py"), "--json", "--device", sizes.device,
            "--runs", str(sizes.registry_runs)]
    return [Step("registry", argv, parse_registry(args.dry_run), limits["registry"], env=child_env)]


def _check_steps(args: argparse.Namespace, sizes: Sizes, limits: dict[str, float], env: dict[str, str],
                 work: Path) -> list[Step]:
    op = _load("cuda_nondet_train", ROOT / SCRIPT).NONDETERMINISTIC_OP[sizes.device]
    script = [sys.executable, SCRIPT, "--device", sizes.device, *sizes.script_args]
    check = [sys.executable, "-m", "torchrepro", "check", "--json"]
    return [
        Step("check", [*check, "--out", str(work / "check"), "--", *script],
             parse_check("diverged", None, args.dry_run), limits["check"], env=env),
        Step("check --locate", [*check, "--locate", "--out", str(work / "check-locate"), "--", *script],
             parse_check("diverged", op, args.dry_run), limits["check --locate"], env=env),
        Step("check --deterministic", [*check, "--deterministic", "--out", str(work / "check-det"), "--", *script],
             parse_check("identical", None, args.dry_run), limits["check --deterministic"], env=env),
    ]


def _worker_steps(name: str) -> Callable[..., list[Step]]:
    def steps(args: argparse.Namespace, sizes: Sizes, limits: dict[str, float], env: dict[str, str],
              work: Path) -> list[Step]:
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker", name]
        return [Step(name, argv + (["--dry-run"] if args.dry_run else []), parse_worker, limits[name], env=env)]

    return steps


def _bench_steps(args: argparse.Namespace, sizes: Sizes, limits: dict[str, float], env: dict[str, str],
                 work: Path) -> list[Step]:
    steps = []
    for i, precision in enumerate(("fp32", "bf16")):
        argv = [sys.executable, "-m", "torchrepro", "bench", "--explain", "--builtin", "resnet18", "--precisions",
                precision, "--device", sizes.device, *sizes.bench_args, "--json", "--out",
                str(work / f"bench-{precision}")]
        if sizes.builtin_args:
            argv += ["--", *sizes.builtin_args]
        steps.append(Step(precision, argv, parse_bench(precision), None, share=0.5 if i == 0 else 1.0, env=env))
    return steps


PARTS = (  # in the order they run: bench last, it takes the time that is left
    Part("registry", 1, "registry verification (tools/verify_cuda_registry.py --json)", _registry_steps),
    Part("check", 2, f"check, check --locate, check --deterministic on {SCRIPT}", _check_steps),
    Part("invariance", 4, "batch invariance of a cuBLAS matmul (tools/batch_invariance_cuda.py)",
         _worker_steps("invariance")),
    Part("fingerprint", 5, "device fingerprint path against tensor.sum()", _worker_steps("fingerprint")),
    Part("bench", 3, "bench --explain --builtin resnet18, fp32 and bf16", _bench_steps),
)


# --- the two parts that run in a child of this script ---------------------------------------------------------------
def worker_invariance(sizes: Sizes) -> dict[str, Any]:
    """``tools/batch_invariance_cuda.py`` as it is, with each ``check_batch_invariance`` result kept as JSON."""
    import torch

    import torchrepro

    tool = _load("batch_invariance_cuda", TOOLS / "batch_invariance_cuda.py")
    original = torchrepro.check_batch_invariance
    captured: list[dict[str, Any]] = []

    def recording(model: Any, batch: Any, **kwargs: Any) -> Any:
        result = original(model, batch, **kwargs)
        captured.append({"model": _model_label(model, batch, torch), "headline": result.headline(),
                         **result.to_json()})
        return result

    torchrepro.check_batch_invariance = recording  # type: ignore[assignment]  # this child process only
    printed, error = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(printed):
            rc = tool.main(["--device", sizes.device, "--sizes", sizes.invariance_sizes])
    except Exception as exc:  # e.g. no transformers for the GPT-2 part: keep the Linear results
        rc, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        torchrepro.check_batch_invariance = original  # type: ignore[assignment]
    linear = [c for c in captured if c["model"].startswith("Linear")]
    summary = [f"{c['model']}: {c['headline']}" for c in captured]
    result = {"summary": summary, "results": captured, "exit_code": rc, "error": error,
              "output_tail": _tail(printed.getvalue(), 4000)}
    if not linear:
        return {"status": ERROR, "reason": error or f"no Linear result (exit {rc})", "result": result}
    if rc not in (0, None):
        return {"status": FAILED, "reason": f"batch_invariance_cuda.py exited {rc}", "result": result}
    return {"status": PASSED, "reason": f"after the Linear checks: {error}" if error else None, "result": result}


def _model_label(model: Any, batch: Any, torch: Any) -> str:
    if isinstance(model, torch.nn.Linear):
        return f"Linear({model.in_features}, {model.out_features}) {str(model.weight.dtype).replace('torch.', '')}"
    ids = batch.get("input_ids") if isinstance(batch, dict) else batch
    shape = tuple(ids.shape) if hasattr(ids, "shape") else "?"
    return f"{type(model).__name__}, input {shape}"


def worker_fingerprint(sizes: Sizes) -> dict[str, Any]:
    """``torchrepro.fingerprint`` against ``tensor.sum()`` (and a plain copy) on one large tensor, interleaved
    rounds as in benchmarks/bench_fingerprint.py; then the digests' checks."""
    import torch

    import torchrepro

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _timing import interleaved_samples, paired_ratio

    fpmod = importlib.import_module("torchrepro._core.fingerprint")
    dev = torch.device(sizes.device)
    cuda = dev.type == "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(sizes.fingerprint_numel, generator=gen, device=dev)
    dst = torch.empty_like(x)

    def synced(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            out = fn()
            if cuda:
                torch.cuda.synchronize(dev)
            return out
        return run

    variants = {"tensor.sum()": synced(x.sum), "torchrepro.fingerprint": synced(lambda: torchrepro.fingerprint(x)),
                "plain copy": synced(lambda: dst.copy_(x))}
    if not cuda and hasattr(fpmod, "_digests_torch"):  # the device algorithm, forced on the CPU (as the bench does)
        variants["device algorithm on cpu"] = lambda: fpmod._digests_torch([x], dev)
    samples = interleaved_samples(variants, rounds=sizes.timing_rounds, inner=sizes.timing_inner)
    mark = fpmod.usage_mark() if hasattr(fpmod, "usage_mark") else None
    torchrepro.fingerprint(x)
    algorithm = fpmod.algorithms_since(mark) if mark is not None else None  # the one torchrepro.fingerprint used
    nbytes = x.numel() * x.element_size()
    med = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
    timings = {k: {"median_ms": round(t * 1e3, 4), "gb_per_s": round(nbytes / t / 1e9, 2)} for k, t in med.items()}
    ratio = med["tensor.sum()"] / med["torchrepro.fingerprint"]
    quartiles = paired_ratio(samples, "tensor.sum()", "torchrepro.fingerprint") if len(samples["tensor.sum()"]) > 2 \
        else (ratio, ratio, ratio)

    peak = None
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        torchrepro.fingerprint(x)
        peak = torch.cuda.max_memory_allocated(dev) - base
    first = torchrepro.fingerprint(x)
    checks: dict[str, bool | None] = {"repeatable": torchrepro.fingerprint(x) == first}
    bits = x.view(torch.int32)
    k = x.numel() // 3
    bits[k] ^= 1
    checks["one_bit_flip_changes_it"] = torchrepro.fingerprint(x) != first
    bits[k] ^= 1
    checks["flip_back_restores_it"] = torchrepro.fingerprint(x) == first
    small = x[:sizes.cross_device_numel]
    if cuda and hasattr(fpmod, "_digests_torch"):  # one algorithm: equal bytes, equal digests, on every device
        checks["same_as_on_cpu"] = torchrepro.fingerprint(small) == fpmod._digests_torch(
            [small.cpu()], torch.device("cpu"))[0]
    else:
        checks["same_as_on_cpu"] = None  # the CPU itself: nothing to compare with
    rate = {k: v["gb_per_s"] for k, v in timings.items()}
    size = f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"
    summary = [f"{x.numel():,} float32 ({size}) on {dev}, algorithm {algorithm}: sum "
               f"{rate['tensor.sum()']} GB/s, fingerprint {rate['torchrepro.fingerprint']} GB/s, plain copy "
               f"{rate['plain copy']} GB/s read" + (f", the device algorithm on the CPU {forced} GB/s" if
                                                    (forced := rate.get("device algorithm on cpu")) else ""),
               f"  throughput fingerprint / sum = {ratio:.3f}x (round by round: {quartiles[1]:.3f} to "
               f"{quartiles[2]:.3f}); the fingerprint takes as long as {1 / ratio:.2f} reads of the tensor by sum",
               "  peak temporary memory of one fingerprint: " + (f"{peak / 2**20:.1f} MiB ({peak / nbytes:.3f} of the "
                                                                 "tensor)" if peak is not None else "not measured "
                                                                 "(CPU)"),
               "  checks: " + ", ".join(f"{k}={v}" for k, v in checks.items())]
    result = {"summary": summary, "device": str(dev), "numel": x.numel(), "bytes": nbytes, "algorithm": algorithm,
              "timings": timings, "ratio_fingerprint_vs_sum": round(ratio, 4),
              "ratio_quartiles": [round(q, 4) for q in quartiles], "rounds": sizes.timing_rounds,
              "inner": sizes.timing_inner, "peak_temporary_bytes": peak, "checks": checks}
    bad = [k for k, v in checks.items() if v is False]
    return {"status": FAILED if bad else PASSED, "reason": f"checks failed: {', '.join(bad)}" if bad else None,
            "result": result}


WORKERS = {"invariance": worker_invariance, "fingerprint": worker_fingerprint}


# --- the document and its summary -----------------------------------------------------------------------------------
def environment(torch: Any, dry: bool) -> dict[str, Any]:
    import torchrepro

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "torch_cuda": torch.version.cuda, "torchrepro": torchrepro.__version__,
                           "torchrepro_from": str(Path(torchrepro.__file__).parent), "platform": platform.platform(),
                           "cpu_threads": torch.get_num_threads(), "gpu": None}
    with contextlib.suppress(Exception):
        env["git_revision"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                             timeout=10).stdout.strip() or None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                      "memory_gib": round(props.total_memory / 2**30, 1),
                      "multiprocessors": props.multi_processor_count, "count": torch.cuda.device_count(),
                      "cudnn": torch.backends.cudnn.version()}
    return env


def summary_text(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    gpu = env.get("gpu") or {}
    lines = [f"torchrepro GPU check (issue 41 item 5): {gpu.get('name') or 'no GPU'}, torch {env['torch']} "
             f"(CUDA {env.get('torch_cuda')}, cuDNN {gpu.get('cudnn')}), torchrepro {env['torchrepro']}, Python "
             f"{env['python']}"]
    if doc["message"]:
        return "\n".join([*lines, doc["message"]]) + "\n"
    if doc["dry_run"]:
        lines.append("DRY RUN on the CPU with the smallest sizes: it checks the plumbing; no verdict here says "
                     "anything about a GPU")
    done = doc["elapsed_s"] is not None
    lines.append(f"budget {doc['budget_s']:.0f} s" + (f", took {doc['elapsed_s']:.0f} s; exit code "
                                                      f"{doc['exit_code']}" if done else " (still running)"))
    for part in doc["parts"].values():
        lines.append("")
        lines.append(f"[{part['status']}] {part['number']}. {part['title']}"
                     + (f" -- {part['reason']}" if part["reason"] and part["status"] != PASSED else ""))
        for name, step in part["steps"].items():
            took = f"{step['elapsed_s']} s" if step["elapsed_s"] is not None else "not started"
            lines.append(f"  {name} [{step['status']}, {took} of {step['limit_s']} s]"
                         + (f": {step['reason']}" if step["reason"] else ""))
            for line in (step["result"] or {}).get("summary", []):
                lines.append(f"    {line}")
            if step["status"] in (FAILED, ERROR) and step["stderr_tail"]:
                lines += [f"    | {x}" for x in step["stderr_tail"].splitlines()[-8:]]
    return "\n".join(lines) + "\n"


def write(out: Path, doc: dict[str, Any]) -> None:
    from torchrepro._core.io import atomic_write_bytes, atomic_write_json

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "gpu_check.json", doc)
    atomic_write_bytes(out / "gpu_check.txt", summary_text(doc).encode())


def _parts(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = [p.key for p in PARTS]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown part(s) {', '.join(unknown) or '(none)'}; known: "
                                         f"{', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", metavar="DIR", help="where gpu_check.json and gpu_check.txt go (default: $OUT, "
                        "else torchrepro-runs/gpu-check)")
    parser.add_argument("--dry-run", action="store_true", help="run every part on the CPU with the smallest sizes")
    parser.add_argument("--parts", type=_parts, default=[p.key for p in PARTS],
                        help="comma-separated, to rerun some: registry, check, invariance, fingerprint, bench")
    parser.add_argument("--budget", type=float, help="seconds for the whole check (default 480; dry run 1200)")
    parser.add_argument("--time-factor", type=float, default=1.0,
                        help="multiply every step's own limit (a slow or loaded machine)")
    parser.add_argument("--keep-work", action="store_true", help="keep the run directories (their path is printed)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    mode = "dry" if args.dry_run else "gpu"
    sizes = SIZES[mode]
    if args.worker:  # one JSON document on stdout; what the part prints goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            doc = WORKERS[args.worker](sizes)
        print(json.dumps(doc))
        return 0

    import torch

    out = Path(args.out or os.environ.get("OUT") or ROOT / "torchrepro-runs" / "gpu-check")
    clock = Clock(args.budget if args.budget is not None else BUDGET_S[mode], args.time_factor)
    doc: dict[str, Any] = {"schema": SCHEMA, "dry_run": args.dry_run, "cuda": torch.cuda.is_available(),
                           "message": None, "environment": environment(torch, args.dry_run),
                           "budget_s": clock.budget, "time_factor": args.time_factor, "elapsed_s": None,
                           "parts": {}, "exit_code": None}
    if not args.dry_run and not torch.cuda.is_available():
        doc.update(message=NO_CUDA, elapsed_s=0.0, exit_code=0)
        write(out, doc)
        print(NO_CUDA)
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    limits = {k: float(v) for k, v in LIMITS[mode].items()}
    gpu = (doc["environment"]["gpu"] or {}).get("name")
    say(("dry run on the CPU" if args.dry_run else f"on {gpu}") + f", budget {clock.budget:.0f} s, "
        f"writing {out}/gpu_check.json")
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    logs = work / "logs"
    logs.mkdir()
    try:
        with signals_as_interrupts():
            run_parts(args, sizes, limits, env, work, logs, clock, out, doc)
    except Interrupted as exc:
        name = signal.Signals(exc.signum).name
        doc.update(message=f"stopped by {name}: the running step was stopped with its processes; the parts before it "
                           "are kept", elapsed_s=round(time.monotonic() - clock.start, 1), exit_code=128 + exc.signum)
        write(out, doc)
        say(doc["message"])
        return int(doc["exit_code"])
    finally:
        if args.keep_work:
            say(f"run directories kept in {work}")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    ran = [s for p in doc["parts"].values() for s in p["steps"].values()] + [
        p for p in doc["parts"].values() if not p["steps"]]
    doc["exit_code"] = 1 if any(s["status"] in (FAILED, ERROR) for s in ran) else 0
    doc["elapsed_s"] = round(time.monotonic() - clock.start, 1)
    write(out, doc)
    print(summary_text(doc), end="")
    return doc["exit_code"]


def run_parts(args: argparse.Namespace, sizes: Sizes, limits: dict[str, float], env: dict[str, str], work: Path,
              logs: Path, clock: Clock, out: Path, doc: dict[str, Any]) -> None:
    """Each part asked for, step by step, into ``doc`` (written to ``out`` after each step)."""
    for part in PARTS:
        if part.key not in args.parts:
            continue
        entry: dict[str, Any] = {"number": part.number, "title": part.title, "status": SKIPPED, "reason": None,
                                 "steps": {}}
        doc["parts"][part.key] = entry
        try:
            steps = part.steps(args, sizes, limits, env, work)
        except Exception as exc:  # a part that cannot even be set up is its own finding
            entry.update(status=ERROR, reason=f"{type(exc).__name__}: {exc}")
            write(out, doc)
            continue
        for step in steps:
            entry["steps"][step.name] = run_step(step, clock, logs)
            entry["status"], entry["reason"] = aggregate(entry["steps"])
            write(out, doc)


if __name__ == "__main__":
    sys.exit(main())
