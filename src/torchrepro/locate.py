"""Finding the first nondeterministic operation in two traced runs (layer L3).

Given the op streams of two runs of the same step (see :mod:`torchrepro.optrace`), the **origin** is the first
op whose input fingerprints are equal in both runs while its outputs differ. Before looking at values, the op
sequences themselves are compared: a different op (or source line) at the same position means the control
flow differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

VERDICTS = {
    "origin": "nondeterministic operation",
    "rng": "random-number state differs",
    "control-flow": "control flow differs",
    "external-input": "inputs differ, but no traced operation produced them",
    "not-reproduced": "the divergence did not reproduce in the traced re-runs",
    "nothing-to-locate": "the runs are identical: nothing to locate",
}


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
    def title(self) -> str:
        return VERDICTS[self.verdict]

    @property
    def deterministic_kernel(self) -> str | None:
        return deterministic_kernel(self.op_a["op"], self.device) if self.verdict == "origin" and self.op_a else None

    @property
    def fix(self) -> str:
        op = self.op_a["op"] if self.op_a else ""
        where = f" ({_where(self.op_a)})" if self.op_a else ""
        if self.verdict == "origin":
            if _KNOWN.get(op, {}).get(self.device) == _R:
                return (f"{op} has no deterministic kernel on {self.device}: replace it{where} with an equivalent "
                        "that has one (e.g. sort + segment reduction, or compute it on CPU), or accept and bound "
                        "the difference.")
            return (f"Run with deterministic mode: `torchrepro check --deterministic -- ...`, or call "
                    f"torchrepro.deterministic() before training; {op}{where} then uses a deterministic kernel "
                    "(or raises if it has none).")
        if self.verdict == "rng":
            return (f"The random numbers drawn by {op}{where} differ between runs: seed the generator it uses "
                    "(torch.Generator().manual_seed(SEED) instead of .seed()), or draw from the global RNG "
                    "seeded by torchrepro.seed_everything().")
        if self.verdict == "control-flow":
            return ("The two runs executed different operations: find what the branch or loop bound at these "
                    "lines depends on (an unseeded draw, time, the environment) and make it deterministic.")
        if self.verdict == "external-input":
            return (f"A tensor entering {op}{where} differs but was not produced by a traced torch operation: it "
                    "comes from NumPy/Python randomness, data loading in worker processes, or I/O. Seed those "
                    "sources (torchrepro.seed_everything, seed_worker, seeded numpy Generators).")
        if self.verdict == "not-reproduced":
            return ("The nondeterminism is intermittent (e.g. a race that rarely changes the result). Trace more "
                    "steps with `--locate-steps N`, or run `check --runs 3`.")
        return ""

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "title": self.title, "step": self.step, "op_index": self.index,
                "op": self.op_a, "op_other_run": self.op_b, "deterministic_kernel": self.deterministic_kernel,
                "fix": self.fix, "ops_traced": list(self.ops_traced), "traced_steps": self.traced_steps,
                "device": self.device, "context": self.context}


def _where(op: dict[str, Any] | None) -> str:
    if not op or not op.get("file"):
        return "no user source line"
    return f"{op['file']}:{op['line']}"


def _inputs_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    ia, ib = a["in"], b["in"]
    if a.get("rng") and a["op"].endswith("_"):  # in-place random fill: the old value of self does not matter
        ia, ib = ia[1:], ib[1:]
    return ia == ib


def _context(ops_a: list[dict[str, Any]], ops_b: list[dict[str, Any]], i: int, radius: int = 4) -> list[dict]:
    rows = []
    for j in range(max(0, i - radius), min(max(len(ops_a), len(ops_b)), i + radius + 1)):
        a = ops_a[j] if j < len(ops_a) else None
        b = ops_b[j] if j < len(ops_b) else None
        ref = a or b or {}
        rows.append({
            "i": j, "op": ref.get("op"), "op_other_run": b.get("op") if b else None, "phase": ref.get("phase"),
            "module": ref.get("module"), "line": ref.get("line"), "code": ref.get("code"),
            "inputs_equal": bool(a and b and _inputs_equal(a, b)),
            "outputs_equal": bool(a and b and a["out"] == b["out"]),
            "origin": j == i,
        })
    return rows


def locate_ops(ops_a: list[dict[str, Any]], ops_b: list[dict[str, Any]], *, device: str = "cpu") -> LocateResult:
    """Compare two op streams of the same traced step(s) and name where they first part."""
    traced = sorted({op.get("step") for op in ops_a + ops_b if op.get("step") is not None})
    base = {"ops_traced": (len(ops_a), len(ops_b)), "traced_steps": traced, "device": device}
    for i, (a, b) in enumerate(zip(ops_a, ops_b)):
        if a["op"] != b["op"] or (a.get("file"), a.get("line")) != (b.get("file"), b.get("line")):
            return LocateResult("control-flow", a.get("step"), i, a, b, context=_context(ops_a, ops_b, i), **base)
        same_in, same_out = _inputs_equal(a, b), a["out"] == b["out"]
        if same_in and same_out:
            continue
        verdict = ("rng" if a.get("rng") else "origin") if same_in else "external-input"
        return LocateResult(verdict, a.get("step"), i, a, b, context=_context(ops_a, ops_b, i), **base)
    if len(ops_a) != len(ops_b):
        i = min(len(ops_a), len(ops_b))
        longer = ops_a if len(ops_a) > len(ops_b) else ops_b
        a = ops_a[i] if i < len(ops_a) else None
        b = ops_b[i] if i < len(ops_b) else None
        return LocateResult("control-flow", longer[i].get("step"), i, a, b, context=_context(ops_a, ops_b, i),
                            **base)
    return LocateResult("not-reproduced", **base)
