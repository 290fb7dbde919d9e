"""Seeding: random-number generators that are never seeded, seeded too late, or seeded with a value that changes."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .. import knowledge as K
from ..calls import argument, constant, has_splat
from ..classify import is_assumed_seeder
from ..events import DRAW, MODEL, SEED, Event, Spawn, Summary
from ..module import Module, Scope, dotted
from ..rule import Context, Finding, Rule
from .seed_options import _unseeded_by_default
from .seed_sources import _judge_seed

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


def _is_torch_generator(module: Module, scope: Scope, expr: ast.AST) -> bool:
    if expr.__class__ is ast.Call:
        return module.qual(expr.func) == K.TORCH_GENERATOR
    if expr.__class__ is ast.Name:
        return any(_is_torch_generator(module, scope, value) for value in scope.values_of(expr.id))
    return False


RULES = (UnseededRng, PartialSeeding, SeedAfterDraw, UnseededGenerator, NondeterministicSeed,
         SeedDoesNotReachSpawnedProcess)
