"""Seeding: random-number generators that are never seeded, seeded too late, or seeded with a value that changes."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from .. import knowledge as K
from ..calls import argument, constant, has_splat, is_true, names_in
from ..flow import DRAW, MODEL, SEED, Event, Spawn, Summary, classify_call, draw_of, is_assumed_seeder
from ..module import Module, Scope, dotted
from ..rule import Context, Finding, Rule

Process = tuple[Summary, Spawn | None]


def _processes(ctx: Context) -> list[Process]:
    """The program's own process and the processes it spawns, each with its own events."""
    return ctx.walker.processes(ctx.summary)


def _first_draw(ctx: Context, events: Summary, lib: str, fallback: bool) -> tuple[ast.AST, str] | None:
    """Where ``lib`` first draws in a process; with ``fallback``, else a draw anywhere in the module that no
    walk reached (when the program draws from ``lib`` nowhere on its paths)."""
    event = events.first(DRAW, lib)
    if event is not None:
        return event.site_in(ctx.module), _describe(ctx.module, event)
    if not fallback or ctx.summary.has(DRAW, lib):
        return None
    draws = [d for d in ctx.draws[lib] if not ctx.walker.reached(d[2])]
    if draws:
        call, detail, _scope = min(draws, key=lambda d: (d[0].lineno, d[0].col_offset))
        return call, detail
    return None


def _describe(module: Module, event: Event) -> str:
    if event.module is module:
        return event.detail
    return f"{event.detail} at {event.where()}"


def _seed_site(ctx: Context, event: Event) -> str:
    node = event.site_in(ctx.module)
    return f"{event.detail}, line {getattr(node, 'lineno', 1)}"


def _in_process(ctx: Context, spawn: Spawn | None) -> str:
    """`` in worker(), which mp.spawn (line 12) runs in a new process`` ("" for the program's own process)."""
    if spawn is None:
        return ""
    line = getattr(spawn.site_in(ctx.module), "lineno", 1)
    return f" in {spawn.target.name}(), which {spawn.api} (line {line}) runs in a new process"


class UnseededRng(Rule):
    code = "TR101"
    name = "unseeded-rng"
    family = "seeding"
    program = True
    summary = "A program draws random numbers but never seeds any random-number generator."
    what = """
        A program (a module with an entry point) that draws from the global generators of `random`,
        `numpy.random` or `torch` — including building a model, whose layers draw their initial weights, and a
        shuffling DataLoader, and sampling (`torch.multinomial`, `generate(do_sample=True)`) — while no seeding
        call is on the path from the entry point. A seed set in a helper that the entry point calls (in this
        file or an imported project file) counts, and so does a helper we cannot see whose name says it seeds
        (`set_seed`, `seed_all`, ...). A function run in a new process (`mp.spawn(fn)`, `Process(target=fn)`,
        unless forked) is an entry point of its own: a seed inside it counts, and its draws are reported when
        neither it nor the parent seeds (a seed only in the parent is TR106). Loading pretrained weights
        (`from_pretrained` without a new task head, `pretrained=True`, `weights=` a string or a `*_Weights`
        entry, but not `"DEFAULT" if args.pretrained else None` or an option that may be None) and greedy
        decoding draw nothing that matters, nor do torchvision's look-ups (`list_models`, `get_weight`, the
        `*_Weights` enums). One finding per library and process, at its first draw.
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
        fallback = not any(ctx.summary.has(SEED, lib) for lib in K.LIBS)
        seen: set[tuple[int, str]] = set()
        for events, spawn in _processes(ctx):
            if any(events.has(SEED, lib) for lib in K.LIBS):
                continue
            where = "on the path from the entry point" if spawn is None else "in that process"
            for lib in K.LIBS:
                if spawn is not None and lib in spawn.seeded:
                    continue  # seeded in the parent only: TR106
                first = _first_draw(ctx, events, lib, fallback and spawn is None)
                if first is not None and (id(first[0]), lib) not in seen:
                    seen.add((id(first[0]), lib))
                    node, detail = first
                    yield Finding(node, f"{K.LIB_LABEL[lib]} draws random numbers here ({detail})"
                                        f"{_in_process(ctx, spawn)}, but no generator is seeded {where}")


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
        seen: set[tuple[int, str]] = set()
        for events, spawn in _processes(ctx):
            seeded = [lib for lib in K.LIBS if events.has(SEED, lib)]
            if not seeded:
                continue
            for lib in K.LIBS:
                if lib in seeded or (spawn is not None and lib in spawn.seeded):
                    continue
                first = _first_draw(ctx, events, lib, spawn is None)
                if first is None or (id(first[0]), lib) in seen:
                    continue
                seen.add((id(first[0]), lib))
                node, detail = first
                seeds = events.first(SEED, seeded[0])
                labels = " and ".join(K.LIB_LABEL[s] for s in seeded)
                yield Finding(node, f"{K.LIB_LABEL[lib]} draws random numbers here ({detail}){_in_process(ctx, spawn)} "
                                    f"but is never seeded{' there' if spawn else ''}; only {labels} "
                                    f"{'is' if len(seeded) == 1 else 'are'} ({_seed_site(ctx, seeds)})",
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
        seen: set[tuple[int, str]] = set()
        for events, spawn in _processes(ctx):
            for lib in K.LIBS:
                seed, draw = events.first(SEED, lib), events.first(DRAW, lib)
                if seed is None or draw is None or events.position(draw) > events.position(seed):
                    continue
                if spawn is not None and lib in spawn.seeded:
                    continue  # the parent seeded it: TR106
                node = draw.site_in(ctx.module)
                if (id(node), lib) in seen:
                    continue
                seen.add((id(node), lib))
                model = events.first(MODEL)
                if model is not None and model.chain == draw.chain:
                    what = f"the model is built here ({_describe(ctx.module, model)}), so its initial weights are drawn"
                else:
                    what = f"{K.LIB_LABEL[lib]} draws random numbers here ({_describe(ctx.module, draw)})"
                yield Finding(node, f"{what}{_in_process(ctx, spawn)} before {K.LIB_LABEL[lib]} is seeded "
                                    f"({_seed_site(ctx, seed)}); the seed does not cover them")


_METHOD_NOTE = {
    None: " (with the spawn or forkserver start method, the default except on Linux before Python 3.14)",
    "forkserver": " (start method forkserver)",
}


class SeedDoesNotReachSpawnedProcess(Rule):
    code = "TR106"
    name = "seed-does-not-reach-spawned-process"
    family = "seeding"
    program = True
    summary = "A program seeds, then starts a process with the spawn method; the process draws, unseeded."
    what = """
        A function run in a new process — `torch.multiprocessing.spawn(fn)` / `mp.spawn(fn)`,
        `start_processes(fn)`, `multiprocessing.Process(target=fn)` (also `torch.multiprocessing` and
        `get_context(...).Process`) — that draws from a library's global generator (building a model, shuffling,
        sampling) without seeding it first, while the parent seeded that library before starting the process. The
        spawned function is an entry point of its own: a seed inside it, or in a helper it calls, counts, and so
        does one at the top level of the main module outside `if __name__ == "__main__":`, which the new
        process runs again when it re-imports the module. Not reported when the process is forked
        (`get_context("fork")`, `set_start_method("fork")`, or `start_processes(..., start_method="fork")`),
        since a forked child inherits the parent's generators; threads share them too. A process whose
        function seeds nothing while the parent seeds nothing either is reported by TR101.
        """
    why = """
        The spawn and forkserver start methods run the function in a fresh interpreter: its generators are
        seeded from the operating system, not from the parent's seed. `mp.spawn` always spawns; plain
        `multiprocessing` spawns by default on macOS and Windows and uses forkserver on Linux from Python
        3.14. The parent's `torch.manual_seed` covers only the parent, so each worker builds its model and
        draws its data order and augmentations from a different random state in every run, although the
        program looks seeded.
        """
    example = """
        def main_worker(rank, args):
            model = resnet50()                          # TR106: the seed in main() does not reach this process
        def main():
            torch.manual_seed(args.seed)
            mp.spawn(main_worker, nprocs=4, args=(args,))
        """
    instead = """
        def main_worker(rank, args):
            torchrepro.seed_everything(args.seed)       # in the process itself (add the rank where ranks differ)
            model = resnet50()
        """
    help = "seed at the start of the function the new process runs (e.g. torchrepro.seed_everything(seed) there)"

    def check(self, ctx: Context) -> Iterator[Finding]:
        seen: set[tuple[int, str]] = set()
        for events, spawn in _processes(ctx):
            if spawn is None:
                continue
            for lib in K.LIBS:
                draw, seed = events.first(DRAW, lib), events.first(SEED, lib)
                if draw is None or lib not in spawn.seeded or (
                        seed is not None and events.position(seed) < events.position(draw)):
                    continue
                node = draw.site_in(ctx.module)
                if (id(node), lib) in seen:
                    continue
                seen.add((id(node), lib))
                yield Finding(node, f"{K.LIB_LABEL[lib]} draws random numbers here ({_describe(ctx.module, draw)})"
                                    f"{_in_process(ctx, spawn)}{_METHOD_NOTE.get(spawn.method, '')}: "
                                    f"{_parent_seed(ctx, spawn, lib)} does not reach that process, whose generators "
                                    "start from a random state")


def _parent_seed(ctx: Context, spawn: Spawn, lib: str) -> str:
    """``the seed set before it (torch.manual_seed, line 12)``."""
    event = ctx.summary.own.first(SEED, lib)
    return "the seed set before it" + (f" ({_seed_site(ctx, event)})" if event is not None else "")


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
    summary = ("A seed comes from the clock, the OS, a uuid, `hash()` of a string or an unseeded generator — or "
               "no seed is given at all.")
    what = """
        A seeding call (`random.seed`, `np.random.seed`, `torch.manual_seed`, `seed_everything`, `set_seed`,
        `Generator.manual_seed`, `default_rng`, ...) whose seed is computed from `time.time()`,
        `datetime.now()`, `os.urandom`, `os.getpid()`, `uuid`, `secrets`, `id()`, `hash()` of a string, or a
        draw from a global generator that is not seeded before it (`seed = random.randint(1, 10000)`;
        `random.seed(args.seed)` first makes a derived seed fine) — directly or through a local variable or
        attribute; and calls that seed from the OS: `random.seed()`, `np.random.seed()` and
        `np.random.seed(None)`, `torch.seed()`, `Generator.seed()`. A seed that varies only when none is given
        (`args.seed or int(time.time())`, `if args.seed is None: args.seed = random.randint(...)`) is reported
        too, unless the option (`add_argument("--seed", type=int, default=1)`) or the parameter (`seed=0`) has
        a fixed default, so that the random choice never runs unless asked for; when the chosen value is
        printed or logged afterwards (in the same function, or the whole options object), the message says so.
        One finding per varying value, at the first seeding call that uses it. Also a seed set only when a seed
        option is given, which the default command does not seed: a seeding call under
        `if args.seed is not None:` (or `if args.seed:`, `if args.seed >= 0:`, the `else` of
        `if args.seed is None:`) while the option's default skips it (`add_argument("--seed", default=None)`, no
        default, or `default=0` tested for truth), directly or in a helper that every call in the module gives
        the option (`set_seed(args.seed)`), when nothing else in that function seeds in the default run; one
        finding per `if`. Not when the option is required, the program assigns it (`args.seed = cfg.seed`), or
        its default passes the test.
        """
    why = """
        The code looks seeded, but the seed differs in every run. `hash()` of a `str` is randomised per
        process unless `PYTHONHASHSEED` is set before Python starts. A seed drawn at random and never logged
        is lost with the run: that run can never be repeated. One that is printed still makes the program's
        default command give a different run every time: repeating one means reading the log and passing the
        value back by hand. A seed set only under `if args.seed is not None:` leaves the default command
        unseeded: the script looks reproducible, but only runs given `--seed` are.
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
        seen: set[int] = set()  # the varying values reported (one finding for a seed given to several calls)
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
            finding = _judge_seed(ctx, scope, call, seed_expr, seen) if seed_expr is not None else None
            if finding is not None:
                yield finding
        yield from _unseeded_by_default(module, candidates)


# --- seeds set only when a seed option is given ------------------------------------------------------------------
@dataclass(frozen=True)
class _Option:
    """A command-line option (``add_argument("--seed", ...)``): its flag as written and its default value."""

    dest: str
    flag: str
    default: object
    call: ast.Call


_UNKNOWN = NotImplemented  # a value the linter cannot know
_COMPARE = {ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b, ast.Eq: lambda a, b: a == b,
            ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}
_ACTION_DEFAULTS = {"store_true": False, "store_false": True, "count": None, "store_const": None, "append": None,
                    "append_const": None, "extend": None}


def _seed_argument(module: Module, call: ast.Call) -> ast.expr | None:
    """The seed a seeding call is given (None for a call that is not one, or restores a state)."""
    qual = module.qual(call.func)
    if qual in K.SEEDERS:
        _libs, pos, keywords = K.SEEDERS[qual]
        return argument(call, pos, keywords) if pos is not None else None
    func = call.func
    if func.__class__ is ast.Attribute and func.attr in ("manual_seed", "seed_everything"):
        return argument(call, 0, ("seed",))
    if qual not in K.RNG_CONSTRUCTORS and is_assumed_seeder(qual or dotted(func) or ""):
        return argument(call, 0, ("seed",))
    return None


def _option_default(module: Module, call: ast.Call) -> object:
    """The default of the option ``add_argument`` declares (``_UNKNOWN`` when it is required or not a literal)."""
    if is_true(argument(call, None, ("required",))):
        return _UNKNOWN
    flags = [constant(a) for a in call.args]
    if flags and isinstance(flags[0], str) and not flags[0].startswith("-") and constant(
            argument(call, None, ("nargs",))) not in ("?", "*"):
        return _UNKNOWN  # a positional argument: always given
    default = argument(call, None, ("default",))
    if default is not None:
        return constant(default)
    action = constant(argument(call, None, ("action",)), None)
    return _ACTION_DEFAULTS.get(action, _UNKNOWN) if isinstance(action, str) else None


def _option_of(module: Module, scope: Scope, expr: ast.Attribute) -> _Option | None:
    """The option read by ``args.seed`` (declared in ``scope``, else in the module), with a default that holds when
    the program runs: None if the module assigns the attribute or sets another default (``set_defaults``)."""
    name = dotted(expr)
    if name is None or name.count(".") != 1 or name.startswith("self."):
        return None
    dest = expr.attr
    found = next(((flag, call) for d, flag, call in _options(module, scope) if d == dest), None)
    if found is None:
        return None
    default = _option_default(module, found[1])
    for other, _scope in module.calls_to(methods=("set_defaults",)):
        if any(kw.arg == dest or kw.arg is None for kw in other.keywords):
            return None
    for store, _scope in module.stores:
        targets = store.targets if store.__class__ is ast.Assign else [getattr(store, "target", None)]
        if any(t.__class__ is ast.Attribute and t.attr == dest for t in targets):
            return None  # filled in by the program (a fallback, a config file): not judged here
    return None if default is _UNKNOWN else _Option(dest, found[0], default, found[1])


def _default_value(module: Module, scope: Scope, expr: ast.AST, depth: int = 0) -> tuple[object, _Option | None]:
    """The value of ``expr`` in a run of the default command (a literal, an option's default, through a local
    name or a parameter that every call in the module gives one option), and the option it comes from."""
    cls = expr.__class__
    if cls is ast.Constant:
        return expr.value, None
    if cls is ast.Attribute:
        option = _option_of(module, scope, expr)
        return (option.default, option) if option is not None else (_UNKNOWN, None)
    if cls is ast.Name and depth < 3:
        values = scope.values_of(expr.id)
        if len(values) == 1:
            return _default_value(module, scope, values[0], depth + 1)
        if not values and _is_parameter(scope, expr.id):
            return _argument_default(module, scope, expr.id, depth)
    return _UNKNOWN, None


def _argument_default(module: Module, scope: Scope, param: str, depth: int) -> tuple[object, _Option | None]:
    """The default-command value of parameter ``param`` of the function ``scope``: the same option at every call
    of the function in the module (``set_seed(args.seed)``)."""
    while scope is not None and not isinstance(scope.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        scope = scope.parent
    if scope is None:
        return _UNKNOWN, None
    node = scope.node
    positional = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    if param not in positional and param not in [a.arg for a in node.args.kwonlyargs]:
        return _UNKNOWN, None
    offset = 1 if scope.owner is not None and positional[:1] in (["self"], ["cls"]) else 0
    calls = module.calls_to(bare=(node.name,)) if offset == 0 else module.calls_to(methods=(node.name,))
    found: tuple[object, _Option | None] = (_UNKNOWN, None)
    for call, call_scope in calls:
        index = positional.index(param) - offset if param in positional else -1
        given = argument(call, index if index >= 0 else None, (param,))
        if given is None or has_splat(call):
            return _UNKNOWN, None
        value, option = _default_value(module, call_scope, given, depth + 1)
        if option is None or (found[1] is not None and found[1].call is not option.call):
            return _UNKNOWN, None
        found = (value, option)
    return found


def _truth(module: Module, scope: Scope, test: ast.AST) -> tuple[bool | None, _Option | None]:
    """Whether ``test`` holds in a run of the default command (None: not known), and the option it reads."""
    cls = test.__class__
    if cls is ast.UnaryOp and isinstance(test.op, ast.Not):
        truth, option = _truth(module, scope, test.operand)
        return (None if truth is None else not truth), option
    if cls is ast.BoolOp:
        parts = [_truth(module, scope, v) for v in test.values]
        known = [(t, o) for t, o in parts if t is not None]
        decisive = not isinstance(test.op, ast.And)  # `and` is false when one part is, `or` true when one is
        for truth, option in known:
            if truth is decisive:
                return truth, option
        return (not decisive, known[0][1]) if len(known) == len(parts) else (None, None)
    if cls is ast.Compare:
        if len(test.ops) != 1 or test.ops[0].__class__ not in _COMPARE:
            return None, None
        left, left_option = _default_value(module, scope, test.left)
        right, right_option = _default_value(module, scope, test.comparators[0])
        option = left_option or right_option
        if left is _UNKNOWN or right is _UNKNOWN or option is None:
            return None, None
        try:
            return bool(_COMPARE[test.ops[0].__class__](left, right)), option
        except TypeError:
            return None, None
    value, option = _default_value(module, scope, test)
    return (None, None) if value is _UNKNOWN or option is None else (bool(value), option)


def _skipping_guard(module: Module, scope: Scope, call: ast.Call) -> tuple[ast.If, _Option] | None:
    """The ``if`` around ``call`` (in its function) that a run of the default command does not enter."""
    child: ast.AST = call
    parent = module.parents.get(call)
    while parent is not None and parent is not scope.node:
        if parent.__class__ is ast.If and child is not parent.test:
            truth, option = _truth(module, scope, parent.test)
            inside = any(child is stmt for stmt in parent.body)
            if truth is not None and option is not None and truth is not inside:
                return parent, option
        child, parent = parent, module.parents.get(parent)
    return None


def _unseeded_by_default(module: Module, candidates: list[tuple[ast.Call, Scope]]) -> Iterator[Finding]:
    """Seeding calls that run only when a seed option is given (``if args.seed is not None:`` with
    ``add_argument("--seed", default=None)``), in a scope that seeds nothing in a run of the default command:
    that run is not seeded. One finding per ``if``, at its first seeding call."""
    guarded: dict[int, list[tuple[ast.Call, ast.If, _Option]]] = {}
    seeds_by_default: set[int] = set()  # scopes with a seeding call that the default command runs
    for call, scope in candidates:
        seed = _seed_argument(module, call)
        if seed is None:
            continue
        found = _skipping_guard(module, scope, call)
        if found is None:
            seeds_by_default.add(id(scope))
            continue
        guard, option = found
        _value, seed_option = _default_value(module, scope, seed)
        if (seed_option is not None and seed_option.call is option.call) or option.dest in set(names_in(seed)):
            guarded.setdefault(id(scope), []).append((call, guard, option))
    reported: set[int] = set()
    for scope_id, calls in guarded.items():
        if scope_id in seeds_by_default:
            continue
        for call, guard, option in calls:
            if id(guard) in reported:
                continue
            reported.add(id(guard))
            flag = option.flag or option.dest
            if option.default is None and argument(option.call, None, ("default",)) is None:
                reason = f"{flag} has no default, and the `if` on line {guard.lineno} skips it when {flag} is not given"
            else:
                reason = f"{flag} defaults to {option.default!r}, for which the `if` on line {guard.lineno} skips it"
            label = dotted(call.func) or "this seeding call"
            yield Finding(call, f"{label}() runs only when {flag} is given: {reason}; a run of the default command is "
                                "not seeded, so two such runs differ",
                          f"give {flag} a fixed default (add_argument(\"{flag}\", type=int, default=0)), or seed "
                          "unconditionally")


def _is_torch_generator(module: Module, scope: Scope, expr: ast.AST) -> bool:
    if expr.__class__ is ast.Call:
        return module.qual(expr.func) == K.TORCH_GENERATOR
    if expr.__class__ is ast.Name:
        return any(_is_torch_generator(module, scope, value) for value in scope.values_of(expr.id))
    return False


@dataclass(frozen=True)
class _Source:
    """What makes a seed differ from run to run (the call that varies, described), and whether always or only
    when no seed is given."""

    what: str
    always: bool
    node: ast.AST


_FALLBACK_HELP = ("give the seed option a fixed default (add_argument(\"--seed\", type=int, default=0)), so that the "
                  "default run is repeatable")


def _judge_seed(ctx: Context, scope: Scope, call: ast.Call, seed_expr: ast.expr, seen: set[int]) -> Finding | None:
    """A finding when the seed passed to ``call`` varies: always, or when no seed is given (unless an option's
    fixed default means the random choice never runs); once per varying value."""
    source = _source(ctx, scope, seed_expr, 0)
    if source is None or id(source.node) in seen:
        return None
    module = ctx.module
    if not source.always and _fixed_default(module, scope, seed_expr):
        return None
    seen.add(id(source.node))
    logged = _logged(module, scope, seed_expr, source.node)
    if source.always:
        note = "" if logged is None else (f" (it is {_logs(logged)} on line {logged.lineno}: a run can be repeated "
                                          "only by putting that value back by hand)")
        return Finding(call, f"the seed comes from {source.what}, so it differs in every run{note}")
    if logged is None:
        return Finding(call, f"when no seed is given, the seed comes from {source.what} and is not logged, so such a "
                             "run can never be repeated", _FALLBACK_HELP)
    option = _option_name(module, scope, seed_expr)
    return Finding(call, f"when no seed is given, the seed comes from {source.what}, so two runs of the same command "
                         f"differ; it is {_logs(logged)} on line {logged.lineno}, so a run can be repeated only by "
                         f"passing that value back by hand{f' ({option})' if option else ''}", _FALLBACK_HELP)


def _logs(call: ast.Call) -> str:
    """``printed`` or ``logged``: what a log call does with the seed."""
    func = call.func
    last = func.attr if func.__class__ is ast.Attribute else func.id if func.__class__ is ast.Name else ""
    return "printed" if last in ("print", "pprint") else "logged"


def _source(ctx: Context, scope: Scope, expr: ast.AST, depth: int) -> _Source | None:
    """What makes ``expr`` differ from run to run (None if nothing does). A varying value only in a fallback
    (``seed or int(time.time())``, a name also assigned a fixed value, a parameter) is not ``always``."""
    cls = expr.__class__
    if cls is ast.Call:
        what = _call_source(ctx, scope, expr)
        if what:
            return _Source(what, True, expr)
    if cls is ast.BoolOp or cls is ast.IfExp:
        branches = expr.values if cls is ast.BoolOp else [expr.body, expr.orelse]
        return _combine([_source(ctx, scope, b, depth) for b in branches])
    if cls is ast.Name:
        values = scope.values_of(expr.id)
        if depth >= 3 or not values:
            return None
        sources = [_source(ctx, scope, v, depth + 1) for v in values]
        return _combine(sources + [None] if _is_parameter(scope, expr.id) else sources)
    if cls is ast.Attribute:
        found = _attribute_source(ctx, scope, expr, depth)
        if found is not None:
            return found
    for child in ast.iter_child_nodes(expr):  # arithmetic or conversion of a varying value varies too
        found = _source(ctx, scope, child, depth)
        if found is not None:
            return found
    return None


def _combine(sources: list[_Source | None]) -> _Source | None:
    varying = [s for s in sources if s is not None]
    if not varying:
        return None
    return _Source(varying[0].what, len(varying) == len(sources) and all(s.always for s in varying), varying[0].node)


def _call_source(ctx: Context, scope: Scope, call: ast.Call) -> str:
    module = ctx.module
    qual = module.qual(call.func)
    source = K.NONDETERMINISTIC_SOURCES.get(qual or "")
    if source:
        return source
    if module.is_builtin(call.func, "id"):
        return K.NONDETERMINISTIC_SOURCES["id"]
    if module.is_builtin(call.func, "hash") and call.args and _stringy(call.args[0]):
        return "hash() of a str, which is randomised per process unless PYTHONHASHSEED is set"
    lib, detail = draw_of(qual, call) if qual else (None, "")
    if lib is not None and not _seeded_before(ctx, scope, call, lib):
        return f"{detail} (before {K.LIB_LABEL[lib]} is seeded)"
    return ""


def _attribute_source(ctx: Context, scope: Scope, expr: ast.Attribute, depth: int) -> _Source | None:
    """``opt.seed`` assigned a varying value in the same scope: always, unless the assignment is guarded by
    an ``if`` on ``opt.seed`` (``if opt.seed is None: opt.seed = random.randint(...)``)."""
    name = dotted(expr)
    if name is None or depth >= 3:
        return None
    module = ctx.module
    for store, store_scope in reversed(module.stores):
        if store_scope is not scope or store.__class__ is not ast.Assign:
            continue
        if any(dotted(t) == name for t in store.targets):
            found = _source(ctx, scope, store.value, depth + 1)
            if found is not None:
                return _Source(found.what, not _guarded_by(module, store, name), found.node)
    return None


def _guarded_by(module: Module, node: ast.AST, name: str) -> bool:
    """Whether ``node`` lies in an ``if`` whose test mentions ``name`` (a dotted name)."""
    parent = module.enclosing(node, (ast.If,))
    while parent is not None:
        if any(dotted(n) == name for n in ast.walk(parent.test) if n.__class__ is ast.Attribute):
            return True
        parent = module.enclosing(parent, (ast.If,))
    return False


def _seeded_before(ctx: Context, scope: Scope, call: ast.Call, lib: str) -> bool:
    """Whether ``lib`` is seeded before ``call`` draws: earlier in the same scope, or first seeded outside this
    scope by the program (or a program importing this module), presumably before the scope runs."""
    items = scope.items
    index = next((i for i, item in enumerate(items) if item is call), len(items))
    if any(item.__class__ is ast.Call and _seeds(ctx, scope, item, lib) for item in items[:index]):
        return True
    if scope is ctx.module.top:
        return False
    for program in [ctx.module] if ctx.is_program else ctx.importing_programs():
        first = ctx.walker.program(program).own.first(SEED, lib)
        if first is not None and not any(node is item for _mod, node in first.chain for item in items):
            return True
    return False


def _seeds(ctx: Context, scope: Scope, call: ast.Call, lib: str) -> bool:
    """Whether ``call`` seeds ``lib``: a seeding API, a helper that seeds it, or one whose name says it seeds."""
    module = ctx.module
    qual = module.qual(call.func)
    if any(kind == SEED and found == lib for kind, found, _d in classify_call(module, scope, call, qual)):
        return True
    targets = list(ctx.walker.call_targets(module, scope, call))
    if not targets:
        return qual not in K.SEEDERS and is_assumed_seeder(qual or dotted(call.func) or "")
    return any(isinstance(t, Scope) and ctx.walker.summary(t).own.has(SEED, lib) for t in targets)


def _logged(module: Module, scope: Scope, expr: ast.AST, chosen: ast.AST) -> ast.Call | None:
    """A call that prints or logs the seed held in ``expr`` (a name or attribute) after it is ``chosen``: in
    ``scope``, or anywhere for one that logs the whole object holding it (``print(args)``,
    ``wandb.init(config=args)``; in ``scope`` only after the choice, since an earlier one logs no seed yet)."""
    wanted = dotted(expr)
    if wanted is None:
        return None
    holder = wanted.partition(".")[0] if "." in wanted else None
    after = (getattr(chosen, "lineno", 0), getattr(chosen, "col_offset", 0))
    for call, call_scope in module.calls:
        if not _is_log_call(module, call) or (call_scope is scope and (call.lineno, call.col_offset) < after):
            continue
        for arg in (*call.args, *(kw.value for kw in call.keywords)):
            for node in ast.walk(arg):
                if call_scope is scope and dotted(node) == wanted:
                    return call
                if (node.__class__ is ast.Name and node.id == holder
                        and module.parents.get(node).__class__ is not ast.Attribute):
                    return call
    return None


def _is_log_call(module: Module, call: ast.Call) -> bool:
    func = call.func
    last = func.attr if func.__class__ is ast.Attribute else func.id if func.__class__ is ast.Name else ""
    return last in K.LOG_CALL_NAMES or module.qual(func) in K.LOG_CALLS


def _options(module: Module, scope: Scope) -> Iterator[tuple[str, str, ast.Call]]:
    """(destination, flag as written, call) of each ``add_argument("--seed", ...)`` of ``scope`` if it declares
    options, else of the module."""
    calls = module.calls_to(methods=("add_argument",))
    mine = [(call, sc) for call, sc in calls if sc is scope]
    for call, _scope in mine or calls:
        dest = argument(call, None, ("dest",))
        flags = [constant(a) for a in call.args if isinstance(constant(a), str)]
        flag = next((f for f in flags if f.startswith("--")), flags[0] if flags else "")
        option = constant(dest) if dest is not None else flag
        if isinstance(option, str) and option:
            yield option.lstrip("-").replace("-", "_"), flag, call


def _seed_names(scope: Scope, expr: ast.AST) -> set[str]:
    """The names the seed in ``expr`` is read from (through a local name's values)."""
    exprs = [expr, *(scope.values_of(expr.id) if expr.__class__ is ast.Name else ())]
    return {name for e in exprs for name in names_in(e)}


def _fixed_default(module: Module, scope: Scope, expr: ast.AST) -> bool:
    """Whether the seed is an option (``args.seed``, through a local name) declared with a fixed default
    (``add_argument("--seed", default=42)``), or a parameter with one (``def main(seed=0)``): the fallback
    then runs only when it is asked for."""
    names = _seed_names(scope, expr)
    for dest, _flag, call in _options(module, scope):
        default = argument(call, None, ("default",))
        if dest in names and default is not None and constant(default, None) is not None:
            return True
    exprs = [expr, *(scope.values_of(expr.id) if expr.__class__ is ast.Name else ())]
    bare = {n.id for e in exprs for n in ast.walk(e) if n.__class__ is ast.Name}
    return any(constant(default, None) is not None for name, default in _parameter_defaults(scope) if name in bare)


def _parameter_defaults(scope: Scope) -> Iterator[tuple[str, ast.expr]]:
    """(parameter, default) of the function that ``scope`` is, or lies in."""
    while scope is not None and not isinstance(scope.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        scope = scope.parent
    if scope is None:
        return
    args = scope.node.args
    positional = [*args.posonlyargs, *args.args]
    yield from zip((a.arg for a in positional[len(positional) - len(args.defaults):]), args.defaults)
    yield from ((a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)


def _option_name(module: Module, scope: Scope, expr: ast.AST) -> str:
    """The command-line flag the seed comes from (``--manualSeed``), or ""."""
    names = _seed_names(scope, expr)
    return next((flag for dest, flag, _call in _options(module, scope) if dest in names and flag.startswith("-")), "")


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


RULES = (UnseededRng, PartialSeeding, SeedAfterDraw, UnseededGenerator, NondeterministicSeed,
         SeedDoesNotReachSpawnedProcess)
