"""Signs that a module's code runs on CUDA: what TR203 asks before it reports an op that is nondeterministic only
on CUDA (a convolution's cuDNN algorithm, a scatter-add's atomics), which a CPU-only script never runs.

A sign is anything that puts work on a GPU or picks one: ``.cuda()``, a ``"cuda"``/``"cuda:0"``/``"gpu"``/
``"nccl"`` string (``torch.device("cuda" if torch.cuda.is_available() else "cpu")``, ``device="cuda"``,
``add_argument("--device", default="cuda")``), ``torch.device(<not a literal>)`` (a device chosen at run
time), ``torch.cuda`` APIs other than seeding and ``is_available`` (``torch.cuda.set_device``,
``torch.cuda.amp``, ``torch.cuda.FloatTensor``), ``torch.accelerator`` (``current_accelerator()``),
``.to(args.device)``/``.to(rank)``, ``DataParallel``, DDP with ``device_ids``, ``cudnn.benchmark = True``, and
the trainers that move the model to a GPU when there is one (Lightning's ``Trainer`` and ``Fabric`` unless
``accelerator="cpu"``, Hugging Face's ``Trainer`` and ``TrainingArguments`` unless ``use_cpu``/``no_cuda``,
Accelerate's ``Accelerator`` unless ``cpu=True``, ``deepspeed.initialize``). The tables are in knowledge.py.
Which modules count (the program and the project files it imports) is the rule's business; this module judges
one file.
"""

from __future__ import annotations

import ast
import weakref

from . import knowledge as K
from .calls import argument, constant, is_true
from .module import Module, dotted

_CUDA_PREFIXES = ("cuda:", "torch.cuda.")
_MEMO: weakref.WeakKeyDictionary[Module, str] = weakref.WeakKeyDictionary()


def cuda_use(module: Module) -> str:
    """Where ``module`` first shows that it runs on CUDA (``"line 12 (.cuda())"``), or "" when nothing does.

    >>> from pathlib import Path
    >>> def use(src):
    ...     return cuda_use(Module(Path("m.py"), "m.py", src, ast.parse(src)))
    >>> use("import torch\\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\\n")
    'line 2 (torch.device(...))'
    >>> use("import torch\\nif torch.cuda.is_available():\\n    torch.cuda.manual_seed_all(0)\\nx = 'cpu'\\n")
    ''
    """
    found = _MEMO.get(module)
    if found is None:
        found = _MEMO[module] = _first_sign(module)
    return found


def _first_sign(module: Module) -> str:
    """The first sign found (calls first, then strings and ``torch.cuda`` names, then cuDNN settings)."""
    for call, _scope in module.calls:
        what = _call_use(module, call)
        if what:
            return f"line {call.lineno} ({what})"
    parents = module.parents
    for node in parents:
        cls = node.__class__
        if cls is ast.Constant:
            value = node.value
            if (isinstance(value, str) and (value.lower() in K.CUDA_STRINGS or value.startswith(_CUDA_PREFIXES))
                    and parents[node].__class__ is not ast.Expr):  # not a docstring, nor a string as a comment
                return f"line {node.lineno} ({value!r})"
        elif cls is ast.Attribute and _names_cuda_member(module, node):
            return f"line {node.lineno} ({module.qual(node)})"
    for node, _scope in module.stores:
        if node.__class__ is ast.Assign and is_true(node.value):
            for target in node.targets:
                if (target.__class__ is ast.Attribute and target.attr == "benchmark"
                        and module.qual(target.value) == K.CUDNN):
                    return f"line {node.lineno} (cudnn.benchmark = True)"
    return ""


def _call_use(module: Module, call: ast.Call) -> str:
    func = call.func
    qual = module.qual(func)
    if qual is not None:
        if (qual.startswith("torch.cuda.") and qual.split(".")[2] not in K.CUDA_NOT_USE
                or qual.startswith(K.ACCELERATOR + ".")):
            return qual
        if qual == "torch.device":
            device = argument(call, 0, ("type", "device"))
            return "torch.device(...)" if device is not None and not isinstance(constant(device), str) else ""
        framework = _framework_use(call, qual)
        if framework:
            return framework
    if func.__class__ is ast.Attribute:
        if func.attr == "cuda" and not (qual or "").startswith("torch.cuda"):
            return ".cuda()"
        if func.attr == "to" and _picks_device(argument(call, 0, ("device",))):
            return f".to({ast.unparse(argument(call, 0, ('device',)))})"
    device = argument(call, None, ("device",))
    if device is not None and _picks_device(device):
        return f"device={ast.unparse(device)}"
    return ""


def _framework_use(call: ast.Call, qual: str) -> str:
    """A trainer or wrapper that puts the model on a GPU (when there is one), unless told to use the CPU."""
    short = qual.rpartition(".")[2]
    if qual in (K.LIGHTNING_TRAINER, K.FABRIC) or qual.startswith(K.FABRIC + "."):
        return "" if constant(argument(call, None, ("accelerator",))) == "cpu" else short
    if qual in K.HF_TRAINERS or qual in K.HF_TRAINING_ARGUMENTS:
        return "" if any(is_true(argument(call, None, (k,))) for k in ("use_cpu", "no_cuda")) else short
    if qual == K.ACCELERATE:
        return "" if is_true(argument(call, None, ("cpu",))) else short
    if qual in K.DATA_PARALLEL:
        return short
    if qual in K.DDP and argument(call, 1, ("device_ids",)) is not None:
        return f"{short}(device_ids=...)"
    return ""


def _picks_device(expr: ast.expr | None) -> bool:
    """``args.device``, ``cfg.gpu`` or ``rank``/``local_rank``: a device (or GPU index) chosen at run time. A
    literal is judged by the string scan, a local name where it is assigned, ``x.device`` (a tensor's device)
    not at all."""
    if expr is None:
        return False
    if expr.__class__ is ast.Name:
        return expr.id.lower() in K.RANK_NAMES
    name = dotted(expr)
    if expr.__class__ is not ast.Attribute or name is None:
        return False
    parts = name.lower().split(".")
    return parts[-2] in K.OPTION_HOLDERS and any(word in parts[-1] for word in K.DEVICE_WORDS)


def _names_cuda_member(module: Module, node: ast.Attribute) -> bool:
    """``torch.cuda.FloatTensor``, ``torch.cuda.amp.GradScaler``, ``torch.accelerator.current_accelerator``:
    members named, not only called."""
    owner = node.value
    if not (owner.__class__ is ast.Attribute and owner.attr in ("cuda", "accelerator")
            or owner.__class__ is ast.Name and owner.id in module.imports
            and module.qual(owner) in ("torch.cuda", K.ACCELERATOR)):
        return False
    qual = module.qual(node)
    return qual is not None and (qual.startswith("torch.cuda.") and qual.split(".")[2] not in K.CUDA_NOT_USE
                                 or qual.startswith(K.ACCELERATOR + "."))
