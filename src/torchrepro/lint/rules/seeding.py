"""Seeding: random-number generators that are never seeded, seeded too late, or seeded with a value that changes."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .. import knowledge as K
from ..calls import argument, constant, has_splat
from ..flow import DRAW, SEED, Event, is_assumed_seeder
from ..module import Module, Scope, dotted
from ..rule import Context, Finding, Rule


def _first_draw(ctx: Context, lib: str) -> tuple[ast.AST, str] | None:
    """Where ``lib`` first draws: on the path from the entry point, else anywhere in the module."""
    event = ctx.summary.first(DRAW, lib)
    if event is not None:
        return event.site_in(ctx.module), _describe(ctx.module, event)
    draws = ctx.draws[lib]
    if draws:
        call, detail = min(draws, key=lambda d: (d[0].lineno, d[0].col_offset))
        return call, detail
    return None


def _describe(module: Module, event: Event) -> str:
    if event.module is module:
        return event.detail
    return f"{event.detail} at {event.where()}"


def _seed_site(ctx: Context, event: Event) -> str:
    node = event.site_in(ctx.module)
    return f"{event.detail}, line {getattr(node, 'lineno', 1)}"


class UnseededRng(Rule):
    code = "TR101"
    name = "unseeded-rng"
    family = "seeding"
    program = True
    summary = "A program draws random numbers but never seeds any random-number generator."
    what = """
        A program (a module with an entry point) that draws from the global generators of `random`,
        `numpy.random` or `torch` — including building a model, whose layers draw their initial weights, and a
        shuffling DataLoader — while no seeding call is on the path from the entry point. A seed set in a helper
        that the entry point calls (in this file or an imported project file) counts, and so does a helper we
        cannot see whose name says it seeds (`set_seed`, `seed_all`, ...). One finding per library, at its
        first draw.
        """
    why = """
        Without a seed every run starts from different initial weights, data order and augmentations, so two
        runs of the same code cannot be compared: a difference may be the change you made or just the seed.
        """
    example = """
        def main():
            model = nn.Linear(20, 2)          # TR101: weights drawn from an unseeded generator
            ...
        """
    instead = """
        def main():
            torchrepro.seed_everything(0)     # or random.seed / np.random.seed / torch.manual_seed
            model = nn.Linear(20, 2)
        """
    help = "seed every library at the start of the entry point: torchrepro.seed_everything(seed)"

    def check(self, ctx: Context) -> Iterator[Finding]:
        if any(ctx.summary.has(SEED, lib) for lib in K.LIBS):
            return
        for lib in K.LIBS:
            first = _first_draw(ctx, lib)
            if first is not None:
                node, detail = first
                yield Finding(node, f"{K.LIB_LABEL[lib]} draws random numbers here ({detail}), but no generator is "
                                    "seeded on the path from the entry point")


class PartialSeeding(Rule):
    code = "TR102"
    name = "partial-seeding"
    family = "seeding"
    program = True
    summary = "Some libraries are seeded, but another one that draws random numbers is not."
    what = """
        A program that seeds one library (typically only `torch.manual_seed`) while another library's global
        generator (`random` or `numpy.random`) also draws random numbers and is never seeded on the path from
        the entry point.
        """
    why = """
        Each library has its own generator: `torch.manual_seed` does not seed NumPy or `random`. Augmentations,
        sampling or splits drawn from the unseeded one differ in every run, although the code looks seeded.
        """
    example = """
        torch.manual_seed(0)
        idx = np.random.permutation(len(data))   # TR102: numpy.random is never seeded
        """
    instead = """
        torchrepro.seed_everything(0)            # random, numpy and torch together
        idx = np.random.permutation(len(data))
        """
    help = "seed every library that draws, e.g. torchrepro.seed_everything(seed) instead of torch.manual_seed"

    def check(self, ctx: Context) -> Iterator[Finding]:
        summary = ctx.summary
        seeded = [lib for lib in K.LIBS if summary.has(SEED, lib)]
        if not seeded:
            return
        for lib in K.LIBS:
            if lib in seeded:
                continue
            first = _first_draw(ctx, lib)
            if first is not None:
                node, detail = first
                seeds = summary.first(SEED, seeded[0])
                labels = " and ".join(K.LIB_LABEL[s] for s in seeded)
                yield Finding(node, f"{K.LIB_LABEL[lib]} draws random numbers here ({detail}) but is never seeded; "
                                    f"only {labels} {'is' if len(seeded) == 1 else 'are'} ({_seed_site(ctx, seeds)})",
                              f"seed it too: {K.LIB_SEEDER[lib]}, or torchrepro.seed_everything(seed) for all")


class SeedAfterDraw(Rule):
    code = "TR103"
    name = "seed-after-draw"
    family = "seeding"
    program = True
    summary = "Random numbers (often a model's initial weights) are drawn before the generator is seeded."
    what = """
        On the path from the entry point, a library's first draw comes before its first seed. The common case
        is a model built before the seed is set: the Hugging Face pattern of
        `AutoModelForSequenceClassification.from_pretrained(...)` (whose new head is initialised randomly)
        followed by `Trainer(...)`, which only seeds in its constructor.
        """
    why = """
        The seed covers only what is drawn after it. Weights initialised before the seed differ in every run,
        so runs that look seeded start from different models.
        """
    example = """
        model = AutoModelForSequenceClassification.from_pretrained(name)   # TR103
        trainer = Trainer(model=model, args=args)                          # seeds here, too late
        """
    instead = """
        set_seed(args.seed)                                                # before the model is built
        model = AutoModelForSequenceClassification.from_pretrained(name)
        trainer = Trainer(model=model, args=args)      # or Trainer(model_init=..., args=args)
        """
    help = "move the seeding call before the first draw (before the model is built)"

    def check(self, ctx: Context) -> Iterator[Finding]:
        summary = ctx.summary
        for lib in K.LIBS:
            seed, draw = summary.first(SEED, lib), summary.first(DRAW, lib)
            if seed is None or draw is None or summary.position(draw) > summary.position(seed):
                continue
            model = ctx.summary.first("model")
            if model is not None and model.chain == draw.chain:
                what = f"the model is built here ({_describe(ctx.module, model)}), so its initial weights are drawn"
            else:
                what = f"{K.LIB_LABEL[lib]} draws random numbers here ({_describe(ctx.module, draw)})"
            yield Finding(draw.site_in(ctx.module),
                          f"{what} before {K.LIB_LABEL[lib]} is seeded ({_seed_site(ctx, seed)}); the seed does not "
                          "cover them")


def _generator_left_unseeded(module: Module, call: ast.Call) -> bool:
    """Whether ``torch.Generator(...)`` is used without a seed: passed as an argument, or stored in a name or
    attribute on which no ``.manual_seed(...)``/``.set_state(...)`` is called anywhere in the module. A chained
    ``.manual_seed(...)`` seeds it; a returned generator may be seeded by the caller (not reported)."""
    parent = module.parents.get(call)
    if parent.__class__ is ast.keyword or parent.__class__ is ast.Expr:
        return True
    if parent.__class__ in (ast.Assign, ast.AnnAssign):
        targets = parent.targets if parent.__class__ is ast.Assign else [parent.target]
        names = {dotted(t) for t in targets} - {None}
        for other, _scope in module.calls_to(methods=("manual_seed", "set_state")):
            if dotted(other.func.value) in names:
                return False
        return bool(names)
    return False


class UnseededGenerator(Rule):
    code = "TR104"
    name = "unseeded-generator"
    family = "seeding"
    summary = "A generator object is created without a seed."
    what = """
        `numpy.random.default_rng()`, `numpy.random.RandomState()`, `random.Random()`, NumPy bit generators
        and `SeedSequence()` without a seed (or with `None`), and `torch.Generator()` that is never given
        `manual_seed` (chained, or later on the name it is stored in).
        """
    why = """
        NumPy and `random` generators without a seed take one from the operating system: every run differs,
        whatever the global seed. A `torch.Generator()` without `manual_seed` starts from a fixed default
        seed that ignores your seed: changing the seed does not change its stream, and every generator built
        this way produces the same numbers.
        """
    example = """
        self.rng = np.random.default_rng()          # TR104
        g = torch.Generator()                       # TR104: never seeded
        """
    instead = """
        self.rng = np.random.default_rng(seed)
        g = torch.Generator().manual_seed(seed)
        """
    help = "pass the seed: np.random.default_rng(seed), random.Random(seed), torch.Generator().manual_seed(seed)"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        for call, _scope in module.calls_to((K.TORCH_GENERATOR, *K.RNG_CONSTRUCTORS)):
            qual = module.qual(call.func)
            if qual == K.TORCH_GENERATOR:
                if _generator_left_unseeded(module, call):
                    yield Finding(call, "torch.Generator() is never given a seed: it starts from a fixed default "
                                        "seed that ignores yours, the same for every generator built this way",
                                  "seed it: torch.Generator().manual_seed(seed)")
                continue
            spec = K.RNG_CONSTRUCTORS.get(qual)
            if spec is None or has_splat(call):
                continue
            seed = argument(call, *spec)
            if seed is None or constant(seed, "") is None:
                short = qual.replace("numpy.", "np.", 1)
                yield Finding(call, f"{short}() without a seed takes its seed from the operating system, so every "
                                    "run draws different numbers", f"pass a seed: {short}(seed)")


_STRINGY = ("name", "tag", "path", "dir", "file", "str", "text")


class NondeterministicSeed(Rule):
    code = "TR105"
    name = "nondeterministic-seed"
    family = "seeding"
    summary = "A seed comes from the clock, the OS, a uuid or `hash()` of a string — or no seed is given at all."
    what = """
        A seeding call (`random.seed`, `np.random.seed`, `torch.manual_seed`, `seed_everything`, `set_seed`,
        `Generator.manual_seed`, `default_rng`, ...) whose seed is computed from `time.time()`,
        `datetime.now()`, `os.urandom`, `os.getpid()`, `uuid`, `secrets`, `id()` or `hash()` of a string
        (directly or through a local variable); and calls that seed from the OS: `random.seed()`,
        `np.random.seed()` and `np.random.seed(None)`, `torch.seed()`, `Generator.seed()`.
        """
    why = """
        The code looks seeded, but the seed differs in every run. `hash()` of a `str` is randomised per
        process unless `PYTHONHASHSEED` is set before Python starts.
        """
    example = """
        seed = int(time.time())
        torch.manual_seed(seed)                     # TR105
        """
    instead = """
        seed = args.seed                            # a fixed value, logged with the run
        torch.manual_seed(seed)
        """
    help = "use a fixed seed (a command-line option with a default) and log it"

    def check(self, ctx: Context) -> Iterator[Finding]:
        module = ctx.module
        by_qual, by_attr, by_name = module.index
        candidates = module.calls_to([q for q in by_qual if "seed" in q.lower() or q in K.SEEDERS
                                      or q in K.RNG_CONSTRUCTORS],
                                     methods=[m for m in by_attr if "seed" in m.lower()],
                                     bare=[n for n in by_name if "seed" in n.lower()])
        for call, scope in candidates:
            qual = module.qual(call.func)
            func = call.func
            attr = func.attr if func.__class__ is ast.Attribute else None
            seed_expr: ast.expr | None = None
            if qual in K.SEEDERS and K.SEEDERS[qual][1] is not None:
                _libs, pos, keywords = K.SEEDERS[qual]
                seed_expr = argument(call, pos, keywords)
                if seed_expr is None and qual in K.ENTROPY_SEEDERS and not call.args and not call.keywords:
                    yield Finding(call, K.ENTROPY_SEEDERS[qual] + ", so every run differs")
                    continue
                if seed_expr is not None and constant(seed_expr, "") is None and qual in K.ENTROPY_SEEDERS:
                    yield Finding(call, K.ENTROPY_SEEDERS[qual].replace("without an argument", "with None")
                                  + ", so every run differs")
                    continue
            elif qual in K.ENTROPY_SEEDERS:
                yield Finding(call, K.ENTROPY_SEEDERS[qual] + ", so every run differs")
                continue
            elif qual in K.RNG_CONSTRUCTORS:
                seed_expr = argument(call, *K.RNG_CONSTRUCTORS[qual])
            elif attr == "seed" and not call.args and not call.keywords and _is_torch_generator(module, scope,
                                                                                               func.value):
                yield Finding(call, "Generator.seed() sets a nondeterministic seed taken from the OS, so every "
                                    "run differs")
                continue
            elif attr in ("manual_seed", "seed_everything") or is_assumed_seeder(qual or dotted(func) or ""):
                seed_expr = argument(call, 0, ("seed",))
            if seed_expr is None:
                continue
            source = _entropy_source(module, scope, seed_expr, 0)
            if source:
                yield Finding(call, f"the seed comes from {source}, so it differs in every run")


def _is_torch_generator(module: Module, scope: Scope, expr: ast.AST) -> bool:
    if expr.__class__ is ast.Call:
        return module.qual(expr.func) == K.TORCH_GENERATOR
    if expr.__class__ is ast.Name:
        return any(_is_torch_generator(module, scope, value) for value in scope.values_of(expr.id))
    return False


def _entropy_source(module: Module, scope: Scope, expr: ast.AST, depth: int) -> str:
    """What makes ``expr`` differ from run to run, when it always does ("" if not, or only in a fallback:
    ``seed or int(time.time())``, a name also assigned a fixed value, a function parameter)."""
    cls = expr.__class__
    if cls is ast.Call:
        qual = module.qual(expr.func)
        source = K.NONDETERMINISTIC_SOURCES.get(qual or "")
        if source:
            return source
        if module.is_builtin(expr.func, "id"):
            return K.NONDETERMINISTIC_SOURCES["id"]
        if module.is_builtin(expr.func, "hash") and expr.args and _stringy(expr.args[0]):
            return "hash() of a str, which is randomised per process unless PYTHONHASHSEED is set"
    if cls is ast.BoolOp or cls is ast.IfExp:
        branches = expr.values if cls is ast.BoolOp else [expr.body, expr.orelse]
        sources = [_entropy_source(module, scope, b, depth) for b in branches]
        return sources[0] if all(sources) else ""
    if cls is ast.Name:
        values = scope.values_of(expr.id)
        if depth >= 3 or not values or _is_parameter(scope, expr.id):
            return ""
        sources = [_entropy_source(module, scope, v, depth + 1) for v in values]
        return sources[0] if all(sources) else ""
    for child in ast.iter_child_nodes(expr):  # arithmetic or conversion of a varying value varies too
        source = _entropy_source(module, scope, child, depth)
        if source:
            return source
    return ""


def _is_parameter(scope: Scope | None, name: str) -> bool:
    while scope is not None:
        node = scope.node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            if any(a.arg == name for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)):
                return True
        if name in scope.assigns:
            return False
        scope = scope.parent
    return False


def _stringy(expr: ast.AST) -> bool:
    for node in ast.walk(expr):
        if node.__class__ is ast.Constant and isinstance(node.value, str) or node.__class__ is ast.JoinedStr:
            return True
        name = node.id if node.__class__ is ast.Name else node.attr if node.__class__ is ast.Attribute else ""
        if name and name.lower().endswith(_STRINGY):
            return True
        if node.__class__ is ast.Call and node.func.__class__ is ast.Name and node.func.id in ("str", "repr"):
            return True
    return False


RULES = (UnseededRng, PartialSeeding, SeedAfterDraw, UnseededGenerator, NondeterministicSeed)
