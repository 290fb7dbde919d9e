"""Launching an unmodified Python training script with recording installed.

The parent (``torchrepro run``) fixes the environment and starts ``python -m torchrepro.record.child ARGS`` as a
child (:mod:`torchrepro.record.child`): it applies the seed and deterministic mode, installs the
:class:`~torchrepro.record.recorder.Recorder`, and runs the user's script as ``__main__`` with its own
``sys.argv``. The parent supervises it (signals passed on, no orphans) and then writes ``manifest.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .._core.errors import InternalError, Interrupted, StateFileError
from .._core.readjson import field_problems, read_json
from .launchers import (
    TORCHRUN_KIND,
    launcher_argv,
    parse_accelerate,
    refuse_not_followed,
    several_processes_error,
)
from .launchers import CommandError as CommandError  # the launcher commands (torchrun, accelerate) are read there
from .launchers import TorchrunSpec as TorchrunSpec
from .launchers import is_interpreter as is_interpreter
from .launchers import parse_torchrun as parse_torchrun
from .launchers import parse_torchrun_command as parse_torchrun_command
from .launchers import ranks_command as ranks_command
from .options import LaunchOptions as LaunchOptions  # re-exported: the launcher's options live there
from .outdir import check_run_dir, clear_run_dir, lock_dir, make_dir
from .store import read_trace_lines, write_manifest

CONFIG_ENV = "TORCHREPRO_LAUNCH"
NODE_TOKEN_ENV = "TORCHREPRO_NODE_TOKEN"  # one node's launch of a run of several nodes: its ranks write it down
PARENT_ENV = "TORCHREPRO_PARENT_PID"
INTERNAL_KEY = "torchrepro_internal_error"  # in child.json: torchrepro's own code failed (see _end_safely)
_PY_FLAGS_PASSED = {"-u", "-B", "-O", "-OO", "-q", "-s"}
PY_OPTIONS_WITH_VALUE = {"-W": "ARG", "-X": "OPT"}  # passed on with their value: `-W ignore`, `-Wignore`, `-X dev`
_PY_FLAGS_REFUSED = {"-E": "ignores PYTHONHASHSEED and the other variables torchrepro sets",
                     "-I": "ignores PYTHONHASHSEED and the other variables torchrepro sets"}
_USAGE = "Pass `python train.py [ARGS]`, `python -m package.module [ARGS]`, `python -c CODE` or `train.py [ARGS]`."


@dataclass(frozen=True)
class Target:
    """What to run in the child: a script path, a module or code, its argv, and the interpreter to run it with."""

    kind: str  # "path", "module" or "code"
    target: str
    argv: list[str]
    interpreter: str = sys.executable
    python_flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # what a launcher sets for the script (accelerate launch of one process)
    launcher: tuple[str, ...] = ()  # the launcher that starts the ranks (accelerate launch of several: launchers)

    def child_command(self) -> list[str]:
        """The child's command line: the user's interpreter running the torchrepro launcher."""
        return [self.interpreter, *self.python_flags, "-m", "torchrepro.record.child", self.kind, self.target,
                *self.argv[1:]]


def parse_python_command(command: list[str]) -> Target:
    """Understand ``python train.py ARGS``, ``python -m pkg.mod ARGS``, ``python -c CODE`` or ``train.py ARGS``.

    The interpreter named in the command is the one that runs the script (it must have torchrepro installed);
    a script given without an interpreter runs with the current one. ``accelerate launch ...`` is the script it
    starts (see :mod:`torchrepro.record.launchers`); other launchers are refused by name.

    >>> target = parse_python_command([sys.executable, "-m", "pkg.train", "--lr", "0.1"])
    >>> target.kind, target.target, target.argv
    ('module', 'pkg.train', ['pkg.train', '--lr', '0.1'])
    >>> parse_python_command(["train.py"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    torchrepro.record.launchers.CommandError: script 'train.py' does not exist (working directory ...).
    """
    if not command:
        raise CommandError("no command given. Usage: torchrepro run [OPTIONS] -- python train.py [ARGS]")
    refuse_not_followed(command)
    accelerate = parse_accelerate(command)
    if accelerate is not None:
        return dataclasses.replace(parse_python_command(accelerate.python_command), env=accelerate.env,
                                   launcher=accelerate.launcher)
    args = list(command)
    interpreter, flags = sys.executable, []
    if is_interpreter(args[0]):
        interpreter = resolve_interpreter(args[0], shlex.join(args[1:]) or "train.py")
        args = args[1:]
        while args and args[0].startswith("-") and args[0] not in ("-m", "-c", "-"):
            if args[0] in _PY_FLAGS_REFUSED:
                raise CommandError(f"python option {args[0]} {_PY_FLAGS_REFUSED[args[0]]}; remove it.")
            if args[0][:2] in PY_OPTIONS_WITH_VALUE:
                width = 2 if args[0] in PY_OPTIONS_WITH_VALUE else 1  # `-W ignore` or `-Wignore`
                if len(args) < width:
                    raise CommandError(f"python option {args[0]} needs a value, e.g. `python -W ignore train.py` or "
                                       f"`python -X dev train.py`. {_USAGE}")
                flags.extend(args[:width])
                del args[:width]
                continue
            if args[0] not in _PY_FLAGS_PASSED:
                supported = sorted([*_PY_FLAGS_PASSED, *(f"{o} {v}" for o, v in PY_OPTIONS_WITH_VALUE.items())])
                raise CommandError(f"python option {args[0]!r} is not supported by torchrepro (supported: "
                                   f"{' '.join(supported)}). {_USAGE}")
            flags.append(args.pop(0))
        if args[:1] in (["-m"], ["-c"]):
            if len(args) < 2:
                raise CommandError(f"`python {args[0]}` needs an argument, e.g. `python -m mypkg.train` or "
                                   "`python -c 'import train; train.main()'`.")
            kind = "module" if args[0] == "-m" else "code"
            argv = [args[1] if kind == "module" else "-c", *args[2:]]
            return Target(kind, args[1], argv, interpreter, tuple(flags))
    if not args or not args[0].endswith(".py"):
        raise CommandError(f"torchrepro records Python training scripts; got {' '.join(command)!r}. {_USAGE}")
    if not Path(args[0]).is_file():
        raise CommandError(f"script {args[0]!r} does not exist (working directory {os.getcwd()}).")
    return Target("path", args[0], args, interpreter, tuple(flags))


def resolve_interpreter(name: str, rest: str = "train.py") -> str:
    """The path of the interpreter ``name`` (a path, or a name looked up on PATH); it must import torchrepro.

    A bare name (``python``, ``python3``) that PATH resolves to an interpreter without torchrepro -- the shell's
    Python when ``.venv/bin/torchrepro`` runs without the venv activated -- is replaced by the interpreter
    torchrepro runs in, and one line on stderr says so. A path is the interpreter the user chose: it is kept, and
    refused when it lacks torchrepro. ``rest``: the command after the interpreter, for the messages."""
    bare = not (os.sep in name or (os.altsep and os.altsep in name))
    path = shutil.which(name) if bare else name
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        where = "on PATH" if path is None else "(no such executable file)"
        raise CommandError(f"the interpreter {name!r} in your command was not found {where}. Name an existing "
                           f"Python, e.g. `-- {sys.executable} {rest}`, or give only the script: `-- {rest}`.")
    path = os.path.abspath(path)
    if bare and path != os.path.abspath(sys.executable) and _probe(path) != 0:
        _say_replaced(name, path)
        return os.path.abspath(sys.executable)
    _check_importable(path, rest)
    return path


@functools.cache
def _say_replaced(name: str, path: str) -> None:
    """Once per interpreter: the command's `python` was not the one torchrepro runs in."""
    print(f"torchrepro: `{name}` on PATH is {path}, which has no torchrepro (or no torch); running the script with "
          f"{sys.executable}, the Python torchrepro runs in (name an interpreter's path to use another).",
          file=sys.stderr, flush=True)


@functools.cache
def _probe(interpreter: str) -> int:
    """0: ``interpreter`` imports torchrepro and torch; 7: no torchrepro; ``_NO_TORCH``: no torch."""
    try:
        return subprocess.run([interpreter, "-c", _PROBE], capture_output=True, timeout=120).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CommandError(f"cannot start the interpreter {interpreter!r} ({exc}).") from None


def _check_importable(interpreter: str, rest: str = "train.py") -> None:
    if interpreter == os.path.abspath(sys.executable):
        return
    rc = _probe(interpreter)
    if rc != 0:
        missing = "torch" if rc == _NO_TORCH else "torchrepro"  # torchrepro found through PYTHONPATH, torch not
        raise CommandError(
            f"{missing} is not installed for the interpreter in your command ({interpreter}), so torchrepro cannot "
            f"record the script there. Install it into that environment (`{interpreter} -m pip install {missing}`), "
            f"or run the script with the Python that has torchrepro: `-- {sys.executable} {rest}`.")


_NO_TORCH = 8
_PROBE = ("import importlib.util as u, sys\n"
          f"sys.exit(7 if u.find_spec('torchrepro') is None else {_NO_TORCH} if u.find_spec('torch') is None else 0)")


# --- torchrun ------------------------------------------------------------------------------------------------
def torchrun_command(target: Target, nproc_per_node: int, rendezvous: list[str] | None = None) -> list[str]:
    """``torch.distributed.run --standalone --nproc-per-node P --no-python`` + the child launcher, run by
    :func:`_torchrun_main` (so that torchrun, and through it every rank, dies with torchrepro). ``rendezvous``
    replaces ``--standalone`` for one node of several (``--nnodes N --node-rank R --rdzv-endpoint ...``). An
    ``accelerate launch`` of several processes (``target.launcher``) starts them itself, with the same child."""
    if target.launcher:
        return [target.interpreter, *target.python_flags, "-m", "torchrepro.record.child",
                *launcher_argv(target.child_command(), target.launcher)]
    return [target.interpreter, *target.python_flags, "-m", "torchrepro.record.child", TORCHRUN_KIND,
            *(rendezvous if rendezvous else ["--standalone"]), f"--nproc-per-node={nproc_per_node}", "--no-python",
            *target.child_command()]


@dataclass
class RunResult:
    returncode: int
    status: str  # ok | failed | killed | stopped-at-max-steps | stopped-after-divergence
    record: str | None
    manifest: dict[str, Any] | None


def child_env(opts: LaunchOptions, launcher_env: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    """The child's environment: PYTHONHASHSEED fixed, seed and cuBLAS config set before user code runs; over this
    process's, what the user's launcher sets (``launcher_env``: ``Target.env``).

    PYTHONHASHSEED is always set (to the seed, or 0): a value the user exported (``random``, say) would make
    set and dict-of-str order differ from run to run, so it is overridden, and :func:`launch` says so.
    """
    env = {**os.environ, **dict(launcher_env), **opts.extra_env}
    env["PYTHONHASHSEED"] = hash_seed(opts)
    if opts.seed is not None:
        env["TORCHREPRO_SEED"] = str(opts.seed)
    if opts.deterministic and opts.determinism.get("cublas_workspace", ":4096:8") is not None:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    config = opts.to_json()
    if opts.record and opts.workdir.cwd:  # the child starts in another directory: a relative path would land there
        config["record"] = os.path.abspath(opts.record)
    env[CONFIG_ENV] = json.dumps(config)
    env[PARENT_ENV] = str(os.getpid())  # under torchrun: torchrun's parent (it passes its own pid to the ranks)
    return env


def hash_seed(opts: LaunchOptions) -> str:
    return str(opts.seed) if opts.seed is not None else "0"


def hash_seed_note(opts: LaunchOptions) -> str | None:
    """A note when the user's PYTHONHASHSEED differs from the one the child gets; None otherwise."""
    theirs = {**os.environ, **opts.extra_env}.get("PYTHONHASHSEED")
    if theirs is None or theirs == hash_seed(opts):
        return None
    return (f"torchrepro: PYTHONHASHSEED={theirs} in your environment was replaced by PYTHONHASHSEED="
            f"{hash_seed(opts)} so that str hashing (set and dict order) is the same in every run.")


def prepare_run_dir(path: Path, *, flag: str = "--record") -> None:
    """Create ``path``, or empty it of an earlier recording; refuse to touch a directory that is not a run."""
    check_run_dir(path, flag=flag)
    make_dir(path, flag=flag)
    clear_run_dir(path)


# Signals that stop a command: forwarded to the child, which is then waited for (SIGINT arrives as
# KeyboardInterrupt). SIGKILL follows if the child has not ended GRACE_S seconds after the signal.
FORWARDED = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)
GRACE_S = 10.0


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """SIGTERM/SIGHUP raise :class:`Interrupted` (as Ctrl-C raises KeyboardInterrupt), so that cleanup runs.
    While a command runs, the launcher passes them on to it first (bisect, tools/gpu_check.py)."""
    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signum, f"interrupted by {signal.Signals(signum).name}")

    previous = {}
    try:
        for sig in FORWARDED:
            previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class _SignalForwarder:
    """While active, SIGTERM/SIGHUP to this process are passed on to the child instead of ending us at once.

    In a thread other than the main one (``check --parallel`` launches its runs from threads) no handler is
    installed: the main thread passes a signal on to every active forwarder with :func:`interrupt_all`.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[Any] | None = None
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = self.received or signum
        self.forward(signum)

    def forward(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def __enter__(self) -> _SignalForwarder:
        if threading.current_thread() is threading.main_thread():
            for sig in FORWARDED:
                self._previous[sig] = signal.signal(sig, self._handle)
        _ACTIVE.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.discard(self)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def wait_for_child(self) -> None:
        """Wait for the child to end after a forwarded signal; SIGKILL it after GRACE_S seconds."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_ACTIVE: set[_SignalForwarder] = set()  # the forwarders of the launches running now, in any thread


def interrupt_all(signum: int, *, forward: bool = True) -> None:
    """Stop every launch running now as if this process had got ``signum`` (each raises ``Interrupted`` once its
    script has ended); ``forward=False``: only mark them (a Ctrl-C has reached the scripts already)."""
    for fwd in list(_ACTIVE):
        fwd.received = fwd.received or signum
        if forward:
            fwd.forward(signum)


def _how_it_ended(returncode: int) -> str:
    """``it ended on SIGTERM`` for a negative return code (killed by a signal), else ``exit status N``."""
    try:
        return f"it ended on {signal.Signals(-returncode).name}" if returncode < 0 else f"exit status {returncode}"
    except ValueError:
        return f"killed by signal {-returncode}"


def launch(command: list[str], opts: LaunchOptions, *, stdout: IO[Any] | None = None,
           stderr: IO[Any] | None = None, on_poll: Any = None) -> RunResult:
    """Run ``command`` recorded into ``opts.record``; write the manifest; return the outcome.

    ``on_poll(steps_so_far)`` is called about five times a second while the script runs (progress display).
    SIGINT, SIGTERM and SIGHUP are passed on to the script; once it has ended, the manifest of the partial run
    is written and :class:`~torchrepro._core.errors.Interrupted` is raised.
    """
    target = parse_python_command(command)
    note = hash_seed_note(opts)
    if note:
        print(note, file=sys.stderr, flush=True)
    if not opts.record:
        return _run_child(target, command, opts, stdout, stderr, on_poll)
    record = Path(opts.record)
    check_run_dir(record, flag="--record")
    make_dir(record, flag="--record")
    if opts.ranks.nnodes > 1:  # the other nodes may be recording into this directory too: each rank clears its own
        return _run_child(target, command, dataclasses.replace(
            opts, extra_env={**opts.extra_env, NODE_TOKEN_ENV: uuid.uuid4().hex}), stdout, stderr, on_poll)
    with lock_dir(record):
        clear_run_dir(record)
        return _run_child(target, command, opts, stdout, stderr, on_poll)


def _run_child(target: Target, command: list[str], opts: LaunchOptions, stdout: IO[Any] | None,
               stderr: IO[Any] | None, on_poll: Any) -> RunResult:
    started = time.time()
    with _SignalForwarder() as fwd:
        fwd.proc = _spawn(target, opts, stdout, stderr)
        return _supervise(fwd, command, opts, started, stderr, on_poll)


def _spawn(target: Target, opts: LaunchOptions, stdout: IO[Any] | None, stderr: IO[Any] | None,
           pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    if target.launcher and not opts.ranks.nproc_per_node:
        raise several_processes_error(target.launcher)
    try:
        nproc = opts.ranks.nproc_per_node
        cmd = torchrun_command(target, nproc, opts.ranks.rendezvous) if nproc else target.child_command()
        return subprocess.Popen(cmd, env=child_env(opts, target.env), stdout=stdout, stderr=stderr,
                                cwd=opts.workdir.cwd, pass_fds=pass_fds)
    except OSError as exc:
        raise CommandError(f"cannot start {target.interpreter!r}: {exc.strerror or exc}.") from None


def _supervise(fwd: _SignalForwarder, command: list[str], opts: LaunchOptions, started: float,
               stderr: IO[Any] | None, on_poll: Any) -> RunResult:
    """Wait for ``fwd.proc`` (signals passed on, progress polled), then write the manifest (:func:`_finish_run`)."""
    proc = fwd.proc
    assert proc is not None
    first_rank = f"rank{opts.ranks.node_rank * (opts.ranks.nproc_per_node or 1)}" if opts.ranks.nproc_per_node else ""
    counter = _StepCounter(Path(opts.record) / first_rank) if opts.record else None
    try:
        while proc.poll() is None and fwd.received is None:
            if on_poll is not None and counter is not None:
                on_poll(counter())
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
    except KeyboardInterrupt:  # Ctrl-C reaches the child too; pass it on only if the child carries on
        fwd.received = signal.SIGINT
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            fwd.forward(signal.SIGINT)
    if fwd.received is not None:
        fwd.wait_for_child()
    result = _finish_run(command, opts, proc.returncode, started, interrupted=fwd.received,
                         log=getattr(stderr, "name", None))
    if fwd.received is not None:
        name = signal.Signals(fwd.received).name
        where = f"; the partial recording is in {opts.record}" if opts.record else ""
        ended = _how_it_ended(proc.returncode)
        raise Interrupted(fwd.received, f"interrupted by {name}: stopped the script `{' '.join(command)}` "
                                        f"({ended}){where}.")
    return result


@dataclass
class GatedLaunch:
    """A recorded run whose interpreter has started (torch imported) but waits before the script runs.

    Made by :func:`start_gated`; :meth:`release` runs the script as :func:`launch` would and returns its outcome,
    :meth:`cancel` ends the process unrun (it has run no code of the script: killing it loses nothing). One of the
    two must be called: the run directory stays locked until then.
    """

    command: list[str]
    opts: LaunchOptions
    stderr: IO[Any] | None
    proc: subprocess.Popen[bytes]
    gate: int  # the write end of the pipe the child waits on
    lock: contextlib.ExitStack

    def release(self, on_poll: Any = None) -> RunResult:
        """Let the script start; wait for it as :func:`launch` does (signals, progress, manifest)."""
        note = hash_seed_note(self.opts)
        if note:
            print(note, file=sys.stderr, flush=True)
        with self.lock, _SignalForwarder() as fwd:
            fwd.proc = self.proc
            started = time.time()
            with contextlib.suppress(OSError):  # the child died before the gate (its stderr says why): reported below
                os.write(self.gate, GATE_GO)
            os.close(self.gate)
            return _supervise(fwd, self.command, self.opts, started, self.stderr, on_poll)

    def cancel(self) -> None:
        """End the waiting process (SIGKILL: no code of the script has run) and unlock the run directory."""
        with self.lock:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            os.close(self.gate)


GATE_GO = b"g"  # what the parent writes to let a gated child run its script (EOF instead: exit unrun)


def start_gated(command: list[str], opts: LaunchOptions, *, stdout: IO[Any] | None = None,
                stderr: IO[Any] | None = None) -> GatedLaunch:
    """Start the interpreter of a recorded run of ``command`` now, and hold it before the script runs.

    The child does everything a launched run does before the script (start the interpreter, import torch and
    torchrepro) and then waits on a pipe, so that ``check`` can overlap that start-up with the run before it
    (``check --no-prestart`` turns that off). The seeding, deterministic mode and the recorder are set up only
    after the gate opens, and the script runs exactly as it would under :func:`launch`. One process only (no
    torchrun, one node); POSIX (the gate is an inherited pipe).
    """
    if opts.ranks.nproc_per_node or not opts.record or not hasattr(os, "pipe"):
        raise ValueError("start_gated: a recorded run of one process only")
    target = parse_python_command(command)
    record = Path(opts.record)
    check_run_dir(record, flag="--record")
    make_dir(record, flag="--record")
    lock = contextlib.ExitStack()
    lock.enter_context(lock_dir(record))
    try:
        clear_run_dir(record)
        read, write = os.pipe()
        try:
            proc = _spawn(target, dataclasses.replace(opts, gate_fd=read), stdout, stderr, pass_fds=(read,))
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
    except BaseException:
        lock.close()
        raise
    return GatedLaunch(command, opts, stderr, proc, write, lock)


def _wait_for_gate(fd: int) -> None:
    """In a gated child: wait until the parent lets the script run; exit at once (code 0, nothing written) when it
    closes the gate instead (``check`` ended before this run's turn)."""
    try:
        go = os.read(fd, 1)
    except OSError:
        go = b""
    finally:
        os.close(fd)
    if go != GATE_GO:
        os._exit(0)


def _finish_run(command: list[str], opts: LaunchOptions, rc: int, started: float, *,
                interrupted: int | None, log: Any = None) -> RunResult:
    """Read the child's summary, write the manifest (for recorded runs) and classify the outcome."""
    if opts.record and opts.ranks.nproc_per_node:
        return _finish_ranks(command, opts, rc, started, interrupted=interrupted, log=log)
    ended = time.time()
    manifest = None
    summary: dict[str, Any] = {}
    if opts.record:
        spath = Path(opts.record) / "child.json"
        if os.path.lexists(spath):
            summary = read_summary(spath)
            spath.unlink()
    internal = summary.pop(INTERNAL_KEY, None)
    if internal is not None:
        summary = {}
    status = "ok" if rc == 0 else ("killed" if rc < 0 else "failed")
    if rc == 0 and summary.get("stopped_at_max_steps"):
        status = "stopped-at-max-steps"
    if rc == 0 and summary.get("stopped"):
        status = "stopped-after-divergence"
    if interrupted is not None:
        status = "interrupted"
    if opts.record:
        events, truncated = read_trace_lines(opts.record)
        if not summary:  # the child died before summarising: derive what we can from the trace
            steps = sum(1 for e in events if e.get("kind") == "step")
            backwards = sum(1 for e in events if e.get("kind") == "backward")
            summary = {"step_mode": "optimizer" if steps else "backward", "steps": steps or backwards,
                       "optimizer_steps": steps, "backward_calls": backwards}
        summary["trace_records"] = len(events)
        summary["trace_truncated"] = truncated
        summary.setdefault("fingerprint_algorithm", None)  # null: the child died before naming it
        manifest = {
            "command": list(command),
            "cwd": opts.workdir.cwd or os.getcwd(),
            "exit_code": rc,
            "signal": signal.Signals(-rc).name if rc < 0 and -rc in signal.Signals._value2member_map_ else None,
            "status": status,
            "interrupted_by": signal.Signals(interrupted).name if interrupted is not None else None,
            "seed": opts.seed,
            "deterministic": opts.deterministic,
            "determinism_options": opts.determinism,
            "max_steps": opts.max_steps,
            "trace_steps": list(opts.trace.steps) if opts.trace.steps else None,
            "pythonhashseed": hash_seed(opts),
            "torch": summary.get("torch") or _torch_version(),
            "started": started,
            "duration_s": round(ended - started, 3),
            **summary,
        }
        manifest = write_manifest(opts.record, manifest)
    if internal is not None:
        raise _internal_error(command, str(internal), log)
    return RunResult(returncode=rc, status=status, record=opts.record, manifest=manifest)


def _internal_error(command: list[str], what: str, log: Any) -> InternalError:
    """The error for torchrepro's own code failing in the launched process (``_end_safely``)."""
    where = f" Its traceback is in {log}." if isinstance(log, str) else " Its traceback is above."
    error = InternalError(f"torchrepro's own code failed in the process that ran `{' '.join(command)}`, after "
                          f"the script ended: {what}. This is a bug in torchrepro, not in your script.{where} "
                          "Please report it with that traceback.", stderr_path=log if isinstance(log, str) else None)
    return error


_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_failures(text: str) -> tuple[dict[int, int], int | None]:
    """Exit codes by rank from torchrun's failure report, and the rank it names as the root cause (first failure)."""
    codes = {int(r): int(c) for r, c in _FAILURE.findall(text)}
    root = text.rfind("Root Cause")
    found = _FAILURE.search(text, root) if root >= 0 else None
    return codes, int(found.group(1)) if found else None


def _rank_exit(rank_dir: Path, reported: dict[int, int], rank: int) -> tuple[int | None, float | None]:
    """A rank's exit code and end time: from its launcher's summary, else from torchrun's report."""
    summary = read_summary(rank_dir / "child.json")
    if not {"child_exit_code", "child_ended"} <= set(summary) or field_problems(summary, _EXIT_FIELDS):
        return reported.get(rank), None
    return summary["child_exit_code"], float(summary["child_ended"])


_EXIT_FIELDS = {"child_exit_code": ("int",), "child_ended": ("number",)}


def read_summary(path: Path) -> dict[str, Any]:
    """The summary our child wrote (``child.json``), or ``{}`` when it is missing or unusable (the child was killed
    while writing it, or something else is there): the caller then derives what it can from the trace."""
    try:
        summary = read_json(path)
    except StateFileError:
        return {}
    return summary if isinstance(summary, dict) else {}


def _finish_ranks(command: list[str], opts: LaunchOptions, rc: int, started: float, *, interrupted: int | None,
                  log: Any) -> RunResult:
    """Write each rank's manifest (``RECORD/rank{R}``) and the run's (``RECORD/manifest.json``, listing the ranks)."""
    record, n = Path(opts.record or "."), int(opts.ranks.nproc_per_node or 1)
    text = ""
    if isinstance(log, str) and os.path.isfile(log):
        with contextlib.suppress(OSError):
            text = Path(log).read_text(errors="replace")
    reported, root = torchrun_failures(text)
    ranks: dict[str, dict[str, Any]] = {}
    ends: dict[int, float] = {}
    base = _node_base(record, opts, n)
    for r in range(base, base + n):
        rank_dir = record / f"rank{r}"
        rank_dir.mkdir(exist_ok=True)
        code, ended = _rank_exit(rank_dir, reported, r)
        if ended is not None:
            ends[r] = ended
        one = dataclasses.replace(opts.ranks, nproc_per_node=None)
        sub = dataclasses.replace(opts, record=str(rank_dir), ranks=one)
        rank_rc = code if code is not None else (rc if rc else 0)
        res = _finish_run(command, sub, rank_rc, started, interrupted=interrupted)
        # no exit status at all: torchrun stopped the rank after another one failed, or it ended abruptly
        ranks[f"rank{r}"] = {"exit_code": code, "status": res.status if code is not None or not rc else "stopped",
                             "steps": (res.manifest or {}).get("steps", 0)}
    failed = [int(k[4:]) for k, v in ranks.items() if v["status"] not in ("ok", "stopped-at-max-steps")]
    failed_ends = {r: ends[r] for r in failed if r in ends}
    first = root if root is not None else (min(failed_ends, key=failed_ends.get) if failed_ends else  # type: ignore[arg-type]
                                           (failed[0] if failed else None))
    status = "ok" if rc == 0 else ("killed" if rc < 0 else "failed")
    if rc == 0 and ranks and all(v["status"] == "stopped-at-max-steps" for v in ranks.values()):
        status = "stopped-at-max-steps"
    if interrupted is not None:
        status = "interrupted"
    first_rank = ranks.get(f"rank{base}", {})
    fields = {
        "command": list(command), "cwd": opts.workdir.cwd or os.getcwd(), "exit_code": rc, "status": status,
        "interrupted_by": signal.Signals(interrupted).name if interrupted is not None else None,
        "nproc_per_node": n, "ranks": list(ranks), "rank_status": ranks, "failed_rank": first if failed else None,
        "ended_early": ended_early(ranks, ends, failed),
        "seed": opts.seed, "deterministic": opts.deterministic,
        "determinism_options": opts.determinism, "max_steps": opts.max_steps,
        "pythonhashseed": hash_seed(opts), "torch": first_rank.get("torch") or _torch_version(), "started": started,
        "duration_s": round(time.time() - started, 3), "steps": first_rank.get("steps", 0), "trace_records": 0,
    }
    if opts.ranks.nnodes > 1:
        node = base // n
        fields.update(nnodes=opts.ranks.nnodes, node=node, world_size=opts.ranks.nnodes * n)
        make_dir(record / f"node{node}", flag="--record")
        write_manifest(record / f"node{node}", fields)
        manifest = write_nodes_manifest(record, fields)
    else:
        manifest = write_manifest(record, fields)
    return RunResult(returncode=rc, status=status, record=opts.record, manifest=manifest)


def _node_base(record: Path, opts: LaunchOptions, n: int) -> int:
    """The first global rank of this node: ``group_rank * n`` as its ranks wrote it down (a dynamic rendezvous
    numbers the nodes as they join), else ``node_rank * n`` (torchrun's static rendezvous)."""
    if opts.ranks.nnodes <= 1:
        return 0
    token = opts.extra_env.get(NODE_TOKEN_ENV)
    for child in sorted(record.glob("rank*/child.json")):
        summary = read_summary(child)
        if token and summary.get("node_token") == token and isinstance(summary.get("group_rank"), int):
            return int(summary["group_rank"]) * n
    return opts.ranks.node_rank * n


def write_nodes_manifest(record: Path, mine: dict[str, Any], wait_s: float = 60.0) -> dict[str, Any]:
    """Write the run's manifest of a node that has written its own (``nodeN/manifest.json``): the nodes of a run
    recorded into one directory end at about the same time, so each merges and writes under the directory's
    lock in turn, and the node that goes last sees every node's manifest (without it, a node that merged first
    could write last and leave a manifest that lists itself alone)."""
    with lock_dir(record, what="torchrepro run (writing the run's manifest of one node)", wait_s=wait_s):
        return write_manifest(record, merged_nodes_manifest(record, mine))


def merged_nodes_manifest(record: Path, mine: dict[str, Any]) -> dict[str, Any]:
    """The run's manifest from the node manifests in ``record`` (``nodeN/manifest.json``) so far: every node's
    ranks, statuses and the first failure; this node's fields otherwise. On a shared file system the node that
    ends last writes the complete one; readers take the node manifests as the truth (store.load_ranks)."""
    nodes = []
    for path in sorted(record.glob("node*/manifest.json")):
        doc = read_summary(path)
        if isinstance(doc.get("ranks"), list) and isinstance(doc.get("rank_status"), dict) and \
                doc.get("nnodes") == mine["nnodes"] and isinstance(doc.get("node"), int) and \
                0 <= doc["node"] < mine["nnodes"]:  # not a node of an earlier, larger run recorded here
            nodes.append(doc)
    if not nodes:
        return mine
    ranks = sorted({r for d in nodes for r in d["ranks"]}, key=lambda name: int(name[4:]))
    status = {r: v for d in nodes for r, v in d["rank_status"].items()}
    bad = [d for d in nodes if d.get("status") not in ("ok", "stopped-at-max-steps")]
    failed = [d["failed_rank"] for d in nodes if isinstance(d.get("failed_rank"), int)]
    return {**mine, "ranks": ranks, "rank_status": status, "nodes": [f"node{d.get('node')}" for d in nodes],
            "status": bad[0]["status"] if bad else mine["status"], "failed_rank": min(failed) if failed else None,
            "exit_code": bad[0].get("exit_code", mine["exit_code"]) if bad else mine["exit_code"]}


def ended_early(ranks: dict[str, dict[str, Any]], ends: dict[int, float], failed: list[int]) -> list[int]:
    """The ranks that exited 0 (not at --max-steps) before any failed rank ended: the others were left waiting."""
    if not failed:
        return []
    first_failure = min((ends[r] for r in failed if r in ends), default=float("inf"))
    return [int(name[4:]) for name, info in ranks.items()
            if info["status"] == "ok" and ends.get(int(name[4:]), first_failure) < first_failure]


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


def _torch_version() -> str | None:
    """torch's version from its metadata (the parent does not import torch: the child reports its own)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's reach (``gc.freeze()``).

    Called in the child just before the script runs, when the heap holds only what imports made (torch alone
    is ~200k objects), and by the CLI when its work is done. Interpreter shutdown runs full collections over
    every tracked object: for the MLP of ``benchmarks/bench_check_wall.py`` that took 0.75 s of exit time, 0.35 s
    with the import-time objects frozen. The script's own objects stay collectable, so its atexit handlers,
    unclosed files and finalizers behave exactly as under plain ``python``.
    """
    gc.freeze()
