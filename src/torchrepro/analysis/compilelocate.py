"""Finding the nondeterministic kernel inside ``torch.compile``'d code.

The eager op tracer (:mod:`torchrepro.record.optrace`) sees the ATen ops that run eagerly, not the kernels inductor
generates, so it cannot look into compiled regions. Instead, two re-runs capture the graphs inductor compiled and
measure them at the first divergent step (:mod:`torchrepro.record.compiled` writes ``compiled_graphs.json`` in each):

1. the compiled program of each graph, run R times on identical copies of its real inputs;
2. an instrumented compile of the same graph whose every intermediate node is an output, run R times;
3. the graph run eagerly, ATen op by ATen op;
4. when the program varies but no instrumented node does: a bisection over prefixes of the graph, each compiled
   with its own fusions, naming the node where the variation starts.

Here the measurements of both re-runs are compared (within each process, and between them when the graph's
inputs are equal): the **origin** is the first node of the instrumented compile whose output bits vary while all
of its inputs are identical: the kernel inductor generated for it is nondeterministic. It is named by its ATen op
(and the op it was decomposed from, e.g. ``aten.embedding_dense_backward``), the user's source line
(``node.meta["stack_trace"]``) and module, and whether eager PyTorch computed it identically in every run.

Example:
    >>> docs = [json.loads(Path(d, "compiled_graphs.json").read_text()) for d in ("a", "b")]  # doctest: +SKIP
    >>> result = locate_compiled(docs, step=1)                                               # doctest: +SKIP
    >>> result.verdict, result.op["original_aten"]                                           # doctest: +SKIP
    ('compiled-kernel', 'aten.embedding_dense_backward')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERDICTS = {
    "compiled-kernel": "nondeterministic compiled kernel: the code torch.compile generated gives different bits "
                       "for identical inputs",
    "compiled-graph": "nondeterministic compiled graph: a compiled graph gives different bits for identical inputs, "
                      "but no single node could be isolated",
    "compiled-not-reproduced": "the compiled graphs gave identical bits for identical inputs in the traced re-runs",
    "compiled-not-captured": "no compiled graph was captured in the traced re-runs",
}


def _node_variants(reps: list[dict[str, Any]], name: str) -> int:
    return len({r.get(name) for r in reps if name in r})


def _pairs(docs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The graphs of each re-run, paired by (region, kind, occurrence), in run 1's call order."""
    keyed: list[dict[tuple, dict[str, Any]]] = []
    for doc in docs:
        seen: dict[tuple, int] = {}
        mine: dict[tuple, dict[str, Any]] = {}
        for g in sorted(doc.get("graphs", []), key=lambda g: g.get("order", 0)):
            key = (g.get("region"), g.get("kind"))
            mine[key + (seen.get(key, 0),)] = g
            seen[key] = seen.get(key, 0) + 1
        keyed.append(mine)
    if not keyed:
        return []
    return [[k[key] for k in keyed if key in k] for key in keyed[0]]


@dataclass
class GraphFinding:
    """What the measurements of one graph (in every re-run) show."""

    region: int
    kind: str
    nodes: int
    program_variants: int  # distinct output fingerprints of the compiled program over every run pooled
    runs_pooled: int  # how many re-runs' measurements were pooled (those whose inputs equal run 1's)
    repeats: int
    origin: dict[str, Any] | None = None
    origin_variants: int = 0
    eager_variants: int | None = None  # distinct eager values of the origin node; None if not measured
    eager_graph_deterministic: bool | None = None
    errors: list[str] = field(default_factory=list)
    context: list[dict[str, Any]] = field(default_factory=list)
    method: str | None = None  # "instrumented" (every node an output) or "bisection" (over prefixes of the graph)
    compiles: int = 0  # compiles the bisection took


def _producer(nodes: list[dict[str, Any]], i: int, index: dict[str, int], measured: dict[str, Any]) -> int:
    """The node to name for node ``i``: itself, or, for a node that only takes an element of another node's
    tuple output (``operator.getitem`` of ``var_mean``, which is not measured as a whole), that node."""
    node = nodes[i]
    while "getitem" in str(node.get("op") or "") and node.get("args") and node["args"][0] in index \
            and node["args"][0] not in measured:
        i = index[node["args"][0]]
        node = nodes[i]
    return i


def _graph_finding(graphs: list[dict[str, Any]]) -> GraphFinding:
    first = graphs[0]
    pooled = [g for g in graphs if g.get("inputs") == first.get("inputs")]  # identical inputs only
    program = {tuple(p) for g in pooled for p in g.get("program", [])}
    compiled = [r for g in pooled for r in g.get("compiled", [])]
    eager = [r for g in pooled for r in g.get("eager", [])]
    nodes = [n for n in first.get("nodes", []) if n.get("kind") == "call_function"]
    finding = GraphFinding(first.get("region", 0), first.get("kind", "?"), len(nodes), len(program), len(pooled),
                           len(first.get("program", [])), errors=[e for g in graphs for e in g.get("errors", [])])
    if eager:
        finding.eager_graph_deterministic = all(len({r.get(k) for r in eager}) == 1 for k in eager[0])
    if not compiled:
        return _bisected(finding, pooled, nodes, eager)
    constant = {name for name in compiled[0] if _node_variants(compiled, name) == 1}
    index = {n["name"]: j for j, n in enumerate(nodes)}
    for i, node in enumerate(nodes):
        name = node["name"]
        if name not in compiled[0] or name in constant:
            continue
        if all(a in constant or a not in compiled[0] for a in node.get("args", [])):
            i = _producer(nodes, i, index, compiled[0])
            node, name = nodes[i], nodes[i]["name"]
            finding.origin, finding.method = node, "instrumented"
            finding.origin_variants = _node_variants(compiled, name)
            if eager and name in eager[0]:
                finding.eager_variants = _node_variants(eager, name)
            finding.context = [
                {"i": j, "op": n.get("op"), "original_aten": n.get("original_aten"), "module": n.get("module"),
                 "line": n.get("line"), "code": n.get("code"), "origin": j == i,
                 "inputs_equal": all(a in constant or a not in compiled[0] for a in n.get("args", [])),
                 "outputs_equal": n["name"] in constant or n["name"] not in compiled[0]}
                for j, n in enumerate(nodes) if abs(j - i) <= 4]
            return finding
    return _bisected(finding, pooled, nodes, eager)


def _bisected(finding: GraphFinding, pooled: list[dict[str, Any]], nodes: list[dict[str, Any]],
              eager: list[dict[str, Any]]) -> GraphFinding:
    """The node a bisection over prefixes of the graph found (when the instrumented compile isolated none)."""
    bisected: dict[str, Any] | None = next((g["bisect"] for g in pooled if g.get("bisect")), None)
    node = next((n for n in nodes if bisected and n["name"] == bisected["node"]), None)
    if node is not None:
        assert bisected is not None  # a node was found in it
        finding.origin, finding.method, finding.compiles = node, "bisection", int(bisected.get("compiles", 0))
        finding.origin_variants = finding.program_variants
        if eager and node["name"] in eager[0]:
            finding.eager_variants = _node_variants(eager, node["name"])
    return finding


@dataclass
class CompiledLocateResult:
    """Where in compiled code two runs part, and why (see the module docstring)."""

    verdict: str
    step: int | None
    regions: list[dict[str, Any]]
    findings: list[GraphFinding] = field(default_factory=list)
    finding: GraphFinding | None = None
    repeats: int = 0
    processes: int = 0
    device: str = "cpu"
    deterministic: bool = False

    @property
    def title(self) -> str:
        return VERDICTS[self.verdict]

    @property
    def region(self) -> dict[str, Any] | None:
        if self.finding is None:
            return None
        return next((r for r in self.regions if r.get("index") == self.finding.region), None)

    @property
    def op(self) -> dict[str, Any] | None:
        if self.finding is None or self.finding.origin is None:
            return None
        node = self.finding.origin
        return {"op": node.get("op"), "original_aten": node.get("original_aten"), "node": node.get("name"),
                "phase": self.finding.kind, "module": node.get("module"), "file": node.get("file"),
                "line": node.get("line"), "code": node.get("code")}

    @property
    def eager_deterministic(self) -> bool | None:
        f = self.finding
        if f is None or f.eager_variants is None:
            return None
        return f.eager_variants == 1

    @property
    def explanation(self) -> str:
        traced = self.traced
        if self.verdict == "compiled-kernel":
            op = self.op or {}
            name = op.get("op")
            if op.get("original_aten") and op.get("original_aten") != name:
                name = f"{name} (lowered from {op['original_aten']})"
            eager = {True: "eager is deterministic here; the compiled kernel is not (the same graph run eagerly, "
                           "ATen op by ATen op, gave identical bits every time).",
                     False: "eager PyTorch also varies here (the same op run eagerly gave different bits).",
                     None: "eager was not measured for this op."}[self.eager_deterministic]
            if self.finding.method == "bisection":  # type: ignore[union-attr]
                return (f"In {traced}, the compiled graph gave {self.finding.origin_variants} different results "  # type: ignore[union-attr]
                        f"for identical inputs; bisection over prefixes of the graph ({self.finding.compiles} "  # type: ignore[union-attr]
                        f"compiles) found that the variation starts at {name}: {eager}")
            return (f"In {traced}, {name} gave {self.finding.origin_variants} different results for identical "  # type: ignore[union-attr]
                    f"inputs, in the code inductor generated for it: {eager}")
        if self.verdict == "compiled-graph":
            return (f"In {traced}, the compiled {self.finding.kind} graph gave {self.finding.program_variants} "  # type: ignore[union-attr]
                    "different results for identical inputs, but an instrumented compile of it (every node an "
                    "output) did not vary: the nondeterminism needs the fused kernels of the real program.")
        if self.verdict == "compiled-not-reproduced":
            return (f"Traced: {traced}; every compiled program, every instrumented node and the eager graph gave "
                    "identical bits. The divergence may come from code outside these graphs (graph breaks run "
                    "eagerly: try `check --locate` on an eager run), or be intermittent (`--runs 3`).")
        return ("The traced re-runs captured no graph compiled by inductor: the region uses another backend, or "
                "compiled nothing before the divergent step. Only the default inductor backend can be looked into.")

    @property
    def traced(self) -> str:
        graphs = ", ".join(f"{f.kind} graph of region {f.region} ({f.nodes} nodes)" for f in self.findings) or "none"
        return (f"the FX graphs inductor compiled ({graphs}), each run {self.repeats} times with identical inputs in "
                f"each of {self.processes} re-runs at step {self.step}")

    @property
    def fix(self) -> str:
        op = self.op or {}
        where = f" at {op['file']}:{op['line']}" if op.get("file") else ""
        name = op.get("original_aten") or op.get("op") or "this op"
        if self.verdict == "compiled-kernel":
            text = ("Turn on deterministic mode before the model is compiled: `torchrepro check --deterministic -- "
                    "...` to confirm, then torch.use_deterministic_algorithms(True) (or torchrepro.deterministic()) "
                    f"before torch.compile; inductor then generates deterministic code for {name} (for scatter/"
                    "index_put it calls PyTorch's deterministic kernel instead of atomic adds).")
            if self.eager_deterministic:
                text += (f" Or exclude just this code from compilation: move the line{where} into a function "
                         "decorated with @torch.compiler.disable (it then runs eagerly, which was measured "
                         "deterministic here; it costs a graph break).")
            return text
        if self.verdict == "compiled-graph":
            return ("Turn on deterministic mode before compiling (`torchrepro check --deterministic -- ...`, then "
                    "torch.use_deterministic_algorithms(True) before torch.compile), or compile the region with "
                    "fewer fusions to isolate the kernel.")
        if self.verdict == "compiled-not-reproduced":
            return "Rerun `check --runs 3 --locate`, or trace more steps with `--locate-steps N`."
        return "Compile with the default inductor backend to locate inside compiled code, or check an eager run."

    def to_json(self) -> dict[str, Any]:
        f = self.finding
        return {
            "verdict": self.verdict, "title": self.title, "step": self.step, "compiled": True,
            "region": self.region, "op": self.op, "op_other_run": None, "op_index": None,
            "eager_deterministic": self.eager_deterministic, "explanation": self.explanation, "fix": self.fix,
            "traced_in": self.traced, "traced_steps": [self.step] if self.step is not None else [],
            "ops_traced": [sum(g.nodes for g in self.findings)] * 2, "device": self.device,
            "deterministic_kernel": None, "repeats": self.repeats, "processes": self.processes,
            "measured": None if f is None else {
                "graph": f.kind, "nodes": f.nodes, "program_variants": f.program_variants,
                "node_variants": f.origin_variants, "eager_variants": f.eager_variants, "method": f.method,
                "compiles": f.compiles,
                "eager_graph_deterministic": f.eager_graph_deterministic, "runs_pooled": f.runs_pooled},
            "graphs": [{"region": g.region, "kind": g.kind, "nodes": g.nodes, "program_variants": g.program_variants,
                        "origin": g.origin.get("name") if g.origin else None, "errors": g.errors}
                       for g in self.findings],
            "context": f.context if f is not None else [],
        }


def locate_compiled(docs: list[dict[str, Any]], *, step: int | None = None,
                    device: str = "cpu") -> CompiledLocateResult:
    """Compare the ``compiled_graphs.json`` documents of the re-runs and name the origin (module docstring)."""
    regions: list[dict[str, Any]] = next((d.get("regions") for d in docs if d.get("regions")), []) or []  # type: ignore[misc]
    result = CompiledLocateResult("compiled-not-captured", step, regions, repeats=int(docs[0].get("repeats", 0))
                                  if docs else 0, processes=len(docs), device=device,
                                  deterministic=any(d.get("deterministic") for d in docs))
    result.findings = [_graph_finding(graphs) for graphs in _pairs(docs)]
    if not result.findings:
        return result
    for finding in result.findings:  # causal order: the graphs in the order they ran
        if finding.origin is not None:
            result.verdict, result.finding = "compiled-kernel", finding
            return result
    for finding in result.findings:
        if finding.program_variants > 1:
            result.verdict, result.finding = "compiled-graph", finding
            return result
    result.verdict = "compiled-not-reproduced"
    return result
