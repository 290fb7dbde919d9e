"""Launcher commands: which ones torchrepro follows into the training processes they start, and how.

``torchrepro run`` and ``check`` record the training script in every process a launcher starts:

- ``torchrun`` (``python -m torch.distributed.run``) is unwrapped into the Python command of every rank, and
  torchrepro starts torch.distributed.run itself (:func:`~torchrepro.record.launcher.torchrun_command`);
- ``accelerate launch`` (``accelerate-launch``, ``python -m accelerate.commands.launch``) is read by accelerate's own
  parser and checks (its options, its config file), and accelerate's choice of launcher is followed. Where it would
  start one process (``--cpu``, ``--num_processes 1``, no GPUs: its simple launcher runs ``python train.py ARGS``
  with some variables set), torchrepro runs the script itself with exactly those variables (``Target.env``), so
  everything a one-process check does applies. Where it would start several through torch.distributed.run
  (``--multi_gpu``, FSDP, Megatron-LM), accelerate itself launches them, in a process tied to torchrepro, with
  torchrepro's child launcher as the script of every rank (:func:`run_launcher`): each rank is recorded as under
  torchrun, with everything accelerate sets.

Other launchers (DeepSpeed's, MPI's, srun, Horovod's, Fabric's, the deprecated ``torch.distributed.launch``) start the
training processes out of torchrepro's reach: :func:`refuse_not_followed` names them and says what to run instead.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import runpy
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from .._core.errors import ReproError

_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)*)?(\.exe)?")


class CommandError(ReproError):
    """A command that torchrepro cannot launch with recording."""


def is_interpreter(word: str) -> bool:
    """``python``, ``python3``, ``/usr/bin/python3.11`` -- but not ``python_train.py``."""
    return bool(_PYTHON_NAME.fullmatch(Path(word).name))


# --- launchers not followed ----------------------------------------------------------------------------------
_STARTS_ITSELF = "it starts the training processes itself, so torchrepro would record the launcher, not the training"
_DEEPSPEED = ("DeepSpeed's launcher", " (DeepSpeed reads the ranks torchrun sets)")
_MPI = ("MPI's launcher", " (the script then reads torchrun's RANK and WORLD_SIZE, not MPI's)")
_FABRIC = ("Lightning Fabric's launcher", " (Fabric reads the ranks torchrun sets)")
# an executable's name, or ``python -m MODULE``'s module -> (what it is, what the script reads under torchrun; None:
# a script for it does not run under torchrun)
_NOT_FOLLOWED: dict[str, tuple[str, str | None]] = {
    "deepspeed": _DEEPSPEED, "deepspeed.launcher.runner": _DEEPSPEED, "deepspeed.launcher.launch": _DEEPSPEED,
    "mpirun": _MPI, "mpiexec": _MPI, "orterun": _MPI, "horovodrun": ("Horovod's launcher", None),
    "fabric": _FABRIC, "lightning": _FABRIC,
    "torch.distributed.launch": ("PyTorch's deprecated launcher, which passes --local-rank to the script",
                                 " (the script reads its local rank from os.environ['LOCAL_RANK'])"),
}


def _script_words(words: list[str]) -> str:
    """The script and its arguments in a launcher command (from its first ``.py`` word), for the advice."""
    start = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    return " ".join(words[start:]) if start is not None else "train.py [ARGS]"


def refuse_not_followed(command: list[str]) -> None:
    """Raise :class:`CommandError` for a launcher command whose training processes torchrepro would not record:
    the launcher named, and what to run instead. torchrun too: only ``run`` and ``check`` take it (unwrapped first
    by :func:`ranks_command`)."""
    words = list(command)
    if not words:
        return
    name = Path(words[0]).name.removesuffix(".exe")
    if is_interpreter(words[0]):
        if words[1:2] != ["-m"] or len(words) < 3:
            return
        name, shown = words[2], f"python -m {words[2]}"
    else:
        shown = name
    if name == "torchrun" or name in _TORCHRUN_MODULES:
        raise CommandError(f"this command does not take torchrun commands ({' '.join(command)!r}); `torchrepro run` "
                           "and `check` do: `torchrepro check -- torchrun --nproc-per-node N train.py`.")
    if name in ("fabric", "lightning"):
        if words[1:2] != ["run"]:
            return  # `lightning` and `fabric` also name other tools; only their `run` launches a script
        shown = f"{name} run"
    script = _script_words(words)
    if name == "srun":
        raise CommandError(f"torchrepro does not follow `srun` (SLURM's launcher): {_STARTS_ITSELF}. Start "
                           "torchrepro under srun instead, one task per node: `srun torchrepro run --record DIR -- "
                           f"torchrun --nproc-per-node N {script}` (see docs/distributed.md, SLURM).")
    if name in _NOT_FOLLOWED:
        what, reads = _NOT_FOLLOWED[name]
        torchrun = ("Run the script with torchrun, which torchrepro follows: `-- torchrun --nproc-per-node N "
                    f"{script}`{reads}, or with python for one process" if reads is not None else
                    "Run the script with python, in one process")
        raise CommandError(f"torchrepro does not follow `{shown}` ({what}): {_STARTS_ITSELF}. {torchrun}: "
                           f"`-- python {script}`.")
    if name == "accelerate" and words[1:2] != ["launch"]:
        sub = f"accelerate {words[1]}" if len(words) > 1 else "accelerate"
        raise CommandError(f"torchrepro follows `accelerate launch`, not `{sub}`: pass `-- accelerate launch "
                           "[OPTIONS] train.py [ARGS]`.")


# --- torchrun ------------------------------------------------------------------------------------------------
TORCHRUN_KIND = "torchrun"  # ``python -m torchrepro.record.child torchrun ARGS``: torch.distributed.run, tied to us

_TORCHRUN_NAMES = {"torchrun", "torchrun.exe"}
_TORCHRUN_MODULES = ("torch.distributed.run",)  # torch.distributed.launch passes --local-rank: not followed
# torchrun options whose value changes what is run: check refuses them unless they have these values
_TORCHRUN_REFUSED = {"nnodes": ("1", "1:1"), "node_rank": (0,), "max_restarts": (0,), "no_python": (False,),
                     "virtual_local_rank": (False,)}


# torchrun options passed on for one node of several: how the nodes find each other
_RENDEZVOUS = ("nnodes", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "master_addr",
               "master_port", "local_addr")


@dataclass(frozen=True)
class TorchrunSpec:
    """A torchrun command, understood: the Python command of every rank, ranks per node, and for several
    nodes the rendezvous options (passed on to torchrun as they were given)."""

    python_command: list[str]
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rendezvous: tuple[str, ...] = ()
    static: bool = True  # ranks numbered node_rank * nproc_per_node + local rank (torchrun's static rendezvous)


def parse_torchrun_command(command: list[str]) -> tuple[list[str], int] | None:
    """``torchrun [OPTIONS] train.py ARGS`` (or ``python -m torch.distributed.run ...``) as ``(python command,
    nproc_per_node)``; None when ``command`` is not a torchrun command.

    torchrun's own parser reads the options. Only one node is supported here (``torchrepro run`` takes several:
    :func:`parse_torchrun`); rendezvous and logging options are replaced (each run gets ``--standalone``);
    options that change what runs (``--nnodes`` > 1, restarts, ``--no-python``) are refused.

    >>> parse_torchrun_command(["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "0.1"])
    (['python', 'train.py', '--lr', '0.1'], 2)
    """
    spec = parse_torchrun(command)
    if spec is None:
        return None
    if spec.nnodes > 1:
        raise CommandError(f"this command runs torchrun commands on one machine; remove --nnodes {spec.nnodes} from "
                           f"`{' '.join(command)}`, or record each node with `torchrepro run --record DIR -- "
                           f"{' '.join(command)}` and compare two such runs with `torchrepro diff` (see "
                           "docs/distributed.md).")
    return spec.python_command, spec.nproc_per_node


def parse_torchrun(command: list[str]) -> TorchrunSpec | None:
    """A torchrun command as a :class:`TorchrunSpec` (None when ``command`` is not one); ``--nnodes N`` (a fixed
    number) with its rendezvous options is kept for a run on several nodes.

    >>> spec = parse_torchrun(["torchrun", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
    ...                        "--master-port", "29500", "--nproc-per-node", "4", "train.py"])
    >>> spec.nnodes, spec.node_rank, spec.rendezvous
    (2, 1, ('--nnodes=2', '--node-rank=1', '--master-addr=10.0.0.1', '--master-port=29500'))
    """
    words = list(command)
    interpreter = "python"
    if words and Path(words[0]).name in _TORCHRUN_NAMES:
        rest = words[1:]
    elif len(words) >= 3 and is_interpreter(words[0]) and words[1] == "-m" and words[2] in _TORCHRUN_MODULES:
        interpreter, rest = words[0], words[3:]
    else:
        return None
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            args = parser.parse_args(rest)
    except SystemExit:
        raise CommandError(f"cannot read the torchrun command `{' '.join(command)}`: "
                           f"{err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else 'bad options'}"
                           ".") from None
    defaults = vars(parser.parse_args([args.training_script]))
    nnodes = _nnodes(args.nnodes, command)
    refused = {k: v for k, v in _TORCHRUN_REFUSED.items() if nnodes == 1 or k not in ("nnodes", "node_rank")}
    for name, allowed in refused.items():
        if getattr(args, name) not in allowed and getattr(args, name) != defaults[name]:
            raise CommandError(f"torchrepro runs torchrun commands without restarts, with Python scripts; remove "
                               f"--{name.replace('_', '-')} {getattr(args, name)} from `{' '.join(command)}`.")
    if nnodes > 1 and args.standalone:
        raise CommandError(f"--standalone starts a rendezvous on this machine only, so it cannot join {nnodes} "
                           f"nodes; remove it from `{' '.join(command)}` and give --rdzv-endpoint (or --master-addr "
                           "and --master-port).")
    try:
        nproc = int(args.nproc_per_node)
    except ValueError:
        raise CommandError(f"torchrun's --nproc-per-node {args.nproc_per_node} is not a number; torchrepro needs the "
                           "number of ranks, e.g. --nproc-per-node 2.") from None
    if nproc < 1:
        raise CommandError(f"torchrun's --nproc-per-node must be at least 1, got {nproc}.")
    script = ["-m", args.training_script] if args.module else [args.training_script]
    rendezvous = tuple(f"--{n.replace('_', '-')}={getattr(args, n)}" for n in _RENDEZVOUS
                       if getattr(args, n) != defaults[n] or n == "nnodes") if nnodes > 1 else ()
    return TorchrunSpec([interpreter, *script, *args.training_script_args], nproc, nnodes, int(args.node_rank),
                        rendezvous, static=args.rdzv_backend == "static")


def _nnodes(value: str, command: list[str]) -> int:
    """torchrun's ``--nnodes`` as a fixed number of nodes (an elastic range MIN:MAX is refused)."""
    low, _, high = str(value).partition(":")
    try:
        n, top = int(low), int(high or low)
    except ValueError:
        n, top = 0, -1
    if n < 1 or n != top:
        raise CommandError(f"torchrun's --nnodes {value} in `{' '.join(command)}`: torchrepro needs a fixed number of "
                           "nodes (e.g. --nnodes 2), so that every run has the same ranks to compare.")
    return n


def ranks_command(command: list[str], nproc_per_node: int | None) -> tuple[list[str], int | None]:
    """The command to record and its number of ranks: a torchrun command is unwrapped into the Python command of
    every rank, an ``accelerate launch`` command is kept (:func:`parse_python_command` reads it again) with the
    number of processes accelerate starts (None: one, run as such); either must agree with ``nproc_per_node``
    when both are given. Other commands pass through."""
    accelerate = parse_accelerate(command)
    if accelerate is not None:
        n = accelerate.nproc or 1
        if nproc_per_node is not None and nproc_per_node != n:
            raise CommandError(f"--nproc-per-node {nproc_per_node} disagrees with the accelerate command, which starts "
                               f"{n} process{'es' if n > 1 else ''}; give the number of processes once, to accelerate "
                               "(--num_processes).")
        if accelerate.note:
            print(accelerate.note, file=sys.stderr, flush=True)
        return list(command), accelerate.nproc
    parsed = parse_torchrun_command(command)
    if parsed is None:
        return command, nproc_per_node
    python_command, n = parsed
    if nproc_per_node is not None and nproc_per_node != n:
        raise CommandError(f"--nproc-per-node {nproc_per_node} disagrees with the torchrun command's --nproc-per-node "
                           f"{n}; give the number of ranks once.")
    return python_command, n


# --- accelerate launch ---------------------------------------------------------------------------------------
ACCELERATE_KIND = "accelerate"  # ``python -m torchrepro.record.child accelerate ...``: its launch, tied to us
LAUNCHER_KINDS = (TORCHRUN_KIND, ACCELERATE_KIND)


@dataclass(frozen=True)
class AccelerateSpec:
    """An ``accelerate launch`` command, understood through accelerate's own parser, checks and choice of launcher."""

    python_command: list[str]  # what accelerate runs in each process: the interpreter, [-m] the script, its arguments
    nproc: int | None = None  # None: one process (accelerate's simple launcher); N: N ranks (its torchrun)
    env: tuple[tuple[str, str], ...] = ()  # one process: the variables accelerate sets for it (changed ones only)
    launcher: tuple[str, ...] = ()  # several: the accelerate command, run by :func:`run_launcher`
    note: str | None = None  # said once by :func:`ranks_command`


def _accelerate_args(words: list[str]) -> list[str] | None:
    """The words of an ``accelerate launch`` command after ``launch`` (its options, the script, its arguments); None
    when ``words`` is not one."""
    name = Path(words[0]).name.removesuffix(".exe") if words else ""
    if name == "accelerate" and words[1:2] == ["launch"]:
        return words[2:]
    if name == "accelerate-launch":
        return words[1:]
    if is_interpreter(name) and words[1:2] == ["-m"]:
        if words[2:3] == ["accelerate.commands.launch"]:
            return words[3:]
        if words[2:4] == ["accelerate.commands.accelerate_cli", "launch"]:
            return words[4:]
    return None


def parse_accelerate(command: list[str]) -> AccelerateSpec | None:
    """An ``accelerate launch`` command as an :class:`AccelerateSpec`, None when ``command`` is not one.

    accelerate's parser reads the options and ``launch_command`` checks them (config file included) and picks the
    launcher, as ``accelerate launch`` would; the launcher is not run. The script runs with the interpreter named
    in the command (``python -m accelerate.commands.launch``), else ``python`` (as for torchrun).

    >>> spec = parse_accelerate(["accelerate", "launch", "--cpu", "--mixed_precision", "bf16", "train.py", "--x"])
    >>> spec.python_command, spec.nproc, dict(spec.env)["ACCELERATE_MIXED_PRECISION"]
    (['python', 'train.py', '--x'], None, 'bf16')
    """
    words = list(command)
    rest = _accelerate_args(words)
    if rest is None:
        return None
    interpreter = words[0] if is_interpreter(words[0]) else "python"
    with _ACCELERATE_LOCK:  # accelerate's module is patched while it picks its launcher (check --parallel: threads)
        return _accelerate_spec(tuple(words), tuple(rest), interpreter, tuple(sorted(os.environ.items())))


_ACCELERATE_LOCK = threading.Lock()
# accelerate's launchers (the names launch_command calls them by): followed, and not followed -> the launch they make
_ACCELERATE_FOLLOWED = ("simple_launcher", "multi_gpu_launcher")  # one process; several through torchrun
_ACCELERATE_REFUSED = {"deepspeed_launcher": "with DeepSpeed (--use_deepspeed, or distributed_type DEEPSPEED in "
                                             "accelerate's config), whose launcher starts the processes",
                       "tpu_launcher": "on TPUs", "tpu_pod_launcher": "on a TPU pod",
                       "sagemaker_launcher": "on Amazon SageMaker"}


class _Chosen(Exception):
    """Raised by a stand-in for one of accelerate's launchers: which one ``launch_command`` chose."""


@contextlib.contextmanager
def _quiet() -> Any:
    """accelerate's warnings and log lines while torchrepro reads a command (it says them again when it launches)."""
    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield err


@functools.lru_cache(maxsize=16)
def _accelerate_spec(words: tuple[str, ...], rest: tuple[str, ...], interpreter: str,
                     environ: tuple[tuple[str, str], ...]) -> AccelerateSpec:
    shown = " ".join(words)
    try:
        import accelerate.commands.launch as launch_module  # type: ignore[import-untyped]
    except ImportError as exc:
        raise CommandError(f"cannot read `{shown}`: accelerate does not import in torchrepro's Python "
                           f"({sys.executable}: {exc}); torchrepro reads the command with accelerate's own parser. "
                           f"Install it there (`{sys.executable} -m pip install accelerate`).") from None
    parser = launch_module.launch_command_parser()
    with _quiet() as err:
        try:
            args = parser.parse_args(list(rest))
        except SystemExit:
            text = err.getvalue().strip()
            raise CommandError(f"cannot read the accelerate command `{shown}`: "
                               f"{text.splitlines()[-1] if text else 'bad options'}.") from None
    script = " ".join([args.training_script, *args.training_script_args])
    if args.no_python:
        raise CommandError(f"torchrepro records Python training scripts; remove --no_python from `{shown}`.")
    if getattr(args, "mpirun_hostfile", None):
        raise CommandError(f"torchrepro does not follow `accelerate launch --mpirun_hostfile`: accelerate starts its "
                           "CPU processes through mpirun (MPI's launcher), out of torchrepro's reach. For several "
                           f"CPU processes use `-- accelerate launch --multi_gpu --num_processes N {script}` with "
                           "Accelerator(cpu=True) (torchrun underneath), which torchrepro follows.")
    chosen = _chosen_launcher(launch_module, args, shown)
    if chosen == "simple_launcher":
        with _quiet():
            try:
                cmd, env = launch_module.prepare_simple_launcher_cmd_env(args)
            except Exception as exc:  # noqa: BLE001 - accelerate refuses the command: it says why
                raise CommandError(f"accelerate cannot launch `{shown}`: {exc}") from None
        n = args.num_processes or 1
        note = (f"torchrepro: note: `{shown}` starts one process whatever --num_processes says (accelerate's simple "
                "launcher: several processes need --multi_gpu, or mpirun through --mpirun_hostfile); torchrepro "
                "records that one process, as accelerate runs it. For several CPU processes: `accelerate launch "
                "--multi_gpu --num_processes N` with Accelerator(cpu=True).") if n > 1 else None
        return AccelerateSpec([interpreter, *cmd[1:]], None, tuple(sorted(
            (k, v) for k, v in env.items() if dict(environ).get(k) != v)), note=note)
    if chosen != "multi_gpu_launcher":
        how = _ACCELERATE_REFUSED.get(chosen or "", "as given")
        raise CommandError(f"torchrepro does not follow `accelerate launch` {how}. It follows accelerate's launches "
                           "of one process and of several through torchrun (--multi_gpu, FSDP): `-- accelerate launch "
                           f"--multi_gpu --num_processes N {script}`, or `-- accelerate launch --num_processes 1 "
                           f"{script}`.")
    if int(args.num_machines or 1) > 1:
        raise CommandError(f"torchrepro follows `accelerate launch` on one machine; remove --num_machines "
                           f"{args.num_machines} from `{shown}`, or record each node of a torchrun command with "
                           "`torchrepro run --record DIR -- torchrun --nnodes ...` (see docs/distributed.md).")
    if int(getattr(args, "max_restarts", 0) or 0):
        raise CommandError(f"torchrepro runs launches without restarts; remove --max_restarts {args.max_restarts} "
                           f"from `{shown}`.")
    python = [interpreter, *(["-m"] if args.module else []), args.training_script, *args.training_script_args]
    return AccelerateSpec(python, int(args.num_processes), launcher=words)


def _chosen_launcher(launch_module: Any, args: Any, shown: str) -> str | None:
    """The name of the launcher accelerate's ``launch_command`` calls for ``args`` (each replaced by a stand-in that
    only says it was chosen: nothing is launched), after accelerate's own checks of the command."""
    chosen: list[str] = []

    def stand_in(name: str) -> Any:
        def launcher(*_: Any) -> None:
            chosen.append(name)
            raise _Chosen(name)
        return launcher

    with contextlib.ExitStack() as stack, _quiet():
        for name in (*_ACCELERATE_FOLLOWED, *_ACCELERATE_REFUSED):
            if hasattr(launch_module, name):
                stack.enter_context(mock.patch.object(launch_module, name, stand_in(name)))
        try:
            launch_module.launch_command(args)
        except _Chosen:
            pass
        except Exception as exc:  # noqa: BLE001 - accelerate refuses the command: it says why
            raise CommandError(f"accelerate cannot launch `{shown}`: {exc}") from None
    return chosen[0] if chosen else None


def several_processes_error(launcher: tuple[str, ...]) -> CommandError:
    """The error for an ``accelerate launch`` of several processes given to a command that records one."""
    spec = parse_accelerate(list(launcher))
    n = spec.nproc if spec is not None else "several"
    return CommandError(f"`{' '.join(launcher)}` starts {n} processes, and this command runs one: record every "
                        "process with `torchrepro run` or `check`, or give accelerate --num_processes 1.")


def launcher_argv(child: list[str], launcher: tuple[str, ...]) -> list[str]:
    """The arguments of ``python -m torchrepro.record.child`` that run ``accelerate launch`` (``launcher``) with
    the child launcher's command (``child``) as the script of every process (:func:`run_launcher`)."""
    return [ACCELERATE_KIND, str(len(child)), *child, *launcher]


def run_launcher(kind: str, args: list[str]) -> None:
    """Run, in this process (tied to torchrepro), torch.distributed.run ``ARGS``, or ``accelerate launch`` as the
    user gave it but with torchrepro's child launcher as the script of every process it starts."""
    if kind == TORCHRUN_KIND:
        sys.argv = ["torchrun", *args]
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
        return
    count = int(args[0])
    child, command = args[1:1 + count], args[1 + count:]
    from accelerate.commands.launch import launch_command, launch_command_parser

    launch_args = launch_command_parser().parse_args(_accelerate_args(command))
    launch_args.training_script, launch_args.training_script_args = child[0], child[1:]
    launch_args.module, launch_args.no_python = False, True  # the child is an interpreter running our launcher
    launch_command(launch_args)
