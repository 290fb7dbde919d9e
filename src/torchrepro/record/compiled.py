"""What a training script runs as ``torch.compile``'d code, and the graphs inductor compiled for it.

Two jobs, both done from inside the recorded process:

* **Noting compiled regions.** While a :class:`CompileWatch` is installed, ``torch.compile`` is wrapped: each call
  from user code (``torch.compile(model)``, ``@torch.compile``, ``model.compile()``) is noted with its call site
  (file, line, code), its target (module class or function name), backend, mode and options. At the end the
  module regions get their path among the recorded models and the prefix their parameters are named with
  (``_orig_mod.`` for ``model = torch.compile(model)``), so ``compare`` can say whether a divergent tensor belongs
  to compiled code. ``OptimizedModule`` instances compiled before recording started are found too.
* **Capturing graphs** (``check --locate`` on compiled code, :data:`CAPTURE_ENV` set). The default inductor backend
  is replaced by the same backend with a capturing ``inner_compile``: PyTorch's ``compile_fx`` still runs AOT
  autograd, the partitioner and inductor as usual, and hands each forward/backward ATen graph to
  ``compile_fx_inner``; the wrapper keeps the graph and its compiled program and, on every call, a copy of the
  program's real inputs (the last call's are kept). When the run ends (after the first divergent step),
  :func:`measure_graphs` runs each program several times on identical copies of its inputs, compiles an
  instrumented copy of the graph whose every intermediate value is an output (to see which node's kernel
  varies; when none does, :func:`bisect_graph` compiles shorter and shorter prefixes of the graph), runs the graph
  eagerly node by node, and writes fingerprints of everything to ``compiled_graphs.json``.
  :mod:`torchrepro.analysis.compilelocate` compares them (within a process and between two re-runs).

Example:
    >>> with CompileWatch() as watch:                      # doctest: +SKIP
    ...     model = torch.compile(model)
    >>> watch.regions({"": model})[0]["target"]             # doctest: +SKIP
    'GPT'
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._core.fingerprint import fingerprint
from .._core.io import atomic_write_json
from .outdir import GRAPHS

CAPTURE_ENV = "TORCHREPRO_COMPILE_CAPTURE"  # JSON {"repeats": R}: capture graphs and measure them at the end
GRAPHS_FILE = GRAPHS  # outdir knows it as torchrepro's own output
DEFAULT_REPEATS = 8
_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(__file__))  # the torchrepro package, every subpackage
_ORIG = "_orig_mod"


def _user_frame(depth: int = 2) -> tuple[str, int, str] | None:
    """(file, line, code) of the innermost frame outside torch and torchrepro, or None."""
    f: Any = sys._getframe(depth)
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith(_TORCH_DIR) or name.startswith(_OWN_DIR) or name.startswith("<frozen")
                or "/contextlib.py" in name or "/runpy.py" in name or "/functools.py" in name):
            return name, f.f_lineno, _line_text(name, f.f_lineno)
        f = f.f_back
    return None


def _line_text(path: str, line: int) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def _called_from_torch_internals() -> bool:
    """Whether ``torch.compile`` was called by torch itself (not on the user's behalf via ``Module.compile``)."""
    f: Any = sys._getframe(2)
    if f is None:
        return False
    name = f.f_code.co_filename
    return name.startswith(_TORCH_DIR) and f.f_code.co_name != "compile"


def _backend_name(backend: Any) -> str:
    if backend is None:
        return "inductor"
    if isinstance(backend, str):
        return backend
    return getattr(backend, "__name__", None) or type(backend).__name__


def _plain(value: Any) -> Any:
    """JSON-able text of an option value (never an object's repr with a memory address)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return getattr(value, "__qualname__", None) or type(value).__name__


@dataclass
class CompiledRegion:
    """One ``torch.compile`` call: where it was made, on what, and how."""

    index: int
    kind: str  # "module" (torch.compile(module), module.compile()) or "function"
    target: str  # the module's class name or the function's qualified name
    file: str | None = None
    line: int | None = None
    code: str = ""
    backend: str = "inductor"
    mode: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    fullgraph: bool = False
    dynamic: bool | None = None
    found_by: str = "torch.compile call"  # or "OptimizedModule among the models"
    module_path: str | None = None  # the compiled module's path among the recorded models ("" = a root model)
    param_prefix: str | None = None  # its parameters' names start with this ("" = every parameter)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class CompileWatch:
    """Wraps ``torch.compile`` while installed, noting each call from user code (and capturing graphs when
    ``capture`` is given: ``{"repeats": R}``). A context manager; :meth:`install`/:meth:`uninstall` restore
    ``torch.compile`` whatever happens."""

    def __init__(self, *, capture: dict[str, Any] | None = None) -> None:
        self.capture = capture
        self._regions: list[CompiledRegion] = []
        self._targets: list[tuple[CompiledRegion, Any, Any]] = []  # (region, weakref to target, to result)
        self.graphs: list[CapturedGraph] = []
        self._orig: Any = None
        self._saved_flags: dict[str, Any] = {}

    @classmethod
    def from_env(cls) -> CompileWatch:
        raw = os.environ.get(CAPTURE_ENV)
        capture = None
        if raw:
            with contextlib.suppress(ValueError):
                capture = dict(json.loads(raw))
        return cls(capture=capture)

    # --- install -----------------------------------------------------------------------------------------
    def install(self) -> CompileWatch:
        if self._orig is not None:
            return self
        orig = self._orig = torch.compile
        watch = self

        def compile(model: Any = None, **kwargs: Any) -> Any:  # noqa: A001 - stands in for torch.compile
            if model is None:  # @torch.compile(mode=...) used as a decorator factory
                return lambda fn: compile(fn, **kwargs)
            if _called_from_torch_internals():
                return orig(model, **kwargs)
            region = watch._note(model, kwargs)
            if watch.capture is not None:
                kwargs = watch._capturing(region, kwargs)
            result = orig(model, **kwargs)
            watch._targets.append((region, _weak(_module_of(model) or model), _weak(result)))
            return result

        compile.__wrapped__ = orig  # type: ignore[attr-defined]
        compile.__doc__ = orig.__doc__
        torch.compile = compile
        if self.capture is not None:  # the AOT autograd cache would skip the compilers whose graphs we capture
            import torch._functorch.config as functorch_config

            self._saved_flags["enable_autograd_cache"] = functorch_config.enable_autograd_cache
            functorch_config.enable_autograd_cache = False
        return self

    def uninstall(self) -> None:
        if self._orig is None:
            return
        torch.compile = self._orig
        self._orig = None
        if "enable_autograd_cache" in self._saved_flags:
            import torch._functorch.config as functorch_config

            functorch_config.enable_autograd_cache = self._saved_flags.pop("enable_autograd_cache")

    def __enter__(self) -> CompileWatch:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # --- noting --------------------------------------------------------------------------------------------
    def _note(self, model: Any, kwargs: dict[str, Any]) -> CompiledRegion:
        module = _module_of(model)
        target = type(module).__name__ if module is not None else (
            getattr(model, "__qualname__", None) or type(model).__name__)
        where = _user_frame(3)
        region = CompiledRegion(
            index=len(self._regions), kind="module" if module is not None else "function", target=target,
            file=where[0] if where else None, line=where[1] if where else None, code=where[2] if where else "",
            backend=_backend_name(kwargs.get("backend")), mode=kwargs.get("mode"),
            options={str(k): _plain(v) for k, v in (kwargs.get("options") or {}).items()},
            fullgraph=bool(kwargs.get("fullgraph", False)), dynamic=kwargs.get("dynamic"))
        self._regions.append(region)
        return region

    def regions(self, models: dict[str, nn.Module] | None = None) -> list[dict[str, Any]]:
        """The compiled regions as JSON, module regions located among ``models`` (``{prefix: root module}``)."""
        models = models or {}
        if not self._regions and "torch._dynamo.eval_frame" not in sys.modules:
            return []
        paths = _module_paths(models)
        for region, target, result in self._targets:
            if region.kind != "module":
                continue
            for ref in (result, target):  # the OptimizedModule first: its path includes "_orig_mod"
                obj = ref() if ref is not None else None
                if obj is not None and id(obj) in paths:
                    path = paths[id(obj)]
                    inner = f"{path}.{_ORIG}" if path and isinstance(obj, _optimized_module_type()) else (
                        _ORIG if isinstance(obj, _optimized_module_type()) else path)
                    region.module_path = path
                    region.param_prefix = f"{inner}." if inner else ""
                    break
        seen = {r.module_path for r in self._regions if r.module_path is not None}
        for path, module in _optimized_modules(models):  # compiled before recording began
            if path in seen:
                continue
            inner = f"{path}.{_ORIG}" if path else _ORIG
            self._regions.append(CompiledRegion(
                index=len(self._regions), kind="module", target=type(module._orig_mod).__name__,
                backend="unknown", found_by="OptimizedModule among the models", module_path=path,
                param_prefix=f"{inner}."))
        return [r.to_json() for r in self._regions]

    # --- capturing -----------------------------------------------------------------------------------------
    def _capturing(self, region: CompiledRegion, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with the inductor backend swapped for the same backend with a capturing inner compiler."""
        if region.backend != "inductor":
            return kwargs  # not captured: compilelocate says which backend it cannot look into
        from torch._inductor import list_mode_options

        mode = kwargs.get("mode")
        patches = dict(list_mode_options(mode, kwargs.get("dynamic"))) if mode not in (None, "default") else {}
        patches.update(kwargs.get("options") or {})
        out = {k: v for k, v in kwargs.items() if k not in ("backend", "mode", "options")}
        out["backend"] = _CaptureBackend(self, region, patches)
        return out


def _weak(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _module_of(model: Any) -> nn.Module | None:
    """The module compiled by ``torch.compile(model)``: the module, or the module of ``module._call_impl``."""
    if isinstance(model, nn.Module):
        return model
    owner = getattr(model, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def _optimized_module_type() -> type:
    from torch._dynamo.eval_frame import OptimizedModule

    return OptimizedModule


def _module_paths(models: dict[str, nn.Module]) -> dict[int, str]:
    """``{id(module): path}`` over the models' modules, paths prefixed as the recorder prefixes parameter names."""
    out: dict[int, str] = {}
    for prefix, model in models.items():
        for name, module in model.named_modules(remove_duplicate=False):
            path = ".".join(p for p in (prefix, name) if p)
            out.setdefault(id(module), path)
    return out


def _optimized_modules(models: dict[str, nn.Module]) -> list[tuple[str, nn.Module]]:
    if "torch._dynamo.eval_frame" not in sys.modules:  # nothing was compiled (and importing dynamo costs seconds)
        return []
    kind: Any = _optimized_module_type()
    return [(".".join(p for p in (prefix, name) if p), m) for prefix, model in models.items()
            for name, m in model.named_modules() if isinstance(m, kind)]


# --- capture ---------------------------------------------------------------------------------------------
@dataclass
class CapturedGraph:
    """One ATen graph inductor compiled (a forward, backward or inference graph of a region)."""

    region: int
    kind: str
    gm: Any
    program: Any
    order: int = 0  # position of its last call among all captured programs' calls
    inputs: list[Any] | None = None  # copies of the real inputs of its last call


class _CaptureBackend:
    """Inductor, with ``inner_compile`` wrapped to keep each graph and its program (see the module docstring)."""

    def __init__(self, watch: CompileWatch, region: CompiledRegion, patches: dict[str, Any]) -> None:
        self.watch, self.region, self.patches = watch, region, patches
        self.__name__ = "inductor"

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, inner_compile=self._inner, config_patches=self.patches or None)

    def _inner(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        from torch._inductor.compile_fx import compile_fx_inner

        program = compile_fx_inner(gm, example_inputs, **kwargs)
        kind = "backward" if kwargs.get("is_backward") else ("inference" if kwargs.get("is_inference") else "forward")
        graph = CapturedGraph(self.region.index, kind, gm, program)
        self.watch.graphs.append(graph)
        cls = type(program)
        capturing = _capturing_class(cls)
        if capturing is not None:
            program.__class__ = capturing
            program._torchrepro_graph = graph  # type: ignore[attr-defined]
        return program


_CAPTURING: dict[type, type] = {}
_calls = [0]


def _capturing_class(cls: type) -> type | None:
    """A subclass of the compiled program's class whose ``__call__`` first copies the (boxed) inputs."""
    if "__call__" not in dir(cls):
        return None
    if cls not in _CAPTURING:
        def __call__(self: Any, inputs: Any) -> Any:
            graph = getattr(self, "_torchrepro_graph", None)
            if graph is not None:
                _calls[0] += 1
                graph.order = _calls[0]
                graph.inputs = [_copy(x) for x in inputs]
            return cls.__call__(self, inputs)

        _CAPTURING[cls] = type(f"Capturing{cls.__name__}", (cls,), {"__call__": __call__})
    return _CAPTURING[cls]


def _copy(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


# --- measuring -------------------------------------------------------------------------------------------
def _fp(value: Any) -> str | None:
    """Fingerprint of a tensor (or of the tensors of a tuple, joined); None for anything else."""
    if isinstance(value, torch.Tensor):
        try:
            return fingerprint(value.detach().contiguous())
        except Exception as exc:  # noqa: BLE001 - recorded, never fatal
            return f"unfingerprintable: {type(exc).__name__}"
    if isinstance(value, (list, tuple)):
        parts = [_fp(v) for v in value]
        return "|".join(p or "-" for p in parts) if any(parts) else None
    return None


def _op_name(target: Any) -> str:
    """``aten.embedding_dense_backward.default`` -> ``aten.embedding_dense_backward``."""
    text = str(target)
    for suffix in (".default", ".Tensor", ".Scalar", ".self", ".int", ".dim_IntList"):
        if text.endswith(suffix):
            return text[: -len(suffix)]
    return text


def _source(node: Any) -> tuple[str | None, int | None, str]:
    """The user's source line of a graph node, from ``node.meta["stack_trace"]`` (the innermost user frame)."""
    trace = node.meta.get("stack_trace") or ""
    found: tuple[str | None, int | None, str] = (None, None, "")
    lines = trace.splitlines()
    for i, text in enumerate(lines):
        text = text.strip()
        if not text.startswith('File "'):
            continue
        try:
            path = text.split('"')[1]
            line = int(text.split(", line ")[1].split(",")[0])
        except (IndexError, ValueError):
            continue
        if path.startswith(_TORCH_DIR) or path.startswith(_OWN_DIR):
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) else ""
        found = (path, line, code)
    return found


def _module(node: Any) -> str | None:
    """The module path of a node (for backward nodes: of the forward op that created it), relative to the region."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    name = str(list(stack.values())[-1][0])
    for prefix in ("L['self'].", "L['self']", "L['mod'].", "L['mod']", "L['s'].", "L['s']"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return name.replace("._modules['", ".").replace("['", ".").replace("']", "").lstrip(".")


def _describe_nodes(gm: Any) -> list[dict[str, Any]]:
    out = []
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "call_function"):
            continue
        file, line, code = _source(node) if node.op == "call_function" else (None, None, "")
        out.append({"name": node.name, "kind": node.op,
                    "op": _op_name(node.target) if node.op == "call_function" else None,
                    "original_aten": _op_name(node.meta["original_aten"]) if node.meta.get("original_aten") else None,
                    "module": _module(node), "file": file, "line": line, "code": code,
                    "args": [a.name for a in node.all_input_nodes]})
    return out


def _instrumented(gm: Any) -> tuple[Any, list[str]]:
    """A copy of ``gm`` that also returns every tensor-valued intermediate node (in graph order)."""
    graph = torch.fx.Graph()
    env: dict[Any, Any] = {}
    result = graph.graph_copy(gm.graph, env)
    names = []
    extra = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.meta.get("val"), torch.Tensor):
            names.append(node.name)
            extra.append(env[node])
    outputs = list(result) if isinstance(result, (list, tuple)) else [result]
    graph.output(tuple(outputs + extra))
    return torch.fx.GraphModule(gm, graph), names


def _eager_nodes(gm: Any, inputs: list[Any]) -> dict[str, str | None]:
    """Fingerprints of every node's value when the graph runs eagerly, ATen op by ATen op."""
    fps: dict[str, str | None] = {}

    class _Interp(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            value = super().run_node(n)
            if n.op in ("placeholder", "call_function"):
                fps[n.name] = _fp(value)
            return value

    with torch.no_grad():
        _Interp(gm).run(*[_copy(x) for x in inputs])
    return fps


def _eager_values(gm: Any, inputs: list[Any]) -> dict[str, Any]:
    """Every call node's value when the graph runs eagerly, ATen op by ATen op."""
    values: dict[str, Any] = {}

    class _Interp(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            value = super().run_node(n)
            if n.op == "call_function":
                values[n.name] = value
            return value

    with torch.no_grad():
        _Interp(gm).run(*[_copy(x) for x in inputs])
    return values


def _delta(x: Any, y: Any) -> dict[str, float] | None:
    """max |Δ| and max |Δ|/|y| of two float tensors of one shape (None for anything else)."""
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.shape != y.shape:
        return None
    if not (x.is_floating_point() and y.is_floating_point()) or x.numel() == 0:
        return None
    a, b = x.detach().double(), y.detach().double()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = (a - b).abs().masked_fill(same, 0.0)
    rel = (diff / b.abs()).masked_fill(same, 0.0)
    return {"max_abs": float(diff.max()), "max_rel": float(rel.nan_to_num(nan=0.0).max())}


def _output_names(gm: Any) -> list[str | None]:
    """The node behind each output of the graph (None for outputs that are not nodes)."""
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    args = out.args[0] if out is not None and out.args else []
    items = args if isinstance(args, (list, tuple)) else [args]
    return [a.name if isinstance(a, torch.fx.Node) else None for a in items]


def node_deltas(gm: Any, program: Any, names: list[str], n_out: int, inputs: list[Any]) -> dict[str, Any]:
    """How far each node's value in the instrumented compile is from its eager value, on identical inputs
    (``compare --locate`` on eager vs compiled code: the size of the difference)."""
    with torch.no_grad():
        compiled = dict(zip(names, program([_copy(x) for x in inputs])[n_out:]))
    eager = _eager_values(gm, inputs)
    return {name: d for name, value in compiled.items() if (d := _delta(value, eager.get(name))) is not None}


def _run_program(program: Any, inputs: list[Any]) -> list[str | None]:
    with torch.no_grad():
        outs = program([_copy(x) for x in inputs])
    return [_fp(o) for o in (outs if isinstance(outs, (list, tuple)) else [outs])]


def _prefix(gm: Any, k: int) -> Any:
    """The graph's first ``k`` ATen calls as a graph of their own, returning the values later nodes still need."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"][:k]
    keep = set(calls)
    graph = torch.fx.Graph()
    env: dict[Any, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node in keep:
            env[node] = graph.node_copy(node, lambda n: env[n])
    live = [env[n] for n in calls
            if isinstance(n.meta.get("val"), torch.Tensor) and any(u not in keep for u in n.users)]
    graph.output(tuple(live))
    return torch.fx.GraphModule(gm, graph)


def _varies(gm: Any, inputs: list[Any], repeats: int) -> bool:
    from torch._inductor.compile_fx import compile_fx_inner

    with torch.no_grad():
        program = compile_fx_inner(gm, [_copy(x) for x in inputs])
    # A race shows only when the threads overlap: right after a compile (inductor's compile workers still busy, a
    # loaded machine) it can take more runs. Stop at the first difference; a stable prefix costs 4 x repeats runs.
    first = tuple(_run_program(program, inputs))
    return any(tuple(_run_program(program, inputs)) != first for _ in range(4 * repeats - 1))


def bisect_graph(gm: Any, inputs: list[Any], repeats: int) -> dict[str, Any] | None:
    """The shortest prefix of the graph whose compiled code varies on identical inputs (each prefix compiled with
    its own fusions, the way the minifier shrinks a failing graph): its last node is where variation starts.
    None when even the whole graph, compiled anew, is stable."""
    n = sum(1 for node in gm.graph.nodes if node.op == "call_function")
    if not n or not _varies(_prefix(gm, n), inputs, repeats):
        return None
    lo, hi, compiles = 0, n, 1  # prefix lo is stable (0: nothing), prefix hi varies
    while hi - lo > 1:
        mid = (lo + hi) // 2
        compiles += 1
        if _varies(_prefix(gm, mid), inputs, repeats):
            hi = mid
        else:
            lo = mid
    node = [x for x in gm.graph.nodes if x.op == "call_function"][hi - 1]
    return {"node": node.name, "prefix": hi, "compiles": compiles}


def measure_graph(graph: CapturedGraph, repeats: int, *, instrument: bool = True,
                  deltas: bool = False) -> dict[str, Any]:
    """Run one captured graph ``repeats`` times on identical copies of its inputs: as compiled, as an
    instrumented compile (every node an output) and eagerly; fingerprints of everything, as JSON. When the
    program varies but no instrumented node does, bisect over prefixes of the graph (:func:`bisect_graph`).
    ``deltas``: also how far each instrumented node is from its eager value (:func:`node_deltas`)."""
    inputs = graph.inputs or []
    with contextlib.suppress(AttributeError):
        graph.program._torchrepro_graph = None  # stop capturing: these calls are measurements, not the training
    doc: dict[str, Any] = {"region": graph.region, "kind": graph.kind, "order": graph.order,
                           "nodes": _describe_nodes(graph.gm), "program": [], "compiled": [], "eager": [],
                           "errors": []}
    placeholders = [n.name for n in graph.gm.graph.nodes if n.op == "placeholder"]
    if deltas:
        doc["outputs"] = _output_names(graph.gm)
    doc["inputs"] = {name: _fp(x) for name, x in zip(placeholders, inputs)}
    for _ in range(repeats):
        doc["program"].append(_run_program(graph.program, inputs))
    try:
        from torch._inductor.compile_fx import compile_fx_inner

        if not instrument:
            raise RuntimeError("instrumented compile turned off")
        gm2, names = _instrumented(graph.gm)
        with torch.no_grad():
            program2 = compile_fx_inner(gm2, [_copy(x) for x in inputs])
            n_out = len(program2([_copy(x) for x in inputs])) - len(names)
        for _ in range(repeats):
            fps = _run_program(program2, inputs)[n_out:]
            doc["compiled"].append(dict(zip(names, fps)) | doc["inputs"])
        if deltas:
            doc["deltas"] = node_deltas(graph.gm, program2, names, n_out, inputs)
    except Exception as exc:  # noqa: BLE001 - the whole-program measurement still stands
        doc["errors"].append(f"instrumented compile failed: {type(exc).__name__}: {str(exc)[:300]}")
    node_varies = any(len({r.get(k) for r in doc["compiled"]}) > 1 for k in (doc["compiled"] or [{}])[0])
    if len({tuple(p) for p in doc["program"]}) > 1 and not node_varies:
        try:
            doc["bisect"] = bisect_graph(graph.gm, inputs, repeats)
        except Exception as exc:  # noqa: BLE001
            doc["errors"].append(f"bisection failed: {type(exc).__name__}: {str(exc)[:300]}")
    for _ in range(min(repeats, 3)):
        try:
            doc["eager"].append(_eager_nodes(graph.gm, inputs))
        except Exception as exc:  # noqa: BLE001
            doc["errors"].append(f"eager run failed: {type(exc).__name__}: {str(exc)[:300]}")
            break
    return doc


def measure_graphs(watch: CompileWatch, run_dir: str | Path, models: dict[str, nn.Module] | None = None) -> Path:
    """Measure every captured graph that ran (see :func:`measure_graph`) and write ``compiled_graphs.json``."""
    repeats = int((watch.capture or {}).get("repeats", DEFAULT_REPEATS))
    instrument = bool((watch.capture or {}).get("instrument", True))
    deltas = bool((watch.capture or {}).get("deltas", False))
    graphs = sorted((g for g in watch.graphs if g.inputs is not None), key=lambda g: g.order)
    docs = []
    for g in graphs:
        try:
            docs.append(measure_graph(g, repeats, instrument=instrument, deltas=deltas))
        except Exception as exc:  # noqa: BLE001 - say so in the file; compilelocate reports it
            docs.append({"region": g.region, "kind": g.kind, "order": g.order, "nodes": [], "program": [],
                         "compiled": [], "eager": [], "inputs": {},
                         "errors": [f"measuring failed: {type(exc).__name__}: {str(exc)[:300]}"]})
    path = Path(run_dir) / GRAPHS_FILE
    atomic_write_json(path, {"format": "torchrepro.compiled-graphs", "version": 1, "repeats": repeats,
                             "threads": torch.get_num_threads(),
                             "deterministic": torch.are_deterministic_algorithms_enabled(),
                             "inductor_rng": inductor_rng_settings(),
                             "regions": watch.regions(models), "captured": len(watch.graphs), "graphs": docs})
    return path


RNG_SETTINGS = ("fallback_random", "align_random_eager")  # torch._inductor.config: compiled vs eager random numbers


def inductor_rng_settings() -> dict[str, Any]:
    """This torch's inductor settings that align the compiled code's random numbers with eager's, as the run had
    them (a setting this torch lacks is left out), and the torch version; {} when inductor was never imported."""
    config = sys.modules.get("torch._inductor.config")
    if config is None:
        return {}
    found: dict[str, Any] = {"torch": torch.__version__}
    for name in RNG_SETTINGS:
        try:
            found[name] = bool(getattr(config, name))
        except AttributeError:
            continue
    return found
