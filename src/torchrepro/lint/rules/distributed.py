"""Distributed training: samplers that reshuffle identically every epoch, and one data seed shared by all ranks."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .. import knowledge as K
from ..calls import argument, has_splat, is_false, is_true
from ..events import DIST, RANK_SEED, SEED, SET_EPOCH, SHARDED
from ..module import Module, Scope, dotted, walk_own
from ..rule import Context, Finding, Rule

_KIND_OF_NAMES = {
    SET_EPOCH: lambda q: False, DIST: lambda q: q in K.DIST_INIT,
    SHARDED: lambda q: q in K.HF_TRAINERS or q == K.LIGHTNING_TRAINER or q.startswith(
        ("accelerate.Accelerator", "lightning.fabric.Fabric")),
}


def _module_has(ctx: Context, kind: str) -> bool:
    """Whether a call in the module, or on the path from its entry point, causes an event of ``kind``."""
    module = ctx.module
    if kind == SET_EPOCH and any(_sets_epoch(name) for table in module.index[1:] for name in table):
        return True
    if any(_KIND_OF_NAMES[kind](qual) for qual in module.index[0]):
        return True
    return ctx.is_program and ctx.summary.has(kind)


def _sets_epoch(name: str) -> bool:
    """``set_epoch``, or a helper whose name says it sets the epoch (``set_loader_epoch``, ``_set_sampler_epoch``):
    a helper the linter cannot see is assumed to do what its name says."""
    last = name.lower().lstrip("_")
    return last.startswith("set") and "epoch" in last


def _escapes(scope: Scope, sampler: ast.Call) -> bool:
    """Whether the sampler leaves the function that builds it: returned or yielded (alone, or in a loader, dict
    or tuple built from it) or stored on an object, so that its epoch is the caller's to set (a loader factory)."""
    if scope.kind != "function":
        return False
    held: set[str] = set()  # local names holding the sampler, or something built from it
    nodes = list(walk_own(scope.node))
    for _round in range(5):
        before = len(held)
        if any(_passes_out(node, sampler, held) for node in nodes):
            return True
        if len(held) == before:
            return False
    return False


def _passes_out(node: ast.AST, sampler: ast.Call, held: set[str]) -> bool:
    """Whether ``node`` hands what holds the sampler out of the function; the local names it binds to it are
    added to ``held`` (``loader = DataLoader(ds, sampler=sampler)``, ``loader_args.update(sampler=sampler)``)."""
    cls = node.__class__
    if cls in (ast.Return, ast.Yield, ast.YieldFrom):
        return _mentions(node.value, sampler, held)
    if cls in (ast.Assign, ast.AnnAssign) and _mentions(node.value, sampler, held):
        for target in node.targets if cls is ast.Assign else [node.target]:
            for t in target.elts if target.__class__ in (ast.Tuple, ast.List) else [target]:
                while t.__class__ is ast.Subscript:
                    t = t.value
                if t.__class__ is ast.Attribute:
                    return True  # self.sampler = ...
                if t.__class__ is ast.Name:
                    held.add(t.id)
    elif cls is ast.Call and node.func.__class__ is ast.Attribute and node.func.value.__class__ is ast.Name and any(
            _mentions(a, sampler, held) for a in (*node.args, *(kw.value for kw in node.keywords))):
        held.add(node.func.value.id)
    return False


def _mentions(expr: ast.AST | None, sampler: ast.Call, held: set[str]) -> bool:
    return expr is not None and any(n is sampler or (n.__class__ is ast.Name and n.id in held)
                                    for n in ast.walk(expr))


class SamplerWithoutSetEpoch(Rule):
    code = "TR401"
    name = "sampler-without-set-epoch"
    family = "distributed"
    summary = "A shuffling `DistributedSampler` whose `set_epoch` is never called."
    what = """
        `DistributedSampler(...)` (shuffling, the default) in a module where no `.set_epoch(...)` call exists —
        neither in the module, nor on the path from its entry point or from the function that builds the
        sampler, nor in a linted program that imports it — and no framework that calls it for you (Lightning,
        Hugging Face `Trainer`, Accelerate) is used. Any `set_epoch` call counts (`loader.sampler.set_epoch`,
        `sampler.set_epoch`, `loader.set_epoch`), and so does a helper the linter cannot see whose name says it
        sets the epoch (`set_loader_epoch(loader, epoch)`). A sampler that a library function hands back to its
        caller (a loader factory such as timm's `create_loader`) is not reported when no program that calls it
        is found: setting the epoch is the caller's job.
        """
    why = """
        The sampler shuffles with `seed + epoch`. Without `set_epoch(epoch)` the epoch stays 0, so every epoch
        visits the data in exactly the same order, which hurts training and differs from what a resumed or
        single-process run does.
        """
    example = """
        sampler = DistributedSampler(train_set)                    # TR401
        for epoch in range(epochs):
            for batch in DataLoader(train_set, sampler=sampler): ...
        """
    instead = """
        sampler = DistributedSampler(train_set, seed=seed)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for batch in DataLoader(train_set, sampler=sampler): ...
        """
    help = "call sampler.set_epoch(epoch) at the start of every epoch"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        samplers = [(call, scope) for call, scope in module.calls_to(K.DISTRIBUTED_SAMPLER)
                    if not is_false(argument(call, 3, ("shuffle",)))]
        if not samplers or _module_has(ctx, SET_EPOCH) or _module_has(ctx, SHARDED):
            return
        samplers = [(call, scope) for call, scope in samplers if not ctx.walker.summary(scope).has(SET_EPOCH)]
        programs = ctx.importing_programs() if samplers else []
        for program in programs:
            program_ctx = Context(program, ctx.project, ctx.walker, ctx.programs)
            if _module_has(program_ctx, SET_EPOCH) or _module_has(program_ctx, SHARDED):
                return
        for call, scope in samplers:
            if not programs and not ctx.is_program and _escapes(scope, call):
                continue  # a factory whose callers cannot be seen: they set the epoch
            yield Finding(call, "DistributedSampler shuffles with seed + epoch, but set_epoch() is never called: "
                                "every epoch repeats the same order")


def _generator_seeds(module: Module, scope: Scope, expr: ast.AST, depth: int = 0) -> list[ast.expr] | None:
    """The seed values given to a generator expression (``torch.Generator().manual_seed(s)``, or a name bound
    to one or seeded later); an empty list for a generator never seeded; None when unknown."""
    if expr.__class__ is ast.Call:
        func = expr.func
        if func.__class__ is ast.Attribute and func.attr == "manual_seed":
            seed = argument(expr, 0, ("seed",))
            return [seed] if seed is not None else None
        if module.qual(func) == K.TORCH_GENERATOR:
            return []
        return None
    name = dotted(expr)
    if name is None:
        return None
    seeds: list[ast.expr] = []
    if expr.__class__ is ast.Name and depth < 2:
        for value in scope.values_of(expr.id):
            found = _generator_seeds(module, scope, value, depth + 1)
            if found is None:
                return None
            seeds.extend(found)
    for call, _scope in module.calls_to(methods="manual_seed"):
        func = call.func
        if dotted(func.value) == name:
            seed = argument(call, 0, ("seed",))
            if seed is None:
                return None
            seeds.append(seed)
    return seeds or None


def _mentions_rank(expr: ast.AST) -> bool:
    for node in ast.walk(expr):
        word = node.id if node.__class__ is ast.Name else node.attr if node.__class__ is ast.Attribute else (
            node.value if node.__class__ is ast.Constant and isinstance(node.value, str) else "")
        if isinstance(word, str) and any(w in word.lower() for w in K.RANK_WORDS):
            return True
    return False


class SameDataSeedOnEveryRank(Rule):
    code = "TR402"
    name = "same-data-seed-on-every-rank"
    family = "distributed"
    summary = "In a distributed program, every rank shuffles the whole dataset with the same seed."
    what = """
        A module that starts distributed training (`init_process_group`, `DistributedDataParallel`, FSDP,
        `deepspeed.initialize`) and builds a shuffling `DataLoader` without a sampler, whose order comes from a
        seed that does not involve the rank: a `generator=` seeded with a rank-independent value (or not at
        all), or torch's global generator seeded with a rank-independent value. Programs that use
        Lightning, Accelerate or Hugging Face `Trainer` (which shard loaders themselves) are not reported.
        """
    why = """
        With the same seed, every rank draws the same permutation of the whole dataset, so all ranks train on
        identical batches: the effective batch is one rank's, and an epoch is not what the code assumes.
        """
    example = """
        dist.init_process_group("nccl")
        torch.manual_seed(seed)
        loader = DataLoader(train_set, batch_size=64, shuffle=True)               # TR402
        """
    instead = """
        sampler = DistributedSampler(train_set, shuffle=True, seed=seed)          # one shard per rank
        loader = DataLoader(train_set, batch_size=64, sampler=sampler)
        """
    help = "shard the data with sampler=DistributedSampler(dataset, seed=seed) (and call set_epoch each epoch)"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        if not _module_has(ctx, DIST) or _module_has(ctx, SHARDED):
            return
        for call, scope in module.calls_to(K.DATALOADER):
            if has_splat(call):
                continue
            if not is_true(argument(call, K.LOADER_SHUFFLE, ("shuffle",))):
                continue
            if argument(call, K.LOADER_SAMPLER, ("sampler",)) is not None or argument(
                    call, K.LOADER_BATCH_SAMPLER, ("batch_sampler",)) is not None:
                continue
            generator = argument(call, K.LOADER_GENERATOR, ("generator",))
            if generator is not None:
                seeds = _generator_seeds(module, scope, generator)
                if seeds is None or any(_mentions_rank(s) for s in seeds):
                    continue
                source = "its generator's seed" if seeds else "its unseeded generator (a fixed default seed)"
            else:
                if not ctx.is_program or not ctx.summary.has(SEED, K.TORCH) or ctx.summary.has(RANK_SEED):
                    continue
                source = "torch's global seed"
            yield Finding(call, f"every rank shuffles the whole dataset with the same seed ({source} does not "
                                "depend on the rank), so all ranks train on the same batches")


RULES = (SamplerWithoutSetEpoch, SameDataSeedOnEveryRank)
