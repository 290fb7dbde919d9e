"""Classifying one call or assignment: the events (a seed, a draw, a model built, deterministic mode, CUDA use, ...)
that a call to a library API causes, read from the tables of :mod:`.knowledge` (:func:`classify_call`,
:func:`store_events`), and the helpers rules share: which global generator a call draws from, what model it
builds, whether its weights are pretrained."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from . import knowledge as K
from .calls import argument, constant, env_assignments, has_keyword, is_false, is_true, names_in
from .events import (
    CUBLAS_ENV,
    CUDA,
    CUDNN_DET,
    DET,
    DIST,
    DRAW,
    MODEL,
    RANK_SEED,
    SEED,
    SET_EPOCH,
    SHARDED,
    WORKER_SEEDS,
)
from .module import Module, Scope, dotted


def _seed_value(call: ast.Call, pos: int | None, keywords: tuple[str, ...]) -> ast.expr | None:
    return argument(call, pos, keywords) if pos is not None else None


def _mentions_rank(expr: ast.AST | None) -> bool:
    return expr is not None and any(w in name.lower() for name in names_in(expr) for w in K.RANK_WORDS)


def is_assumed_seeder(name: str) -> bool:
    """A helper we cannot see whose name says it seeds (``set_seed``, ``seed_all``, ``fix_seeds``)."""
    last = name.rpartition(".")[2].lower().lstrip("_")
    return ("seed" in last and not last.startswith(K.NOT_SEEDING_PREFIXES)
            and last not in ("seed_worker", "seed_worker_fn"))


def is_assumed_determinism(name: str) -> bool:
    last = name.rpartition(".")[2].lower()
    return "determinis" in last and "nondeterminis" not in last and not last.startswith(("is_", "get", "check"))


def mentions_cuda(module: Module, scope: Scope, expr: ast.AST | None, depth: int = 0) -> bool:
    """Whether ``expr`` names a CUDA device: ``"cuda"``, ``"cuda:0"``, or a local assigned from one."""
    if expr is None:
        return False
    value = constant(expr)
    if isinstance(value, str):
        return value.startswith("cuda")
    for node in ast.walk(expr):
        if node.__class__ is ast.Constant and isinstance(node.value, str) and node.value.startswith("cuda"):
            return True
        if node.__class__ is ast.Name and depth < 2:
            for value_expr in scope.values_of(node.id):
                if mentions_cuda(module, scope, value_expr, depth + 1):
                    return True
    return False


def classify_call(module: Module, scope: Scope, call: ast.Call, qual: str | None) -> Iterator[tuple[str, str | None,
                                                                                                    str]]:
    """The events a call to a library API causes: ``(kind, library, detail)``."""
    func = call.func
    attr = func.attr if func.__class__ is ast.Attribute else None
    if qual is not None:
        yield from _classify_known(module, scope, call, qual)
    if attr is not None:
        if attr in K.SEED_ALL_METHODS and qual not in K.SEEDERS:
            for lib in K.LIBS:
                yield SEED, lib, f"{dotted(func) or attr}()"
            if is_true(argument(call, 1, ("workers",))):
                yield WORKER_SEEDS, None, ""
        elif attr in K.TORCH_INPLACE_DRAWS and not has_keyword(call, "generator") and not _foreign(qual):
            yield DRAW, K.TORCH, f".{attr}()"
        elif attr in K.SAMPLING_METHODS and is_true(argument(call, None, ("do_sample",))):
            yield DRAW, K.TORCH, f".{attr}(do_sample=True)"
        elif attr == "cuda" and not call.args and qual is None:
            yield CUDA, None, ".cuda()"
        elif attr == "to" and qual is None and (mentions_cuda(module, scope, argument(call, 0, ("device",)))):
            yield CUDA, None, ".to(cuda)"
        elif attr == "set_epoch":
            yield SET_EPOCH, None, ""


def _foreign(qual: str | None) -> bool:
    """A name resolved to a library other than torch (so a method name match is not a torch method)."""
    return qual is not None and not qual.startswith("torch")


def _classify_known(module: Module, scope: Scope, call: ast.Call, qual: str) -> Iterator[tuple[str, str | None, str]]:
    seeder = K.SEEDERS.get(qual)
    if seeder is not None:
        libs, pos, keywords = seeder
        value = _seed_value(call, pos, keywords)
        if pos is not None and value is None and not call.args and not call.keywords:
            return  # seeds from entropy: not a seed (TR105 reports it)
        for lib in K.LIBS:
            if lib in libs:
                yield SEED, lib, qual
        if _mentions_rank(value):
            yield RANK_SEED, None, qual
        if qual.endswith("seed_everything") and is_true(argument(call, 1, ("workers",))):
            yield WORKER_SEEDS, None, ""
        if is_true(argument(call, 1, ("deterministic",))) and not qual.startswith("torch."):
            yield DET, None, qual
        if qual == "monai.utils.set_determinism":
            yield DET, None, qual
        return
    if qual in K.HF_TRAINERS:
        for lib in K.LIBS:
            yield SEED, lib, f"{qual.rpartition('.')[2]}(...) seeds in its constructor"
        yield SHARDED, None, qual
        return
    if qual in K.DETERMINISM_ENABLERS:
        mode = argument(call, 0, ("mode", "d", "debug_mode"))
        if not (is_false(mode) or constant(mode) == "default"):
            yield DET, None, qual
        return
    if qual == K.LIGHTNING_TRAINER:
        yield SHARDED, None, qual
        if is_true(argument(call, None, ("deterministic",))):
            yield DET, None, "Trainer(deterministic=...)"
        return
    if qual in K.HF_TRAINING_ARGUMENTS:
        if is_true(argument(call, None, ("full_determinism",))):
            yield DET, None, "TrainingArguments(full_determinism=True)"
        return
    if qual.startswith("accelerate.Accelerator") or qual.startswith("lightning.fabric.Fabric"):
        yield SHARDED, None, qual
        return
    if qual in K.DIST_INIT:
        yield DIST, None, qual
        return
    if qual.startswith("torch.cuda.") and qual.count(".") == 2 and qual[11:] not in K.CUDA_HARMLESS:
        yield CUDA, None, qual
        return
    if qual == K.DATALOADER:
        if (is_true(argument(call, K.LOADER_SHUFFLE, ("shuffle",)))
                and argument(call, K.LOADER_GENERATOR, ("generator",)) is None):
            yield DRAW, K.TORCH, "DataLoader(shuffle=True)"
        return
    if qual in K.ORDER_DRAWS:
        if argument(call, K.ORDER_DRAWS[qual], ("generator",)) is None:
            yield DRAW, K.TORCH, qual.rpartition(".")[2]
        return
    lib, detail = draw_of(qual, call)
    if lib is not None:
        yield DRAW, lib, detail
        return
    model = model_of(qual)
    if model:
        yield MODEL, None, model
        if draws_initial_weights(module, scope, qual, call):
            yield DRAW, K.TORCH, model


def draw_of(qual: str, call: ast.Call) -> tuple[str | None, str]:
    """Which global generator a call to ``qual`` draws from (None if none)."""
    if qual in K.RANDOM_DRAWS:
        return K.RANDOM, qual
    if qual.startswith("numpy.random.") and qual.count(".") == 2 and qual[13:] not in K.NUMPY_NOT_DRAWS:
        return K.NUMPY, qual.replace("numpy.", "np.", 1)
    if (qual in K.TORCH_DRAWS or (qual.startswith(K.TORCH_INIT_PREFIX)
                                  and qual[len(K.TORCH_INIT_PREFIX):] not in K.TORCH_INIT_NOT_DRAWS)):
        if not has_keyword(call, "generator"):
            return K.TORCH, qual
    return None, ""


def is_seed_choice(module: Module, call: ast.Call) -> bool:
    """Whether a draw picks the seed itself (``opt.manualSeed = random.randint(1, 10000)`` when no seed is given,
    ``torch.manual_seed(random.randint(...))``): the value is a seed, not a random number the run consumes."""
    node: ast.AST = call
    parent = module.parents.get(node)
    while parent is not None and not isinstance(parent, ast.stmt):
        if parent.__class__ is ast.Call and parent is not call:
            name = module.qual(parent.func) or dotted(parent.func) or ""
            if name in K.SEEDERS or is_assumed_seeder(name) or name.endswith(".manual_seed"):
                return True
        node, parent = parent, module.parents.get(parent)
    if parent.__class__ in (ast.Assign, ast.AnnAssign):
        targets = parent.targets if parent.__class__ is ast.Assign else [parent.target]
        return any("seed" in (dotted(t) or "").lower() for t in targets)
    return False


def may_draw(qual: str) -> bool:
    """Whether some call of ``qual`` draws from a global generator (depending on its arguments)."""
    return (qual == K.DATALOADER or qual in K.ORDER_DRAWS or qual in K.RANDOM_DRAWS or qual in K.TORCH_DRAWS
            or qual.startswith(("numpy.random.", K.TORCH_INIT_PREFIX)) or bool(model_of(qual)))


def model_of(qual: str) -> str:
    """A description of the model built by calling ``qual`` ("" if it builds none)."""
    if qual.startswith("torch.nn.") and qual.count(".") == 2 and qual[9:] in K.RANDOM_INIT_LAYERS:
        return qual.replace("torch.", "", 1)
    if qual in K.MODEL_FACTORIES:
        return qual
    prefix = next((p for p in K.MODEL_FACTORY_PREFIXES if qual.startswith(p)), None)
    if prefix is not None and _builds_model(qual[len(prefix):]):
        return qual
    head, _, method = qual.rpartition(".")
    if (method in K.MODEL_BUILDER_METHODS and head.startswith("transformers.")
            and not head.endswith(K.NOT_MODEL_SUFFIXES)):
        return f"{head.rpartition('.')[2]}.{method}"
    return ""


def _builds_model(member: str) -> bool:
    """Whether calling ``member`` of a model factory prefix builds a model (``resnet50``, ``get_model``,
    ``detection.fasterrcnn_resnet50_fpn``, ``__dict__[...]``): not a look-up (``list_models``, ``get_weight``)
    nor a weights enum (``ResNet50_Weights.DEFAULT.transforms``)."""
    return not any(part in K.NOT_MODEL_MEMBERS or part.endswith(K.WEIGHTS_ENUM_SUFFIX) for part in member.split("."))


def draws_initial_weights(module: Module, scope: Scope, qual: str, call: ast.Call) -> bool:
    """Whether building a model with ``call`` leaves weights drawn from torch's generator in it: not when
    every weight comes from a checkpoint (``from_pretrained`` without a new task head, ``weights=`` that are
    surely given, ``pretrained=True``)."""
    head, _, method = qual.rpartition(".")
    if method in K.PRETRAINED_LOADERS and head.startswith("transformers."):
        return (any(word in head.rpartition(".")[2] for word in K.NEW_HEAD_WORDS)
                or any(has_keyword(call, kw) for kw in K.NEW_HEAD_KEYWORDS))
    for prefix, options in K.PRETRAINED_FACTORIES.items():
        if qual.startswith(prefix) and any(_gives(module, scope, call, kw, value) for kw, value in options):
            new_head = K.NEW_CLASSIFIER_KEYWORDS.get(prefix)
            return new_head is not None and has_keyword(call, new_head)
    return True


def _gives(module: Module, scope: Scope, call: ast.Call, keyword: str, value: bool | None) -> bool:
    """Whether ``call`` passes ``keyword=value`` (``value`` None: weights that are surely given)."""
    given = argument(call, None, (keyword,))
    if given is None:
        return False
    return weights_given(module, scope, given) if value is None else is_true(given)


def weights_given(module: Module, scope: Scope, expr: ast.expr, depth: int = 0) -> bool:
    """Whether ``expr`` surely names pretrained weights: a non-empty string, a ``*_Weights`` entry or a look-up
    of one (``get_weight(...)``, ``get_model_weights(arch).DEFAULT``), or a local name or ``a if c else b``
    that is one in every case. ``None``, ``"DEFAULT" if args.pretrained else None`` and values the linter
    cannot know (``args.weights``, a parameter: often None, training from scratch) are not."""
    cls = expr.__class__
    if cls is ast.Constant:
        return isinstance(expr.value, str) and bool(expr.value)
    if cls is ast.IfExp:
        return all(weights_given(module, scope, branch, depth) for branch in (expr.body, expr.orelse))
    if cls is ast.Name and expr.id not in module.imports:
        values = scope.values_of(expr.id) if depth < 3 else []
        return bool(values) and all(weights_given(module, scope, v, depth + 1) for v in values)
    return _names_weights(module, expr)


def _names_weights(module: Module, expr: ast.AST) -> bool:
    """Whether ``expr`` is (or is taken from) a torchvision weights enum or a weights look-up."""
    node: ast.AST | None = expr
    while node is not None:
        cls = node.__class__
        name = module.qual(node) if cls is ast.Name or cls is ast.Attribute else None
        if name and (name in K.WEIGHTS_LOOKUPS or any(p.endswith(K.WEIGHTS_ENUM_SUFFIX) for p in name.split("."))):
            return True
        node = node.func if cls is ast.Call else node.value if cls is ast.Attribute or cls is ast.Subscript else None
    return False


def dynamic_qual(module: Module, func: ast.AST) -> str | None:
    """A name for a member looked up at run time: ``models.__dict__[arch]`` and ``getattr(models, arch)`` give
    ``torchvision.models.__dict__[...]`` when ``models`` is ``torchvision.models``."""
    owner = None
    if func.__class__ is ast.Subscript and func.value.__class__ is ast.Attribute and func.value.attr == "__dict__":
        owner = module.qual(func.value.value)
    elif (func.__class__ is ast.Call and module.is_builtin(func.func, "getattr") and len(func.args) >= 2
          and func.args[1].__class__ is not ast.Constant):
        owner = module.qual(func.args[0])
    return f"{owner}.__dict__[...]" if owner else None


def store_events(module: Module, node: ast.AST) -> Iterator[tuple[str, str | None, str]]:
    """Events of an assignment: ``cudnn.deterministic = True``, ``os.environ["CUBLAS_WORKSPACE_CONFIG"] = ...``."""
    if node.__class__ is ast.Assign:
        for target in node.targets:
            if (target.__class__ is ast.Attribute and target.attr == "deterministic"
                    and module.qual(target.value) == K.CUDNN and is_true(node.value)):
                yield CUDNN_DET, None, "torch.backends.cudnn.deterministic = True"
    for name, _value in env_assignments(module, node):
        if name == "CUBLAS_WORKSPACE_CONFIG":
            yield CUBLAS_ENV, None, name
