"""Determinism: cuDNN flags, ops that are nondeterministic on CUDA (from the registry's rows: the table is
:mod:`.nondet_table`), and environment variables set too late."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..._core import nondet_ops as facts
from ..._core.nondet_ops import Row
from .. import knowledge as K
from ..calls import argument, constant, env_assignments, is_false, is_true
from ..classify import classify_call, is_assumed_determinism, store_events
from ..devices import cuda_use
from ..events import CUBLAS_ENV, CUDA, CUDNN_DET, DET, DRAW, MODEL, SEED, Event
from ..flow import Walker
from ..module import Module, Scope, dotted
from ..rule import Context, Finding, Rule
from .nondet_table import NONDETERMINISTIC_OPS, Op, nondeterministic_op
from .nondet_table import STATIC_TESTS as STATIC_TESTS  # re-exported: TR203's table is in nondet_table


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


@dataclass(frozen=True)
class Determinism:
    """Whether deterministic mode, cuDNN's deterministic flag or a fixed cuBLAS workspace is set, and where."""

    mode: str = ""
    cudnn: str = ""
    cublas: str = ""

    def covers(self, row: Row) -> bool:
        """Whether this makes ``row`` deterministic. Deterministic mode covers every row: it switches kernels or
        raises, and a program that enables it is taken to run with CUBLAS_WORKSPACE_CONFIG set (torch < 2.10
        raises for cuBLAS work without it; torchrepro.deterministic(), Lightning and transformers set it)."""
        return bool(self.mode or (row.cudnn and self.cudnn) or (row.effect == facts.NOTHING and self.cublas))


def _may_enable(qual: str) -> bool:
    return (qual in K.DETERMINISM_ENABLERS or qual in K.SEEDERS or qual == K.LIGHTNING_TRAINER
            or qual in K.HF_TRAINING_ARGUMENTS)


def _cublas_set(module: Module) -> str:
    """Where ``module`` sets CUBLAS_WORKSPACE_CONFIG (``os.environ[...] = ``, ``setdefault``, ...), or ""."""
    setters = module.calls_to(methods=("setdefault", "update", "putenv"))
    for node, _scope in sorted((*module.stores, *setters), key=lambda e: e[0].lineno):
        if any(key == "CUBLAS_WORKSPACE_CONFIG" for key, _value in env_assignments(module, node)):
            return f"line {node.lineno}"
    return ""


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
    cublas = _cublas_set(module)
    summary = walker.program(module)
    if not mode and summary.has(DET):
        mode = summary.first(DET).detail
    if not cudnn and summary.has(CUDNN_DET):
        cudnn = summary.first(CUDNN_DET).where()
    if not cublas and summary.has(CUBLAS_ENV):
        cublas = summary.first(CUBLAS_ENV).where()
    return Determinism(mode, cudnn, cublas)


# What a finding says after "<op>: <cause>", by kind (a row's effect; "cudnn" for rows the cuDNN flag fixes too),
# and its help ("" = the rule's). {where}: "this program" or "this module (...)"; {on}: the device, in words.
_TAILS: dict[str, tuple[str, str]] = {
    "cudnn": ("; {where} sets neither torch.backends.cudnn.deterministic = True nor deterministic mode",
              "set torch.backends.cudnn.deterministic = True and benchmark = False, or enable "
              "torch.use_deterministic_algorithms(True)"),
    facts.SWITCHES: (" {on}; {where} never enables deterministic mode, which would switch it to a deterministic "
                     "kernel", ""),
    facts.RAISES: (" {on}, and PyTorch has no deterministic kernel for it there; {where} never enables "
                   "deterministic mode, so the results silently vary",
                   "enable deterministic mode so that it raises instead of varying, then replace it, run it "
                   "{elsewhere}, or accept and bound the difference"),
    facts.WARNS: (" {on}, and deterministic mode only warns about it; {where} never enables deterministic mode",
                  "enable deterministic mode to be told when it runs, then replace it"),
    facts.NOTHING: ("; {where} sets neither the variable nor deterministic mode (which has no other kernel for "
                    "it, but needs the variable on torch < 2.10)",
                    "export CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) before the program starts, or call "
                    "torchrepro.deterministic() first thing (it sets the variable)"),
}
_ON = {"cuda": "on CUDA", "cpu": "on CPU with 2+ threads"}
_ELSEWHERE = {"cuda": "on CPU", "cpu": "with one thread"}
_WITH_ALTERNATIVE = frozenset({facts.RAISES, facts.WARNS})  # kinds whose help names the row's alternative


@dataclass(frozen=True)
class Site:
    """One flagged call: where, in which outermost scope, and which entry it matches."""

    call: ast.Call
    scope: Scope
    op: Op


def _outermost(scope: Scope) -> Scope:
    """The top-level class or function around ``scope`` (the module's own scope for top-level code)."""
    while scope.parent is not None and scope.parent.parent is not None:
        scope = scope.parent
    return scope


_SCOPE_NAMES = {"class": "in class {}", "function": "in function {}()", "lambda": "in a lambda",
                "module": "at the top level"}


def _line_list(lines: list[int]) -> str:
    """``line 12`` or ``lines 12, 14`` (each line once)."""
    unique = list(dict.fromkeys(lines))
    return ("line " if len(unique) == 1 else "lines ") + ", ".join(map(str, unique))


def _others(first: Site, rest: list[Site]) -> str:
    """`` (and 9 more in class Net: lines 12, 14)``: the other places of a group ("" when there are none)."""
    if not rest:
        return ""
    by_label: dict[str, list[int]] = {}
    for site in rest:
        by_label.setdefault(site.op.describe(site.call), []).append(site.call.lineno)
    if list(by_label) == [first.op.describe(first.call)]:
        listed = _line_list(by_label.popitem()[1])
    else:
        listed = "; ".join(f"{label} at {_line_list(lines)}" for label, lines in by_label.items())
    scope = _SCOPE_NAMES[first.scope.kind].format(first.scope.name)
    return f" (and {len(rest)} more {scope}: {listed})"


def _groups(sites: list[Site]) -> list[list[Site]]:
    """Sites grouped by cause (registry row) and outermost scope, in source order of their first site."""
    groups: dict[tuple[int, int], list[Site]] = {}
    for site in sites:
        groups.setdefault((id(site.op.row), id(site.scope)), []).append(site)
    return list(groups.values())


class NondeterministicOp(Rule):
    code = "TR203"
    name = "nondeterministic-op"
    family = "determinism"
    summary = ("An op that is nondeterministic on CUDA (a few: on CPU with 2+ threads), in a program that never "
               "enables deterministic mode.")
    what = """
        Calls of ops that the registry of nondeterministic ops (`torchrepro.nondeterministic_ops()`, the same
        rows) lists for CUDA, or for CPU where no CUDA row applies (`index_put_(accumulate=True)`):
        `index_add_`, `scatter_add_`, `scatter_reduce` (sum/mean/prod), `scatter_` with a tensor `src`,
        explicit `index_put_` with accumulate=False, `index_copy_`, `put_`, `index_reduce`, `histc`,
        `bincount(weights)`, `median(dim)`, `kthvalue`, `interpolate`/`nn.Upsample` with
        linear/bilinear/bicubic/trilinear modes, `grid_sample`, `ctc_loss`/`CTCLoss`, `embedding_bag` with
        `mode='max'`, adaptive and 3-D pooling, `MaxUnpool`, reflection and replication padding (also
        `F.pad(mode=...)`), convolutions (cuDNN) and cuDNN RNNs (`nn.LSTM`/`GRU`/`RNN`), when neither the
        module nor a linted program that imports it enables deterministic mode
        (`torch.use_deterministic_algorithms(True)`, `torchrepro.deterministic()`, Lightning's
        `Trainer(deterministic=True)`, `enable_full_determinism`, ...). For convolutions,
        `torch.backends.cudnn.deterministic = True` is enough; for RNNs, `CUBLAS_WORKSPACE_CONFIG`. The calls
        with one cause in one top-level class or function are one finding, at the first, naming the other lines.
        The ops that vary only on CUDA are reported only where the code may run on CUDA: the program, or a
        project file it imports, shows CUDA use (`.cuda()`, a `"cuda"` device, also one picked at run time as
        in `"cuda" if torch.cuda.is_available() else "cpu"`, `torch.device(args.device)`, `.to(rank)`,
        `torch.cuda` calls other than seeding and `is_available`, `torch.accelerator`, `DataParallel`, DDP
        with `device_ids`, `cudnn.benchmark = True`, or a trainer that moves the model to a GPU: Lightning,
        Hugging Face, Accelerate); for a module that is not a program, the programs that import it and their
        project files do (library code that no program is known to import may run anywhere: it is judged to use
        CUDA). A
        program that never uses CUDA gets only the ops that also vary on the CPU (`index_put_(accumulate=True)`,
        `index_copy_`, `put_`, `MaxUnpool`), with the CPU's reason.
        """
    why = """
        These kernels accumulate floating-point values with atomics in whatever order the GPU schedules them,
        or let the last of several writes to one place win. Float addition is not associative, so results
        differ in the last bits from run to run, and training amplifies the difference until two same-seed runs
        give different models. Deterministic mode switches to deterministic kernels where PyTorch has them and
        raises where it does not (the message says which).
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
        sites = [Site(call, _outermost(scope), op) for call, scope in candidates
                 if (op := nondeterministic_op(module, call))]
        if not sites:
            return
        status = _coverage(ctx)
        sites = [s for s in sites if not status.covers(s.op.row)]
        if any(site.op.row.device == "cuda" for site in sites) and not runs_on_cuda(ctx):
            # nothing here runs on CUDA: only the ops nondeterministic on CPU are (a CPU row where there is one)
            sites = [Site(site.call, site.scope, op) for site in sites
                     if (op := nondeterministic_op(module, site.call, cuda=False)) and not status.covers(op.row)]
        where = "this program" if ctx.is_program else "this module (and no linted program importing it)"
        for first, *rest in _groups(sites):
            # A noqa on the reported line silences the group (the engine drops it); one on another line of the
            # group takes that line out of the group.
            rest = [s for s in rest if not ctx.suppressed(s.call, self.code)]
            yield self._finding(first, rest, where)

    def _finding(self, first: Site, rest: list[Site], where: str) -> Finding:
        row = first.op.row
        kind = "cudnn" if row.cudnn else row.effect
        tail, help_text = _TAILS[kind]
        cause = f"its backward {row.cause}" if row.backward else row.cause
        message = (f"{first.op.describe(first.call)}{_others(first, rest)}: {cause}"
                   f"{tail.format(where=where, on=_ON[row.device])}")
        help_text = help_text.format(elsewhere=_ELSEWHERE[row.device])
        if kind in _WITH_ALTERNATIVE and row.alternative:
            help_text += f"; known alternative: {row.alternative}"
        return Finding(first.call, message, help_text)


def runs_on_cuda(ctx: Context) -> bool:
    """Whether the code of ``ctx.module`` may run on CUDA: some sign of CUDA use (:func:`..devices.cuda_use`) in
    the program, or in a project file it imports; for a module that is not a program, in the programs that
    import it and their project files. A module that no program is known to import is library code, judged to
    run on CUDA (nothing says how it is run)."""
    project = ctx.project
    programs = [ctx.module] if ctx.is_program else ctx.importing_programs()
    if not programs:
        return True
    seen: set[int] = set()
    for program in programs:
        for module in (program, *(project.module_at(path) for path in project.imported_files(program))):
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                if cuda_use(module):
                    return True
    return False


def _coverage(ctx: Context) -> Determinism:
    own = module_determinism(ctx.module, ctx.walker)
    if own.mode or ctx.is_program:
        return own
    mode, cudnn, cublas = own.mode, own.cudnn, own.cublas
    for program in ctx.importing_programs():
        theirs = module_determinism(program, ctx.walker)
        mode, cudnn, cublas = mode or theirs.mode, cudnn or theirs.cudnn, cublas or theirs.cublas
    return Determinism(mode, cudnn, cublas)


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


_SPAWN_NOTE = {
    None: "; with the spawn or forkserver start method, the default except on Linux before Python 3.14",
    "forkserver": "; start method forkserver",
}


def _name_of(module: Module, target: Scope) -> ast.AST:
    """A node spanning the name in ``def name(`` (where a finding about a whole function points)."""
    node = target.node
    line = module.lines[node.lineno - 1] if 0 < node.lineno <= len(module.lines) else ""
    start = line.find(target.name, node.col_offset)
    start = node.col_offset if start < 0 else start
    marker = ast.Name(id=target.name)
    marker.lineno = marker.end_lineno = node.lineno
    marker.col_offset, marker.end_col_offset = start, start + len(target.name)
    return marker


class DeterminismDoesNotReachSpawnedProcess(Rule):
    code = "TR207"
    name = "determinism-does-not-reach-spawned-process"
    family = "determinism"
    program = True
    summary = ("A program enables deterministic mode or cuDNN's deterministic flag, then starts a process with the "
               "spawn method that does not set them itself.")
    what = """
        A function run in a new process — `torch.multiprocessing.spawn(fn)` / `mp.spawn(fn)`,
        `start_processes(fn)`, `multiprocessing.Process(target=fn)` (also `get_context(...).Process`) — that
        builds a model or uses CUDA, while the parent enabled deterministic mode
        (`torch.use_deterministic_algorithms(True)`, `torchrepro.deterministic()`, ...) or set
        `torch.backends.cudnn.deterministic = True` before starting it, and neither the function (nor a helper it
        calls, nor the main module's top level outside `if __name__ == "__main__":`, which the new process
        re-imports) sets them again. The finding is on the function (`def main_worker`), or on the call that
        starts it when the function lives in another file; it says when the parent's seeds do not reach the
        process either (TR106 reports its draws). Not reported when the process is forked
        (`get_context("fork")`, `set_start_method("fork")`, `start_method="fork"`), since a forked child
        inherits the parent's settings.
        """
    why = """
        Deterministic mode and the `torch.backends.cudnn` flags are settings of one Python process. The spawn
        and forkserver start methods run the function in a fresh interpreter, which starts from PyTorch's
        defaults: nondeterministic algorithms allowed, cuDNN free to pick any convolution algorithm. The
        pytorch/examples ImageNet script sets `cudnn.deterministic = True` in `main()` and then trains in
        `main_worker`, started by `mp.spawn`, where the flag is off: the training that was meant to be
        deterministic is not. (Environment variables such as `CUBLAS_WORKSPACE_CONFIG` do reach the new process.)
        """
    example = """
        def main_worker(rank, args):                # TR207: the flags set in main() are not set here
            model = resnet50().cuda(rank)
        def main():
            torch.manual_seed(args.seed)
            torch.backends.cudnn.deterministic = True
            mp.spawn(main_worker, nprocs=4, args=(args,))
        """
    instead = """
        def main_worker(rank, args):
            torchrepro.seed_everything(args.seed)   # in the process itself (add the rank where ranks differ)
            torchrepro.deterministic()              # or torch.backends.cudnn.deterministic = True
            model = resnet50().cuda(rank)
        """
    help = ("seed and set the flags at the start of the function the new process runs: "
            "torchrepro.seed_everything(seed + rank) (or the same seed) and torchrepro.deterministic() (or "
            "torch.backends.cudnn.deterministic = True) there")

    def check(self, ctx: Context) -> Iterator[Finding]:
        module, parent = ctx.module, ctx.summary.own
        seen: set[int] = set()
        for events, spawn in ctx.walker.processes(ctx.summary):
            if spawn is None or id(spawn.target) in seen:
                continue
            missing = []
            if DET in spawn.settings and not events.has(DET):
                missing.append(self._setting(module, parent.first(DET), "deterministic mode"))
            if CUDNN_DET in spawn.settings and not events.has(CUDNN_DET) and not events.has(DET):
                missing.append(self._setting(module, parent.first(CUDNN_DET), ""))
            if not missing or not (events.has(MODEL) or events.has(CUDA) or events.has(DRAW, K.TORCH)):
                continue
            seen.add(id(spawn.target))
            unseeded = [lib for lib in K.LIBS if lib in spawn.seeded and not events.has(SEED, lib)]
            seeds = (f", nor do the seeds ({', '.join(K.LIB_LABEL[lib] for lib in unseeded)})" if unseeded else "")
            line = getattr(spawn.site_in(module), "lineno", 1)
            own = spawn.target.module is module and spawn.target.kind == "function"
            node = _name_of(module, spawn.target) if own else spawn.site_in(module)
            settings = " and ".join(missing)
            yield Finding(node, f"{spawn.target.name}() runs in a new process ({spawn.api}, line {line}"
                                f"{_SPAWN_NOTE.get(spawn.method, '')}), which starts from PyTorch's default "
                                f"settings: {settings}, set before it in this process, "
                                f"{'do' if len(missing) > 1 else 'does'} not reach it{seeds}")

    @staticmethod
    def _setting(module: Module, event: Event | None, what: str) -> str:
        """``cudnn.deterministic = True (line 62)``: how the parent made a setting, and where."""
        if event is None:
            return what or "cudnn.deterministic = True"
        detail = event.detail.replace("torch.backends.", "")
        line = getattr(event.site_in(module), "lineno", 1)
        return f"{what} ({detail}, line {line})" if what else f"{detail} (line {line})"


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
         HashSeedInProcess, DeterminismDoesNotReachSpawnedProcess)
