"""Comparing recorded runs: identical, or where, what and why they diverge (layer L3).

Example:
    >>> from torchrepro.compare import compare_runs          # doctest: +SKIP
    >>> result = compare_runs([load_run("a"), load_run("b")])  # doctest: +SKIP
    >>> result.verdict, result.first_step, result.cause        # doctest: +SKIP
    ('diverged', 1, 'compute')
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .store import Run

SCHEMA = "torchrepro.check/1"

# Recorded quantities in causal order: what a step consumes comes before what it produces.
KINDS = ("batches", "init", "loss", "grads", "params", "state", "steps")
LABELS = {
    "batches": "data batch",
    "init": "initial parameters",
    "loss": "loss",
    "grads": "gradients",
    "params": "parameters",
    "state": "optimizer state",
    "steps": "number of steps",
}

# cause class -> (explanation, next action)
CAUSES: dict[str, tuple[str, str]] = {
    "initial-weights": (
        "The initial parameters differ between runs: the model is initialised from unseeded random numbers.",
        "Seed before building the model: call torchrepro.seed_everything(SEED) (or torch.manual_seed) at the "
        "top of the script, or rerun with `torchrepro check --seed 0 -- ...` to confirm.",
    ),
    "data": (
        "The runs saw different data batches while the parameters were still identical: DataLoader shuffling "
        "or data augmentation draws unseeded random numbers.",
        "Seed the data path: pass generator=torchrepro.make_generator(SEED) and "
        "worker_init_fn=torchrepro.seed_worker to the DataLoader, and draw augmentation randomness from "
        "seeded generators (random, numpy, torch) rather than os.urandom or fresh unseeded generators.",
    ),
    "compute": (
        "Identical inputs and parameters produced different results: a nondeterministic kernel (e.g. a "
        "scatter/index_put_ accumulation, atomicAdd on GPU, cuDNN autotuning) or an unseeded random op "
        "(dropout with its own generator).",
        "Rerun with `torchrepro check --deterministic -- ...` to confirm it is a kernel; "
        "`torchrepro check --locate -- ...` names the operation and its source line.",
    ),
    "steps": (
        "Every recorded value matches, but the runs took different numbers of steps: control flow depends on "
        "something unseeded or on timing (early stopping on wall-clock, data-dependent loops).",
        "Look for branches or loop bounds that depend on time, unseeded randomness or the environment.",
    ),
}


@dataclass
class Difference:
    """One recorded quantity that differs at one step, with the tensors involved."""

    kind: str
    step: int
    names: list[str] = field(default_factory=list)
    runs: tuple[int, int] = (0, 1)

    @property
    def label(self) -> str:
        return LABELS[self.kind]


@dataclass
class CheckResult:
    """The outcome of comparing N runs (as data; render it with the CLI or ``to_json``)."""

    verdict: str  # "identical" | "diverged"
    runs: list[str]
    step_mode: str
    steps: list[int]
    first_step: int | None = None
    first: list[Difference] = field(default_factory=list)  # what differs at the first divergent step
    kind_first_steps: dict[str, int] = field(default_factory=dict)
    cause: str | None = None
    losses: list[list[float | None]] = field(default_factory=list)
    loss_delta: list[float | None] = field(default_factory=list)
    param_delta: dict[int, float] = field(default_factory=dict)  # step -> max |Δ| over parameters
    final_max_abs_delta: float | None = None
    final_max_abs_delta_tensor: str | None = None
    max_ulp: int | None = None
    max_ulp_tensor: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def explanation(self) -> str | None:
        return CAUSES[self.cause][0] if self.cause else None

    @property
    def action(self) -> str | None:
        return CAUSES[self.cause][1] if self.cause else None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "runs": self.runs,
            "step_mode": self.step_mode,
            "steps": self.steps,
            "first_divergent_step": self.first_step,
            "diverged_first": [asdict(d) | {"label": d.label} for d in self.first],
            "first_step_by_kind": self.kind_first_steps,
            "cause": self.cause,
            "explanation": self.explanation,
            "action": self.action,
            "losses": self.losses,
            "loss_max_abs_delta": self.loss_delta,
            "param_max_abs_delta": {str(k): v for k, v in sorted(self.param_delta.items())},
            "final_max_abs_delta_weight": self.final_max_abs_delta,
            "final_max_abs_delta_tensor": self.final_max_abs_delta_tensor,
            "max_ulp_distance": self.max_ulp,
            "max_ulp_tensor": self.max_ulp_tensor,
            "notes": self.notes,
        }


def _diff_maps(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    a, b = a or {}, b or {}
    return [k for k in list(a) + [k for k in b if k not in a] if a.get(k) != b.get(k)]


def _diff_lists(a: list[Any] | None, b: list[Any] | None, label: str) -> list[str]:
    a, b = a or [], b or []
    names = [f"{label}[{i}]" for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or a[i] != b[i]]
    return names


def _step_fields(step: dict[str, Any], mode: str) -> dict[str, Any]:
    losses = [x.get("fp") for x in step.get("losses", [])] if mode == "optimizer" else [step["loss"].get("fp")]
    return {"batches": step.get("batches", []), "loss": losses, "grads": step.get("grads"),
            "params": step.get("params"), "state": step.get("state")}


def _pair_differences(a: Run, b: Run, ia: int, ib: int) -> list[Difference]:
    """Every kind's first difference between two runs (at most one per kind)."""
    found: dict[str, Difference] = {}
    init_a, init_b = a.of_kind("init"), b.of_kind("init")
    if init_a and init_b:
        names = _diff_maps(init_a[0].get("params"), init_b[0].get("params"))
        if names:
            found["init"] = Difference("init", 0, names, (ia, ib))
    sa, sb = a.steps(), b.steps()
    for k, (x, y) in enumerate(zip(sa, sb), start=1):
        fx, fy = _step_fields(x, a.step_mode), _step_fields(y, b.step_mode)
        for kind in ("batches", "loss", "grads", "params", "state"):
            if kind in found:
                continue
            if kind in ("batches", "loss"):
                names = _diff_lists(fx[kind], fy[kind], "batch" if kind == "batches" else "loss")
            else:
                names = _diff_maps(fx[kind], fy[kind])
            if names:
                found[kind] = Difference(kind, k, names, (ia, ib))
    n = min(len(sa), len(sb))
    if "params" not in found:
        fa, fb = a.of_kind("final"), b.of_kind("final")
        if fa and fb and len(sa) == len(sb):
            names = _diff_maps(fa[0].get("params"), fb[0].get("params"))
            if names:
                found["params"] = Difference("params", max(n, 1), names, (ia, ib))
    if len(sa) != len(sb):
        found["steps"] = Difference("steps", n + 1, [f"run {ia}: {len(sa)} steps", f"run {ib}: {len(sb)} steps"],
                                    (ia, ib))
    return sorted(found.values(), key=lambda d: (d.step, KINDS.index(d.kind)))


def _loss_value(step: dict[str, Any], mode: str) -> float | None:
    entries = step.get("losses", []) if mode == "optimizer" else [step.get("loss", {})]
    values = [e.get("value") for e in entries if e.get("value") is not None]
    return float.fromhex(values[-1]) if values else None


_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between two same-shape float tensors (0 if identical)."""
    if a.dtype not in _INT_VIEW or a.shape != b.shape or a.numel() == 0:
        return 0
    ia, ib = a.contiguous().view(_INT_VIEW[a.dtype]).long(), b.contiguous().view(_INT_VIEW[a.dtype]).long()
    bits = torch.iinfo(_INT_VIEW[a.dtype]).bits
    top = (1 << (bits - 1)) - 1
    # map sign-magnitude float bits onto a monotonic integer line
    oa = torch.where(ia < 0, -(ia & top), ia).double()
    ob = torch.where(ib < 0, -(ib & top), ib).double()
    return int((oa - ob).abs().max().item())


def _max_abs_delta(va: dict[str, torch.Tensor], vb: dict[str, torch.Tensor]) -> tuple[float, str | None]:
    best, where = 0.0, None
    for name, x in va.items():
        y = vb.get(name)
        if y is None or y.shape != x.shape or not x.is_floating_point():
            continue
        d = (x.double() - y.double()).abs()
        m = float(d.max()) if d.numel() else 0.0
        if math.isnan(m):
            m = math.inf
        if m > best or where is None:
            best, where = m, name
    return best, where


def _values_name(step: int, mode: str) -> str:
    return f"step_{step:06d}" if mode == "optimizer" else f"backward_{step:06d}"


def compare_runs(runs: list[Run]) -> CheckResult:
    """Compare every run with the first one; the earliest divergence over all pairs is reported."""
    if len(runs) < 2:
        raise ValueError("compare_runs needs at least two runs")
    mode = runs[0].step_mode
    result = CheckResult(verdict="identical", runs=[str(r.path) for r in runs], step_mode=mode,
                         steps=[len(r.steps()) for r in runs])
    diffs: list[Difference] = []
    for i, other in enumerate(runs[1:], start=1):
        if other.step_mode != mode:
            diffs.append(Difference("steps", 1, [f"run 0 steps by {mode}", f"run {i} steps by {other.step_mode}"],
                                    (0, i)))
            continue
        diffs.extend(_pair_differences(runs[0], other, 0, i))
    result.losses = [[_loss_value(s, mode) for s in r.steps()] for r in runs]
    n = min(len(x) for x in result.losses)
    for k in range(n):
        vals = [x[k] for x in result.losses]
        result.loss_delta.append(None if any(v is None for v in vals) else
                                 max(abs(v - vals[0]) for v in vals))  # type: ignore[operator]
    if mode == "backward":
        result.notes.append("The script updates parameters without torch.optim, so each backward() call is "
                            "treated as one step.")
    if not diffs:
        return result

    result.verdict = "diverged"
    result.first_step = min(d.step for d in diffs)
    first: dict[str, Difference] = {}
    for d in sorted(diffs, key=lambda d: (d.step, KINDS.index(d.kind))):
        result.kind_first_steps.setdefault(d.kind, d.step)
        if d.step == result.first_step:
            first.setdefault(d.kind, d)
    result.first = sorted(first.values(), key=lambda d: KINDS.index(d.kind))
    kinds = {d.kind for d in result.first}
    if "init" in result.kind_first_steps:
        result.cause = "initial-weights"
    elif result.first[0].kind == "batches":
        result.cause = "data"
    elif kinds <= {"steps"}:
        result.cause = "steps"
    else:
        result.cause = "compute"
    _growth(runs, result)
    return result


def _growth(runs: list[Run], result: CheckResult) -> None:
    """Per-step max |Δ parameter| and final max |Δ weight| and ULP distance, from saved values."""
    base = runs[0]
    mode = result.step_mode
    steps = range(0, min(result.steps) + 1)
    for k in steps:
        name = "init" if k == 0 else _values_name(k, mode)
        va = base.values(name)
        if va is None:
            continue
        worst = 0.0
        for other in runs[1:]:
            vb = other.values(name)
            if vb is not None:
                worst = max(worst, _max_abs_delta(va, vb)[0])
        result.param_delta[k] = worst
    fa = base.values("final")
    if fa is None:
        result.notes.append("Parameter values were not saved, so max |Δ weight| is unknown (record with values).")
        return
    for other in runs[1:]:
        fb = other.values("final")
        if fb is None:
            continue
        m, where = _max_abs_delta(fa, fb)
        if result.final_max_abs_delta is None or m > result.final_max_abs_delta:
            result.final_max_abs_delta, result.final_max_abs_delta_tensor = m, where
        for name, x in fa.items():
            y = fb.get(name)
            if y is None or not x.is_floating_point():
                continue
            u = ulp_distance(x, y)
            if result.max_ulp is None or u > result.max_ulp:
                result.max_ulp, result.max_ulp_tensor = u, name
