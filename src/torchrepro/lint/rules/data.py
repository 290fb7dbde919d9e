"""Data: loader randomness taken from the global generator, worker seeding, and orders that change between runs."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .. import knowledge as K
from ..calls import argument, constant, has_splat, is_true
from ..classify import classify_call
from ..events import WORKER_SEEDS
from ..module import Module, Scope, dotted
from ..rule import Context, Finding, Rule
from .worker_draws import DRAWS, HELD, WorkerDraws


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
    summary = "A DataLoader whose workers draw random numbers, with neither `generator=` nor `worker_init_fn=`."
    what = """
        `DataLoader(num_workers=N)` with N > 0 (or not a literal) and neither `generator=` nor
        `worker_init_fn=`, when what the workers run draws random numbers: a random torchvision transform
        (`Random*`, `ColorJitter`, `RandAugment`, `GaussianBlur`, ...), timm's
        `create_transform(is_training=True)`, or a draw (`random`, `np.random`, `torch.rand*`) in the
        dataset's `__getitem__`/`__iter__`, the helpers and transforms it calls, or the `collate_fn`. The
        linter follows the dataset expression to where it is built (names, `self.x` attributes, project classes
        with their constructor arguments, project functions, `random_split`/`Subset`/`ConcatDataset`, the
        callers of a function whose parameter it is). Also reported, even with `generator=`: a dataset that
        draws from a generator object it holds (`self.rng = np.random.default_rng(seed)`). Not reported: loaders
        whose workers draw nothing (validation transforms such as `Resize`, `CenterCrop`, `ToTensor`,
        `Normalize`, or draws in a branch the dataset never takes: `if self.augment:` in a dataset built with
        `augment=False`), datasets the linter cannot see into (built by a library or an unknown factory), and
        modules that call Lightning's `seed_everything(..., workers=True)`, which installs a worker init
        function.
        """
    why = """
        Each worker seeds torch, `random` and NumPy from a base seed that the loader draws from torch's global
        generator, so the randomness in workers (augmentations) shifts whenever earlier code draws
        differently. Generator objects your Dataset created in `__init__` (`np.random.default_rng(...)`) are
        copied into every worker with the same state, so the workers repeat each other's random numbers.
        """
    example = """
        train_set = ImageFolder(root, transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()]))
        loader = DataLoader(train_set, batch_size=64, num_workers=4)                # TR302
        """
    instead = """
        loader = DataLoader(train_set, batch_size=64, num_workers=4,
                            worker_init_fn=torchrepro.seed_worker,
                            generator=torchrepro.make_generator(seed))
        """
    help = "pass generator=torch.Generator().manual_seed(seed) and worker_init_fn=torchrepro.seed_worker"
    held_help = ("seed the dataset's generator in each worker (a worker_init_fn that rebuilds it from "
                 "torch.utils.data.get_worker_info().seed), or draw from torch's generator, which each worker "
                 "seeds differently")

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        if _lightning_seeds_workers(module):
            return
        draws = WorkerDraws(module, ctx.project)
        for call, scope in module.calls_to(K.DATALOADER):
            if has_splat(call):
                continue
            workers = argument(call, K.LOADER_WORKERS, ("num_workers",))
            if workers is None or constant(workers, 1) == 0:
                continue
            if argument(call, K.LOADER_INIT_FN, ("worker_init_fn",)) is not None:
                continue
            verdict = draws.loader(call, scope)
            shown = ast.unparse(workers)
            if verdict.level == HELD:
                yield Finding(call, f"DataLoader(num_workers={shown}) has no worker_init_fn=, and its dataset draws "
                                    f"from a generator object it holds ({verdict.detail}): every worker gets a copy "
                                    "with the same state, so the workers repeat each other's random numbers",
                              self.held_help)
            elif verdict.level == DRAWS and argument(call, K.LOADER_GENERATOR, ("generator",)) is None:
                yield Finding(call, f"DataLoader(num_workers={shown}) has neither generator= nor worker_init_fn=, "
                                    f"and its workers draw random numbers ({verdict.detail}): their seeds come from "
                                    "torch's global generator, so these draws shift whenever any earlier code "
                                    "draws differently")


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
# `x = f([x, y])` accumulates into x in the loop's order.
_CONCATENATE = frozenset({"torch.cat", "torch.concat", "torch.concatenate", "torch.stack", "torch.vstack",
                          "torch.hstack", "numpy.concatenate", "numpy.append", "numpy.stack", "numpy.vstack",
                          "numpy.hstack", "pandas.concat"})
# Methods that return a str, bytes or list: `x += f.read()` concatenates (it does not add numbers).
_SEQUENCE_METHODS = frozenset({"read", "read_text", "read_bytes", "readline", "readlines", "splitlines", "split",
                               "tolist", "encode", "decode", "strip"})
_SEQUENCE_BUILTINS = ("list", "sorted", "tuple", "str", "bytes")


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

    def sorted_later(self, name: str | None, depth: int = 0) -> bool:
        """Whether ``name`` is sorted (``name.sort()``, ``sorted(name)``): in this scope for a local name, in
        the module for an attribute (``self.files``); or, for a local name, whether a list built from it is
        (``pairs = [... for f, y in zip(files, labels)]`` then ``pairs = sorted(pairs)``)."""
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
        return "." not in name and depth < 2 and any(
            self.sorted_later(derived, depth + 1) for derived in self._derived(name))

    def _derived(self, name: str) -> Iterator[str]:
        """Local names assigned a value built from ``name`` (other than ``name`` itself)."""
        for item in self.scope.items:
            if item.__class__ is ast.Assign and len(item.targets) == 1 and item.targets[0].__class__ is ast.Name:
                target = item.targets[0].id
                if target != name and any(True for _n in _loads(item.value, name)):
                    yield target

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
            if cls is ast.AugAssign or cls is ast.Assign:
                accumulated = self._accumulated(n)
                if accumulated:
                    receivers.add(accumulated)
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

    def _accumulated(self, node: ast.AugAssign | ast.Assign) -> str | None:
        """The name a loop statement accumulates into in the loop's order: ``data += f.read()``, ``files +=
        [...]``, ``blob = blob + chunk``, ``ids = torch.cat([ids, t])``; not ``count += 1`` nor a sum of numbers."""
        if node.__class__ is ast.AugAssign:
            target, op, value = node.target, node.op, node.value
        elif len(node.targets) == 1 and node.value.__class__ is ast.BinOp:
            target, op, value = node.targets[0], node.value.op, node.value.right
            if dotted(node.value.left) != dotted(target):
                return None
        elif len(node.targets) == 1 and node.value.__class__ is ast.Call:
            name = dotted(node.targets[0])
            return name if name and self._concatenates(node.value, name) else None
        else:
            return None
        name = dotted(target)
        if name is None or op.__class__ is not ast.Add:
            return None
        return name if self._sequence(value) or self._sequence_init(name) else None

    def _concatenates(self, call: ast.Call, name: str) -> bool:
        """``torch.cat([name, t])``, ``np.concatenate((name, a))``: ``name`` grows by a concatenation."""
        return self.m.qual(call.func) in _CONCATENATE and any(
            dotted(n) == name for arg in call.args[:1] for n in ast.walk(arg))

    def _sequence(self, value: ast.AST) -> bool:
        """Whether ``value`` is a str, bytes, list or tuple (so ``+`` concatenates)."""
        cls = value.__class__
        if cls in (ast.List, ast.ListComp, ast.Tuple, ast.JoinedStr):
            return True
        if cls is ast.Constant:
            return isinstance(value.value, (str, bytes))
        if cls is ast.Call:
            func = value.func
            return any(self.m.is_builtin(func, f) for f in _SEQUENCE_BUILTINS) or (
                func.__class__ is ast.Attribute and func.attr in _SEQUENCE_METHODS)
        return False

    def _sequence_init(self, name: str) -> bool:
        """Whether local ``name`` starts as a str, bytes, list or tuple (``data = ""``, ``out = []``)."""
        return "." not in name and any(self._sequence(v) for v in self.scope.values_of(name)
                                       if v.__class__ is not ast.BinOp)


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
        return _int_literals(node.elts)
    if node.__class__ is ast.Call and node.args:
        arg = node.args[0]
        if arg.__class__ in (ast.List, ast.Tuple):
            return _int_literals(arg.elts)
        if arg.__class__ is ast.GeneratorExp:
            return _int_comprehension(module, arg)
        if arg.__class__ is ast.Call:
            inner = arg.func
            if module.is_builtin(inner, "range") or (inner.__class__ is ast.Attribute and inner.attr == "tolist"):
                return True
            if module.is_builtin(inner, "map") and arg.args and module.is_builtin(arg.args[0], "int"):
                return True
    if node.__class__ is ast.SetComp:
        return _int_comprehension(module, node)
    return False


def _int_literals(elts: list[ast.expr]) -> bool:
    return bool(elts) and all(isinstance(constant(e, None), int) for e in elts)


def _int_comprehension(module: Module, comp: ast.SetComp | ast.GeneratorExp) -> bool:
    """``{int(x) for x in xs}``, or arithmetic on the targets of loops over ``range(...)``."""
    elt = comp.elt
    if elt.__class__ is ast.Call and module.is_builtin(elt.func, "int"):
        return True
    targets = set()
    for gen in comp.generators:
        if not (gen.iter.__class__ is ast.Call and module.is_builtin(gen.iter.func, "range")
                and gen.target.__class__ is ast.Name):
            return False
        targets.add(gen.target.id)
    return all(n.__class__ in _ARITHMETIC or (n.__class__ is ast.Name and n.id in targets)
               or isinstance(constant(n, None), int) for n in ast.walk(elt))


_ARITHMETIC = frozenset({ast.BinOp, ast.UnaryOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Pow,
                         ast.USub, ast.Load})


def _registry(module: Module, node: ast.AST) -> bool:
    """A module-level set that functions fill with the object they register and return (a decorator
    registry: ``_leaf_modules.add(cls); return cls``). It holds classes or functions, not strings, and is
    listed for lookups."""
    assign = module.parents.get(node)
    if assign.__class__ not in (ast.Assign, ast.AnnAssign) or module.parents.get(assign) is not module.tree:
        return False
    targets = assign.targets if assign.__class__ is ast.Assign else [assign.target]
    if len(targets) != 1 or targets[0].__class__ is not ast.Name:
        return False
    name = targets[0].id
    adds = [(c, sc) for c, sc in module.calls_to(methods=("add", "update", "__ior__"))
            if dotted(c.func.value) == name]
    return bool(adds) and all(_registers(call, scope) for call, scope in adds)


def _registers(call: ast.Call, scope: Scope) -> bool:
    """``registry.add(param)`` in a function that returns ``param`` (a registering decorator)."""
    arg = call.args[0] if len(call.args) == 1 and call.func.attr == "add" else None
    if arg is None or arg.__class__ is not ast.Name or scope.kind != "function":
        return False
    params = {a.arg for a in (*scope.node.args.posonlyargs, *scope.node.args.args, *scope.node.args.kwonlyargs)}
    return arg.id in params and any(
        n.__class__ is ast.Return and n.value.__class__ is ast.Name and n.value.id == arg.id
        for n in ast.walk(scope.node))


class SetIterationOrder(Rule):
    code = "TR303"
    name = "set-iteration-order"
    family = "data"
    summary = "The iteration order of a set feeds an ordering, a vocabulary or a sample."
    what = """
        A set (`{...}`, a set comprehension, `set(...)`, `frozenset(...)`, or a name bound to one) whose order
        becomes data: turned into a list or tuple, enumerated or zipped, iterated by a loop that appends,
        yields, assigns positions or draws random numbers, joined, returned or passed on. Sorting it first, or
        using it only for membership, length, set algebra, `sum`/`min`/`max`, is fine. Not reported: sets of
        visible ints (`set(range(n))`, `set(t.tolist())`, `{i % k for i in range(n)}`, `set([1, 2])`), whose
        order does not change, and registries that a registering decorator fills with the classes or functions
        it registers (`_leaf_modules.add(cls); return cls`), which are listed for lookups. Dicts keep insertion
        order and are never reported.
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
            if _numeric_set(module, node) or _registry(module, node):
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
        loop that appends, extends, concatenates — `data += f.read()`, `files += [...]`, `x = x + chunk`,
        `ids = torch.cat([ids, t])`; not a sum of numbers — or yields, passed to a Dataset) without
        `sorted(...)` or a later `.sort()` — of the list itself or of a list built from it (`pairs = [...
        zip(files, labels)]`, then `sorted(pairs)`). An `os.walk` loop is fine when what it collects is sorted
        afterwards, or when it sorts `dirs` in place and sorts (or does not use) the file names.
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
    dirs, files = (names[1], names[2]) if len(names) > 2 else (None, None)
    dirs_sorted = False
    files_sorted = files is not None and not any(True for stmt in loop.body for _n in _loads(stmt, files))
    for node in _walk_body(loop):
        if node.__class__ is ast.Assign and dirs and any(  # dirs[:] = sorted(...)
                t.__class__ is ast.Subscript and dotted(t.value) == dirs for t in node.targets) and (
                node.value.__class__ is ast.Call and module.is_builtin(node.value.func, "sorted")):
            dirs_sorted = True
        if node.__class__ is ast.Call:
            func = node.func
            sorts = func.__class__ is ast.Attribute and func.attr == "sort"
            if sorts and dirs and dotted(func.value) == dirs:
                dirs_sorted = True
            if files and ((sorts and dotted(func.value) == files) or (
                    module.is_builtin(func, "sorted") and node.args and dotted(node.args[0]) == files)):
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
