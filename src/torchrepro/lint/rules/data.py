"""Data: loader randomness taken from the global generator, worker seeding, and orders that change between runs."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .. import knowledge as K
from ..calls import argument, constant, has_splat, is_true
from ..flow import WORKER_SEEDS, classify_call
from ..module import Module, Scope, dotted
from ..rule import Context, Finding, Rule


class DataOrderGlobalRng(Rule):
    code = "TR301"
    name = "data-order-global-rng"
    family = "data"
    summary = "A shuffling DataLoader, random sampler or `random_split` without `generator=`."
    what = """
        `DataLoader(shuffle=True)` without `generator=`, and `RandomSampler`, `SubsetRandomSampler`,
        `WeightedRandomSampler` and `random_split` without `generator=`.
        """
    why = """
        Without a generator, the order is drawn from torch's global generator when iteration starts, so it
        depends on everything drawn before it: adding a layer, a dropout or an augmentation changes the data
        order too, and two experiments that should differ in one thing differ in two. An unseeded global
        generator makes the order differ in every run.
        """
    example = """
        loader = DataLoader(train_set, batch_size=64, shuffle=True)                 # TR301
        """
    instead = """
        loader = DataLoader(train_set, batch_size=64, shuffle=True,
                            generator=torch.Generator().manual_seed(seed))          # or torchrepro.make_generator(seed)
        """
    help = "pass generator=torch.Generator().manual_seed(seed) (or torchrepro.make_generator(seed))"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        for call, _scope in module.calls_to((K.DATALOADER, *K.ORDER_DRAWS)):
            qual = module.qual(call.func)
            if qual == K.DATALOADER:
                if (is_true(argument(call, K.LOADER_SHUFFLE, ("shuffle",))) and not has_splat(call)
                        and argument(call, K.LOADER_GENERATOR, ("generator",)) is None):
                    yield Finding(call, "DataLoader(shuffle=True) without generator= draws the order from torch's "
                                        "global generator, so it shifts whenever any earlier code draws differently")
            elif qual in K.ORDER_DRAWS and not has_splat(call):
                if argument(call, K.ORDER_DRAWS[qual], ("generator",)) is None:
                    name = qual.rpartition(".")[2]
                    yield Finding(call, f"{name}() without generator= draws from torch's global generator, so its "
                                        "result shifts whenever any earlier code draws differently")


class WorkerSeeding(Rule):
    code = "TR302"
    name = "worker-seeding"
    family = "data"
    summary = "A DataLoader with worker processes but neither `generator=` nor `worker_init_fn=`."
    what = """
        `DataLoader(num_workers=N)` with N > 0 (or not a literal) and neither `generator=` nor
        `worker_init_fn=`. Not reported when Lightning's `seed_everything(..., workers=True)` is called in the
        module, which installs a worker init function.
        """
    why = """
        Each worker seeds torch, `random` and NumPy from a base seed that the loader draws from torch's global
        generator, so the randomness in workers (augmentations) shifts whenever earlier code draws
        differently. Generator objects your Dataset created in `__init__` (`np.random.default_rng(...)`) are
        copied into every worker with the same state, so the workers repeat each other's random numbers.
        """
    example = """
        loader = DataLoader(train_set, batch_size=64, num_workers=4)                # TR302
        """
    instead = """
        loader = DataLoader(train_set, batch_size=64, num_workers=4,
                            worker_init_fn=torchrepro.seed_worker,
                            generator=torchrepro.make_generator(seed))
        """
    help = "pass generator=torch.Generator().manual_seed(seed) and worker_init_fn=torchrepro.seed_worker"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        if _lightning_seeds_workers(module):
            return
        for call, _scope in module.calls_to(K.DATALOADER):
            if has_splat(call):
                continue
            workers = argument(call, K.LOADER_WORKERS, ("num_workers",))
            if workers is None or constant(workers, 1) == 0:
                continue
            if argument(call, K.LOADER_INIT_FN, ("worker_init_fn",)) is not None:
                continue
            if argument(call, K.LOADER_GENERATOR, ("generator",)) is not None:
                continue
            shown = ast.unparse(workers)
            yield Finding(call, f"DataLoader(num_workers={shown}) has neither generator= nor worker_init_fn=: worker "
                                "seeds come from torch's global generator, and RNG objects held by the dataset are "
                                "copied into every worker with the same state")


def _lightning_seeds_workers(module: Module) -> bool:
    for call, scope in module.calls_to(methods="seed_everything", bare="seed_everything"):
        if any(kind == WORKER_SEEDS for kind, _l, _d in classify_call(module, scope, call, module.qual(call.func))):
            return True
    return False


# --- orders that change between runs --------------------------------------------------------------------------------
_ORDER_FREE = frozenset({"sorted", "len", "set", "frozenset", "sum", "max", "min", "any", "all", "bool", "print",
                         "isinstance", "Counter", "collections.Counter", "numpy.sort", "heapq.nsmallest",
                         "heapq.nlargest", "os.path.exists", "os.remove", "os.unlink", "shutil.rmtree"})
_MATERIALISE = frozenset({"list", "tuple", "numpy.array", "numpy.asarray", "torch.tensor", "torch.as_tensor"})
_PASS_THROUGH = frozenset({"filter", "map", "reversed", "iter"})
_INDEXING = frozenset({"enumerate", "zip", "next"})
_ORDER_FREE_METHODS = frozenset({"sort", "count", "issubset", "issuperset", "isdisjoint", "add", "remove",
                                 "discard", "update", "clear", "intersection_update", "difference_update",
                                 "__contains__"})
_SET_METHODS = frozenset({"union", "intersection", "difference", "symmetric_difference", "copy"})
_ACCUMULATE = frozenset({"append", "extend", "insert", "appendleft", "write", "writelines"})


class _Orders:
    """Finds where the iteration order of a value becomes data: a list or index built from it, a loop that
    appends or yields in that order, a function it is passed to. ``sink`` returns that node, or None when the
    order is discarded (sorted, counted, used as a set, for membership)."""

    def __init__(self, module: Module, scope: Scope, *, ordered: bool) -> None:
        # ordered: the value is a list (a listing) whose order travels with it wherever it goes; otherwise a set,
        # which has no order until something iterates it.
        self.m, self.scope, self.ordered = module, scope, ordered

    def sink(self, node: ast.AST, depth: int = 0) -> ast.AST | None:
        if depth > 6:
            return None
        m = self.m
        parent = m.parents.get(node)
        cls = parent.__class__
        if cls is ast.Call:
            return None if node is parent.func else self._argument(parent, depth)
        if cls is ast.keyword:
            call = m.parents.get(parent)
            return self._argument(call, depth) if call.__class__ is ast.Call else None
        if cls is ast.Attribute:
            call = m.parents.get(parent)
            if call.__class__ is not ast.Call or call.func is not parent or parent.attr in _ORDER_FREE_METHODS:
                return None
            return self.sink(call, depth + 1) if parent.attr in _SET_METHODS else call
        if cls is ast.comprehension:
            comp = m.parents.get(parent)
            if node is not parent.iter or comp.__class__ in (ast.SetComp, ast.DictComp):
                return None  # a dict built from it is looked up by key (enumerate() is caught as a call)
            if comp.__class__ is ast.GeneratorExp:
                return self.sink(comp, depth + 1)
            return self._materialised(comp, depth)
        if cls in (ast.For, ast.AsyncFor):
            return parent if node is parent.iter and self.loop_orders(parent) else None
        if cls in (ast.Assign, ast.AnnAssign):
            return self._stored(parent, depth)
        if cls in (ast.Return, ast.Yield, ast.YieldFrom, ast.Subscript):
            return parent if self.ordered else None
        if cls in (ast.BinOp, ast.Starred, ast.List, ast.Tuple, ast.IfExp):
            return self.sink(parent, depth + 1)
        return None

    def _name(self, call: ast.Call) -> str:
        func = call.func
        if func.__class__ is ast.Name and func.id not in self.m.imports:
            return func.id
        return self.m.qual(func) or dotted(func) or ""

    def _argument(self, call: ast.Call, depth: int) -> ast.AST | None:
        name = self._name(call)
        if name in _ORDER_FREE:
            return None
        if name in _PASS_THROUGH:
            return self.sink(call, depth + 1)
        if name in _MATERIALISE:
            return self._materialised(call, depth)
        if self.ordered or name in _INDEXING or name.startswith(("random.", "numpy.random.")) or (
                name.endswith(".join") or call.func.__class__ is ast.Attribute and call.func.attr == "join"):
            return call  # enumerate, zip, join, sampling, a Dataset built from a listing: the order becomes data
        return None  # a set passed to an unknown function (perhaps only for membership)

    def _materialised(self, node: ast.AST, depth: int) -> ast.AST | None:
        """``node`` builds a list (or tuple) in the value's order: where that list's order is observed (for a
        set, the list itself is reported), or None when it is only sorted, counted or tested."""
        ordered = self if self.ordered else _Orders(self.m, self.scope, ordered=True)
        found = ordered.sink(node, depth + 1)
        return None if found is None else (found if self.ordered else node)

    def _stored(self, assign: ast.Assign | ast.AnnAssign, depth: int) -> ast.AST | None:
        targets = assign.targets if assign.__class__ is ast.Assign else [assign.target]
        if len(targets) != 1:
            return None
        target = targets[0]
        name = dotted(target)
        if name is None or self.sorted_later(name):
            return None
        if target.__class__ is not ast.Name:
            return assign if self.ordered else None  # a listing stored on an object (self.files = ...)
        for use in _loads(self.scope.node, target.id):
            found = self.sink(use, depth + 1)
            if found is not None:
                return found
        return None

    def sorted_later(self, name: str | None) -> bool:
        """Whether ``name`` is sorted (``name.sort()``, ``sorted(name)``): in this scope for a local name, in
        the module for an attribute (``self.files``)."""
        if name is None:
            return False
        calls = (c for c, _s in self.m.calls) if "." in name else (
            i for i in self.scope.items if i.__class__ is ast.Call)
        for call in calls:
            func = call.func
            if func.__class__ is ast.Attribute and func.attr == "sort" and dotted(func.value) == name:
                return True
            if self.m.is_builtin(func, "sorted") and call.args and dotted(call.args[0]) == name:
                return True
        return False

    def loop_orders(self, loop: ast.For | ast.AsyncFor) -> bool:
        """Whether a loop body makes the iteration order observable: it appends or writes (to something not
        sorted afterwards), yields, assigns positions (``index[x] = len(index)``) or draws random numbers."""
        receivers: set[str] = set()
        counters = {n.target.id for n in _walk_body(loop) if n.__class__ is ast.AugAssign
                    and n.target.__class__ is ast.Name}
        for n in _walk_body(loop):
            cls = n.__class__
            if cls is ast.Yield or cls is ast.YieldFrom:
                return True
            if cls is ast.Call:
                func = n.func
                if func.__class__ is ast.Attribute and func.attr in _ACCUMULATE:
                    receivers.add(dotted(func.value) or "?")
                qual = self.m.qual(func) or ""
                if qual in K.RANDOM_DRAWS or qual.startswith("numpy.random."):
                    return True
            elif cls is ast.Assign and any(t.__class__ is ast.Subscript for t in n.targets):
                for v in ast.walk(n.value):
                    if (v.__class__ is ast.Call and self.m.is_builtin(v.func, "len")) or (
                            v.__class__ is ast.Name and v.id in counters):
                        return True
        return any(r == "?" or not self.sorted_later(r) for r in receivers)


def _walk_body(loop: ast.For | ast.AsyncFor) -> Iterator[ast.AST]:
    for stmt in loop.body:
        yield from ast.walk(stmt)


def _loads(root: ast.AST, name: str) -> Iterator[ast.Name]:
    for node in ast.walk(root):
        if node.__class__ is ast.Name and node.id == name and node.ctx.__class__ is ast.Load:
            yield node


def _numeric_set(module: Module, node: ast.AST) -> bool:
    """Sets whose elements are visibly ints (their iteration order does not change between runs)."""
    if node.__class__ is ast.Set:
        return all(isinstance(constant(e, None), int) for e in node.elts)
    if node.__class__ is ast.Call and node.args:
        arg = node.args[0]
        if arg.__class__ is ast.Call:
            inner = arg.func
            if module.is_builtin(inner, "range") or (inner.__class__ is ast.Attribute and inner.attr == "tolist"):
                return True
            if module.is_builtin(inner, "map") and arg.args and module.is_builtin(arg.args[0], "int"):
                return True
    if node.__class__ is ast.SetComp:
        elt = node.elt
        return elt.__class__ is ast.Call and module.is_builtin(elt.func, "int")
    return False


class SetIterationOrder(Rule):
    code = "TR303"
    name = "set-iteration-order"
    family = "data"
    summary = "The iteration order of a set feeds an ordering, a vocabulary or a sample."
    what = """
        A set (`{...}`, a set comprehension, `set(...)`, `frozenset(...)`, or a name bound to one) whose order
        becomes data: turned into a list or tuple, enumerated or zipped, iterated by a loop that appends,
        yields, assigns positions or draws random numbers, joined, returned or passed on. Sorting it first, or
        using it only for membership, length, set algebra, `sum`/`min`/`max`, is fine. Sets of visible ints
        (`set(range(n))`, `set(t.tolist())`) are not reported.
        """
    why = """
        A set's order follows the hashes of its elements. `str` (and `bytes`) hashes are randomised per
        process unless `PYTHONHASHSEED` is set before Python starts, and objects without `__hash__` hash by
        memory address, so a vocabulary or class list built from a set gets different indices in every run.
        """
    example = """
        vocab = {word: i for i, word in enumerate(set(words))}      # TR303
        """
    instead = """
        vocab = {word: i for i, word in enumerate(sorted(set(words)))}
        """
    help = "sort it first: sorted(the_set) (or keep insertion order with dict.fromkeys(items))"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        sources: list[tuple[ast.AST, Scope]] = [
            (call, scope) for call, scope in module.calls_to(bare=("set", "frozenset"))
            if module.is_builtin(call.func, call.func.id)]
        sources.extend((n, s) for n, s in module.loops if n.__class__ is ast.SetComp)
        sources.extend(module.set_literals)
        seen: set[int] = set()
        for node, scope in sources:
            if _numeric_set(module, node):
                continue
            sink = _Orders(module, scope, ordered=False).sink(node)
            if sink is not None and id(sink) not in seen:
                seen.add(id(sink))
                built = "" if node.lineno == sink.lineno else f" (built at line {node.lineno})"
                yield Finding(sink, f"the order of a set{built} becomes data here; it changes between runs for str "
                                    "elements (hash randomisation) and id-hashed objects")


_LISTINGS = {"os.listdir": "os.listdir", "os.scandir": "os.scandir", "glob.glob": "glob.glob",
             "glob.iglob": "glob.iglob"}
_PATH_LISTINGS = frozenset({"glob", "rglob", "iterdir"})


class UnsortedListing(Rule):
    code = "TR304"
    name = "unsorted-directory-listing"
    family = "data"
    summary = "Files listed with `os.listdir`, `glob` or `Path.glob`/`iterdir`/`os.walk` and used without sorting."
    what = """
        The result of `os.listdir`, `os.scandir`, `glob.glob`/`iglob`, `Path.glob`/`rglob`/`iterdir` or the
        lists of `os.walk` used in an order-sensitive way (stored, turned into a list, indexed, iterated by a
        loop that appends or yields, passed to a Dataset) without `sorted(...)` or a later `.sort()`.
        """
    why = """
        These functions return entries in file-system order, which depends on the file system, the order files
        were created and the machine: the same data copied elsewhere yields a different sample order, split
        and label mapping.
        """
    example = """
        self.files = [os.path.join(root, f) for f in os.listdir(root)]     # TR304
        """
    instead = """
        self.files = [os.path.join(root, f) for f in sorted(os.listdir(root))]
        """
    help = "sort the listing: sorted(os.listdir(path)) / sorted(Path(path).glob(pattern))"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        for call, scope in module.calls_to(("os.walk", *_LISTINGS), methods=_PATH_LISTINGS):
            qual = module.qual(call.func)
            func = call.func
            if qual == "os.walk":
                loop = module.parents.get(call)
                if loop.__class__ is ast.For and loop.iter is call and _walk_unsorted(module, scope, loop):
                    yield Finding(call, "os.walk lists directories and files in file-system order, which differs "
                                        "between machines; the loop keeps that order", "sort in place inside the "
                                        "loop: dirs.sort() and iterate sorted(files)")
                continue
            label = _LISTINGS.get(qual or "")
            if label is None and qual is None and func.__class__ is ast.Attribute and func.attr in _PATH_LISTINGS:
                label = f"Path.{func.attr}"
            if label is None:
                continue
            if _Orders(module, scope, ordered=True).sink(call) is not None:
                yield Finding(call, f"{label} returns entries in file-system order, which differs between machines "
                                    "and copies of the data; this order is used without sorting")


def _walk_unsorted(module: Module, scope: Scope, loop: ast.For) -> bool:
    orders = _Orders(module, scope, ordered=True)
    if not orders.loop_orders(loop):
        return False
    target = loop.target
    names = [dotted(e) for e in target.elts] if target.__class__ is ast.Tuple else []
    dirs_sorted = files_sorted = False
    for node in _walk_body(loop):
        if node.__class__ is ast.Assign and len(names) > 1 and any(  # dirs[:] = sorted(...)
                t.__class__ is ast.Subscript and dotted(t.value) == names[1] for t in node.targets) and (
                node.value.__class__ is ast.Call and module.is_builtin(node.value.func, "sorted")):
            dirs_sorted = True
        if node.__class__ is ast.Call:
            func = node.func
            if func.__class__ is ast.Attribute and func.attr == "sort" and len(names) > 1 \
                    and dotted(func.value) == names[1]:
                dirs_sorted = True
            if module.is_builtin(func, "sorted") and node.args and len(names) > 2 and dotted(node.args[0]) == names[2]:
                files_sorted = True
    return not (dirs_sorted and files_sorted)


def _worker_init_scopes(module: Module) -> Iterator[tuple[ast.Call, Scope]]:
    """The functions (or lambdas) passed as ``worker_init_fn=`` to a DataLoader, defined in this module."""
    for call, scope in module.calls_to(K.DATALOADER):
        fn = argument(call, K.LOADER_INIT_FN, ("worker_init_fn",))
        if fn is None:
            continue
        if fn.__class__ is ast.Lambda:
            target = module.scope_of.get(fn)
        elif fn.__class__ is ast.Name:
            found = scope.lookup_def(fn.id)
            target = found if isinstance(found, Scope) else None
        else:
            target = None
        if target is not None:
            yield call, target


_PER_PROCESS = ("initial_seed", "get_worker_info", "get_state", "getstate", "base_seed")


class WorkerSeedFromId(Rule):
    code = "TR305"
    name = "worker-seed-from-id"
    family = "data"
    summary = "A `worker_init_fn` seeds from the worker id (and constants) only."
    what = """
        A function passed as `worker_init_fn=` (defined in the same module) that seeds `random`, NumPy or torch
        with a value computed only from the worker id, constants and settings — not from
        `torch.initial_seed()` or `get_worker_info().seed`, which change with the loader's base seed.
        """
    why = """
        The init function runs each time workers start: every epoch unless `persistent_workers=True`. A seed
        made of the worker id and a constant is the same each time, so every epoch replays exactly the same
        augmentations, and every rank of a distributed job uses the same ones.
        """
    example = """
        def seed_worker(worker_id):
            np.random.seed(args.seed + worker_id)                  # TR305
        """
    instead = """
        def seed_worker(worker_id):
            np.random.seed(torch.initial_seed() % 2**32)           # base seed + worker id, new each epoch
        """
    help = "derive the worker seed from torch.initial_seed() (or use worker_init_fn=torchrepro.seed_worker)"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        done: set[int] = set()
        for _loader, fn_scope in _worker_init_scopes(module):
            if id(fn_scope) in done:
                continue
            done.add(id(fn_scope))
            for item in fn_scope.items:
                if item.__class__ is not ast.Call:
                    continue
                qual = module.qual(item.func)
                spec = K.SEEDERS.get(qual or "")
                if spec is None or spec[1] is None:
                    continue
                value = argument(item, spec[1], spec[2])
                if value is None or _varies_per_start(module, fn_scope, value, 0):
                    continue
                yield Finding(item, f"this worker_init_fn seeds from `{ast.unparse(value)}`, which is the same "
                                    "every time workers start: each epoch (and each rank) repeats the same random "
                                    "numbers")


def _varies_per_start(module: Module, scope: Scope, expr: ast.AST, depth: int) -> bool:
    for node in ast.walk(expr):
        if node.__class__ is ast.Attribute and node.attr in _PER_PROCESS:
            return True
        if node.__class__ is ast.Name:
            if node.id in _PER_PROCESS:
                return True
            if depth < 3:
                for value in scope.assigns.get(node.id, ()):
                    if _varies_per_start(module, scope, value, depth + 1):
                        return True
    return False


RULES = (DataOrderGlobalRng, WorkerSeeding, SetIterationOrder, UnsortedListing, WorkerSeedFromId)
