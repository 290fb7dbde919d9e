"""Resume: checkpoints that cannot continue a run exactly."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from .. import knowledge as K
from ..calls import argument, constant, is_false
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
        added = _added(module, scope, expr.id)
        if out is None or added is None:
            return None
        return out + added
    return None


def _added(module: Module, scope: Scope, name: str) -> list[tuple[str, ast.AST]] | None:
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
                first = argument(item, 0)
                more = _entries(module, scope, first) if first is not None else []
                if more is None or any(kw.arg is None for kw in item.keywords):
                    return None  # filled from a dict whose contents cannot be known
                out.extend(more)
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
        for call, scope in _save_calls(module):
            entries = _saved_entries(module, scope, call)
            if not entries:
                continue
            kinds = _kinds(module, entries)
            if not {"model", "optimizer"} <= kinds:
                continue
            missing = [label for kind, label in (("rng", "RNG state"), ("position", "data position (epoch/step)"))
                       if kind not in kinds]
            if missing:
                yield Finding(call, f"this checkpoint saves model and optimizer state but no {' and no '.join(missing)}"
                                    ": a run resumed from it cannot continue the same random streams and data order")


def _save_calls(module: Module) -> list[tuple[ast.Call, Scope]]:
    """Calls of ``torch.save`` and of anything named like a save function."""
    by_qual, by_attr, by_name = module.index
    return module.calls_to([q for q in by_qual if "save" in q.rpartition(".")[2].lower()],
                           methods=[m for m in by_attr if "save" in m.lower()],
                           bare=[n for n in by_name if "save" in n.lower()])


def _kinds(module: Module, entries: list[tuple[str, ast.AST]]) -> set[str]:
    kinds: set[str] = set()
    for key, value in entries:
        kinds |= _classify(module, key, value)
    return kinds


# --- checkpoints meant to resume training, without optimizer state -------------------------------------------------
def _contents(module: Module, scope: Scope, call: ast.Call) -> tuple[list[tuple[str, ast.AST]], set[str]] | None:
    """The entries a save call writes and what they hold; a bare object (``torch.save(model.state_dict(), f)``,
    ``torch.save(model, f)``) is one entry. None when unknown."""
    entries = _saved_entries(module, scope, call)
    if entries:
        return entries, _kinds(module, entries)
    if module.qual(call.func) not in K.SAVE_CALLS:
        return None
    obj = argument(call, 0, ("obj",))
    if obj.__class__ is ast.Call and obj.func.__class__ is ast.Attribute and obj.func.attr == "state_dict":
        return [("", obj)], _classify(module, "", obj)
    name = dotted(obj) if obj is not None else None
    if name is None or (obj.__class__ is ast.Name and any(
            v.__class__ is ast.Dict or v.__class__ is ast.Call and module.is_builtin(v.func, "dict")
            for v in scope.values_of(obj.id))):
        return None
    words = name.lower()
    if ("model" in words or "net" in words) and not any(w in words for w in (*K.NOT_MODEL_WORDS, *K.OPTIMIZER_WORDS)):
        return [("", obj)], {"model"}  # a whole model, pickled
    return None


def _model_names(entries: list[tuple[str, ast.AST]]) -> list[str]:
    """``netG`` for ``netG.state_dict()`` (or a model saved whole)."""
    out = []
    for _key, value in entries:
        node = value.func.value if value.__class__ is ast.Call and value.func.__class__ is ast.Attribute else value
        name = dotted(node)
        if name:
            out.append(name)
    return out


def _path_parts(module: Module, scope: Scope, call: ast.Call) -> list[ast.expr]:
    """What names the file: the arguments but the saved object, and the values of the names they use (two
    levels: ``path = os.path.join(out, name)``, ``name = "ckpt_%d.pt" % step``, ``open(args.save) as f``)."""
    saved = argument(call, 0, ("obj",)) if module.qual(call.func) in K.SAVE_CALLS else None
    parts = [arg for arg in (*call.args, *(kw.value for kw in call.keywords))
             if arg is not saved and _entries(module, scope, arg) is None]
    out = list(parts)
    for _level in range(2):
        names = {n.id for part in parts for n in ast.walk(part) if n.__class__ is ast.Name}
        parts = [v for name in sorted(names) for v in scope.values_of(name)[-1:]]
        parts += [item.context_expr for item in _with_items(module, call)
                  if item.optional_vars is not None and dotted(item.optional_vars) in names]
        out.extend(parts)
    return out


def _literals(parts: list[ast.expr]) -> list[str]:
    return [n.value for part in parts for n in ast.walk(part)
            if n.__class__ is ast.Constant and isinstance(n.value, str)]


def _with_items(module: Module, node: ast.AST) -> Iterator[ast.withitem]:
    parent = module.enclosing(node, (ast.With, ast.AsyncWith))
    while parent is not None:
        yield from parent.items
        parent = module.enclosing(parent, (ast.With, ast.AsyncWith))


def _resume_reason(module: Module, call: ast.Call, entries: list[tuple[str, ast.AST]],
                   paths: list[ast.expr]) -> str:
    """Why a save call is meant to resume training ("" when nothing says so, or its file is an export)."""
    if any(_says(ast.unparse(part), K.EXPORT_NAME_WORDS) for part in paths):
        return ""  # model_final.pt, best.pt, args.best_path: an export of the weights
    for key, _value in entries:
        if key and any(w in key.lower() for w in K.POSITION_KEY_WORDS):
            return f"it records {key!r}"
    for text in _literals(paths):
        if _says(text, K.CHECKPOINT_NAME_WORDS):
            return f"its file name says {text!r}"
    name = module.qual(call.func) or dotted(call.func) or ""
    if any(w in name.lower() for w in ("checkpoint", "ckpt")):
        return f"it is written by {name}()"
    return _loaded_back(module, entries)


def _loaded_back(module: Module, entries: list[tuple[str, ast.AST]]) -> str:
    """The saved model is loaded back with ``load_state_dict`` in a program whose strings speak of resuming
    (``--netG``, "path to netG (to continue training)")."""
    phrase = _resume_phrase(module)
    if not phrase:
        return ""
    models = set(_model_names(entries))
    for load, _scope in module.calls_to(methods="load_state_dict"):
        owner = dotted(load.func.value)
        if owner in models:
            return f"{owner}.load_state_dict() loads it back, and the program says {phrase!r}"
    return ""


def _resume_phrase(module: Module) -> str:
    """The first of :data:`K.RESUME_WORDS` that the program says, as whole words, in its strings (help texts,
    docstrings, messages; not comments, nor inside another word such as ``resumeNet``); "" when none."""
    texts = (n.value for n in ast.walk(module.tree) if n.__class__ is ast.Constant and isinstance(n.value, str))
    words = f" {' '.join(w for text in texts for w in re.findall(r'[a-z0-9]+', text.lower()))} "
    return next((phrase for phrase in K.RESUME_WORDS if f" {phrase} " in words), "")


def _says(text: str, words: tuple[str, ...]) -> bool:
    """Whether a word of ``text`` (split at anything but letters and digits) starts with one of ``words``."""
    return any(token.startswith(words) for token in re.split(r"[^a-z0-9]+", text.lower()) if token)


def _optimizers(module: Module, scope: Scope, models: list[str]) -> list[tuple[str, ast.Call]]:
    """The torch.optim optimizers that train the saved model: those built in the save's function (or the
    enclosing ones), preferring those given the model's parameters; else every one in the module."""
    built = [(qual[12:], call, sc) for qual, calls in module.index[0].items()
             if qual.startswith("torch.optim.") and qual.count(".") == 2 and qual[12:] in K.OPTIMIZER_STATE
             for call, sc in calls]
    chain = []
    current: Scope | None = scope
    while current is not None:
        chain.append(current)
        current = current.parent
    near = [b for b in built if any(b[2] is c for c in chain[:-1])] or built  # chain[-1]: the module
    mine = [b for b in near if b[1].args and any(m in ast.unparse(b[1].args[0]) for m in models)]
    return [(name, call) for name, call, _sc in (mine or near)]


def _stateless(name: str, call: ast.Call) -> bool:
    """An optimizer that keeps no state (SGD without momentum)."""
    spec = K.STATELESS_UNLESS.get(name)
    if spec is None:
        return False
    value = argument(call, spec[1], (spec[0],))
    return value is None or is_false(value)


class CheckpointWithoutOptimizerState(Rule):
    code = "TR502"
    name = "checkpoint-without-optimizer-state"
    family = "resume"
    summary = "A checkpoint meant to resume training saves the model but not the optimizer's state."
    what = """
        A model's weights (`torch.save(model.state_dict(), path)`, a whole model, or a dict holding them) saved
        without the optimizer's `state_dict()`, when the checkpoint is meant to resume training: it records the
        epoch or step, its file name says checkpoint (`checkpoint`, `ckpt`, `last`, `latest`, `resume`), it is
        written by a `save_checkpoint`-like helper, or the program loads the model back with `load_state_dict`
        and its strings (help texts, docstrings, messages; not comments) speak of resuming or continuing
        training as whole words (an option "path to netG (to continue training)"; not `resumeNet`).
        Not reported: files named as exports (`final`, `best`, `export`, ...), modules that save the
        optimizer's state in some checkpoint (the weights-only files are then exports), and optimizers that
        keep no state (`SGD` without momentum).
        """
    why = """
        Adaptive optimizers (Adam, AdamW, RMSprop, ...) and SGD with momentum carry state from step to step.
        Resumed without it, the first steps use fresh moment estimates (zero momentum, and for Adam a bias
        correction that starts over), so the updates and the loss curve jump and the resumed run no longer
        matches one that was never interrupted. Without the RNG state, dropout, augmentation and data order
        differ too.
        """
    example = """
        for epoch in range(epochs):
            train_one_epoch(netG, optimizerG)
            torch.save(netG.state_dict(), f"{out}/netG_epoch_{epoch}.pth")   # TR502 (loaded "to continue training")
        """
    instead = """
        torchrepro.save_checkpoint(path, model=netG, optimizer=optimizerG, step=epoch)
        # or torch.save({"model": netG.state_dict(), "optimizer": optimizerG.state_dict(), "epoch": epoch,
        #                "rng": torchrepro.RNGState.capture()}, path)
        """
    help = "save the optimizer's state_dict() and the RNG states with the model, e.g. torchrepro.save_checkpoint(...)"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        saves = [(call, scope, _contents(module, scope, call)) for call, scope in _save_calls(module)]
        if any(found is not None and "optimizer" in found[1] for _c, _s, found in saves) or _saves_optimizer(module):
            return  # the module saves the optimizer somewhere: its weights-only files are exports
        for call, scope, found in saves:
            if found is None or "model" not in found[1]:
                continue
            entries, kinds = found
            reason = _resume_reason(module, call, entries, _path_parts(module, scope, call))
            if not reason:
                continue
            optimizers = _optimizers(module, scope, _model_names(entries))
            if optimizers and all(_stateless(name, c) for name, c in optimizers):
                continue
            yield Finding(call, _message(reason, optimizers, "rng" in kinds))


def _saves_optimizer(module: Module) -> bool:
    """``torch.save(optimizer.state_dict(), path)`` or ``torch.save(optimizer, path)``: the optimizer's state in
    a file of its own."""
    for call, _scope in module.calls_to(K.SAVE_CALLS):
        obj = argument(call, 0, ("obj",))
        owner = obj.func.value if obj.__class__ is ast.Call and obj.func.__class__ is ast.Attribute else obj
        if any(w in (dotted(owner) or "").lower() for w in K.OPTIMIZER_WORDS):
            return True
    return False


def _message(reason: str, optimizers: list[tuple[str, ast.Call]], has_rng: bool) -> str:
    names = {name for name, _call in optimizers}
    if len(names) == 1:
        name = names.pop()
        lost = f"{name}'s {K.OPTIMIZER_STATE[name]}"
    else:
        lost = "the optimizer's state (momentum, moment estimates) restarts at zero"
    missing = "no optimizer state" if has_rng else "no optimizer state and no RNG state"
    also = "" if has_rng else " and the random streams restart from the seed"
    return (f"this checkpoint is meant to resume training ({reason}) but holds {missing}: {lost}{also}, so a run "
            "resumed from it differs from one never interrupted")


RULES = (CheckpointWithoutRngState, CheckpointWithoutOptimizerState)
