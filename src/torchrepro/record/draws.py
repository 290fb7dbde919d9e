"""Random draws of the first steps of a distributed run, fingerprinted so that ranks can be compared afterwards.

Under torchrun (``WORLD_SIZE`` > 1) the recorder installs a :class:`DrawWatch` for the first
:data:`DEFAULT_DRAW_STEPS` steps (``$TORCHREPRO_DRAW_STEPS``; 0: off): a ``TorchDispatchMode`` that lets every op
through and, for each random op (``bernoulli``, ``native_dropout``, ``rand*``, ``randn*``, ``randint*``,
``normal_``, ``uniform_``, ...), writes one ``"draw"`` event into the trace::

    {"kind": "draw", "during_step": 1,      # the step whose work drew it (1: up to the end of the first step)
     "op": "bernoulli_", "site": "drop",    # the op and the innermost module whose forward drew it ("": none)
     "i": 0,                                # its index among the draws of that op at that site in that step
     "fp": "...", "const": false,           # the fingerprint of the drawn values (a DTensor: its local shard);
                                            # const: all of them are equal (a draw that says nothing)
     "in": "...",                           # the fingerprint of that module's input (null: outside any forward)
     "layout": {...}}                       # the DTensor's layout (_core/dtensor) when the draw was made on one

Nothing is compared here (no collective): ``analysis.shardcheck`` reads the ranks' draws afterwards. A draw made on
a DTensor is a replica of the ranks that hold the same shard (they must draw the same numbers) and differs from
the draws of other shards; a draw on a plain tensor inside a module's forward follows that module's input: ranks
whose inputs are bitwise equal compute a replicated region and must draw alike, ranks whose inputs differ (other
shards of an activation, other data) must not draw the same numbers.

Cost: only in distributed runs, only for the first steps: a Python call per ATen op while the watch is on and a
fingerprint per random op; nothing at all in a single process (the recorder does not create it).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .._core.dispatchmode import QuietDispatchMode
from .._core.dtensor import is_dtensor, layout, local_tensor

DRAW_STEPS_ENV = "TORCHREPRO_DRAW_STEPS"
DEFAULT_DRAW_STEPS = 2  # the model's initialisation and the first two steps
MAX_DRAWS_PER_STEP = 256  # draws recorded per step and rank at most (a model with thousands of dropouts: the first)
RANDOM_OPS = frozenset({
    "bernoulli", "native_dropout", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "normal", "uniform", "multinomial", "exponential", "geometric", "log_normal", "cauchy", "random",
})


def draw_steps() -> int:
    """How many steps a distributed run's draws are recorded for (``$TORCHREPRO_DRAW_STEPS``, default 2); 0 in a
    single process (``WORLD_SIZE`` unset or 1): the watch costs nothing there."""
    try:
        if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
            return 0
        return max(0, int(os.environ.get(DRAW_STEPS_ENV, str(DEFAULT_DRAW_STEPS)) or 0))
    except ValueError:
        return 0


def _const(t: torch.Tensor) -> bool:
    if t.numel() <= 1:
        return True
    flat = t.detach().reshape(-1)
    return bool((flat == flat[0]).all())


class _Mode(QuietDispatchMode):
    def __init__(self, watch: DrawWatch) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.watch = watch

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name.rstrip("_") in RANDOM_OPS and self.watch.on:
            try:
                self.watch.drawn(name, args, out)
            except Exception:  # noqa: BLE001 - never break the script for a record
                pass
        return out


class DrawWatch:
    """Fingerprints the random draws of the first ``steps`` steps of a recorder's run (see the module docs)."""

    def __init__(self, recorder: Any, steps: int) -> None:
        self.rec = recorder
        self.steps = steps
        self.on = False
        self._mode: _Mode | None = None
        self._hooks: list[Any] = []
        self._stack: list[tuple[torch.nn.Module, Any]] = []  # the forwards running: (module, its first tensor input)
        self._names: dict[int, str] = {}
        self._scanned_at: int | None = None
        self._counts: dict[tuple[int, str, str], int] = {}

    @classmethod
    def from_env(cls, recorder: Any) -> DrawWatch | None:
        steps = draw_steps()
        return cls(recorder, steps) if steps else None

    # --- install / uninstall --------------------------------------------------------------------------------------
    def install(self) -> None:
        if self.on:
            return
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        def pre(module: torch.nn.Module, args: Any) -> None:
            if self._during_step() > self.steps:  # past the watched steps: off (here, outside the mode's handler)
                self.uninstall()
                return
            first = next((a for a in args if isinstance(a, torch.Tensor)), None) if isinstance(args, tuple) else None
            self._stack.append((module, first))

        def post(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self._stack and self._stack[-1][0] is module:
                self._stack.pop()

        self._hooks = [register_module_forward_pre_hook(pre), register_module_forward_hook(post, always_call=True)]
        self._mode = _Mode(self)
        self._mode.__enter__()  # type: ignore[no-untyped-call]
        self.on = True

    def uninstall(self) -> None:
        if not self.on:
            return
        self.on = False
        for h in self._hooks:
            h.remove()
        self._hooks, self._stack = [], []
        mode, self._mode = self._mode, None
        stack = _get_current_dispatch_mode_stack()
        if mode is not None and stack and stack[-1] is mode:
            mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        # else: a mode the script pushed later sits above ours: ours stays on the stack, passing every op through

    # --- recording --------------------------------------------------------------------------------------------------
    def _during_step(self) -> int:
        rec = self.rec
        return int(rec.steps or rec.backward_calls) + 1

    def _site(self, module: torch.nn.Module | None, step: int) -> str:
        if module is None:
            return ""
        name = self._names.get(id(module))
        if name is None and self._scanned_at != step:  # modules made since the last scan: look once per step
            self._scanned_at = step
            from .._core.modules import discover_models

            models = self.rec._models if self.rec._models is not None else discover_models()
            for prefix, model in models.items():
                for qual, sub in model.named_modules():
                    full = ".".join(p for p in (prefix, qual) if p)
                    self._names.setdefault(id(sub), full or type(sub).__name__)
            name = self._names.get(id(module))
        return name if name is not None else type(module).__name__

    def drawn(self, op: str, args: Any, out: Any) -> None:
        rec = self.rec
        if rec.forked:
            return
        step = self._during_step()
        if step > self.steps:
            return
        values = out[1] if op == "native_dropout" and isinstance(out, tuple) else out  # the dropout mask
        if isinstance(values, (tuple, list)):
            values = next((v for v in values if isinstance(v, torch.Tensor)), None)
        if not isinstance(values, torch.Tensor):
            return
        module, given = self._stack[-1] if self._stack else (None, None)
        site = self._site(module, step)
        key = (step, site, op)
        index = self._counts.get(key, 0)
        if sum(n for (s, _, _), n in self._counts.items() if s == step) >= MAX_DRAWS_PER_STEP:
            return
        self._counts[key] = index + 1
        from .._core.fingerprint import fingerprint

        local = local_tensor(values)
        lay = layout(values) if is_dtensor(values) else None
        if lay is None:  # an in-place draw on a DTensor's shard returns that DTensor: its first argument says
            first = args[0] if isinstance(args, tuple) and args else None
            lay = layout(first) if is_dtensor(first) else None
        # (the mode is off while its handler runs: these reads dispatch no further draw)
        rec.trace.write({
            "kind": "draw", "during_step": step, "op": op, "site": site, "i": index,
            "fp": fingerprint(local), "const": _const(local),
            "in": fingerprint(local_tensor(given)) if isinstance(given, torch.Tensor) else None,
            "layout": lay,
        })
