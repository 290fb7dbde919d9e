"""Scoped determinism: a per-op policy and ``mark_deterministic`` for modules and functions.

PyTorch has one process-wide switch, ``torch.use_deterministic_algorithms``. A :class:`DeterminismPolicy` turns it
on and then decides per ATen op (by glob pattern or tier) what happens to an op that has no deterministic kernel:
``"error"`` (raise :class:`~torchrepro.NondeterministicOpError`), ``"warn"`` (warn, run it) or ``"allow"`` (run the
nondeterministic kernel, record it once). Deterministic mode stays on for every other op. ``mark_deterministic``
sets the level for one module's forward *and* backward (or one function's call).

Example:
    >>> import torch, torchrepro
    >>> policy = torchrepro.DeterminismPolicy({"aten.put_": "allow"}, default="error")
    >>> with policy:
    ...     _ = torch.zeros(4).put_(torch.tensor([1, 1]), torch.ones(2))
    >>> [(d.op, d.action, d.rule) for d in policy.decisions]
    [('aten.put_', 'allow', 'aten.put_')]
"""

from __future__ import annotations

import fnmatch
import functools
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import Any, TypeVar, cast

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from .._core.compat import fill_uninitialized_memory_get, fill_uninitialized_memory_set
from .._core.dispatchmode import QuietDispatchMode
from .._core.errors import NondeterministicOpError, ReproWarning
from .._core.naming import renamed
from . import registry

F = TypeVar("F", bound=Callable[..., Any])

ACTIONS = ("error", "warn", "allow")
TIERS: dict[str, str] = {"core": "error", "middle": "warn", "edge": "allow"}
# level -> (use_deterministic_algorithms, warn_only); strictness = position in this table
LEVELS: dict[str, tuple[bool, bool]] = {"off": (False, False), "warn": (True, True), "strict": (True, False)}
_STRICTNESS = {name: i for i, name in enumerate(LEVELS)}
ALERT_TEXT = "does not have a deterministic implementation"
_SKIP_OPS = frozenset({"aten.detach", "aten.alias", "prim.device", "aten.sym_size", "aten.sym_stride",
                       "aten.sym_numel", "aten.sym_storage_offset", "aten.is_same_size"})

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(__file__))  # the torchrepro package, every subpackage
_FLAGS_LOCK = threading.RLock()  # every change of the process-wide flags made here happens under this lock


# ---------------------------------------------------------------------------------------------------------------
# Process-wide flags, per-thread scopes
# ---------------------------------------------------------------------------------------------------------------

def _flags() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _set_flags(flags: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])


@contextmanager
def _flags_for_one_op(flags: tuple[bool, bool]) -> Iterator[None]:
    """Put ``flags`` in force around one op and restore what was there, even on error."""
    with _FLAGS_LOCK:
        before = _flags()
        _set_flags(flags)
        try:
            yield
        finally:
            _set_flags(before)


class _Scopes(threading.local):
    """This thread's stack of scopes: DeterminismPolicy objects and mark_deterministic levels (str)."""

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.modules: list[torch.nn.Module] = []  # forward calls in progress, outermost first
        self.handling = 0  # > 0 while a policy is running an op it decided on (outer policies pass it through)


_SCOPES = _Scopes()


class _Levels:
    """The mark_deterministic levels in force in every thread, and the flags they add up to.

    Deterministic mode is one process-wide setting. Each thread's innermost level counts; when several threads are
    inside marked regions at once the strictest of their innermost levels is in force; when the last region ends,
    the setting from before the first one comes back.
    """

    def __init__(self) -> None:
        self.stacks: dict[int, list[str]] = {}
        self.baseline: tuple[bool, bool] | None = None

    def enter(self, level: str) -> None:
        with _FLAGS_LOCK:
            if not self.stacks:
                self.baseline = _flags()
            self.stacks.setdefault(threading.get_ident(), []).append(level)
            self._apply()

    def exit(self) -> None:
        with _FLAGS_LOCK:
            tid = threading.get_ident()
            stack = self.stacks.get(tid)
            if stack:
                stack.pop()
                if not stack:
                    del self.stacks[tid]
            self._apply()

    def _apply(self) -> None:
        if not self.stacks:
            if self.baseline is not None:
                _set_flags(self.baseline)
            self.baseline = None
            return
        strictest = max((s[-1] for s in self.stacks.values()), key=_STRICTNESS.__getitem__)
        _set_flags(LEVELS[strictest])


_LEVELS = _Levels()


class _PolicyGlobals:
    """cuDNN and memory-fill settings while any DeterminismPolicy is open in any thread (counted, under the lock):
    cuDNN deterministic, benchmark off, uninitialized memory filled; the settings from before come back when the
    last policy closes. (The deterministic-algorithms flag itself goes through ``_LEVELS`` as level "strict".)"""

    def __init__(self) -> None:
        self.count = 0
        self.saved: tuple[bool, bool, bool | None] | None = None

    def enter(self) -> None:
        with _FLAGS_LOCK:
            if self.count == 0:
                cudnn = torch.backends.cudnn
                self.saved = (cudnn.deterministic, cudnn.benchmark, fill_uninitialized_memory_get())
                cudnn.deterministic, cudnn.benchmark = True, False
                fill_uninitialized_memory_set(True)
            self.count += 1

    def exit(self) -> None:
        with _FLAGS_LOCK:
            self.count -= 1
            if self.count == 0 and self.saved is not None:
                torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = self.saved[:2]
                if self.saved[2] is not None:
                    fill_uninitialized_memory_set(self.saved[2])
                self.saved = None


_POLICY_GLOBALS = _PolicyGlobals()


@contextmanager
def _level_scope(level: str) -> Iterator[None]:
    _LEVELS.enter(level)
    _SCOPES.stack.append(level)
    try:
        yield
    finally:
        _SCOPES.stack.pop()
        _LEVELS.exit()


# ---------------------------------------------------------------------------------------------------------------
# Where an op comes from: the user's line and the module path
# ---------------------------------------------------------------------------------------------------------------

def user_line() -> str:
    """``file:line`` of the innermost stack frame outside torch and torchrepro ("" if none)."""
    f: Any = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith(_TORCH_DIR) or name.startswith(_OWN_DIR) or name.startswith("<frozen")
                or name.endswith("contextlib.py")):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return ""


def module_path(mods: tuple[torch.nn.Module, ...] | list[torch.nn.Module] | None = None) -> str:
    """Dotted path of the module whose forward is running in this thread ("" outside any module), or of a
    stack of modules noted earlier.

    The outermost module is named by its class (``Net``); submodules by their attribute names (``Net.block.0``).
    """
    mods = _SCOPES.modules if mods is None else mods
    if not mods:
        return ""
    parts = [type(mods[0]).__name__]
    for parent, child in zip(mods, mods[1:]):
        parts.append(next((n for n, m in parent.named_modules() if m is child and n), type(child).__name__))
    return ".".join(parts)


class _ModuleTracker:
    """Global forward pre/post hooks that keep each thread's stack of running modules (installed while needed)."""

    def __init__(self) -> None:
        self.users = 0
        self.handles: list[Any] = []

    def acquire(self) -> None:
        with _FLAGS_LOCK:
            self.users += 1
            if self.users == 1:
                mm = torch.nn.modules.module
                self.handles = [mm.register_module_forward_pre_hook(self._pre),
                                mm.register_module_forward_hook(self._post, always_call=True)]

    def release(self) -> None:
        with _FLAGS_LOCK:
            self.users -= 1
            if self.users == 0:
                for h in self.handles:
                    h.remove()
                self.handles = []

    @staticmethod
    def _pre(module: torch.nn.Module, args: Any) -> None:
        _SCOPES.modules.append(module)

    @staticmethod
    def _post(module: torch.nn.Module, args: Any, output: Any) -> None:
        mods = _SCOPES.modules
        while mods:
            if mods.pop() is module:
                break


_TRACKER = _ModuleTracker()


# ---------------------------------------------------------------------------------------------------------------
# DeterminismPolicy
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Decision:
    """One decision a policy took: ``op`` on ``device`` at ``line`` inside ``module`` got ``action`` by ``rule``.

    ``why`` says what makes the op nondeterministic (the registry's "when" text, or "PyTorch's deterministic-mode
    alert" for an op the registry does not list); ``node`` is the autograd node for backward ops, whose ``line``
    and ``module`` are those of the forward call that created the node; ``count`` how often it ran there.
    """

    op: str
    rule: str
    action: str
    module: str
    line: str
    device: str
    why: str
    node: str = ""
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
    as_dict = renamed("to_json", "as_dict")


def _check_action(action: Any, where: str) -> str:
    if action not in ACTIONS:
        raise ValueError(f"{where}: got action {action!r}, expected one of {ACTIONS}. 'error' raises "
                         "NondeterministicOpError, 'warn' warns and runs the op, 'allow' runs it and records it.")
    return cast(str, action)


def _device_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    flat, _ = tree_flatten((args, kwargs))
    for x in flat:
        if isinstance(x, torch.Tensor):
            return x.device.type
    return "cpu"


class DeterminismPolicy:
    """Deterministic mode with per-op exceptions, as a context manager or a decorator.

    ``rules`` maps ATen op names or glob patterns (``"aten.grid_sampler_2d_backward*"``) to an action; an exact
    name wins over a pattern, and patterns are tried in the order given. Ops no rule matches get ``default``, or
    the action of a ``tier``: ``core`` -> error, ``middle`` -> warn, ``edge`` -> allow.

    Inside the scope ``torch.use_deterministic_algorithms(True)`` is on. An op that would raise under it (PyTorch's
    own alert, or a registry row saying "raises"), or a registry row PyTorch does not act on ("nothing"/"warns"),
    gets its action: ``"error"`` raises :class:`~torchrepro.NondeterministicOpError` naming op, rule, module and
    line; ``"warn"`` warns (``ReproWarning``) and runs the op's nondeterministic kernel; ``"allow"`` runs it.
    An op whose kernel deterministic mode switches ("switches kernel") keeps the deterministic kernel unless its
    action is ``"allow"``. Every decision is kept in ``decisions`` (one entry per op, action, line and module,
    with a count).

    >>> import torch, torchrepro
    >>> with torchrepro.DeterminismPolicy(tier="edge") as p:
    ...     _ = torch.zeros(3).put_(torch.tensor([0, 0]), torch.ones(2))
    >>> p.decisions[0].rule
    'tier edge'
    """

    def __init__(self, rules: Mapping[str, str] | None = None, *, default: str | None = None,
                 tier: str | None = None) -> None:
        if tier is not None and tier not in TIERS:
            raise ValueError(f"DeterminismPolicy(tier={tier!r}): expected one of {sorted(TIERS)} "
                             f"({', '.join(f'{k} -> {v}' for k, v in TIERS.items())}).")
        if tier is not None and default is not None:
            raise ValueError(f"DeterminismPolicy(default={default!r}, tier={tier!r}): give either a default action "
                             "or a tier (which sets the default action), not both.")
        self.tier = tier
        self.default = _check_action(default if default is not None else TIERS.get(tier or "", "error"),
                                     "DeterminismPolicy(default=...)")
        self.rules: dict[str, str] = {}
        for pattern, action in dict(rules or {}).items():
            if not isinstance(pattern, str) or not pattern:
                raise ValueError(f"DeterminismPolicy rules: got pattern {pattern!r}, expected an ATen op name or "
                                 "glob such as 'aten.put_' or 'aten.grid_sampler_2d_backward*'.")
            self.rules[pattern] = _check_action(action, f"DeterminismPolicy rule {pattern!r}")
        self.decisions: list[Decision] = []
        self._index: dict[tuple[str, str, str, str], Decision] = {}
        self._local = threading.local()  # this thread's open scopes of this policy (modes are per thread)

    # -- rules --
    def action_for(self, op: str) -> tuple[str, str]:
        """(action, rule) for ATen op ``op`` (packet or overload name); rule is the pattern, tier or "default"."""
        name = registry.normalize_op(op)
        if name in self.rules:
            return self.rules[name], name
        for pattern, action in self.rules.items():
            if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(str(op), pattern):
                return action, pattern
        return self.default, (f"tier {self.tier}" if self.tier else "default")

    def _decide(self, op: str, device: str, why: str, alternative: str = "",
                cause: BaseException | None = None) -> str:
        action, rule = self.action_for(op)
        line, module = user_line(), module_path()
        node = torch._C._current_autograd_node()
        node_name = node.name() if node is not None else ""
        if node is not None:  # a backward op: point to the forward call that created its node
            site = node.metadata.get(_SITE_KEY)  # type: ignore[attr-defined]  # a dict (torch's stub: a method)
            if site is not None:
                line, module = site[0], module_path(site[1])
        key = (op, action, line, module)
        with _FLAGS_LOCK:
            found = self._index.get(key)
            if found is not None:
                found.count += 1
            else:
                found = self._index[key] = Decision(op, rule, action, module, line, device, why, node_name)
                self.decisions.append(found)
        where = f"at {line or '<unknown line>'}" + (f" in module {module}" if module else "")
        where += f" (backward: {node_name})" if node_name else ""
        if action == "error":
            raise NondeterministicOpError(
                f"{op} on {device} is nondeterministic ({why}) {where}, and rule {rule!r} says 'error'. "
                f"Allow it with DeterminismPolicy({{{op!r}: 'allow'}}) or 'warn'"
                + (f", or use {alternative}." if alternative else "."),
                op=op, rule=rule, line=line, module=module) from cause
        if action == "warn":
            warnings.warn(f"{op} on {device} is nondeterministic ({why}) {where}; rule {rule!r} says 'warn', "
                          "so its nondeterministic kernel runs.", ReproWarning, stacklevel=2)
        return action

    # -- scope --
    def __enter__(self) -> DeterminismPolicy:
        with ExitStack() as stack:  # undone in reverse order on exit, or at once if a step here fails
            _POLICY_GLOBALS.enter()
            stack.callback(_POLICY_GLOBALS.exit)
            _LEVELS.enter("strict")
            stack.callback(_LEVELS.exit)
            _TRACKER.acquire()
            stack.callback(_TRACKER.release)
            stack.enter_context(_SiteMode())
            stack.enter_context(_PolicyMode(self))
            _SCOPES.stack.append(self)
            stack.callback(self._leave_scope)
            self._entries().append(stack.pop_all())
        return self

    def _entries(self) -> list[ExitStack]:
        if not hasattr(self._local, "entries"):
            self._local.entries = []
        return cast(list[ExitStack], self._local.entries)

    def _leave_scope(self) -> None:
        if _SCOPES.stack and _SCOPES.stack[-1] is self:
            _SCOPES.stack.pop()

    def __exit__(self, *exc: Any) -> None:
        self._entries().pop().__exit__(*exc)

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        how = f"tier={self.tier!r}" if self.tier else f"default={self.default!r}"
        return f"DeterminismPolicy(rules={self.rules!r}, {how})"


_SITE_KEY = "torchrepro_site"


class _SiteMode(TorchFunctionMode):
    """Notes on each new autograd node the user's line and module that created it (in ``node.metadata``, so the
    note lives exactly as long as the node), for naming backward ops by their forward call."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                node = t.grad_fn if isinstance(t, torch.Tensor) else None
                if node is not None and _SITE_KEY not in node.metadata:  # type: ignore[operator]
                    node.metadata[_SITE_KEY] = (user_line(), tuple(_SCOPES.modules))  # type: ignore[index]
        return out


class _PolicyMode(QuietDispatchMode):
    """Sees every ATen op in the policy's scope (forward and backward) and applies the policy."""

    def __init__(self, policy: DeterminismPolicy) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.policy = policy

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = registry.normalize_op(func)
        stack = _SCOPES.stack
        if (_SCOPES.handling or name in _SKIP_OPS or (stack and isinstance(stack[-1], str))):
            return func(*args, **kwargs)  # decided by an inner policy, or a mark_deterministic level is innermost
        device = _device_of(args, kwargs)
        entry = registry.match(name, args, kwargs, device)
        # Decided by what this thread's scope means (deterministic mode on), not by the process-wide flag, which
        # another thread may have switched off for a moment to run an op its policy allows.
        if entry is not None and entry.deterministic_mode in ("nothing", "warns"):
            self.policy._decide(name, device, entry.when, entry.alternative)
            return self._run(func, args, kwargs, None)
        if entry is not None and entry.deterministic_mode == "switches kernel":
            action, _ = self.policy.action_for(name)
            if action != "allow":  # the deterministic kernel, also while another thread runs an allowed op
                return self._run(func, args, kwargs, (True, False))
            self.policy._decide(name, device, entry.when, entry.alternative)
            return self._run(func, args, kwargs, (False, False))
        if entry is not None and entry.deterministic_mode == "raises":
            self.policy._decide(name, device, entry.when, entry.alternative)
            return self._run(func, args, kwargs, (False, False))
        try:
            return self._run(func, args, kwargs, None)
        except RuntimeError as exc:
            if ALERT_TEXT not in str(exc):
                raise
            self.policy._decide(name, device, "PyTorch's deterministic-mode alert", cause=exc)  # raises for "error"
        return self._run(func, args, kwargs, (False, False))

    @staticmethod
    def _run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], flags: tuple[bool, bool] | None) -> Any:
        _SCOPES.handling += 1
        try:
            if flags is None:
                return func(*args, **kwargs)
            with _flags_for_one_op(flags):
                return func(*args, **kwargs)
        finally:
            _SCOPES.handling -= 1


# ---------------------------------------------------------------------------------------------------------------
# mark_deterministic
# ---------------------------------------------------------------------------------------------------------------

class _Region(torch.autograd.Function):
    """The boundary of a marked region in the autograd graph.

    Forward returns the region's outputs (detached aliases); backward runs the region's own graph (recorded on
    detached inputs and parameters) with the level in force, restoring it even when that backward raises.
    """

    @staticmethod
    def forward(ctx: Any, box: dict[str, Any], *inputs: torch.Tensor) -> Any:
        ctx.box = box
        return tuple(o.detach() for o in box["outputs"])

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        box = ctx.box
        if torch.is_grad_enabled():  # backward(create_graph=True): second-order terms would miss the real leaves
            raise RuntimeError("Double backward (create_graph=True) through a mark_deterministic region is not "
                               "supported. Mark a smaller region that does not take part in the higher-order "
                               "gradient, or use a DeterminismPolicy around the whole computation instead.")
        if box.get("released"):
            raise RuntimeError("Trying to backward through a mark_deterministic region a second time: its graph "
                               "was freed by the first backward (retain_graph is not supported inside marked "
                               "regions). Run the forward again.")
        pairs = [(o, g) for o, g in zip(box["outputs"], grads) if g is not None]
        leaves = box["leaves"]
        with _level_scope(box["level"]):
            try:
                if pairs:
                    got = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                              allow_unused=True)
                else:
                    got = (None,) * len(leaves)
            finally:
                box["released"] = True
                box.pop("outputs", None)
        return (None, *got)


def _swap_parameters(module: torch.nn.Module) -> tuple[list[tuple[Any, str, Any]], list[torch.Tensor],
                                                             list[torch.Tensor]]:
    """Replace each trainable parameter by a detached leaf for the region's forward; returns what to restore."""
    swapped: list[tuple[Any, str, Any]] = []
    originals: list[torch.Tensor] = []
    leaves: list[torch.Tensor] = []
    memo: dict[int, torch.Tensor] = {}
    for mod in module.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or not p.requires_grad:
                continue
            if id(p) not in memo:
                memo[id(p)] = p.detach().requires_grad_(True)
                originals.append(p)
                leaves.append(memo[id(p)])
            swapped.append((mod, name, p))
            mod._parameters[name] = memo[id(p)]  # type: ignore[assignment]  # a leaf tensor in place of the Parameter
    return swapped, originals, leaves


def _run_marked(func: Callable[..., Any], level: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                module: torch.nn.Module | None) -> Any:
    if not torch.is_grad_enabled():
        with _level_scope(level):
            return func(*args, **kwargs)
    flat, spec = tree_flatten((args, kwargs))
    positions = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor) and x.requires_grad]
    outer_inputs = [flat[i] for i in positions]
    inner_inputs = [t.detach().requires_grad_(True) for t in outer_inputs]
    for i, t in zip(positions, inner_inputs):
        flat[i] = t
    inner_args, inner_kwargs = tree_unflatten(flat, spec)
    swapped, originals, param_leaves = _swap_parameters(module) if module is not None else ([], [], [])
    try:
        with _level_scope(level):
            out = func(*inner_args, **inner_kwargs)
    finally:
        for mod, name, p in swapped:
            mod._parameters[name] = p
    out_flat, out_spec = tree_flatten(out)
    out_positions = [i for i, x in enumerate(out_flat) if isinstance(x, torch.Tensor) and x.requires_grad]
    if not out_positions:
        return out
    box = {"level": level, "outputs": [out_flat[i] for i in out_positions], "leaves": inner_inputs + param_leaves}
    results = _Region.apply(box, *outer_inputs, *originals)  # type: ignore[no-untyped-call]
    for i, r in zip(out_positions, results):
        out_flat[i] = r
    return tree_unflatten(out_flat, out_spec)


_MARKED_CLASSES: dict[tuple[type, str], type] = {}


def _marked_forward(original: Callable[..., Any], level: str) -> Callable[..., Any]:
    original = getattr(original, "__torchrepro_original__", original)  # marking again replaces the level

    @functools.wraps(original)
    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return _run_marked(functools.partial(original, self), level, args, kwargs, self)

    forward.__torchrepro_original__ = original  # type: ignore[attr-defined]
    forward.__torchrepro_level__ = level  # type: ignore[attr-defined]
    return forward


def _check_level(level: Any) -> str:
    if level not in LEVELS:
        raise ValueError(f"mark_deterministic(level={level!r}): expected one of {tuple(reversed(LEVELS))}. "
                         "'strict' raises on nondeterministic ops, 'warn' warns, 'off' allows them.")
    return cast(str, level)


def mark_deterministic(target: Any = None, *, level: str = "strict") -> Any:
    """Run a module's forward and backward (or a function's call) at a determinism ``level``.

    ``level`` is ``"strict"`` (deterministic mode on; ops without a deterministic kernel raise), ``"warn"``
    (deterministic mode with ``warn_only``) or ``"off"``. Use it on an ``nn.Module`` class (every instance), an
    instance, or a plain function; as ``mark_deterministic(obj, level=...)`` or as a decorator
    ``@mark_deterministic(level="strict")``. The previous setting comes back outside the region, also after an
    exception; nested marks take the innermost level. Marking a class wraps its ``forward`` (subclasses that
    override ``forward`` are not marked); marking an instance gives it a marked subclass of its class, so
    ``copy.deepcopy`` keeps the mark; marking again replaces the level.

    >>> import torch, torchrepro
    >>> lin = torchrepro.mark_deterministic(torch.nn.Linear(2, 2), level="strict")
    >>> out = lin(torch.ones(1, 2)); torch.are_deterministic_algorithms_enabled()
    False
    """
    if isinstance(target, str) and target in LEVELS:  # mark_deterministic("strict") as a decorator factory
        target, level = None, target
    _check_level(level)
    if target is None:
        return functools.partial(mark_deterministic, level=level)
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        target.forward = _marked_forward(target.forward, level)
        return target
    if isinstance(target, torch.nn.Module):
        # A subclass made once per (class, level): the mark survives copy.deepcopy and binds to the copy.
        base = type(target).__dict__.get("__torchrepro_base__", type(target))
        cls = _MARKED_CLASSES.get((base, level))
        if cls is None:
            cls = _MARKED_CLASSES[(base, level)] = type(base.__name__, (base,), {
                "forward": _marked_forward(base.forward, level), "__torchrepro_base__": base,
                "__module__": base.__module__, "__qualname__": base.__qualname__})
        target.__class__ = cls
        return target
    if callable(target):
        @functools.wraps(target)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return _run_marked(target, level, args, kwargs, None)

        wrapper.__torchrepro_level__ = level  # type: ignore[attr-defined]
        return wrapper
    raise TypeError(f"mark_deterministic: got {type(target).__name__} {target!r}, expected an nn.Module class, "
                    "an nn.Module instance or a function.")
