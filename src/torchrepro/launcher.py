"""Launching an unmodified Python training script with recording installed (layer L2).

The parent (``torchrepro run``) fixes the environment and starts ``python -m torchrepro.launcher ARGS`` as a
child; the child applies the seed and deterministic mode, installs the :class:`~torchrepro.record.Recorder`,
and runs the user's script as ``__main__`` with its own ``sys.argv``. The parent then writes ``manifest.json``.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from ._io import atomic_write_json
from .errors import ReproError
from .store import MANIFEST, OPS, TRACE, VALUES, read_trace_lines, write_manifest

CONFIG_ENV = "TORCHREPRO_LAUNCH"
_PY_FLAGS_IGNORED = {"-u", "-B", "-O", "-OO", "-s", "-E", "-I", "-q"}


class CommandError(ReproError):
    """A command that torchrepro cannot launch with recording."""


@dataclass(frozen=True)
class Target:
    """What to run in the child: a script path or a module, and its argv."""

    kind: str  # "path" or "module"
    target: str
    argv: list[str]


def parse_python_command(command: list[str]) -> Target:
    """Understand ``python train.py ARGS``, ``python -m pkg.mod ARGS`` or ``train.py ARGS``.

    >>> parse_python_command(["python", "train.py", "--lr", "0.1"])
    Target(kind='path', target='train.py', argv=['train.py', '--lr', '0.1'])
    """
    if not command:
        raise CommandError("no command given. Usage: torchrepro run [OPTIONS] -- python train.py [ARGS]")
    args = list(command)
    if Path(args[0]).name.startswith("python"):
        args = args[1:]
        while args and args[0] in _PY_FLAGS_IGNORED:
            args = args[1:]
        if args and args[0] == "-m":
            if len(args) < 2:
                raise CommandError("`python -m` needs a module name, e.g. `python -m mypkg.train`.")
            return Target("module", args[1], [args[1], *args[2:]])
        if args and args[0].startswith("-"):
            raise CommandError(f"python option {args[0]!r} is not supported by torchrepro run; "
                               "pass a script path or `-m module`.")
    if not args or not args[0].endswith(".py"):
        raise CommandError(
            f"torchrepro records Python training scripts; got {' '.join(command)!r}. "
            "Pass `python train.py [ARGS]`, `python -m package.module [ARGS]` or `train.py [ARGS]`.")
    if not Path(args[0]).is_file():
        raise CommandError(f"script {args[0]!r} does not exist (working directory {os.getcwd()}).")
    return Target("path", args[0], args)


@dataclass
class LaunchOptions:
    record: str | None = None
    seed: int | None = None
    deterministic: bool = False
    max_steps: int | None = None
    keep_values: bool = False
    trace_steps: list[int] | None = None  # [first, last] steps to trace op by op (see optrace)
    trace_mode: str = "optimizer"
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class RunResult:
    returncode: int
    status: str  # ok | failed | killed | stopped-at-max-steps
    record: str | None
    manifest: dict[str, Any] | None


def child_env(opts: LaunchOptions) -> dict[str, str]:
    """The child's environment: PYTHONHASHSEED fixed, seed and cuBLAS config set before user code runs."""
    env = dict(os.environ)
    env.update(opts.extra_env)
    env.setdefault("PYTHONHASHSEED", str(opts.seed) if opts.seed is not None else "0")
    if opts.seed is not None:
        env["TORCHREPRO_SEED"] = str(opts.seed)
    if opts.deterministic:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env[CONFIG_ENV] = json.dumps(asdict(opts))
    return env


def prepare_run_dir(path: Path) -> None:
    """Create ``path``, or empty it of an earlier recording; refuse to touch a directory that is not a run."""
    if path.exists() and not path.is_dir():
        raise CommandError(f"--record {path}: exists and is not a directory.")
    if path.is_dir() and any(path.iterdir()):
        known = {MANIFEST, TRACE, OPS, VALUES, "child.json", "stdout.txt", "stderr.txt"}
        names = {p.name for p in path.iterdir()} - {"stdout.txt", "stderr.txt"}
        if names and (not names & {MANIFEST, TRACE} or names - known):
            raise CommandError(f"--record {path}: the directory is not empty and is not a torchrepro run "
                               f"directory (it holds {sorted(names)[:5]}). Choose a new or empty directory.")
        for name in names:
            target = path / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    path.mkdir(parents=True, exist_ok=True)


def launch(command: list[str], opts: LaunchOptions, *, stdout: IO[Any] | None = None,
           stderr: IO[Any] | None = None, on_poll: Any = None) -> RunResult:
    """Run ``command`` recorded into ``opts.record``; write the manifest; return the outcome.

    ``on_poll(steps_so_far)`` is called about five times a second while the script runs (progress display).
    """
    target = parse_python_command(command)
    if opts.record:
        prepare_run_dir(Path(opts.record))
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "torchrepro.launcher", *target.argv], env=child_env(opts),
                            stdout=stdout, stderr=stderr)
    counter = _StepCounter(Path(opts.record)) if opts.record else None
    try:
        while proc.poll() is None:
            if on_poll is not None and counter is not None:
                on_poll(counter())
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    ended = time.time()
    rc = proc.returncode
    manifest = None
    summary: dict[str, Any] = {}
    if opts.record:
        spath = Path(opts.record) / "child.json"
        if spath.exists():
            try:
                summary = json.loads(spath.read_text())
            except json.JSONDecodeError:
                summary = {}
            spath.unlink()
    status = "ok" if rc == 0 else ("killed" if rc < 0 else "failed")
    if rc == 0 and summary.get("stopped_at_max_steps"):
        status = "stopped-at-max-steps"
    if opts.record:
        events, truncated = read_trace_lines(opts.record)
        if not summary:  # the child died before summarising: derive what we can from the trace
            steps = sum(1 for e in events if e.get("kind") == "step")
            backwards = sum(1 for e in events if e.get("kind") == "backward")
            summary = {"step_mode": "optimizer" if steps else "backward", "steps": steps or backwards,
                       "optimizer_steps": steps, "backward_calls": backwards}
        summary["trace_records"] = len(events)
        summary["trace_truncated"] = truncated
        manifest = {
            "command": list(command),
            "cwd": os.getcwd(),
            "exit_code": rc,
            "signal": signal.Signals(-rc).name if rc < 0 and -rc in signal.Signals._value2member_map_ else None,
            "status": status,
            "seed": opts.seed,
            "deterministic": opts.deterministic,
            "max_steps": opts.max_steps,
            "torch": torch.__version__,
            "started": started,
            "duration_s": round(ended - started, 3),
            **summary,
        }
        manifest = write_manifest(opts.record, manifest)
    return RunResult(returncode=rc, status=status, record=opts.record, manifest=manifest)


class _StepCounter:
    """Counts recorded steps by reading only what was appended to the trace since the last call."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "trace.jsonl"
        self.offset = 0
        self.steps = 0
        self.backwards = 0
        self._partial = b""

    def __call__(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return 0
        self.offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            self.steps += line.startswith(b'{"kind":"step"')
            self.backwards += line.startswith(b'{"kind":"backward"')
        return self.steps or self.backwards


# --- the child side -----------------------------------------------------------------------------------
def _child_main(argv: list[str]) -> int:
    opts = LaunchOptions(**json.loads(os.environ.pop(CONFIG_ENV, "{}")))
    from . import determinism, seeding
    from .envinfo import environment_summary
    from .record import MaxStepsReached, Recorder

    if opts.seed is not None:
        seeding.seed_everything(opts.seed)
    if opts.deterministic:
        determinism.deterministic(True)
    recorder = None
    if opts.record:
        recorder = Recorder(opts.record, keep_values=opts.keep_values, max_steps=opts.max_steps,
                            trace_steps=tuple(opts.trace_steps) if opts.trace_steps else None,  # type: ignore[arg-type]
                            trace_mode=opts.trace_mode).install()
    target = argv[0]
    is_module = not target.endswith(".py") or not Path(target).is_file()
    sys.argv = list(argv)
    code = 0
    stopped = False
    try:
        if is_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
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
        if recorder is not None:
            summary = recorder.finish()
            summary["stopped_at_max_steps"] = stopped
            summary["environment"] = environment_summary()
            atomic_write_json(Path(opts.record) / "child.json", summary)  # type: ignore[arg-type]
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
