"""The child side of a launch (layer L3): the process ``torchrepro run``/``check`` starts as
``python -m torchrepro.record.child KIND TARGET ARGS``.

It applies the launch options (seed, deterministic mode, torch flags, threads), installs the recorder (and the op
tracer, the resume plan, the read audit), runs the user's script with ``runpy`` (its ``sys.argv``, ``__main__``
and exit code preserved), writes the run's summary however the script ends, and dies with its parent. Under
torchrun or accelerate, ``KIND`` names the launcher this process runs (tied to torchrepro) instead. The parent
side, which starts and supervises it, is :mod:`torchrepro.record.launcher`.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import runpy
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._core.io import atomic_write_json
from .._core.patches import Patches
from .launcher import (
    CONFIG_ENV,
    INTERNAL_KEY,
    NODE_TOKEN_ENV,
    PARENT_ENV,
    LaunchOptions,
    _wait_for_gate,
    freeze_heap,
    prepare_run_dir,
)
from .launchers import LAUNCHER_KINDS, TORCHRUN_KIND, run_launcher


def _set_tf32(on: bool) -> None:
    """TF32 in cuBLAS matmuls and cuDNN convolutions/RNNs (through ``fp32_precision`` where torch has it)."""
    import torch

    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):
        precision = "tf32" if on else "ieee"
        torch.backends.cuda.matmul.fp32_precision = precision
        conv.fp32_precision = precision
        torch.backends.cudnn.rnn.fp32_precision = precision  # type: ignore[attr-defined]
    else:
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def _set_cudnn_benchmark(on: bool) -> None:
    import torch

    torch.backends.cudnn.benchmark = on


TORCH_FLAGS = {"cudnn_benchmark": _set_cudnn_benchmark, "tf32": _set_tf32}


def peak_memory() -> dict[str, Any]:
    """This process's peak memory: CUDA ``max_memory_allocated`` (largest device) if CUDA was used, else peak RSS."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peak = max(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count()))
        return {"kind": "cuda-max-allocated", "bytes": int(peak)}
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    except (ImportError, OSError):
        return {"kind": None, "bytes": None}
    return {"kind": "max-rss", "bytes": int(rss) * (1 if sys.platform == "darwin" else 1024)}


def die_with_parent(parent: int | None) -> None:
    """Linux: get SIGTERM when the parent dies (even by SIGKILL): torchrepro, or torchrun for a rank (``parent``
    is that pid, to catch a parent that died before the call), so the script never outlives torchrepro. Also a
    ``preexec_fn`` (tools/gpu_check.py: ``functools.partial(die_with_parent, os.getpid())``)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _torchrun_main(args: list[str], kind: str = TORCHRUN_KIND) -> int:
    """Run ``torch.distributed.run ARGS`` (or accelerate's launch: ``launchers.run_launcher``) in this process, which
    dies with the torchrepro parent.

    Linux: torchrun gets SIGTERM when torchrepro dies (even by SIGKILL) and stops its ranks; each rank, in a
    session of its own, gets SIGTERM when torchrun dies (:func:`die_with_parent`, given torchrun's pid here).
    """
    die_with_parent(_parent_pid())
    os.environ[PARENT_ENV] = str(os.getpid())
    run_launcher(kind, args)
    return 0


def _parent_pid() -> int | None:
    """The pid of the process this one must die with (``TORCHREPRO_PARENT_PID``, removed from the environment)."""
    value = os.environ.pop(PARENT_ENV, "")
    return int(value) if value.isdigit() else None


def _redirect_output(rank_dir: Path) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2) at ``rank_dir/stdout.txt``/``stderr.txt``."""
    rank_dir.mkdir(parents=True, exist_ok=True)
    for stream, fd, name in ((sys.stdout, 1, "stdout.txt"), (sys.stderr, 2, "stderr.txt")):
        stream.flush()
        target = os.open(rank_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        os.dup2(target, fd)
        os.close(target)


def _line_buffered() -> None:
    """Make stdout line-buffered, as on a terminal (written to a file it would wait for 8 KiB): each line the script
    prints reaches ``stdout.txt`` at once, in one write, where check's progress and ``--show-output`` read it."""
    if isinstance(sys.stdout, io.TextIOWrapper) and not sys.stdout.line_buffering:
        with contextlib.suppress(ValueError, OSError):
            sys.stdout.reconfigure(line_buffering=True)


def _run_code(code: str) -> None:
    """Run ``python -c CODE`` as ``__main__``, as the interpreter would (cwd first on sys.path)."""
    import types

    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = __builtins__
    previous = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    sys.path.insert(0, "")
    try:
        exec(compile(code, "<string>", "exec"), module.__dict__)
    finally:
        if previous is not None:
            sys.modules["__main__"] = previous


def _child_main(argv: list[str]) -> int:
    die_with_parent(_parent_pid())
    opts = LaunchOptions.from_json(json.loads(os.environ.pop(CONFIG_ENV, "{}")))
    # gated (start_gated): a Ctrl-C meant for the run before this one must not end this one while it waits
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN) if opts.gate_fd is not None else None
    if opts.ranks.nproc_per_node and opts.record:  # one rank of a torchrun launch: record into RECORD/rank{RANK}
        opts.record = str(Path(opts.record) / f"rank{int(os.environ.get('RANK', '0'))}")
        if opts.ranks.nnodes > 1:  # the run's directory may be shared with the other nodes: only this rank's is cleared
            prepare_run_dir(Path(opts.record))
        if opts.ranks.output:
            _redirect_output(Path(opts.record))
    from ..control import determinism, seeding
    from ..env.info import ScriptProbe
    from .recorder import MaxStepsReached, Recorder
    from .settings import StopSettings
    from .workdir import ReadAudit

    if opts.gate_fd is not None:
        _wait_for_gate(opts.gate_fd)
        signal.signal(signal.SIGINT, sigint if sigint is not None else signal.SIG_DFL)
    if opts.seed is not None:
        seeding.seed_everything(opts.seed)
    if opts.deterministic:
        determinism.deterministic(True, **opts.determinism)
    for flag, value in opts.torch_flags.items():
        TORCH_FLAGS[flag](value)
    probe = ScriptProbe().install() if opts.audit else None
    recorder = None
    plan = None
    if opts.resume_at is not None:
        from .resumeat import ResumePlan

        plan = ResumePlan.from_options(opts.resume_at)
    if opts.record:
        values = opts.values
        resume = None
        if plan is not None:  # check --resume-at: its marks, and gradient snapshots from the step it compares
            values, resume = plan.recorder_settings(values)
        recorder = Recorder(opts.record, values=values, trace=opts.trace, resume=resume, timing=opts.timing,
                            stop=StopSettings(max_steps=opts.max_steps, divergence=opts.divergence_stop)).install()
    if plan is not None:
        plan.install(recorder)
    since = opts.workdir.watch_since_ns
    audit = ReadAudit(since).install() if since is not None else None
    end = _ChildEnd(recorder, probe, audit, opts.record, plan)
    if recorder is not None:
        _write_summary_on_os_exit(end)
    kind, target, args = argv[0], argv[1], argv[2:]
    _line_buffered()
    sys.argv = ["-c" if kind == "code" else target, *args]
    ThreadEnvAtImport().install()  # a thread count the script exports before its `import torch` still counts
    freeze_heap()  # only import-time objects so far: the script's own stay collectable
    code = 0
    stopped = False
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "code":
            _run_code(target)
        else:
            sys.path.insert(0, str(Path(target).resolve().parent))
            runpy.run_path(target, run_name="__main__")
    except MaxStepsReached:
        stopped = True
    except SystemExit as exc:
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        code = _end_safely(end, code, stopped)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


INTERNAL_EXIT = 3  # the CLI's exit code for a bug in torchrepro


def _end_safely(end: _ChildEnd, code: int, stopped: bool) -> int:
    """Write the child's summary; if torchrepro's own code fails doing so, say so (not the script's fault).

    The traceback goes to stderr, and ``child.json`` gets only ``INTERNAL_KEY`` (the exception in one line) so
    that the parent reports a bug in torchrepro (exit 3) instead of telling the user to fix the script.
    """
    try:
        end(code, stopped)
        return code
    except Exception as exc:  # noqa: BLE001 - any failure here is ours; the parent names it
        traceback.print_exc()
        what = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        print(f"torchrepro: internal error after the script ended (a bug in torchrepro, not in the script): {what}",
              file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            atomic_write_json(Path(str(end.record)) / "child.json", {INTERNAL_KEY: what, "child_exit_code": code})
        return INTERNAL_EXIT


@dataclass
class _ChildEnd:
    """Writes the child's summary (``child.json``: what the recorder saw, the environment, the exit code) once,
    in the launched process only: when the script ends, or from ``os._exit`` (which skips ``finally``)."""

    recorder: Any
    probe: Any  # envinfo.ScriptProbe or None
    audit: Any  # workdir.ReadAudit or None
    record: str | None
    plan: Any = None  # resumeat.ResumePlan or None
    pid: int = field(default_factory=os.getpid)
    written: bool = False

    def __call__(self, code: int, stopped: bool) -> None:
        if self.recorder is None or self.recorder.forked or self.written or os.getpid() != self.pid:
            return  # a forked child that returned or called os._exit: the parent records
        self.written = True
        from ..env.info import environment_summary
        from .workdir import READS_KEY

        summary = self.recorder.finish()
        summary["stopped_at_max_steps"] = (stopped or bool(summary.get("stopped_at_max_steps"))) and \
            not summary.get("stopped")
        summary["environment"] = environment_summary()
        if self.probe is not None:
            summary["audit_probe"] = self.probe.facts()
        summary["peak_memory"] = peak_memory()
        if self.audit is not None:
            summary[READS_KEY] = self.audit.facts()
        if self.plan is not None:
            from .resumeat import FACTS_KEY

            summary[FACTS_KEY] = self.plan.facts()
        summary["torch"] = sys.modules["torch"].__version__
        if os.environ.get(NODE_TOKEN_ENV):  # one node of several: which launch and node this rank belonged to
            summary["node_token"] = os.environ[NODE_TOKEN_ENV]
            summary["group_rank"] = int(os.environ.get("GROUP_RANK", "0"))
        summary["child_exit_code"], summary["child_ended"] = code, time.time()
        atomic_write_json(Path(str(self.record)) / "child.json", summary)


def _write_summary_on_os_exit(end: _ChildEnd) -> None:
    """Make ``os._exit(status)`` in this process write the summary first; a forked child's exits as before."""
    real_exit = os._exit

    def _exit(status: int) -> None:
        with contextlib.suppress(BaseException):  # the script asked to exit now: it does, summary or not
            end(status, False)
        real_exit(status)

    os._exit = _exit  # type: ignore[assignment]


class ThreadEnvAtImport:
    """Apply, at the script's first ``import torch``, a thread count the script put into the environment before it.

    The launcher imports torch before the script runs (seeding, deterministic mode and the recorder need it), and
    torch reads ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` when it is imported. A script that sets one at its top
    (``os.environ["OMP_NUM_THREADS"] = "1"``, then ``import torch``) runs with that many threads on its own, but
    would run with torch's default under torchrepro: other numerics (reductions split across threads) and, with a
    kernel that is nondeterministic only with 2+ threads, another verdict. So the first import of torch (or of a
    module of it) by the script's code sets the thread count as torch's own start-up would have: MKL_NUM_THREADS
    over OMP_NUM_THREADS, a positive integer (the first of a comma-separated list). Only when the script changed one
    of them: a count exported before the launch already reached torch.
    """

    VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

    def __init__(self) -> None:
        self.launched = {name: os.environ.get(name) for name in self.VARS}
        self._original = builtins.__import__
        self._patches = Patches()
        self.done = False

    def install(self) -> ThreadEnvAtImport:
        self._original = self._patches.set(builtins, "__import__", self._import)
        return self

    def uninstall(self) -> None:
        self._patches.undo()

    def _import(self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if not self.done and level == 0 and (name == "torch" or name.startswith("torch.")):
            self.done = True  # once, even if another wrapper of __import__ now calls this one
            self.uninstall()
            self.apply()
        return self._original(name, globals, locals, fromlist, level)

    def threads(self) -> int | None:
        """The thread count the script's environment asks for, or None (unchanged since the launch, or invalid)."""
        if all(os.environ.get(name) == self.launched[name] for name in self.VARS):
            return None
        count = None
        for name in self.VARS:  # torch's own order: MKL_NUM_THREADS overrides OMP_NUM_THREADS
            first = (os.environ.get(name) or "").split(",")[0].strip()
            if first.isdigit() and int(first) > 0:
                count = int(first)
        return count

    def apply(self) -> None:
        count = self.threads()
        if count is not None:
            import torch

            torch.set_num_threads(count)


if __name__ == "__main__":
    sys.exit(_torchrun_main(sys.argv[2:], sys.argv[1]) if sys.argv[1] in LAUNCHER_KINDS else _child_main(sys.argv[1:]))
