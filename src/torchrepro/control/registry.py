"""A checked registry of nondeterministic ATen ops: the torch side of ``_core/nondet_ops``.

The rows are data in :mod:`torchrepro._core.nondet_ops` (torch-free, so the linter's TR203 reads the same rows);
here they become :class:`OpEntry` objects, one per ATen op, and their conditions become checks of real ATen
calls. Each entry says which op, on which device kind, when it is nondeterministic, what
``torch.use_deterministic_algorithms(True)`` does about it, a known deterministic alternative, and where the
claim was verified. CPU rows are verified by ``tests/control/test_registry.py`` on every test run; CUDA rows come
from PyTorch's documentation and source and are checked by ``tools/verify_cuda_registry.py`` on a machine with a GPU.

Example:
    >>> from torchrepro.control.registry import match, nondeterministic_ops
    >>> entry = match("aten.index_add_.default", (), {}, "cuda")
    >>> entry.deterministic_mode, entry.alternative
    ('switches kernel', 'torchrepro.nn.functional.index_add')
    >>> match("aten.index_add_", (), {}, "cpu") is None
    True
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .._core import nondet_ops as facts
from .._core.naming import renamed
from .._core.nondet_ops import CPU_VERIFIED, CUDA_UNVERIFIED, DEVICE_KINDS, Arg, Row

__all__ = ["CPU_VERIFIED", "CUDA_UNVERIFIED", "DEVICE_KINDS", "DETERMINISTIC_MODE_EFFECTS", "OpEntry", "device_kind",
           "match", "nondeterministic_ops", "normalize_op"]

DETERMINISTIC_MODE_EFFECTS = facts.EFFECTS
_MISSING = object()
_CUBLAS_VALUE = re.compile(r"(:\d+:\d+)+")


@functools.cache
def _arg_position(op: str, name: str) -> int | None:
    """Position of argument ``name`` in the schema of ``op`` (the first overload that has it)."""
    packet = getattr(torch.ops.aten, op.partition(".")[2], None)
    if packet is None:
        return None
    for overload in packet.overloads():
        names = [a.name for a in getattr(packet, overload)._schema.arguments]
        if name in names:
            return names.index(name)
    return None


def _arg(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, default: Any = _MISSING) -> Any:
    """The value of argument ``name`` in an ATen call of ``op`` (positional or keyword)."""
    if name in kwargs:
        return kwargs[name]
    pos = _arg_position(op, name)
    if pos is not None and pos < len(args):
        return args[pos]
    return default


def _is_float_or_complex(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], cond: Arg) -> bool:
    dtype = _arg(op, args, kwargs, "dtype", None)
    if dtype is None:
        x = _arg(op, args, kwargs, cond.name or "self", None)
        dtype = x.dtype if isinstance(x, torch.Tensor) else None
    return dtype is not None and (dtype.is_floating_point or dtype.is_complex)


def _any_sparse(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], cond: Arg) -> bool:
    return any(isinstance(a, torch.Tensor) and a.is_sparse for a in (*args, *kwargs.values()))


def _env_unset(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], cond: Arg) -> bool:
    """The variable is unset, or not a ``:SIZE:COUNT`` value (read now: cuBLAS read it when CUDA started)."""
    return not _CUBLAS_VALUE.fullmatch(os.environ.get(cond.name or "", ""))


# How each test of the data (torchrepro._core.nondet_ops) reads an ATen call: on one argument's value ...
_VALUE_TESTS: dict[str, Callable[[Any, Arg], bool]] = {
    facts.TRUE: lambda v, c: bool(v),
    facts.FALSE: lambda v, c: not v,
    facts.GIVEN: lambda v, c: v is not None,
    facts.IN: lambda v, c: v in c.values,
    facts.NOT_IN: lambda v, c: v not in c.values,
    facts.TENSOR: lambda v, c: isinstance(v, torch.Tensor),
}
# ... or on the whole call (and the process environment).
_CALL_TESTS: dict[str, Callable[[str, tuple[Any, ...], dict[str, Any], Arg], bool]] = {
    facts.FLOAT_OR_COMPLEX: _is_float_or_complex, facts.ANY_SPARSE: _any_sparse, facts.ENV_UNSET: _env_unset,
}


def _condition(cond: Arg) -> Callable[[str, tuple[Any, ...], dict[str, Any]], bool]:
    """The machine check of one condition of the data: (op, args, kwargs) -> bool."""
    if cond.test in _CALL_TESTS:
        check = _CALL_TESTS[cond.test]
        return lambda op, a, k: check(op, a, k, cond)
    test = _VALUE_TESTS[cond.test]
    return lambda op, a, k: test(_arg(op, a, k, cond.name or "", cond.default), cond)


# Machine-checked conditions, by name: (op, args, kwargs) -> bool. Missing arguments take the data's default.
CONDITIONS: dict[str, Callable[[str, tuple[Any, ...], dict[str, Any]], bool]] = {
    name: _condition(cond) for name, cond in facts.CONDITIONS.items()}


@dataclass(frozen=True)
class OpEntry:
    """One row of the registry: an ATen op that can be nondeterministic on one device kind."""

    op: str  # ATen op packet name, e.g. "aten.index_add_"
    device: str  # "cpu" | "cuda"
    when: str  # human text: "backward only", "accumulate=True", "with duplicate indices", "always"
    deterministic_mode: str  # what use_deterministic_algorithms(True) does: switches kernel | raises | warns | nothing
    alternative: str  # a deterministic replacement, or "" if none is known
    verified_on: str  # where the claim was observed, or "not verified (...)"
    condition: str | None = None  # a key of CONDITIONS; None means always

    def applies(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether this row's condition holds for an ATen call with these arguments."""
        if self.condition is None:
            return True
        return CONDITIONS[self.condition](self.op, tuple(args), dict(kwargs or {}))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
    as_dict = renamed("to_json", "as_dict")


def _entries(row: Row) -> list[OpEntry]:
    """One entry per ATen op of a data row."""
    assert row.device in DEVICE_KINDS and row.effect in facts.EFFECTS, (row.ops, row.device, row.effect)
    assert row.condition is None or row.condition in CONDITIONS, row.condition
    return [OpEntry(op, row.device, row.when, row.effect, row.alternative, row.verified_on, row.condition)
            for op in row.ops]


ENTRIES: tuple[OpEntry, ...] = tuple(e for row in facts.ROWS for e in _entries(row))
_BY_KEY: dict[tuple[str, str], list[OpEntry]] = {}
for _e in ENTRIES:
    _BY_KEY.setdefault((_e.op, _e.device), []).append(_e)


def normalize_op(op: Any) -> str:
    """The ATen packet name of ``op``: an OpOverload, a packet, or text such as ``"aten::index_add_"``,
    ``"aten.index_add_.default"`` or ``"index_add_"`` all give ``"aten.index_add_"``."""
    if not isinstance(op, str):
        op = str(getattr(op, "overloadpacket", op))
    name = op.replace("::", ".")
    parts = name.split(".")
    if len(parts) == 1:
        return f"aten.{parts[0]}"
    return f"{parts[0]}.{parts[1]}"


def device_kind(device: Any) -> str:
    """``"cuda"`` for ``"cuda"``, ``"cuda:1"`` or ``torch.device("cuda", 0)``; likewise for other kinds."""
    if isinstance(device, torch.device):
        return device.type
    return str(device).partition(":")[0].strip().lower()


def nondeterministic_ops(device: str | None = None) -> list[OpEntry]:
    """The registry: every entry, or those for one device kind (``"cpu"``, ``"cuda"``, ``"cuda:0"``).

    >>> rows = nondeterministic_ops("cpu")
    >>> sorted({r.deterministic_mode for r in rows})
    ['raises', 'switches kernel']
    """
    if device is None:
        return list(ENTRIES)
    kind = device_kind(device)
    if kind not in DEVICE_KINDS:
        raise ValueError(f"nondeterministic_ops(device={device!r}): expected one of {DEVICE_KINDS} (or 'cuda:N') "
                         "or None for every entry. The registry has no rows for other device kinds yet.")
    return [e for e in ENTRIES if e.device == kind]


def match(op_name: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device: Any) -> OpEntry | None:
    """The entry for ``op_name`` on ``device`` whose condition holds for these ATen call arguments, else None.

    >>> match("aten::put_", (None, None, None, True), {}, "cuda").when
    'accumulate=True (atomicAdd)'
    """
    for entry in _BY_KEY.get((normalize_op(op_name), device_kind(device)), ()):
        if entry.applies(args, kwargs or {}):
            return entry
    return None
