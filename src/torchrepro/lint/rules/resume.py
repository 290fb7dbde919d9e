"""Resume: checkpoints that cannot continue a run exactly."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .. import knowledge as K
from ..calls import argument, constant
from ..module import Module, Scope, dotted
from ..rule import Context, Finding, Rule


def _entries(module: Module, scope: Scope, expr: ast.AST | None) -> list[tuple[str, ast.AST]] | None:
    """``(key, value)`` pairs of a dict literal, ``dict(...)`` call, or a local name bound to one and filled
    with ``name["k"] = v`` / ``name.update(...)``; None when the contents cannot be known (``**other``)."""
    if expr is None:
        return None
    if expr.__class__ is ast.Dict:
        out = []
        for key, value in zip(expr.keys, expr.values):
            if key is None:
                return None
            name = constant(key)
            out.append((name if isinstance(name, str) else ast.unparse(key), value))
        return out
    if expr.__class__ is ast.Call and module.is_builtin(expr.func, "dict"):
        if expr.args or any(kw.arg is None for kw in expr.keywords):
            return None
        return [(kw.arg, kw.value) for kw in expr.keywords]
    if expr.__class__ is ast.Name:
        values = scope.values_of(expr.id)
        if not values:
            return None
        out = _entries(module, scope, values[-1])
        if out is None:
            return None
        return out + _added(module, scope, expr.id)
    return None


def _added(module: Module, scope: Scope, name: str) -> list[tuple[str, ast.AST]]:
    out: list[tuple[str, ast.AST]] = []
    for item in scope.items:
        if item.__class__ is ast.Assign:
            for target in item.targets:
                if target.__class__ is ast.Subscript and dotted(target.value) == name:
                    key = constant(target.slice)
                    out.append((key if isinstance(key, str) else ast.unparse(target.slice), item.value))
        elif item.__class__ is ast.Call:
            func = item.func
            if func.__class__ is ast.Attribute and func.attr == "update" and dotted(func.value) == name:
                more = _entries(module, scope, argument(item, 0))
                out.extend(more or [])
                out.extend((kw.arg, kw.value) for kw in item.keywords if kw.arg)
    return out


def _words(text: str) -> str:
    return text.lower()


def _classify(module: Module, key: str, value: ast.AST) -> set[str]:
    """What a checkpoint entry holds: "model", "optimizer", "rng", "position" (several may apply)."""
    kinds: set[str] = set()
    k = _words(key)
    for node in ast.walk(value):
        if node.__class__ is ast.Call:
            func = node.func
            qual = module.qual(func)
            if qual in K.RNG_STATE_CALLS or (func.__class__ is ast.Attribute and func.attr in K.RNG_STATE_METHODS):
                kinds.add("rng")
            if func.__class__ is ast.Attribute and func.attr == "state_dict":
                owner = _words(dotted(func.value) or "")
                if any(w in owner for w in K.OPTIMIZER_WORDS):
                    kinds.add("optimizer")
                elif "sampler" in owner or "loader" in owner:
                    kinds.add("position")
                elif not any(w in owner for w in K.NOT_MODEL_WORDS):
                    kinds.add("model")
    if any(w in k for w in K.RNG_KEY_WORDS):
        kinds.add("rng")
    if any(w in k for w in K.POSITION_KEY_WORDS):
        kinds.add("position")
    if "optimizer" not in kinds and "model" not in kinds:
        if any(w in k for w in K.OPTIMIZER_WORDS):
            kinds.add("optimizer")
        elif ("model" in k or k in ("state_dict", "net", "module", "weights")) and "rng" not in kinds:
            kinds.add("model")
    return kinds


def _saved_entries(module: Module, scope: Scope, call: ast.Call) -> list[tuple[str, ast.AST]] | None:
    """The entries of the dict a save call writes: ``torch.save(obj, f)``, ``fabric.save(path, state)``,
    ``save_checkpoint(state, ...)`` (the first argument whose contents are known)."""
    qual = module.qual(call.func)
    if qual in K.SAVE_CALLS:
        return _entries(module, scope, argument(call, 0, ("obj",)))
    name = (qual or dotted(call.func) or "").rpartition(".")[2].lower()
    if "save" not in name or (qual or "").startswith(("torch.", "numpy.", "json.", "pickle.")):
        return None
    for arg in (*call.args, *(kw.value for kw in call.keywords if kw.arg in ("state", "checkpoint", "obj"))):
        found = _entries(module, scope, arg)
        if found:
            return found
    return None


class CheckpointWithoutRngState(Rule):
    code = "TR501"
    name = "checkpoint-without-rng-state"
    family = "resume"
    summary = "A checkpoint saves model and optimizer but no RNG state or no data position."
    what = """
        A dict written with `torch.save`, `fabric.save` or a `save_checkpoint`-like helper that holds a model's
        and an optimizer's state but no random-number-generator state (`torch.get_rng_state()`,
        `np.random.get_state()`, `random.getstate()`, a generator's `get_state()`, or an `rng` entry), or no
        data position (an `epoch`, `step`, `iteration`, sampler or loader entry).
        """
    why = """
        A run resumed from such a checkpoint restarts its generators from the seed (or from whatever state they
        happen to have) and its data from the beginning of an epoch, so dropout, augmentation and data order
        differ from the uninterrupted run and the resumed run cannot be compared with it.
        """
    example = """
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)       # TR501
        """
    instead = """
        torchrepro.save_checkpoint(path, model=model, optimizer=opt, loader=loader, step=step)
        # or add "rng": torchrepro.RNGState.capture(), "epoch": epoch, "step": step to the dict
        """
    help = "save every RNG state and the data position too, e.g. torchrepro.save_checkpoint(...)"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        by_qual, by_attr, by_name = module.index
        saves = module.calls_to([q for q in by_qual if "save" in q.rpartition(".")[2].lower()],
                                methods=[m for m in by_attr if "save" in m.lower()],
                                bare=[n for n in by_name if "save" in n.lower()])
        for call, scope in saves:
            entries = _saved_entries(module, scope, call)
            if not entries:
                continue
            kinds: set[str] = set()
            for key, value in entries:
                kinds |= _classify(module, key, value)
            if not {"model", "optimizer"} <= kinds:
                continue
            missing = [label for kind, label in (("rng", "RNG state"), ("position", "data position (epoch/step)"))
                       if kind not in kinds]
            if missing:
                yield Finding(call, f"this checkpoint saves model and optimizer state but no {' and no '.join(missing)}"
                                    ": a run resumed from it cannot continue the same random streams and data order")


RULES = (CheckpointWithoutRngState,)
