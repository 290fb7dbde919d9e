"""Eager vs ``torch.compile``: the first compiled kernel whose output differs from eager PyTorch (layer L4).

The compiled command is re-run capturing the graphs inductor compiled (:mod:`torchrepro.record.compiled`, as
``check --locate`` does); at the first divergent step each graph runs as an instrumented compile (every node an
output) and eagerly, ATen op by ATen op, on identical copies of its real inputs. The first node whose compiled
value has other bits than its eager value while every input of it agrees is the kernel where inductor's code and
eager PyTorch part: named by its ATen op (and the op it was decomposed from), module and source line, with the
size of the difference. A random op found so (``prims.inductor_seeds``, a dropout mask) is ``compiled-rng``: the
compiled code draws other random numbers than eager (inductor's own stream), which no tolerance absorbs, and the
fix is an RNG setting (``torch._inductor.config.fallback_random``), not a tolerance. When no node differs but the
graph's real outputs do, the fused program is to blame (``compiled-graph``). Both commands compiled: their
graphs' nodes are aligned as op streams instead (:func:`graph_ops`, :mod:`.proglocate`).

Example:
    >>> doc = compiled_vs_eager(json.loads(Path("b/compiled_graphs.json").read_text()), step=1)  # doctest: +SKIP
    >>> doc["verdict"], doc["op"]["op"]                                                          # doctest: +SKIP
    ('compiled-kernel', 'aten.sum')
"""

from __future__ import annotations

from typing import Any

VERDICTS = {
    "compiled-kernel": "a compiled kernel computes differently from eager PyTorch: identical inputs, other bits",
    "compiled-rng": "the compiled code draws other random numbers than eager PyTorch: inductor generates its own "
                    "(dropout masks, torch.rand*) where eager draws them from torch's generator",
    "compiled-graph": "the compiled graph's outputs differ from eager PyTorch's, but no single node could be isolated",
    "compiled-same": "every compiled node gave eager PyTorch's bits in the traced step",
    "compiled-not-captured": "no graph compiled by inductor was captured in the traced re-run",
}
_FIX = {
    "compiled-kernel": "This is how inductor computes {op}: its generated code (fusion, reduction order, vectorised "
                       "math) need not match eager PyTorch bit for bit. Accept it with `--rtol/--atol` ({size}), or "
                       "keep this code eager: move the line{where} into a function decorated with "
                       "@torch.compiler.disable.",
    "compiled-rng": "The random numbers differ, not the arithmetic: the compiled code draws its dropout masks and "
                    "torch.rand* values from inductor's own random stream (seeded per call by {op} from torch's "
                    "generator), while eager PyTorch draws them from torch's generator op by op "
                    "(bernoulli/native_dropout, rand), so the same seed gives other masks. A tolerance cannot absorb "
                    "that: other elements are dropped and kept, so values differ by their full size; --rtol/--atol "
                    "absorb only rounding-sized differences of the same computation. To make the compiled code draw "
                    "eager's random numbers, set `torch._inductor.config.fallback_random = True` in {side}'s script "
                    "before it compiles (its random ops then run as eager kernels: slower), and compare again: what "
                    "is left, if anything, is rounding in the generated kernels, which --rtol/--atol can accept."
                    "{offers}",
    "compiled-graph": "The fused program differs from eager although each node measured alone does not: accept it "
                      "with `--rtol/--atol`, or compile with fewer fusions to isolate the kernel.",
    "compiled-same": "The divergence may come from code outside the compiled graphs (graph breaks run eagerly) or "
                     "from the optimizer step: compare both commands eagerly with `--locate`.",
    "compiled-not-captured": "Only the default inductor backend can be looked into; compile with it, or compare the "
                             "commands eagerly with `--locate`.",
}


# Ops that draw random numbers: inductor's own (its generated code's stream) and eager's (kept in a graph, or run
# through fallback_random). A node of these that differs from eager is an RNG difference, not arithmetic.
RANDOM_OPS = frozenset({
    "prims.inductor_seeds", "prims.inductor_lookup_seed", "prims.inductor_random", "prims.inductor_randint",
    "aten.rand", "aten.randn", "aten.rand_like", "aten.randn_like", "aten.randint", "aten.randint_like",
    "aten.randperm", "aten.bernoulli", "aten.bernoulli_", "aten.native_dropout", "aten.dropout", "aten.normal",
    "aten.normal_", "aten.uniform", "aten.uniform_", "aten.exponential", "aten.exponential_", "aten.multinomial",
    "aten.random_", "aten.rrelu_with_noise", "aten.poisson"})


def is_random_op(name: str | None) -> bool:
    """Whether the graph op ``name`` (``prims.inductor_seeds``, ``aten.bernoulli.p``) draws random numbers."""
    return bool(name) and ".".join(str(name).split(".")[:2]) in RANDOM_OPS


def _rng_offers(rng: dict[str, Any] | None, side: str) -> str:
    """What the compiled run's torch offers to align its random numbers with eager's, and what the run had."""
    if not rng:
        return ""
    offers = []
    if "fallback_random" in rng:
        offers.append("fallback_random (any device)")
    if "align_random_eager" in rng:
        offers.append("align_random_eager (CUDA only: eager's random numbers inside fused kernels, faster than "
                      "fallback_random)")
    if not offers:
        return ""
    had = ", ".join(f"{name} = {rng[name]}" for name in ("fallback_random", "align_random_eager") if name in rng)
    return f" The torch {side} ran ({rng.get('torch', '?')}) offers {' and '.join(offers)}; {side} ran with {had}."


def _calls(graph: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for n in graph.get("nodes", []) if n.get("kind") == "call_function"]


def _site(node: dict[str, Any], graph: dict[str, Any], i: int) -> dict[str, Any]:
    return {"op": node.get("op"), "original_aten": node.get("original_aten"), "node": node.get("name"),
            "index": i, "phase": graph.get("kind"), "module": node.get("module"), "file": node.get("file"),
            "line": node.get("line"), "code": node.get("code") or "", "region": graph.get("region")}


def _context(graph: dict[str, Any], c: dict[str, Any], e: dict[str, Any], at: int) -> list[dict[str, Any]]:
    rows = []
    nodes = _calls(graph)
    for i, n in enumerate(nodes):
        if abs(i - at) > 4:
            continue
        site = _site(n, graph, i)
        same_in = all(c.get(a) == e.get(a) for a in n.get("args", []) if a in c)
        rows.append({"row": i, "kind": "same", "a": site, "b": site, "mark": "=>" if i == at else "",
                     "inputs": "equal" if same_in else "differ",
                     "outputs": "equal" if c.get(n["name"]) == e.get(n["name"]) else "differ"})
    return rows


def compiled_vs_eager(doc: dict[str, Any], *, step: int | None, side: str = "the compiled command") -> dict[str, Any]:
    """The first captured node whose compiled value differs from its eager value on identical inputs (the
    ``locate`` document of ``compare``; see the module docstring). ``side`` names the compiled command in the fix
    (``B``)."""
    graphs = sorted(doc.get("graphs", []), key=lambda g: g.get("order", 0))
    base = {"compiled": True, "step": step, "regions": doc.get("regions") or [], "graphs": len(graphs),
            "errors": [e for g in graphs for e in g.get("errors", [])][:5], "context": []}
    for g in graphs:
        compiled, eager = g.get("compiled") or [], g.get("eager") or []
        if not compiled or not eager:
            continue
        c, e = compiled[0], eager[0]
        for i, n in enumerate(_calls(g)):
            name = n["name"]
            if name not in c or name not in e or c[name] == e[name]:
                continue
            if all(c.get(a) == e.get(a) for a in n.get("args", []) if a in c):
                varies = len({r.get(name) for r in compiled}) > 1
                difference = (g.get("deltas") or {}).get(name)
                random = is_random_op(n.get("op")) or is_random_op(n.get("original_aten"))
                verdict = "compiled-rng" if random else "compiled-kernel"
                return _finding(verdict, base, g, n, i, c, e, difference=difference, side=side,
                                rng=doc.get("inductor_rng")) | {"difference": difference, "compiled_varies": varies}
    for g in graphs:
        e = (g.get("eager") or [{}])[0]
        program = (g.get("program") or [[]])[0]
        outs = g.get("outputs") or []
        differing = [name for name, fp in zip(outs, program) if name is not None and name in e and e[name] != fp]
        if differing:
            nodes = {n["name"]: (i, n) for i, n in enumerate(_calls(g))}
            i, n = nodes.get(differing[0], (0, {"name": differing[0]}))
            return _finding("compiled-graph", base, g, n, i, (g.get("compiled") or [{}])[0], e, side=side)
    verdict = "compiled-same" if graphs else "compiled-not-captured"
    return base | {"verdict": verdict, "title": VERDICTS[verdict], "op": None, "region": None,
                   "fix": _FIX[verdict]}


def _finding(verdict: str, base: dict[str, Any], g: dict[str, Any], n: dict[str, Any], i: int, c: dict[str, Any],
             e: dict[str, Any], *, difference: dict[str, Any] | None = None, side: str = "the compiled command",
             rng: dict[str, Any] | None = None) -> dict[str, Any]:
    site = _site(n, g, i)
    region = next((r for r in base["regions"] if r.get("index") == g.get("region")), None)
    where = f" ({site['file']}:{site['line']})" if site.get("file") else ""
    name = site.get("original_aten") or site.get("op") or "this op"
    size = ("its size is above: compiled vs eager on identical inputs" if difference else
            "its size was not measured for this op: the tolerance lines above say how far the runs part")
    fix = _FIX[verdict].format(op=name, where=where, size=size, side=side, offers=_rng_offers(rng, side))
    return base | {"verdict": verdict, "title": VERDICTS[verdict], "op": site, "region": region,
                   "context": _context(g, c, e, i), "fix": fix}


def graph_ops(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A captured run's compiled graphs as one op stream (nodes with the instrumented compile's fingerprints),
    for aligning two compiled commands with :func:`torchrepro.analysis.proglocate.locate_programs`."""
    ops: list[dict[str, Any]] = []
    for g in sorted(doc.get("graphs", []), key=lambda g: g.get("order", 0)):
        c = (g.get("compiled") or [{}])[0]
        for n in _calls(g):
            ops.append({"i": len(ops), "op": n.get("op") or "?", "phase": g.get("kind"), "module": n.get("module"),
                        "file": n.get("file"), "line": n.get("line"), "code": n.get("code") or "",
                        "in": [str(c.get(a)) for a in n.get("args", []) if a in c], "out": [str(c.get(n["name"]))],
                        "rng": False})
    return ops
