"""Finding the first nondeterministic operation in two traced runs.

Given the op streams of two runs of the same step (see :mod:`torchrepro.record.optrace`), the **origin** is the first
op whose input fingerprints are equal in both runs while its outputs differ. Ops are paired by identity (step,
phase, op name, module path, source line, and occurrence within that identity), not by position, so an op that
only one run executes (a logging ``.item()``, a lazily created buffer) does not make every later op look
different; such ops are reported as the control flow differing only when they can explain the difference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from ..control.registry import nondeterministic_ops
from ..record.opfps import UNINITIALIZED
from ..record.optrace import COLLECTIVE_PREFIXES, EMPTY_OPS, RESIZE_OPS

# Ops that write none of the memory their output holds: what it holds was there before (fresh memory, a storage
# handed to ``set_``, the part a ``resize_`` adds, bytes ``as_strided`` reaches past its input). When their
# outputs differ while their inputs match, the difference is not theirs: those outputs are unknown in both runs
# (see locate_ops) until an op overwrites them.
_NO_WRITE_OPS = EMPTY_OPS | RESIZE_OPS | {"aten.set_", "aten._resize_output_", "aten.as_strided",
                                          "aten.as_strided_",
                                          # FSDP2: the all-gather buffer, of which it writes this rank's part only
                                          "fsdp.all_gather_copy_in"}
# Ops whose first argument gives only its shape, dtype and device, or is overwritten without being read.
_FIRST_NOT_READ = frozenset({
    "aten.copy_", "aten.fill_", "aten.zero_", "aten.set_",
    "aten.empty_like", "aten.zeros_like", "aten.ones_like", "aten.full_like", "aten.rand_like", "aten.randn_like",
    "aten.randint_like", "aten.new_empty", "aten.new_empty_strided", "aten.new_zeros", "aten.new_ones",
    "aten.new_full",
    # collectives whose first tensor is the output buffer they fill (FSDP2's all-gather and reduce-scatter)
    "c10d._allgather_base_", "c10d._reduce_scatter_base_",
})
# Ops whose last tensor argument is a buffer they write without reading it (FSDP2's all-gather output).
_LAST_NOT_READ = frozenset({"fsdp.all_gather_copy_in"})

# What torch.use_deterministic_algorithms(True) does for ops known to be nondeterministic, per device, taken
# from the op list in PyTorch's documentation of that function. "deterministic": a deterministic kernel is
# selected; "raises": no deterministic kernel exists and the op raises; "default": already deterministic.
_D, _R, _OK = "deterministic", "raises", "default"
_KNOWN: dict[str, dict[str, str]] = {
    "aten.index_put_": {"cpu": _D, "cuda": _D},
    "aten.index_put": {"cpu": _D, "cuda": _D},
    "aten._index_put_impl_": {"cpu": _D, "cuda": _D},
    "aten.put_": {"cpu": "deterministic with accumulate=True; raises with accumulate=False", "cuda": _R},
    "aten.scatter_add_": {"cpu": _OK, "cuda": _D},
    "aten.scatter_add": {"cpu": _OK, "cuda": _D},
    "aten.scatter_": {"cpu": _OK, "cuda": _D},
    "aten.scatter": {"cpu": _OK, "cuda": _D},
    "aten.scatter_reduce": {"cpu": _OK, "cuda": "deterministic for sum/mean; raises for prod"},
    "aten.scatter_reduce_": {"cpu": _OK, "cuda": "deterministic for sum/mean; raises for prod"},
    "aten.index_add_": {"cpu": _OK, "cuda": _D},
    "aten.index_add": {"cpu": _OK, "cuda": _D},
    "aten.index_copy_": {"cpu": _D, "cuda": _D},
    "aten.index_copy": {"cpu": _D, "cuda": _D},
    "aten.gather_backward": {"cpu": _OK, "cuda": _D},
    "aten.index_select_backward": {"cpu": _OK, "cuda": _D},
    "aten.cumsum": {"cpu": _OK, "cuda": _R},
    "aten.histc": {"cpu": _OK, "cuda": _R},
    "aten.bincount": {"cpu": _OK, "cuda": "raises when weights are given"},
    "aten.median": {"cpu": _OK, "cuda": _R},
    "aten.grid_sampler_2d_backward": {"cpu": _OK, "cuda": _R},
    "aten.grid_sampler_3d_backward": {"cpu": _OK, "cuda": _R},
    "aten.upsample_linear1d_backward": {"cpu": _OK, "cuda": _R},
    "aten.upsample_bilinear2d_backward": {"cpu": _OK, "cuda": _R},
    "aten.upsample_bicubic2d_backward": {"cpu": _OK, "cuda": _R},
    "aten.upsample_trilinear3d_backward": {"cpu": _OK, "cuda": _R},
    "aten._adaptive_avg_pool2d_backward": {"cpu": _OK, "cuda": _R},
    "aten._adaptive_avg_pool3d_backward": {"cpu": _OK, "cuda": _R},
    "aten.adaptive_max_pool2d_backward": {"cpu": _OK, "cuda": _R},
    "aten.avg_pool3d_backward": {"cpu": _OK, "cuda": _R},
    "aten.max_pool3d_with_indices_backward": {"cpu": _OK, "cuda": _D},
    "aten.fractional_max_pool2d_backward": {"cpu": _OK, "cuda": _R},
    "aten.fractional_max_pool3d_backward": {"cpu": _OK, "cuda": _R},
    "aten.max_unpool2d": {"cpu": _R, "cuda": _R},
    "aten.max_unpool3d": {"cpu": _R, "cuda": _R},
    "aten.reflection_pad1d_backward": {"cpu": _OK, "cuda": _R},
    "aten.reflection_pad2d_backward": {"cpu": _OK, "cuda": _R},
    "aten.reflection_pad3d_backward": {"cpu": _OK, "cuda": _R},
    "aten.replication_pad1d_backward": {"cpu": _OK, "cuda": _D},
    "aten.replication_pad2d_backward": {"cpu": _OK, "cuda": _D},
    "aten.replication_pad3d_backward": {"cpu": _OK, "cuda": _D},
    "aten.nll_loss_forward": {"cpu": _OK, "cuda": _R},
    "aten.nll_loss2d_forward": {"cpu": _OK, "cuda": _R},
    "aten._ctc_loss_backward": {"cpu": _OK, "cuda": _R},
    "aten._embedding_bag_backward": {"cpu": _OK, "cuda": "raises for mode='max'"},
    "aten.convolution": {"cpu": _OK, "cuda": _D},
    "aten.convolution_backward": {"cpu": _OK, "cuda": _D},
    "aten.mm": {"cpu": _OK, "cuda": "deterministic with CUBLAS_WORKSPACE_CONFIG set before CUDA starts"},
    "aten.addmm": {"cpu": _OK, "cuda": "deterministic with CUBLAS_WORKSPACE_CONFIG set before CUDA starts"},
    "aten.bmm": {"cpu": _OK, "cuda": "deterministic with CUBLAS_WORKSPACE_CONFIG set before CUDA starts"},
}

# The fix for a random draw that differs, by the generator it drew from (the op record's ``generator``; None
# in traces from before torchrepro recorded it).
_DRAW_FIXES: dict[str | None, str] = {
    "global": ("come from torch's global generator, which is not seeded with a fixed seed before this draw: call "
               "torchrepro.seed_everything(SEED) (or torch.manual_seed(SEED)) at the top of the script, before "
               "anything draws, or rerun with `torchrepro check --seed 0 -- ...` to confirm."),
    "private": ("come from a torch.Generator passed as generator= whose seed differs between runs (its .seed(), or "
                "a seed taken from the clock or the OS): seed it with a fixed value, generator.manual_seed(SEED)."),
    None: ("differ between runs: seed the generator it uses with a fixed value (torchrepro.seed_everything(SEED) "
           "for torch's global generator; generator.manual_seed(SEED) for a torch.Generator passed as "
           "generator=)."),
}

VERDICTS = {
    "origin": "nondeterministic operation",
    "rng": "random-number state differs",
    "control-flow": "control flow differs",
    "external-input": "inputs differ, but no traced operation produced them",
    "not-reproduced": "the divergence did not reproduce in the traced re-runs",
    "nothing-to-locate": "the runs are identical: nothing to locate",
}


def alternatives(op: str, device: str) -> list[str]:
    """Deterministic replacements the registry (:mod:`torchrepro.control.registry`) names for ``op`` on ``device``."""
    found = {e.alternative for e in nondeterministic_ops(device) if e.op == op and e.alternative}
    return sorted(a for a in found if not any(a != b and a in b for b in found))  # "x" is part of "y, or x"


def deterministic_kernel(op: str, device: str) -> str:
    """What ``torch.use_deterministic_algorithms(True)`` does for ``op`` on ``device``."""
    behaviour = _KNOWN.get(op, {}).get(device)
    if behaviour is None:
        return "unknown (not in torchrepro's table; rerun with --deterministic to find out)"
    return {_D: "yes: deterministic mode selects a deterministic kernel",
            _R: "no: there is no deterministic kernel; deterministic mode raises an error for it",
            _OK: "it is documented as deterministic on this device (check for another cause)"}.get(behaviour, behaviour)


@dataclass
class LocateResult:
    """Where two op streams of the same step first part, and why."""

    verdict: str
    step: int | None = None
    index: int | None = None
    op_a: dict[str, Any] | None = None
    op_b: dict[str, Any] | None = None
    ops_traced: tuple[int, int] = (0, 0)
    traced_steps: list[int] = field(default_factory=list)
    device: str = "cpu"
    context: list[dict[str, Any]] = field(default_factory=list)

    @property
    def from_other_rank(self) -> bool:
        """An origin that is a collective: identical inputs here, other values received from another rank."""
        return self.verdict == "origin" and self.op_a is not None and self.op_a["op"].startswith(COLLECTIVE_PREFIXES)

    @property
    def title(self) -> str:
        return "another rank's difference, received through a collective" if self.from_other_rank else \
            VERDICTS[self.verdict]

    @property
    def deterministic_kernel(self) -> str | None:
        if self.verdict != "origin" or not self.op_a or self.from_other_rank:
            return None
        return deterministic_kernel(self.op_a["op"], self.device)

    @property
    def alternatives(self) -> list[str]:
        return alternatives(self.op_a["op"], self.device) if self.verdict == "origin" and self.op_a else []

    @property
    def fix(self) -> str:
        op = self.op_a["op"] if self.op_a else ""
        where = f" ({_where(self.op_a)})" if self.op_a else ""
        if self.from_other_rank:
            return (f"{op}{where} received other values from another rank while this rank's inputs were identical: "
                    "the difference began on another rank. Locate it there: compare that rank's directories "
                    "(`torchrepro diff --locate RUN_A/rankN RUN_B/rankN`), starting with the rank whose verdict "
                    "names the earliest step.")
        if self.verdict == "origin":
            alts = self.alternatives
            instead = f" Deterministic without global deterministic mode: {'; '.join(alts)}." if alts else ""
            if _KNOWN.get(op, {}).get(self.device) == _R:
                return (f"{op} has no deterministic kernel on {self.device}: replace it{where} with an equivalent "
                        "that has one (e.g. sort + segment reduction, or compute it on CPU), or accept and bound "
                        "the difference." + instead)
            fix = (f"Run with deterministic mode: `torchrepro check --deterministic -- ...`, or call "
                   f"torchrepro.deterministic() before training; {op}{where} then uses a deterministic kernel "
                   "(or raises if it has none)." + instead)
            if op not in _KNOWN:  # e.g. an add_ of a number drawn from os.urandom: the tracer records tensors only
                fix = (f"{op} is not a known nondeterministic op, and its tensor inputs were identical: a Python "
                       "number given to it (a scalar argument, which the tracer does not record) may differ "
                       "between the runs, drawn from os.urandom, the time or an unseeded `random`: seed it. "
                       "Otherwise its kernel is nondeterministic: " + fix[0].lower() + fix[1:])
            return fix
        if self.verdict == "rng":
            generator = self.op_a.get("generator") if self.op_a else None
            return f"The random numbers drawn by {op}{where} " + _DRAW_FIXES.get(generator, _DRAW_FIXES[None])
        if self.verdict == "control-flow":
            return ("The two runs executed different operations: find what the branch or loop bound at these "
                    "lines depends on (an unseeded draw, time, the environment) and make it deterministic.")
        if self.verdict == "external-input" and self.op_a and UNINITIALIZED in _read(self.op_a):
            return (f"{op}{where} reads memory that nothing wrote (from torch.empty, new_empty, resize_ and the "
                    "like), whose bytes differ from run to run: create it with torch.zeros (or write all of it) "
                    "before reading it.")
        if self.verdict == "external-input" and self.op_a and op in _NO_WRITE_OPS:
            return (f"The memory that {op}{where} gives a tensor, without writing it, differs between runs: it "
                    "holds bytes that no traced operation wrote (a storage read from a file or made outside "
                    "torch, or memory never initialised), and later operations read them. Find where that memory "
                    "is filled, and fill it the same way in every run.")
        if self.verdict == "external-input":
            return (f"A tensor entering {op}{where} differs but was not produced by a traced torch operation: it "
                    "comes from NumPy/Python randomness, data loading in worker processes, or I/O. Seed those "
                    "sources (torchrepro.seed_everything, seed_worker, seeded numpy Generators).")
        if self.verdict == "not-reproduced" and not any(self.ops_traced):
            return ("No operation was traced in either re-run: the training ran where the tracer cannot see it. It "
                    "traces the thread where the traced step begins and the threads started while it traces; a "
                    "thread already running before then, or another process (multiprocessing, a subprocess), is not "
                    "traced. Start the training thread after the script begins (or train in the main thread), or "
                    "trace from inside the process that trains with torchrepro.trace_ops().")
        if self.verdict == "not-reproduced":
            return (f"Traced: the eager ATen ops of step(s) {', '.join(map(str, self.traced_steps)) or '-'} in two "
                    "re-runs; code compiled with torch.compile runs as generated kernels that this tracer does not "
                    "see (check names compiled regions in its summary, and --locate then measures their kernels). "
                    "If none ran, the nondeterminism is intermittent (e.g. a race that rarely changes the result): "
                    "trace more steps with `--locate-steps N`, or run `check --runs 3`.")
        return ""

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "title": self.title, "step": self.step, "op_index": self.index,
                "op": self.op_a, "op_other_run": self.op_b, "deterministic_kernel": self.deterministic_kernel,
                "fix": self.fix, "alternatives": self.alternatives, "ops_traced": list(self.ops_traced),
                "traced_steps": self.traced_steps,
                "device": self.device, "context": self.context}


def _where(op: dict[str, Any] | None) -> str:
    if not op or not op.get("file"):
        return "no user source line"
    return f"{op['file']}:{op['line']}"


def _read(op: dict[str, Any]) -> list[str]:
    """The fingerprints of the inputs whose values the op reads: not a first argument it only overwrites (an
    in-place random fill, ``copy_``, ``fill_``, ``set_``) or takes the shape of (``empty_like``, ``new_zeros``)."""
    ins: list[str] = op["in"]
    if op["op"] in _FIRST_NOT_READ or (op.get("rng") and op["op"].endswith("_")):
        return ins[1:]
    if op["op"] in _LAST_NOT_READ:
        return ins[:-1]
    return ins


def _inputs_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return _read(a) == _read(b)


def _compare_inputs(a: dict[str, Any], b: dict[str, Any], unknown_a: dict[str, int],
                    unknown_b: dict[str, int]) -> tuple[bool, list[int]]:
    """Whether the inputs the two ops read match, and for each input of unknown value (uninitialized memory in
    both runs, or memory no traced op wrote, per run: ``unknown_*``), the row its unknown value comes from (-1:
    this op's own read of uninitialized memory)."""
    ia, ib = _read(a), _read(b)
    if len(ia) != len(ib):
        return False, []
    sources: list[int] = []
    for x, y in zip(ia, ib):
        if x == y:
            if x == UNINITIALIZED:  # no fingerprint at all: the bytes may differ
                sources.append(-1)
            continue
        if x in unknown_a and y in unknown_b:
            sources.append(min(unknown_a[x], unknown_b[y]))
            continue
        return False, sources
    return True, sources


Row = tuple[int | None, int | None]  # (index in run A's ops, index in run B's ops); None: the op is not in that run


def op_identity(op: dict[str, Any]) -> tuple:
    """What an op *is*, independent of its position: step, phase, op name, module path and source line."""
    return (op.get("step"), op.get("phase"), op["op"], op.get("module"), op.get("file"), op.get("line"))


def align(ops_a: list[dict[str, Any]], ops_b: list[dict[str, Any]]) -> list[Row]:
    """Pair the ops of two runs by operation identity and occurrence (the k-th op with one identity in A is
    paired with the k-th in B), not by position: an op that only one run executes (a logging ``.item()``, a
    lazily created buffer) is a row of its own and does not shift the pairing of every op after it.

    Rows are in run A's order, with run B's unpaired ops placed just before B's next paired op."""
    seen: dict[tuple, int] = {}
    where_b: dict[tuple, int] = {}
    j: int | None
    for j, b in enumerate(ops_b):
        key = op_identity(b)
        k = seen.get(key, 0)
        seen[key] = k + 1
        where_b[key + (k,)] = j
    seen.clear()
    partner: list[int | None] = []
    for a in ops_a:
        key = op_identity(a)
        k = seen.get(key, 0)
        seen[key] = k + 1
        partner.append(where_b.get(key + (k,)))
    paired_b = {j for j in partner if j is not None}
    rows: list[Row] = []
    nxt = 0  # next of B's ops not yet placed
    for i, j in enumerate(partner):
        if j is not None:
            while nxt < j:
                if nxt not in paired_b:
                    rows.append((None, nxt))
                nxt += 1
            nxt = max(nxt, j + 1)
        rows.append((i, j))
    rows.extend((None, j) for j in range(nxt, len(ops_b)) if j not in paired_b)
    return rows


def _context(ops_a: list[dict[str, Any]], ops_b: list[dict[str, Any]], rows: list[Row], r: int,
             radius: int = 4) -> list[dict]:
    out = []
    for k in range(max(0, r - radius), min(len(rows), r + radius + 1)):
        ia, ib = rows[k]
        a = ops_a[ia] if ia is not None else None
        b = ops_b[ib] if ib is not None else None
        ref = a or b or {}
        out.append({
            "i": ia if ia is not None else ib, "i_other_run": ib, "op": a.get("op") if a else None,
            "op_other_run": b.get("op") if b else None, "phase": ref.get("phase"),
            "module": ref.get("module"), "line": ref.get("line"), "code": ref.get("code"),
            "inputs_equal": bool(a and b and _inputs_equal(a, b)),
            "outputs_equal": bool(a and b and a["out"] == b["out"]),
            "origin": k == r,
        })
    return out


@functools.cache
def alias_op(name: str) -> bool:
    """Whether the op named ``name`` (``aten.view``) only gives views of its inputs: every tensor it returns aliases
    an input without writing it (its schema's ``Tensor(a)``). It reads no value: a view of memory that differs
    between runs differs, but the difference is not its own.

    >>> alias_op("aten.view"), alias_op("aten.t"), alias_op("aten.add_"), alias_op("aten.addmm"), alias_op("x.y")
    (True, True, False, False, False)
    """
    try:
        import torch

        namespace, _, op = name.partition(".")
        packet = getattr(getattr(torch.ops, namespace), op)
        schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]
    except Exception:  # not an op torch knows here (a record from another version)
        return False
    return any(s.returns and all(r.alias_info is not None and not r.alias_info.is_write for r in s.returns)
               for s in schemas)


def _writes(op: dict[str, Any]) -> bool:
    """Whether an op may change state another op reads: in place, or a draw from a random generator."""
    return bool(op.get("rng")) or op["op"].endswith("_")


def locate_ops(ops_a: list[dict[str, Any]], ops_b: list[dict[str, Any]], *, device: str = "cpu") -> LocateResult:
    """Compare two op streams of the same traced step(s) and name where they first part.

    Ops are paired by identity (:func:`align`). The first paired op whose outputs differ is the origin (equal
    inputs), a random draw (equal inputs, random op) or the end of an untraced difference (different inputs).
    Ops that only one run executed are the control flow differing when nothing paired differs, or when they
    can explain the first difference: an unpaired op produced a differing input, or an unpaired in-place op
    or random draw came before it. Otherwise (a logging ``.item()`` in one run) they do not hide the origin.
    """
    traced = sorted({op.get("step") for op in ops_a + ops_b if op.get("step") is not None})  # type: ignore[type-var]
    base: dict[str, Any] = {"ops_traced": (len(ops_a), len(ops_b)), "traced_steps": traced, "device": device}
    rows = align(ops_a, ops_b)

    def result(verdict: str, r: int, a: dict | None, b: dict | None) -> LocateResult:
        ia, ib = rows[r]
        index = ia if ia is not None else ib
        return LocateResult(verdict, (a or b or {}).get("step"), index, a, b,
                            context=_context(ops_a, ops_b, rows, r), **base)

    def control_flow(r: int) -> LocateResult:
        a = b = None
        for ia, ib in rows[r:]:  # the first op of each run in this stretch of unpaired ops
            if ia is not None and ib is not None:
                break
            if ia is not None and a is None:
                a = ops_a[ia]
            if ib is not None and b is None:
                b = ops_b[ib]
        return result("control-flow", r, a, b)

    first_unpaired: int | None = None
    unpaired_outputs: dict[str, int] = {}  # fingerprint -> row of the unpaired op that produced it
    first_unpaired_writer: int | None = None
    # Values no traced op wrote (memory an op handed out without writing it, and what was computed from it), per
    # run: fingerprint -> the row the unknown memory comes from. Never an origin; named only if nothing else is.
    unknown_a: dict[str, int] = {}
    unknown_b: dict[str, int] = {}
    unknown_read: int | None = None  # the first row whose unknown memory a later op read, with a differing result
    for r, (ia, ib) in enumerate(rows):
        if ia is None or ib is None:
            op = ops_a[ia] if ia is not None else ops_b[ib]  # type: ignore[index]
            first_unpaired = r if first_unpaired is None else first_unpaired
            if first_unpaired_writer is None and _writes(op):
                first_unpaired_writer = r
            for fp in op["out"]:
                unpaired_outputs.setdefault(fp, r)
            continue
        a, b = ops_a[ia], ops_b[ib]
        same_in, sources = _compare_inputs(a, b, unknown_a, unknown_b)
        same_out = a["out"] == b["out"]
        if same_in and same_out:
            continue
        if same_in and (sources or a["op"] in _NO_WRITE_OPS):  # the outputs hold memory no traced op wrote
            source = min((r if k < 0 else k for k in sources), default=r)
            if sources and not alias_op(a["op"]):  # a view of unknown memory reads none of it
                unknown_read = source if unknown_read is None else min(unknown_read, source)
            for x, y in zip(a["out"], b["out"]):
                if x != y:
                    unknown_a.setdefault(x, source)
                    unknown_b.setdefault(y, source)
            continue
        if not same_in and alias_op(a["op"]):  # a view of memory that differs: unknown, as what no traced op wrote
            for x, y in zip(a["out"], b["out"]):
                if x != y:
                    unknown_a.setdefault(x, r)
                    unknown_b.setdefault(y, r)
            continue
        if not same_in:
            differing = [fp for fp in a["in"] + b["in"] if fp not in set(a["in"]) & set(b["in"])]
            made = [unpaired_outputs[fp] for fp in differing if fp in unpaired_outputs]
            if made:
                return control_flow(min(made))
            if first_unpaired_writer is not None:
                return control_flow(first_unpaired_writer)
            return result("external-input", r, a, b)
        if a.get("rng") and first_unpaired_writer is not None:  # an extra draw shifted the generator
            return control_flow(first_unpaired_writer)
        return result("rng" if a.get("rng") else "origin", r, a, b)
    if unknown_read is not None:  # nothing but memory no traced op wrote differs, and something read it
        ua, ub = rows[unknown_read]
        return result("external-input", unknown_read, ops_a[ua] if ua is not None else None,
                      ops_b[ub] if ub is not None else None)
    if first_unpaired is not None:
        return control_flow(first_unpaired)
    return LocateResult("not-reproduced", **base)
