"""Determinism: cuDNN flags, ops without deterministic CUDA kernels, and environment variables set too late."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .. import knowledge as K
from ..calls import argument, constant, env_assignments, is_false, is_true
from ..flow import CUBLAS_ENV, CUDA, CUDNN_DET, DET, Walker, classify_call, is_assumed_determinism, store_events
from ..module import Module, Scope, dotted
from ..rule import Context, Finding, Rule


def _cudnn_settings(module: Module, attr: str, wanted: Callable[[ast.AST | None], bool],
                    callers: frozenset[str]) -> Iterator[tuple[ast.AST, str]]:
    """``cudnn.<attr> = value`` stores and ``caller(<attr>=value)`` calls with a ``wanted`` value, each with how it
    is written (``cudnn.benchmark = True``, ``Trainer(benchmark=True)``)."""
    for node, _scope in module.stores:
        if node.__class__ is ast.Assign and wanted(node.value):
            for target in node.targets:
                if target.__class__ is ast.Attribute and target.attr == attr and module.qual(target.value) == K.CUDNN:
                    yield node, f"cudnn.{attr} = {ast.unparse(node.value)}"
    for call, _scope in module.calls_to(callers):
        qual = module.qual(call.func)
        if wanted(value := argument(call, None, (attr,))):
            yield call, f"{qual.rpartition('.')[2]}({attr}={ast.unparse(value)})"


class CudnnBenchmark(Rule):
    code = "TR201"
    name = "cudnn-benchmark"
    family = "determinism"
    summary = "`torch.backends.cudnn.benchmark = True` lets cuDNN pick convolution algorithms by timing."
    what = """
        `torch.backends.cudnn.benchmark = True` (also through `from torch.backends import cudnn`),
        `torch.backends.cudnn.flags(benchmark=True)`, and Lightning's `Trainer(benchmark=True)`.
        """
    why = """
        With benchmarking on, cuDNN times several algorithms at the first call of each input shape and keeps
        the fastest. Timing varies between runs and machines, so different runs may use different algorithms,
        which round differently: the runs diverge after the first step.
        """
    example = """
        torch.backends.cudnn.benchmark = True       # TR201
        """
    instead = """
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True   # or torch.use_deterministic_algorithms(True)
        """
    help = "set torch.backends.cudnn.benchmark = False when runs must be comparable"

    def check(self, ctx: Context) -> Iterator[Finding]:
        callers = frozenset({K.LIGHTNING_TRAINER, K.CUDNN + ".flags"})
        for node, written in _cudnn_settings(ctx.module, "benchmark", is_true, callers):
            yield Finding(node, f"{written} picks convolution algorithms by timing, which can pick different "
                                "(differently rounding) algorithms in different runs")


class CudnnNondeterministic(Rule):
    code = "TR202"
    name = "cudnn-nondeterministic"
    family = "determinism"
    summary = "`torch.backends.cudnn.deterministic = False` allows nondeterministic cuDNN algorithms."
    what = """
        `torch.backends.cudnn.deterministic = False` and `torch.backends.cudnn.flags(deterministic=False)`.
        """
    why = """
        cuDNN's fastest convolution backward algorithms accumulate with atomics in an order that changes
        between runs. Setting the flag to False (its default) keeps them allowed, so convolution gradients
        differ in the last bits from run to run, and training amplifies the difference.
        """
    example = """
        torch.backends.cudnn.deterministic = False  # TR202
        """
    instead = """
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        """
    help = "set torch.backends.cudnn.deterministic = True (or enable torch.use_deterministic_algorithms(True))"

    def check(self, ctx: Context) -> Iterator[Finding]:
        for node, written in _cudnn_settings(ctx.module, "deterministic", is_false, frozenset({K.CUDNN + ".flags"})):
            yield Finding(node, f"{written} lets cuDNN use convolution algorithms whose results differ from run to "
                                "run")


# --- TR203: ops that are nondeterministic on CUDA --------------------------------------------------------------------
Condition = Callable[[ast.Call], bool]
_LINEAR_MODES = frozenset({"linear", "bilinear", "bicubic", "trilinear"})


def _always(call: ast.Call) -> bool:
    return True


def _arg_true(pos: int, name: str) -> Condition:
    return lambda call: is_true(argument(call, pos, (name,)))


def _arg_given(pos: int, name: str) -> Condition:
    return lambda call: (arg := argument(call, pos, (name,))) is not None and constant(arg, 0) is not None


def _mode_in(pos: int, modes: frozenset[str], name: str = "mode") -> Condition:
    return lambda call: constant(argument(call, pos, (name,))) in modes


@dataclass(frozen=True)
class Op:
    """An op that is nondeterministic on CUDA: when a call is one (``when``), and how deterministic mode treats
    it (``fixed``: it selects a deterministic kernel; otherwise it raises, as no deterministic kernel exists)."""

    label: str
    when: Condition = _always
    fixed: bool = True
    cudnn: bool = False  # also fixed by torch.backends.cudnn.deterministic = True
    how: str = "accumulates with atomic adds whose order changes from run to run"


_ATOMIC = "accumulates with atomic adds whose order changes from run to run"
_BACKWARD = "its backward accumulates with atomic adds on CUDA"
_CONV = "cuDNN may pick a convolution algorithm whose results differ from run to run"

# Keys are qualified names; ".name" keys match Tensor methods on any receiver.
NONDETERMINISTIC_OPS: dict[str, Op] = {
    ".index_add_": Op("Tensor.index_add_"), ".index_add": Op("Tensor.index_add"),
    "torch.index_add": Op("torch.index_add"),
    ".scatter_add_": Op("Tensor.scatter_add_"), ".scatter_add": Op("Tensor.scatter_add"),
    "torch.scatter_add": Op("torch.scatter_add"),
    ".index_put_": Op("Tensor.index_put_(accumulate=True)", _arg_true(2, "accumulate")),
    ".index_put": Op("Tensor.index_put(accumulate=True)", _arg_true(2, "accumulate")),
    "torch.index_put": Op("torch.index_put(accumulate=True)", _arg_true(3, "accumulate")),
    ".put_": Op("Tensor.put_", fixed=False, how="writes (or accumulates) in an order that changes between runs"),
    ".scatter_reduce_": Op("Tensor.scatter_reduce_"), ".scatter_reduce": Op("Tensor.scatter_reduce"),
    "torch.scatter_reduce": Op("torch.scatter_reduce"),
    ".index_reduce_": Op("Tensor.index_reduce_", fixed=False), ".index_reduce": Op("Tensor.index_reduce", fixed=False),
    ".histc": Op("Tensor.histc", fixed=False), "torch.histc": Op("torch.histc", fixed=False),
    ".bincount": Op("Tensor.bincount(weights)", _arg_given(0, "weights"), fixed=False),
    "torch.bincount": Op("torch.bincount(weights)", _arg_given(1, "weights"), fixed=False),
    "torch.median": Op("torch.median(dim)", _arg_given(1, "dim"), fixed=False,
                       how="its CUDA kernel picks among equal values in an order that changes between runs"),
    "torch.nn.functional.interpolate": Op("F.interpolate(mode=linear/bilinear/bicubic/trilinear)",
                                          _mode_in(3, _LINEAR_MODES), fixed=False, how=_BACKWARD),
    "torch.nn.functional.upsample": Op("F.upsample(mode=bilinear...)", _mode_in(3, _LINEAR_MODES), fixed=False,
                                       how=_BACKWARD),
    "torch.nn.functional.upsample_bilinear": Op("F.upsample_bilinear", fixed=False, how=_BACKWARD),
    "torch.nn.Upsample": Op("nn.Upsample(mode=linear/bilinear/bicubic/trilinear)", _mode_in(2, _LINEAR_MODES),
                            fixed=False, how=_BACKWARD),
    "torch.nn.UpsamplingBilinear2d": Op("nn.UpsamplingBilinear2d", fixed=False, how=_BACKWARD),
    "torch.nn.functional.grid_sample": Op("F.grid_sample", fixed=False, how=_BACKWARD),
    "torch.nn.functional.ctc_loss": Op("F.ctc_loss", fixed=False, how=_BACKWARD),
    "torch.nn.CTCLoss": Op("nn.CTCLoss", fixed=False, how=_BACKWARD),
    "torch.nn.functional.embedding_bag": Op("F.embedding_bag(mode='max')", _mode_in(6, frozenset({"max"})),
                                            fixed=False, how=_BACKWARD),
    "torch.nn.EmbeddingBag": Op("nn.EmbeddingBag(mode='max')", _mode_in(5, frozenset({"max"})), fixed=False,
                                how=_BACKWARD),
    "torch.nn.functional.pad": Op("F.pad(mode='reflect'/'replicate')",
                                  _mode_in(2, frozenset({"reflect", "replicate"})), fixed=False, how=_BACKWARD),
}
for _name in ("AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool2d", "AvgPool3d", "FractionalMaxPool2d",
              "FractionalMaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d", "ReflectionPad1d",
              "ReflectionPad2d", "ReflectionPad3d"):
    NONDETERMINISTIC_OPS[f"torch.nn.{_name}"] = Op(f"nn.{_name}", fixed=False, how=_BACKWARD)
for _name in ("adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool2d", "avg_pool3d",
              "fractional_max_pool2d", "fractional_max_pool3d", "max_unpool1d", "max_unpool2d", "max_unpool3d"):
    NONDETERMINISTIC_OPS[f"torch.nn.functional.{_name}"] = Op(f"F.{_name}", fixed=False, how=_BACKWARD)
for _name in ("ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "MaxPool3d"):
    NONDETERMINISTIC_OPS[f"torch.nn.{_name}"] = Op(f"nn.{_name}", how=_BACKWARD)
NONDETERMINISTIC_OPS["torch.nn.functional.max_pool3d"] = Op("F.max_pool3d", how=_BACKWARD)
for _d in "123":
    for _name in (f"Conv{_d}d", f"ConvTranspose{_d}d"):
        NONDETERMINISTIC_OPS[f"torch.nn.{_name}"] = Op(f"nn.{_name}", cudnn=True, how=_CONV)
    for _name in (f"conv{_d}d", f"conv_transpose{_d}d"):
        NONDETERMINISTIC_OPS[f"torch.nn.functional.{_name}"] = Op(f"F.{_name}", cudnn=True, how=_CONV)


def nondeterministic_op(module: Module, call: ast.Call) -> Op | None:
    """The table entry a call matches (None if it is not a nondeterministic op, or its arguments make it safe)."""
    qual = module.qual(call.func)
    op = NONDETERMINISTIC_OPS.get(qual) if qual else None
    if op is None and call.func.__class__ is ast.Attribute and (qual is None or qual.startswith("torch.")):
        op = NONDETERMINISTIC_OPS.get("." + call.func.attr)
    if op is not None and op.when(call):
        return op
    return None


@dataclass(frozen=True)
class Determinism:
    """Whether deterministic mode, or cuDNN's deterministic flag, is switched on, and where."""

    mode: str = ""
    cudnn: str = ""


def _may_enable(qual: str) -> bool:
    return (qual in K.DETERMINISM_ENABLERS or qual in K.SEEDERS or qual == K.LIGHTNING_TRAINER
            or qual in K.HF_TRAINING_ARGUMENTS)


def module_determinism(module: Module, walker: Walker) -> Determinism:
    """Deterministic mode set anywhere in ``module``, or on the path from its entry point (through helpers)."""
    mode = cudnn = ""
    by_qual, by_attr, by_name = module.index
    candidates = module.calls_to([q for q in by_qual if _may_enable(q)],
                                 methods=[m for m in by_attr if is_assumed_determinism(m)],
                                 bare=[n for n in by_name if is_assumed_determinism(n)])
    for call, scope in candidates:
        qual = module.qual(call.func)
        for kind, _lib, detail in classify_call(module, scope, call, qual):
            if kind == DET and not mode:
                mode = f"{detail} at line {call.lineno}"
        if not mode and qual is None and is_assumed_determinism(dotted(call.func) or ""):
            mode = f"{dotted(call.func)}() at line {call.lineno}"
    for node, _scope in module.stores:
        for kind, _lib, _detail in store_events(module, node):
            if kind == CUDNN_DET and not cudnn:
                cudnn = f"line {node.lineno}"
    summary = walker.program(module)
    if not mode and summary.has(DET):
        mode = summary.first(DET).detail
    if not cudnn and summary.has(CUDNN_DET):
        cudnn = summary.first(CUDNN_DET).where()
    return Determinism(mode, cudnn)


class NondeterministicOp(Rule):
    code = "TR203"
    name = "nondeterministic-op"
    family = "determinism"
    summary = "An op that is nondeterministic on CUDA, in a program that never enables deterministic mode."
    what = """
        Calls of ops whose CUDA kernels are nondeterministic (per `torch.use_deterministic_algorithms`):
        `index_add_`, `scatter_add_`, `scatter_reduce`, `index_put_(accumulate=True)`, `put_`,
        `index_reduce`, `histc`, `bincount(weights)`, `median(dim)`, `interpolate`/`nn.Upsample` with
        linear/bilinear/bicubic/trilinear modes, `grid_sample`, `ctc_loss`/`CTCLoss`, `embedding_bag` with
        `mode='max'`, adaptive and 3-D pooling, `MaxUnpool`, reflection and replication padding, and
        convolutions (cuDNN), when neither the module nor a linted program that imports it enables
        deterministic mode (`torch.use_deterministic_algorithms(True)`, `torchrepro.deterministic()`,
        Lightning's `Trainer(deterministic=True)`, `enable_full_determinism`, ...). For convolutions,
        `torch.backends.cudnn.deterministic = True` is enough.
        """
    why = """
        These kernels accumulate floating-point values with atomics in whatever order the GPU schedules them.
        Float addition is not associative, so results differ in the last bits from run to run, and training
        amplifies the difference until two same-seed runs give different models. Deterministic mode selects
        deterministic kernels where PyTorch has them and raises where it does not.
        """
    example = """
        out.index_add_(0, index, src)               # TR203 in a program without deterministic mode
        """
    instead = """
        torch.use_deterministic_algorithms(True)    # at start-up, e.g. with torchrepro.deterministic()
        out.index_add_(0, index, src)
        """
    help = ("enable deterministic mode at start-up: torch.use_deterministic_algorithms(True) or "
            "torchrepro.deterministic()")

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        by_qual, by_attr, _by_name = module.index
        candidates = module.calls_to([q for q in by_qual if q in NONDETERMINISTIC_OPS],
                                     methods=[m for m in by_attr if "." + m in NONDETERMINISTIC_OPS])
        found = [(call, op) for call, _scope in candidates if (op := nondeterministic_op(module, call))]
        if not found:
            return
        status = _coverage(ctx)
        for call, op in found:
            if status.mode or (op.cudnn and status.cudnn):
                continue
            where = "this program" if ctx.is_program else "this module (and no linted program importing it)"
            if op.cudnn:
                yield Finding(call, f"{op.label}: {op.how}; {where} sets neither "
                                    "torch.backends.cudnn.deterministic = True nor deterministic mode",
                              "set torch.backends.cudnn.deterministic = True and benchmark = False, or enable "
                              "torch.use_deterministic_algorithms(True)")
            elif op.fixed:
                yield Finding(call, f"{op.label} {op.how} on CUDA; {where} never enables deterministic mode, "
                                    "which would select a deterministic kernel")
            else:
                yield Finding(call, f"{op.label}: {op.how}, and PyTorch has no deterministic CUDA kernel for it; "
                                    f"{where} never enables deterministic mode, so the results silently vary",
                              "enable deterministic mode (the op then raises on CUDA: replace it, or run it on CPU "
                              "or accept and bound the difference)")


def _coverage(ctx: Context) -> Determinism:
    own = module_determinism(ctx.module, ctx.walker)
    if own.mode or ctx.is_program:
        return own
    mode, cudnn = own.mode, own.cudnn
    for program in ctx.importing_programs():
        theirs = module_determinism(program, ctx.walker)
        mode, cudnn = mode or theirs.mode, cudnn or theirs.cudnn
    return Determinism(mode, cudnn)


class CublasAfterCuda(Rule):
    code = "TR204"
    name = "cublas-config-after-cuda"
    family = "determinism"
    program = True
    summary = "`CUBLAS_WORKSPACE_CONFIG` is set after CUDA is first used."
    what = """
        On the path from the entry point, `os.environ["CUBLAS_WORKSPACE_CONFIG"] = ...` (or `setdefault`,
        `update`, `putenv`) comes after the program first uses CUDA (`.cuda()`, `.to("cuda")`, a `torch.cuda`
        call that initialises it).
        """
    why = """
        cuBLAS reads the variable once, when it creates its workspace at the first cuBLAS call. Set later, it
        may be ignored: cuBLAS matrix products can then stay nondeterministic (and older PyTorch releases raise
        for them in deterministic mode). Setting it first thing costs nothing.
        """
    example = """
        model = Net().cuda()
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"   # TR204: too late
        """
    instead = """
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"   # before any CUDA work (or in the shell)
        model = Net().cuda()
        """
    help = "set CUBLAS_WORKSPACE_CONFIG before any CUDA work, ideally in the environment that starts Python"

    def check(self, ctx: Context) -> Iterator[Finding]:
        summary = ctx.summary
        env, cuda = summary.first(CUBLAS_ENV), summary.first(CUDA)
        if env is None or cuda is None or summary.position(cuda) > summary.position(env):
            return
        yield Finding(env.site_in(ctx.module),
                      f"CUBLAS_WORKSPACE_CONFIG is set here, after CUDA is first used ({cuda.detail} at "
                      f"{cuda.where()}); cuBLAS reads it once when it initialises, so it may be ignored")


_DETERMINISM_WORDS = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED")


def _scope_is_about_determinism(module: Module, scope: Scope) -> bool:
    """Whether a scope also seeds or sets determinism flags (so a setting in it is meant for determinism)."""
    for item in scope.items:
        if item.__class__ is ast.Call:
            qual = module.qual(item.func)
            name = qual or dotted(item.func) or ""
            if qual in K.SEEDERS or qual in K.DETERMINISM_ENABLERS or "seed" in name.rpartition(".")[2] \
                    or is_assumed_determinism(name):
                return True
        for key, _value in env_assignments(module, item):
            if key in _DETERMINISM_WORDS:
                return True
        if item.__class__ is ast.Assign and any(t.__class__ is ast.Attribute and module.qual(t.value) == K.CUDNN
                                                for t in item.targets):
            return True
    return False


class LaunchBlocking(Rule):
    code = "TR205"
    name = "launch-blocking-for-determinism"
    family = "determinism"
    summary = "`CUDA_LAUNCH_BLOCKING=1` set as a determinism measure."
    what = """
        `CUDA_LAUNCH_BLOCKING` set to a true value in a function (or module top level) that also seeds or sets
        determinism flags — the "set everything deterministic" helper pattern.
        """
    why = """
        `CUDA_LAUNCH_BLOCKING=1` makes each kernel launch synchronous so that errors are reported at the right
        line. It does not change any kernel's algorithm, so it does not make atomics deterministic; it only
        slows training down.
        """
    example = """
        def set_deterministic(seed):
            torch.manual_seed(seed)
            os.environ["CUDA_LAUNCH_BLOCKING"] = "1"    # TR205
        """
    instead = """
        def set_deterministic(seed):
            torch.manual_seed(seed)
            torch.use_deterministic_algorithms(True)
        """
    help = "remove it; use torch.use_deterministic_algorithms(True) for determinism (keep the variable for debugging)"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        for node, scope in _env_sets(module):
            for key, value in env_assignments(module, node):
                if key == "CUDA_LAUNCH_BLOCKING" and value is not None and constant(value) in ("1", 1, True, "true") \
                        and _scope_is_about_determinism(module, scope):
                    yield Finding(node, "CUDA_LAUNCH_BLOCKING=1 only makes kernel launches synchronous (for "
                                        "debugging); it does not make any kernel deterministic and slows training")


def _env_sets(module: Module) -> Iterator[tuple[ast.AST, Scope]]:
    yield from module.stores
    yield from module.calls_to(methods=("setdefault", "update", "putenv"))


_CHILD_STARTERS = ("os.exec", "os.spawn", "os.posix_spawn", "subprocess.", "multiprocessing.",
                   "torch.multiprocessing.")


class HashSeedInProcess(Rule):
    code = "TR206"
    name = "hashseed-in-process"
    family = "determinism"
    summary = "`PYTHONHASHSEED` set inside the running program, where it has no effect on that program."
    what = """
        `os.environ["PYTHONHASHSEED"] = ...` (or `setdefault`/`update`/`putenv`) in a scope that does not go
        on to start a child process (`os.exec*`, `subprocess`, `multiprocessing`).
        """
    why = """
        Python reads `PYTHONHASHSEED` once, at start-up. Set later, it does not change `hash()` of strings in
        this interpreter, so set iteration orders and anything derived from `hash(str)` still change from run
        to run. Only processes started afterwards see it.
        """
    example = """
        os.environ["PYTHONHASHSEED"] = str(seed)      # TR206: too late for this process
        """
    instead = """
        # in the shell, or via `torchrepro run`/`torchrepro check`, which set it before Python starts:
        #   PYTHONHASHSEED=0 python train.py
        """
    help = "set PYTHONHASHSEED in the environment before Python starts (e.g. PYTHONHASHSEED=0 python train.py)"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        for node, scope in _env_sets(module):
            for key, _value in env_assignments(module, node):
                if key == "PYTHONHASHSEED" and not _starts_children(module, scope):
                    yield Finding(node, "PYTHONHASHSEED is read only when Python starts: setting it here does not "
                                        "change str hashing (or set order) in this process")


def _starts_children(module: Module, scope: Scope) -> bool:
    for item in scope.items:
        if item.__class__ is ast.Call:
            qual = module.qual(item.func) or ""
            if qual.startswith(_CHILD_STARTERS):
                return True
    return False


RULES = (CudnnBenchmark, CudnnNondeterministic, NondeterministicOp, CublasAfterCuda, LaunchBlocking,
         HashSeedInProcess)
