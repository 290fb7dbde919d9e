"""Can recorded runs be compared at all? :func:`check_comparable` refuses runs that ran other commands, built
other models or fingerprinted with other algorithms, saying what differs (:func:`command_key`: a command as compared
between machines)."""

from __future__ import annotations

import difflib
import re

from .._core.errors import RunsNotComparableError
from .._core.fingerprint import LEGACY_ALGORITHM
from ..record.store import Run

_PYTHON_NAME = re.compile(r"python[0-9.]*(\.exe)?|py(\.exe)?", re.IGNORECASE)
_LIST_LIMIT = 5


def _basename(word: str) -> str:
    return re.split(r"[\\/]", word)[-1]


def command_key(command: list[str]) -> list[str]:
    """A command as compared between runs: the interpreter is ``python`` whatever its path, and the script is its
    file name, so that the same command on two machines (other Python installs, other folders) compares equal.

    >>> command_key(["/usr/bin/python3.11", "/home/a/train.py", "--lr", "0.1"])
    ['python', 'train.py', '--lr', '0.1']
    """
    words = [str(w) for w in command]
    if words and _PYTHON_NAME.fullmatch(_basename(words[0])):
        words[0] = "python"
    else:
        words.insert(0, "python")
    for i in range(1, len(words)):
        if words[i] in ("-m", "-c"):
            break
        if not words[i].startswith("-"):
            words[i] = _basename(words[i])
            break
    return words


def _some(names: list[str]) -> str:
    return ", ".join(names[:_LIST_LIMIT]) + (f" (+{len(names) - _LIST_LIMIT} more)" if len(names) > _LIST_LIMIT else "")


def _command_changes(a: list[str], b: list[str], i: int) -> str:
    """What differs between two commands' words, e.g. ``'0.1' in run 1 vs '0.2' in run 2``."""
    parts = []
    for tag, a1, a2, b1, b2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        x, y = " ".join(a[a1:a2]), " ".join(b[b1:b2])
        if tag == "replace":
            parts.append(f"{x!r} in run 1 vs {y!r} in run {i}")
        elif tag == "delete":
            parts.append(f"{x!r} only in run 1")
        elif tag == "insert":
            parts.append(f"{y!r} only in run {i}")
    return "; ".join(parts)


def _param_names(run: Run) -> list[str] | None:
    """Parameter names from the first event that lists them (init, else the first step, else final)."""
    for event in run.of_kind("init")[:1] + run.steps()[:1] + run.of_kind("final")[:1]:
        if isinstance(event.get("params"), dict):
            return list(event["params"])
    return None


def _param_specs(run: Run) -> dict[str, str] | None:
    """``{name: "[3, 4] float32"}`` from saved values (memory-mapped, not read), or None without values."""
    for name in ("init", "final"):
        values = run.values(name, mmap=True)
        if values is not None:
            return {k: f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for k, t in values.items()}
    return None


def fingerprint_algorithm(run: Run) -> str | None:
    """The fingerprint algorithm(s) a run used; runs from before the manifest named it used the legacy one."""
    if "fingerprint_algorithm" not in run.manifest:
        return LEGACY_ALGORITHM
    value = run.manifest["fingerprint_algorithm"]
    return str(value) if value else None  # null: nothing fingerprinted, or the script died before saying


def check_comparable(runs: list[Run], *, one_command: bool = True) -> None:
    """Raise :class:`RunsNotComparableError` when runs ran different commands or built different models.

    Parameter names come from the trace; shapes and dtypes from saved values (when both runs have them).
    ``one_command=False`` (``torchrepro compare``: two different commands on purpose) accepts other commands
    and other dtypes (fp32 vs bf16), and still refuses other parameter names and shapes.
    """
    problems: list[str] = []
    same_command = True
    same_algorithm = True
    base = runs[0]
    for i, other in enumerate(runs[1:], start=2):
        fa, fb = fingerprint_algorithm(base), fingerprint_algorithm(other)
        if fa and fb and fa != fb:
            same_algorithm = False
            problems.append(f"they fingerprinted tensors with different algorithms: run 1 with {fa}, run {i} with "
                            f"{fb}; equal values get different fingerprints, so no step can be compared")
        ca, cb = base.manifest.get("command"), other.manifest.get("command")
        if one_command and isinstance(ca, list) and isinstance(cb, list) and command_key(ca) != command_key(cb):
            same_command = False
            problems.append(f"they ran different commands: run 1 ran `{' '.join(map(str, ca))}`, run {i} ran "
                            f"`{' '.join(map(str, cb))}` ({_command_changes(command_key(ca), command_key(cb), i)})")
        na, nb = _param_names(base), _param_names(other)
        if na is not None and nb is not None:
            only_a, only_b = [n for n in na if n not in set(nb)], [n for n in nb if n not in set(na)]
            if only_a:
                problems.append(f"run 1's model has {len(only_a)} parameter(s) that run {i}'s lacks: {_some(only_a)}")
            if only_b:
                problems.append(f"run {i}'s model has {len(only_b)} parameter(s) that run 1's lacks: {_some(only_b)}")
        sa, sb = _param_specs(base), _param_specs(other)
        if sa is not None and sb is not None and not one_command:  # shapes only: "[3, 4] float32" -> "[3, 4]"
            sa, sb = ({k: v.rsplit(" ", 1)[0] for k, v in s.items()} for s in (sa, sb))
        if sa is not None and sb is not None:
            changed = [f"{n}: {sa[n]} in run 1, {sb[n]} in run {i}" for n in sa if n in sb and sa[n] != sb[n]]
            if changed:
                problems.append(f"{len(changed)} parameter(s) differ in shape or dtype: {_some(changed)}")
    if not problems:
        return
    paths = "Runs: " + ", ".join(f"{k} = {r.path}" for k, r in enumerate(runs, start=1)) + "."
    if not same_algorithm:
        action = ("Compare runs recorded by the same torchrepro version with the model on the same kind of device "
                  "(CPU tensors are hashed with XXH3, tensors on other devices on the device itself).")
    elif not one_command:
        action = ("torchrepro compare compares the steps of two commands that train the same parameters (the same "
                  "names and shapes; torch.compile's _orig_mod. is ignored): make both build the same model.")
    elif same_command:
        action = ("The same command built models with different parameters: the model's structure depends on "
                  "something that changes between runs (unseeded randomness, the environment, files it reads). "
                  "Make it depend only on the command and seeded random numbers, then compare again.")
    else:
        action = ("torchrepro compares runs of the same command (e.g. the same training on two machines); record "
                  "both runs with one command and model, then compare again.")
    raise RunsNotComparableError(problems, f"{action} {paths}")
