"""Is a function deterministic? :func:`assert_deterministic` (and :func:`find_nondeterminism`, which the pytest
plugin calls) call it several times from the same RNG state and say which output differs, where, by how much, and
what to try."""

from __future__ import annotations

import copy
import dataclasses
import enum
import inspect
import math
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._core.errors import ReproError
from .._core.tolerances import PRESETS
from ..analysis.tensordelta import tensor_delta
from ..control.determinism import deterministic
from ..control.rng import RNGState
from .spread import _dense, _differs, _dtype_name

# Tolerances for assert_deterministic(..., **TOLERANCES[name]): the presets of the one tolerance table.
TOLERANCES = PRESETS

_NO_STATE = "it holds no tensors, numbers or fields to compare, and == on it compares identity"


class UncomparableResultError(ReproError, TypeError):
    """A returned object that holds nothing to compare between calls (``==`` on it would compare identity)."""

    def __init__(self, path: str, obj: Any, why: str = _NO_STATE) -> None:
        self.path, self.why = path, why
        self.kind = f"{type(obj).__qualname__} ({type(obj).__module__}.{type(obj).__qualname__})"
        super().__init__()
        self.named("the function")

    def named(self, what: str) -> UncomparableResultError:
        """The same error, its message naming ``what`` returned the object."""
        self.args = (f"{what} cannot be checked: {self.path} is of type {self.kind}, which cannot be compared between "
                     f"calls ({self.why}). Return what must come out the same instead: tensors, numbers or strings, "
                     "a module or optimizer (compared by its state_dict()), or lists, dicts, dataclasses or objects "
                     "of them.",)
        return self


# Compared with == as they are: values whose equality is their content (torch.dtype and enums are singletons).
_VALUES = (type(None), bool, int, float, complex, str, bytes, range, torch.dtype, torch.device, torch.layout,
           torch.memory_format, enum.Enum, frozenset, set, type(Ellipsis))
# Objects with no state to compare (functions, classes, modules, generators: == is identity).
_OPAQUE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type,
           types.GeneratorType, types.CoroutineType, torch.Generator)


@dataclass(frozen=True)
class _Ref:
    """An object met again inside itself (a cycle): compared by where it was first met."""

    path: str


def _slots(cls: type) -> tuple[str, ...]:
    slots = cls.__dict__.get("__slots__", ())
    return (slots,) if isinstance(slots, str) else tuple(slots)


def _fields(obj: Any) -> list[tuple[str, Any]]:
    """An object's attributes: its ``__dict__`` and the ``__slots__`` that are set."""
    found = list(vars(obj).items()) if hasattr(obj, "__dict__") else []
    names = [n for cls in type(obj).__mro__ for n in _slots(cls) if n not in ("__dict__", "__weakref__")]
    return found + [(n, getattr(obj, n)) for n in names if hasattr(obj, n)]


def _module_state(module: nn.Module) -> Iterator[tuple[str, Any]]:
    """A module's state_dict, then the buffers it leaves out (non-persistent ones)."""
    state = module.state_dict()
    yield from state.items()
    for name, buf in module.named_buffers():
        if name not in state:
            yield name, buf


def _value_leaf(obj: Any, path: str) -> tuple[str, Any]:
    """An object compared by its own ``==``: a copy, since a later call may change it."""
    try:
        return path, copy.deepcopy(obj)
    except Exception:  # not copyable: compared as it is
        return path, obj


def _leaves(obj: Any, path: str, seen: dict[int, str] | None = None) -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs of a returned structure, compared by state; tensors are copied (a later call may write
    into them). Modules and optimizers give their state_dict, objects their fields; UncomparableResultError for an
    object with nothing to compare."""
    seen = {} if seen is None else seen
    if isinstance(obj, torch.Tensor):
        yield path, _dense(obj)
        return
    if isinstance(obj, _VALUES):
        yield path, obj
        return
    if isinstance(obj, _OPAQUE):
        raise UncomparableResultError(path, obj)
    if id(obj) in seen:
        yield path, _Ref(seen[id(obj)])
        return
    seen[id(obj)] = path
    try:
        yield from _children(obj, path, seen)
    finally:
        del seen[id(obj)]


def _children(obj: Any, path: str, seen: dict[int, str]) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, nn.Module):
        for name, value in _module_state(obj):
            yield from _leaves(value, f"{path}.{name}", seen)
    elif callable(getattr(type(obj), "state_dict", None)):  # optimizers, LR schedulers, GradScaler
        yield from _leaves(obj.state_dict(), path, seen)
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _leaves(value, f"{path}[{key!r}]", seen)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        for name, value in zip(obj._fields, obj):
            yield from _leaves(value, f"{path}.{name}", seen)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _leaves(value, f"{path}[{i}]", seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name), f"{path}.{f.name}", seen)
    elif type(obj).__module__ == "numpy" and hasattr(obj, "dtype") and hasattr(obj, "shape"):
        try:
            yield path, torch.from_numpy(obj.copy()) if obj.shape else torch.tensor(obj.item())
        except (TypeError, RuntimeError):
            yield path, copy.deepcopy(obj)
    elif type(obj).__eq__ is not object.__eq__:  # type: ignore[comparison-overlap]  # a value type (Path, Decimal, datetime, ...): its own ==
        yield _value_leaf(obj, path)
    elif fields := _fields(obj):
        for name, value in fields:
            yield from _leaves(value, f"{path}.{name}", seen)
    else:
        raise UncomparableResultError(path, obj)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def _tensor_mismatch(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> str | None:
    """None when ``a`` and ``b`` agree; else how they differ (count, greatest |Δ|, where, ULPs)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"is a {_dtype_name(a)} tensor of shape {tuple(a.shape)} in one call and a {_dtype_name(b)} tensor " \
               f"of shape {tuple(b.shape)} in the other"
    if atol == 0 and rtol == 0 or not a.is_floating_point():
        bad = _differs(a, b)
    else:
        bad = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    count = int(bad.sum())
    if count == 0:
        return None
    text = f"{count} of {a.numel()} elements differ ({count / a.numel():.2%})"
    if not a.is_floating_point():
        first = _unravel(int(bad.reshape(-1).nonzero()[0]), tuple(a.shape))
        return text + f"; first at index {first}: {a[first].item()!r} vs {b[first].item()!r}"
    diff = (a.double() - b.double()).abs().reshape(-1)
    flat_bad = bad.reshape(-1)
    candidates = torch.where(flat_bad & torch.isfinite(diff), diff, torch.full_like(diff, -1.0))
    flat = int(candidates.argmax()) if float(candidates.max()) >= 0 else int(flat_bad.nonzero()[0])
    where = _unravel(flat, tuple(a.shape))
    va, vb = a.reshape(-1)[flat], b.reshape(-1)[flat]
    delta = tensor_delta(a, b)
    at = tensor_delta(va.reshape(1), vb.reshape(1))
    text += (f"; greatest |Δ| {float(diff[flat]):.6g} at index {where}: {float(va)!r} vs {float(vb)!r}"
             f" ({at.max_ulp if at else 0} ULP of {_dtype_name(a)}; largest ULP distance anywhere "
             f"{delta.max_ulp if delta else 0})")
    return text


def _close(a: float, b: float, atol: float, rtol: float) -> bool:
    """``|a - b| <= atol + rtol * |b|`` for finite numbers, as torch.isclose compares tensors (Inf only equals Inf)."""
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= atol + rtol * abs(b)


def _leaf_mismatch(a: Any, b: Any, atol: float, rtol: float, path: str = "output") -> str | None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"is a {type(a).__name__} in one call and a {type(b).__name__} in the other"
        return _tensor_mismatch(a, b, atol, rtol)
    if isinstance(a, float) and isinstance(b, float):
        same = a.hex() == b.hex() or (math.isnan(a) and math.isnan(b)) or (
            bool(atol or rtol) and _close(a, b, atol, rtol))
        return None if same else f"is {a!r} in one call and {b!r} in the other (|Δ| {abs(a - b):.6g})"
    try:
        same = bool(a == b) and type(a) is type(b)
    except Exception as exc:  # objects whose == fails or is ambiguous: no verdict rather than a wrong one
        raise UncomparableResultError(path, a, f"== on it raised {type(exc).__name__}: {exc}") from None
    return None if same else f"is {a!r} in one call and {b!r} in the other"


_STATE_CAUSE = ("state that the function changes or reads: a module in train mode (BatchNorm running statistics), "
                "a global counter or cache, a torch.Generator of its own (seed it inside the function, or register "
                "it with torchrepro.register_generator so that it is restored), or uninitialised memory "
                "(torch.empty).")


def _first_mismatch(call: Callable[[], Any], state: RNGState, runs: int, atol: float,
                    rtol: float) -> tuple[str, str | None] | None:
    """Call ``call()`` ``runs`` times, each from ``state``; the first difference from call 1 and its dtype."""
    results = []
    for _ in range(runs):
        state.restore()
        results.append(list(_leaves(call(), "output")))
    paths = [p for p, _ in results[0]]
    for i, result in enumerate(results[1:], start=2):
        if [p for p, _ in result] != paths:
            return (f"the structure of its result differs between call 1 and call {i}: {paths[:8]} vs "
                    f"{[p for p, _ in result][:8]}", None)
        for (path, a), (_, b) in zip(results[0], result):
            text = _leaf_mismatch(a, b, atol, rtol, path)
            if text is not None:
                return f"{path} differs between call 1 and call {i}: {text}", _dtype_name(a) if isinstance(
                    a, torch.Tensor) else None
    return None


def _diagnose(call: Callable[[], Any], state: RNGState, runs: int, atol: float, rtol: float) -> str:
    """Why the calls differ: repeat them under deterministic mode (when it is off) and see what changes."""
    if torch.are_deterministic_algorithms_enabled():
        return f"Cause: deterministic algorithms are on, so the difference comes from {_STATE_CAUSE}"
    try:
        with deterministic():
            again = _first_mismatch(call, state, runs, atol, rtol)
    except Exception as exc:  # an op without a deterministic implementation raises under deterministic mode
        first = (str(exc).strip().splitlines() or [""])[0].split(". ")[0].rstrip(".")[:300] + "."
        return (f"Cause: a kernel without a deterministic implementation: under torchrepro.deterministic() the call "
                f"raises {type(exc).__name__}: {first} Replace that operation, or run it under "
                "torchrepro.deterministic(warn_only=True) to list every such op.")
    if again is None:
        return (f"Cause: a nondeterministic kernel: under torchrepro.deterministic() all {runs} calls agree. Fix: run "
                "it under `with torchrepro.deterministic():` (scripts: `torchrepro run --deterministic`); "
                "torchrepro.trace_ops or `torchrepro check --locate` name the op.")
    return f"Cause: the calls differ under torchrepro.deterministic() too, so the difference comes from {_STATE_CAUSE}"


def find_nondeterminism(call: Callable[[], Any], *, runs: int = 3, atol: float = 0.0, rtol: float = 0.0,
                        what: str = "the function") -> str | None:
    """Call ``call()`` ``runs`` times from the same RNG state; None if every result matches the first, else the
    message :func:`assert_deterministic` raises.

    When the calls differ while deterministic algorithms are off, they are repeated under
    :func:`torchrepro.deterministic` to tell a nondeterministic kernel from changing state. The RNG is left as
    after the ``runs`` calls.
    """
    state = RNGState.capture()
    try:
        found = _first_mismatch(call, state, runs, atol, rtol)
    except UncomparableResultError as exc:
        raise exc.named(what) from None
    if found is None:
        return None
    problem, dtype = found
    after = RNGState.capture()
    try:
        cause = _diagnose(call, state, runs, atol, rtol)
    finally:
        after.restore()
    bitwise = atol == 0 and rtol == 0
    tolerance = "bitwise (atol=0, rtol=0)" if bitwise else f"with atol={atol:g}, rtol={rtol:g}"
    text = f"{what} is not deterministic ({runs} calls, each from the same RNG state; compared {tolerance}): " \
           f"{problem}.\n{cause}"
    if bitwise and dtype in ("float16", "bfloat16"):
        preset = "fp16-autocast" if dtype == "float16" else "bf16-autocast"
        text += (f"\nIf last-bit differences of {dtype} are acceptable here, compare with a tolerance: "
                 f"assert_deterministic(fn, ..., **torchrepro.TOLERANCES[{preset!r}]).")
    return text


def _check_tolerances(runs: Any, atol: Any, rtol: Any) -> None:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"assert_deterministic: runs must be an integer >= 2, got {runs!r}.")
    for name, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"assert_deterministic: {name} must be a number >= 0, got {value!r}. "
                             f"Presets: {', '.join(TOLERANCES)} (torchrepro.TOLERANCES).")


def assert_deterministic(fn: Callable[..., Any], *args: Any, runs: int = 3, atol: float = 0.0, rtol: float = 0.0,
                         **kwargs: Any) -> None:
    """Call ``fn(*args, **kwargs)`` ``runs`` times from identical RNG state; raise ``AssertionError`` unless every
    result equals the first -- bitwise by default, or within ``atol + rtol * |b|`` (:data:`TOLERANCES` has
    presets for fp16/bf16 autocast).

    Results may be tensors, numbers, strings, or lists, tuples, dicts and dataclasses of them; modules and
    optimizers are compared by their ``state_dict()`` (modules also by their non-persistent buffers), other objects
    by their attributes. An object with nothing to compare (``object()``, a function, a ``torch.Generator``) raises
    :class:`UncomparableResultError` (a ``TypeError``) saying what to return instead. The message names
    the output that differs, how many elements, the greatest absolute and ULP difference and where, and what to
    try. The RNG is left as after one call.

    >>> import torch, torchrepro
    >>> torchrepro.assert_deterministic(torch.rand, 3)
    """
    __tracebackhide__ = True
    _check_tolerances(runs, atol, rtol)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if inspect.iscoroutinefunction(fn):
        raise TypeError(f"assert_deterministic: {name} is a coroutine function; pass a plain function.")
    message = find_nondeterminism(lambda: fn(*args, **kwargs), runs=runs, atol=atol, rtol=rtol, what=f"`{name}`")
    if message is not None:
        raise AssertionError(message)
