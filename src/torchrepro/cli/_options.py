"""The options commands share, defined once: argument types, the launch options of every command that runs a
script (``run``, ``check``, ``compare``, ``bisect``) and ``--json``.

Example:
    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_run_options(p)
    >>> args = p.parse_args(["--deterministic-except", "cudnn-benchmark", "--json"])
    >>> determinism_options(args)["deterministic"], args.json
    (True, True)
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from ..control._seeds import validate_seed
from ..control._settings import SETTING_NAMES, setting, without
from ..record.settings import ValueSettings


def seed_arg(text: str) -> int:
    try:
        return validate_seed(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc) if "must be" in str(exc) else
                                         f"seed must be an integer in [0, 4294967295], got {text!r}") from None


def _int_at_least(text: str, minimum: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def step_arg(text: str) -> int:
    return _int_at_least(text, 0, "a step number (0 or more)")


_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
               "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def size_arg(text: str) -> int:
    """A byte count: ``1073741824``, ``512M``, ``4G``, ``1.5GiB`` (binary units); 0 keeps no values."""
    number = text.strip().upper().rstrip("BIKMGT")
    unit = text.strip().upper()[len(number):]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (ValueError, KeyError):
        value = -1
    if not 0 <= value < 1 << 62:
        raise argparse.ArgumentTypeError(f"expected a size in bytes such as 4G, 512M or 1073741824, got {text!r}")
    return int(value)


AUTO = "auto"  # check --runs auto


def runs_arg(text: str) -> int | str:
    """``check --runs``: a number of runs (2 or more), or ``auto``.

    >>> runs_arg("3"), runs_arg("auto")
    (3, 'auto')
    """
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of runs (2 or more) or auto, got {text!r}") from None
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"check compares runs, so it needs at least 2, got {text!r}. To compare one new run with a recorded "
            "one, record it with `torchrepro run --record DIR -- ...` and use `torchrepro diff DIR_A DIR_B`.")
    return value


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|min|m|h)")


def duration_arg(text: str) -> float:
    """A duration in seconds: ``10m``, ``90s``, ``1h30m``, ``1.5h``, ``500ms``, or a bare number of seconds.

    >>> duration_arg("10m"), duration_arg("1h30m"), duration_arg("90"), duration_arg("500ms")
    (600.0, 5400.0, 90.0, 0.5)
    """
    t = text.strip().lower().replace(" ", "")
    try:
        value = float(t)
    except ValueError:
        parts = list(_DURATION_PART.finditer(t))
        tiled = bool(parts) and "".join(m.group(0) for m in parts) == t
        value = sum(float(m.group(1)) * _DURATION_UNITS[m.group(2)] for m in parts) if tiled else -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a duration above 0 such as 90s, 10m or 1h30m (a bare number is "
                                         f"seconds), got {text!r}")
    return value


def duration_text(seconds: float) -> str:
    """``seconds`` as :func:`duration_arg` reads it back, short.

    >>> duration_text(600), duration_text(90), duration_text(5400), duration_text(0.5)
    ('10m', '90s', '90m', '0.5s')
    """
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def settings_arg(text: str) -> list[str]:
    """A comma-separated list of deterministic-mode settings (``--deterministic-except``)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    try:
        if not names:
            raise ValueError("an empty list")
        return [setting(n).name for n in dict.fromkeys(names)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; expected a comma-separated list of: "
                                         f"{', '.join(SETTING_NAMES)}") from None


def determinism_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--deterministic`` / ``--deterministic-except LIST`` as the LaunchOptions fields ``deterministic`` and
    ``determinism`` (keyword arguments of ``torchrepro.deterministic``)."""
    left_out = getattr(args, "deterministic_except", None)
    if left_out:
        return {"deterministic": True, "determinism": without(left_out)}
    return {"deterministic": bool(args.deterministic), "determinism": {}}


def kept_values(args: argparse.Namespace, *, keep: bool = True) -> ValueSettings:
    """What a compared run keeps of parameter values: snapshots on the sampled schedule, within ``--values-budget``
    (the recorder's default when not given); with ``--full-tensors``, the full-tensor view of DTensors too."""
    budget = getattr(args, "values_budget", None)
    return ValueSettings(keep=keep, schedule="sampled", full_tensors=bool(getattr(args, "full_tensors", False)),
                         **({} if budget is None else {"budget": budget}))


FULL_TENSORS_HELP = ("under torchrun: also record the full tensor of every DTensor parameter and gradient (FSDP2, "
                     "tensor parallel), assembled on every rank (a collective: about one extra all-gather of the "
                     "model per kept step) and written by rank 0, so that runs with other world sizes or meshes can "
                     "be compared (`torchrepro compare 'torchrun --nproc-per-node 2 t.py' "
                     "'torchrun --nproc-per-node 4 t.py' --full-tensors`)")


def add_full_tensors_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--full-tensors", action="store_true", help=FULL_TENSORS_HELP)


def add_launch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=seed_arg, help="seed every RNG with this seed before the script starts")
    p.add_argument("--deterministic", action="store_true",
                   help="switch deterministic mode on (flags + CUBLAS_WORKSPACE_CONFIG) before the script starts")
    add_deterministic_except(p)
    p.add_argument("--max-steps", type=positive_int, metavar="K", help="end the script cleanly after K steps")
    p.add_argument("--values-budget", type=size_arg, metavar="SIZE",
                   help="disk for parameter value snapshots per run (e.g. 4G; default 1G, the initial and final "
                        "snapshots included): they give max |Δ weight|; beyond it only fingerprints are recorded")
    p.add_argument("--nproc-per-node", type=positive_int, metavar="P",
                   help="run the script on P ranks through torch.distributed.run (torchrun) and record each rank "
                        "into its own directory (rank0 ...); `-- torchrun --nproc-per-node P train.py` does the same")
    add_full_tensors_option(p)
    p.add_argument("user_command", nargs=argparse.REMAINDER, metavar="-- python train.py [ARGS]",
                   help="the training command; everything from the script on belongs to the script")


def add_deterministic_except(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deterministic-except", type=settings_arg, metavar="LIST",
                   help="deterministic mode without these settings (comma-separated: "
                        f"{', '.join(SETTING_NAMES)}); `torchrepro bench --explain` finds the cheapest set that is "
                        "still bitwise reproducible")


def add_json_option(p: argparse.ArgumentParser, help: str = "write one JSON document to stdout") -> None:
    p.add_argument("--json", action="store_true", help=help)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of ``check`` that apply to each recorded run (shared with ``bisect``)."""
    p.add_argument("--seed", type=seed_arg, help="seed every RNG with this seed before each command starts")
    p.add_argument("--deterministic", action="store_true", help="switch deterministic mode on in each command")
    add_deterministic_except(p)
    p.add_argument("--max-steps", type=positive_int, metavar="K", help="end each command cleanly after K steps")
    p.add_argument("--values-budget", type=size_arg, metavar="SIZE",
                   help="disk for value snapshots per run (default 1G): tolerances need values; steps beyond the "
                        "budget are compared bitwise only, and the verdict says so")
    add_json_option(p)


def launch_words(args: argparse.Namespace) -> list[str]:
    """The launch options ``args`` was given, as command-line words, for a Next that reproduces the same runs.

    >>> launch_words(argparse.Namespace(seed=0, deterministic=True, deterministic_except=None, max_steps=5,
    ...                                 values_budget=None, fresh_cwd=True))
    ['--seed', '0', '--deterministic', '--max-steps', '5', '--fresh-cwd']
    """
    words: list[str] = []
    if getattr(args, "seed", None) is not None:
        words += ["--seed", str(args.seed)]
    if getattr(args, "deterministic_except", None):
        words += ["--deterministic-except", ",".join(args.deterministic_except).replace("_", "-")]
    elif getattr(args, "deterministic", False):
        words.append("--deterministic")
    if getattr(args, "max_steps", None) is not None:
        words += ["--max-steps", str(args.max_steps)]
    if getattr(args, "values_budget", None) is not None:
        words += ["--values-budget", str(args.values_budget)]
    if getattr(args, "full_tensors", False):
        words.append("--full-tensors")
    if getattr(args, "fresh_cwd", False):
        words.append("--fresh-cwd")
    return words


def check_words(args: argparse.Namespace) -> list[str]:
    """``check``'s options that shape its runs, as command-line words: a Next pasted with them (and the user's
    command) reproduces the same check (``--out``, ``--json`` and how long runs go on after a divergence left out).

    >>> check_words(argparse.Namespace(runs=4, seed=0, deterministic=False, deterministic_except=None, max_steps=None,
    ...                                values_budget=None, fresh_cwd=False, nproc_per_node=2, parallel=True))
    ['--runs', '4', '--seed', '0', '--nproc-per-node', '2', '--parallel']
    """
    words = ["--runs", str(args.runs)] if getattr(args, "runs", 2) != 2 else []
    if getattr(args, "budget", None) is not None:
        words += ["--budget", duration_text(args.budget)]
    words += launch_words(args)
    if getattr(args, "nproc_per_node", None):
        words += ["--nproc-per-node", str(args.nproc_per_node)]
    if getattr(args, "parallel", False):
        words.append("--parallel")
    return words


def compare_words(args: argparse.Namespace) -> list[str]:
    """``compare``'s options that shape its runs and verdict (seed, determinism, steps, values, tolerance), as
    command-line words, for a Next that compares the same way.

    >>> compare_words(argparse.Namespace(seed=0, deterministic=False, deterministic_except=None, max_steps=None,
    ...                                  values_budget=None, rtol=0.0001, atol="dtype"))
    ['--seed', '0', '--rtol', '0.0001', '--atol', 'dtype']
    """
    words = launch_words(args)
    for name in ("rtol", "atol"):
        if getattr(args, name, None) is not None:
            words += [f"--{name}", str(getattr(args, name))]
    return words
