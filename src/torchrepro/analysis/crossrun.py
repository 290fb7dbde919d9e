"""Comparing runs of two *different* commands step by step, bitwise and within a tolerance (layer L4).

``check`` compares runs of one command, where any difference is nondeterminism. Here the two runs come from
different commands (two commits, eager vs ``torch.compile``, fp32 vs bf16 autocast, 1 vs 2 threads), so a
difference is expected to be possible and the questions are: are they bitwise **identical**, **equivalent**
(every compared value within ``rtol``/``atol``), or **diverged** (some value out of tolerance, other data, another
number of steps) — and from which step, in which tensor, by how much.

Parameter names are compared after dropping ``torch.compile``'s ``_orig_mod.`` component, so a compiled model
compares with its eager twin. Values come from the runs' value snapshots (``values/*.pt``, within their budget)
and the exact losses of the trace; a step whose differing tensors have no snapshot could only be compared bitwise,
and is listed as such.

Example:
    >>> result = compare_commands(load_run("a"), load_run("b"), Tolerance(rtol=1e-4))  # doctest: +SKIP
    >>> result.verdict, result.first_out and result.first_out.step                    # doctest: +SKIP
    ('equivalent', None)
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..record.store import VALUES, Run
from .causes import SHARED_CWD
from .causes import cause as registered
from .compare import KINDS, LABELS, CheckResult, compare_runs, note_shared_workdir
from .tolerance import Tolerance, ValueDelta, scalar_delta, value_delta

SCHEMA = "torchrepro.compare/1"
_COMPILED = re.compile(r"(^|\.)_orig_mod\.")

VERDICT_EXIT = {"identical": 0, "equivalent": 0, "diverged": 1}


def plain_name(name: str) -> str:
    """A tensor name without ``torch.compile``'s wrapper component.

    >>> plain_name("_orig_mod.fc.weight"), plain_name("enc._orig_mod.0.bias"), plain_name("fc.weight")
    ('fc.weight', 'enc.0.bias', 'fc.weight')
    """
    return _COMPILED.sub(r"\1", name)


class PlainNamesRun(Run):
    """A run whose tensors are named as in eager code (see :func:`plain_name`), in its trace and values."""

    def values(self, name: str, *, mmap: bool = False) -> dict[str, torch.Tensor] | None:
        found = super().values(name, mmap=mmap)
        return None if found is None else {plain_name(k): v for k, v in found.items()}


_NAMED_PARTS = ("params", "grads", "state")


def plain_names(run: Run) -> Run:
    """``run`` with compiled-module names made plain (the same object when nothing is renamed)."""
    def rename(event: dict[str, Any]) -> dict[str, Any]:
        parts = {p: {plain_name(k): v for k, v in event[p].items()} for p in _NAMED_PARTS
                 if isinstance(event.get(p), dict)}
        return event | parts if parts else event

    if not any(_COMPILED.search(k) for e in run.events for p in _NAMED_PARTS for k in (e.get(p) or {})):
        return run
    return PlainNamesRun(path=run.path, manifest=run.manifest, events=[rename(e) for e in run.events])


@dataclass
class Entry:
    """One recorded quantity that differs bitwise at one step, and how far apart its values are."""

    step: int  # 0 = initial parameters; steps + 1 = final parameters (when no step record holds them)
    kind: str  # a compare.KINDS name
    tensor: str
    delta: ValueDelta | None  # None: no values kept here, compared bitwise only
    reason: str | None = None  # why it is out of tolerance without values (other data, other step count)

    @property
    def within(self) -> bool | None:
        if self.reason is not None:
            return False
        return None if self.delta is None else self.delta.within

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "label": LABELS[self.kind], "tensor": self.tensor,
                "within": self.within, "reason": self.reason,
                **(self.delta.to_json() if self.delta is not None else {"max_abs": None, "max_rel": None,
                                                                         "ratio": None})}


@dataclass
class CompareResult:
    """Two commands compared: the bitwise step comparison (``check``), and the values within ``tolerance``."""

    check: CheckResult
    tolerance: Tolerance
    commands: list[str]
    entries: list[Entry] = field(default_factory=list)
    verdict: str = "identical"
    final_step: int = 0  # the step number given to final-parameter entries
    compiled: list[list[dict[str, Any]]] = field(default_factory=lambda: [[], []])  # each side's compiled regions
    without_values: list[str] = field(default_factory=list)  # "A"/"B": recorded with no value snapshot at all
    options: list[str] = field(default_factory=list)  # compare's options (--seed 0 --rtol 1e-4): kept in Next

    @property
    def first_out(self) -> Entry | None:
        """The first quantity out of tolerance, in step and causal order (with a bitwise tolerance: the first
        one out of the per-dtype defaults it is measured against)."""
        return next((e for e in self.entries if e.within is False), None)

    @property
    def bitwise_only(self) -> list[Entry]:
        return [e for e in self.entries if e.within is None]

    @property
    def compared(self) -> list[Entry]:
        return [e for e in self.entries if e.delta is not None]

    def worst(self, attr: str) -> Entry | None:
        """The compared entry with the largest ``max_abs``, ``max_rel`` or ``ratio``."""
        found = [e for e in self.compared if getattr(e.delta, attr) > 0]
        return max(found, key=lambda e: getattr(e.delta, attr)) if found else None

    def per_step(self) -> dict[int, dict[str, float | None]]:
        """step -> largest |Δ| and tolerance ratio over the values compared at that step."""
        out: dict[int, dict[str, float | None]] = {}
        for e in self.compared:
            row = out.setdefault(e.step, {"max_abs": 0.0, "ratio": 0.0})
            row["max_abs"] = max(row["max_abs"] or 0.0, e.delta.max_abs)  # type: ignore[union-attr]
            row["ratio"] = max(row["ratio"] or 0.0, e.delta.ratio)  # type: ignore[union-attr]
        return dict(sorted(out.items()))

    @property
    def cause(self) -> str | None:
        return self.check.cause if self.verdict != "identical" else None

    @property
    def explanation(self) -> str | None:
        """The cause's explanation, with the files B read from A for a shared working directory."""
        cause = self.cause
        if cause is None:
            return None
        shared = (self.check.working_directory or {}).get("read_from_earlier_run") or []
        files = ", ".join(f"B {s['how']} {s['path'] if s['path'] != '.' else 'the working directory'} "
                          f"({s['change']} by A)" for s in shared[:5]) + (" ..." if len(shared) > 5 else "")
        return registered(cause).wording("compare").explanation.format(files=files)

    @property
    def action(self) -> str | None:
        """What to do next, with this comparison's own command lines."""
        cause = self.cause
        if cause is None:
            return None
        tolerance = ("; `--rtol/--atol` say whether the difference is within what you accept"
                     if self.tolerance.bitwise else "")
        a, b = (shlex.quote(c) for c in self.commands)
        return registered(cause).wording("compare").action.format(
            a=a, b=b, tolerance=tolerance, compare=shlex.join(["torchrepro", "compare", *self.options]))

    @property
    def warning(self) -> str | None:
        """For a verdict that stands although B read what A wrote: the same explanation, as a warning."""
        shared = (self.check.working_directory or {}).get("read_from_earlier_run")
        if not shared or self.cause == SHARED_CWD:
            return None
        files = ", ".join(f"{s['path']} ({s['change']} by A)" for s in shared[:5])
        return (f"B read what A wrote in the working directory both commands ran in ({files}); the commands did not "
                f"start from the same state. {registered(SHARED_CWD).wording('compare').action}")

    def to_json(self) -> dict[str, Any]:
        def where(e: Entry | None) -> dict[str, Any] | None:
            return e.to_json() if e is not None else None

        bitwise = {k: v for k, v in self.check.to_json().items()
                   if k not in ("schema", "verdict", "cause", "explanation", "action", "working_directory")}
        cause = self.cause
        return {
            "schema": SCHEMA, "verdict": self.verdict, "exit_code": VERDICT_EXIT[self.verdict],
            "commands": {"a": self.commands[0], "b": self.commands[1]}, "runs": self.check.runs,
            "tolerance": self.tolerance.to_json(), "steps": self.check.steps,
            "first_divergent_step": self.check.first_step, "first_out_of_tolerance": where(self.first_out),
            "largest_abs_difference": where(self.worst("max_abs")),
            "largest_rel_difference": where(self.worst("max_rel")),
            "largest_tolerance_ratio": where(self.worst("ratio")),
            "compared_by_value": len(self.compared),
            "bitwise_only": [e.to_json() for e in self.bitwise_only],
            "bitwise_only_steps": sorted({e.step for e in self.bitwise_only}),
            "per_step": {str(k): v for k, v in self.per_step().items()},
            "differences": [e.to_json() for e in self.entries],
            "compiled": {"a": self.compiled[0], "b": self.compiled[1]},
            "cause": cause, "explanation": self.explanation, "warning": self.warning,
            "working_directory": self.check.working_directory,
            "action": self.action, "bitwise": bitwise,
        }


def _values_name(step: int, mode: str) -> str:
    return f"{'step' if mode == 'optimizer' else 'backward'}_{step:06d}"


class _Values:
    """Value snapshots of two runs, loaded on first use."""

    def __init__(self, a: Run, b: Run) -> None:
        self.runs = (a, b)
        self._cache: dict[str, tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None]] = {}

    def pair(self, name: str) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None]:
        if name not in self._cache:
            self._cache[name] = (self.runs[0].values(name), self.runs[1].values(name))
        return self._cache[name]


def _tensor_entries(step: int, kind: str, ma: dict[str, Any] | None, mb: dict[str, Any] | None, snapshot: str,
                    values: _Values, tol: Tolerance, skip: set[str] | frozenset[str] = frozenset()) -> list[Entry]:
    """The differing tensors of one kind at one step (``ma``/``mb``: the two traces' name -> fingerprint), each
    with its values compared. A tensor that only one command has cannot be within a tolerance: it is out, saying
    so (B's optimizer keeps momentum A's has not)."""
    ma, mb = ma or {}, mb or {}
    va, vb = values.pair(snapshot)
    out = []
    for name in _diff_names(ma, mb):
        if name in skip:
            continue
        x, y = (va or {}).get(name), (vb or {}).get(name)
        delta = value_delta(x, y, tol) if x is not None and y is not None else None
        reason = None
        if name not in ma or name not in mb:
            only, other = ("B", "A") if name not in ma else ("A", "B")
            reason = f"in {only} only: {other} has no {LABELS[kind]} tensor of that name, so it cannot be compared"
        elif x is not None and y is not None and delta is None:
            reason = f"shapes differ: {list(x.shape)} in A, {list(y.shape)} in B"
        out.append(Entry(step, kind, name, delta, reason))
    return out


def _diff_names(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    a, b = a or {}, b or {}
    return [k for k in list(a) + [k for k in b if k not in a] if a.get(k) != b.get(k)]


def _loss_entries(step: int, x: dict[str, Any], y: dict[str, Any], mode: str, tol: Tolerance) -> list[Entry]:
    la = x.get("losses", []) if mode == "optimizer" else [x.get("loss") or {}]
    lb = y.get("losses", []) if mode == "optimizer" else [y.get("loss") or {}]
    out = []
    for i in range(max(len(la), len(lb))):
        ea, eb = (la[i] if i < len(la) else {}), (lb[i] if i < len(lb) else {})
        if ea.get("fp") == eb.get("fp") and ea.get("value") == eb.get("value"):
            continue
        if ea.get("value") is None or eb.get("value") is None:
            reason = None if ea and eb else f"a loss in one command only ({len(la)} vs {len(lb)} per step)"
            out.append(Entry(step, "loss", f"loss[{i}]", None, reason))
            continue
        out.append(Entry(step, "loss", f"loss[{i}]", scalar_delta(float.fromhex(ea["value"]),
                                                                  float.fromhex(eb["value"]), tol)))
    return out


def _entries(a: Run, b: Run, tol: Tolerance) -> tuple[list[Entry], int]:
    """Every bitwise difference between the runs, in step and causal order, with its values compared."""
    values = _Values(a, b)
    mode = a.step_mode
    out: list[Entry] = []
    ia, ib = a.of_kind("init"), b.of_kind("init")
    if ia and ib:
        out += _tensor_entries(0, "init", ia[0].get("params"), ib[0].get("params"), "init", values, tol)
    sa, sb = a.steps(), b.steps()
    for k, (x, y) in enumerate(zip(sa, sb), start=1):
        if (x.get("batches") or []) != (y.get("batches") or []):
            out.append(Entry(k, "batches", "batch", None, "the data batches differ (they are fingerprinted, not "
                             "kept, so they can only be compared bitwise)"))
        out += _loss_entries(k, x, y, mode, tol)
        out += _tensor_entries(k, "grads", x.get("grads"), y.get("grads"), f"grads_{k:06d}", values, tol)
        out += _tensor_entries(k, "params", x.get("params"), y.get("params"), _values_name(k, mode), values, tol)
        out += _tensor_entries(k, "state", x.get("state"), y.get("state"), f"state_{k:06d}", values, tol)
    n = min(len(sa), len(sb))
    fa, fb = a.of_kind("final"), b.of_kind("final")
    if fa and fb and len(sa) == len(sb):
        last = {e.tensor for e in out if e.step == n and e.kind == "params"}
        out += _tensor_entries(n + 1, "params", fa[0].get("params"), fb[0].get("params"), "final", values, tol,
                               skip=last)
    if len(sa) != len(sb):
        out.append(Entry(n + 1, "steps", "steps", None, f"A ran {len(sa)} steps, B {len(sb)}"))
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(out, key=lambda e: (e.step, order[e.kind])), n + 1


def compare_commands(run_a: Run, run_b: Run, tol: Tolerance | None = None, *,
                     commands: list[str] | None = None, workdir: dict[str, Any] | None = None,
                     options: list[str] | None = None) -> CompareResult:
    """Compare the runs of two commands: bitwise step by step, then every differing value within ``tol``.

    Verdict ``identical`` (bitwise), ``equivalent`` (every value compared within tolerance; steps without
    snapshots are listed in ``bitwise_only``) or ``diverged`` (a value out of tolerance, other data, another
    number of steps; with ``tol.bitwise``, any difference). ``workdir``: the watch on the working directory both
    commands ran in (``WorkdirWatch.to_json``); when B read what A wrote there, a divergence is blamed on that.
    ``options``: compare's own options, kept in the commands its next action names.
    """
    tol = tol or Tolerance()
    a, b = plain_names(run_a), plain_names(run_b)
    check = compare_runs([a, b], one_command=False)
    if workdir is not None:
        note_shared_workdir(check, workdir)
    result = CompareResult(check, tol, commands or [_command(run_a), _command(run_b)],
                           compiled=[list(r.manifest.get("compiled") or []) for r in (run_a, run_b)],
                           options=list(options or []))
    if check.verdict == "identical":
        return result
    result.entries, result.final_step = _entries(a, b, tol)
    result.without_values = [side for side, run in zip("AB", (run_a, run_b)) if not (Path(run.path) / VALUES).is_dir()]
    if not tol.bitwise:
        _end_state_unverified(result.entries, result.final_step, UNRECORDED if result.without_values else UNVERIFIED)
    result.verdict = ("diverged" if tol.bitwise or result.first_out is not None or check.cause == SHARED_CWD
                      else "equivalent")
    return result


UNVERIFIED = ("no values of it were kept (values budget), so it cannot be shown to be within the tolerance; raise "
              "--values-budget")


UNRECORDED = ("no values of it were recorded (the run was recorded without --keep-values), so it cannot be shown to "
              "be within the tolerance; record it with `torchrepro run --keep-values --record DIR -- ...`")


def _end_state_unverified(entries: list[Entry], final_step: int, reason: str = UNVERIFIED) -> None:
    """Steps between snapshots may be compared bitwise only, but not the end: a parameter that differs at the last
    step (or in the final parameters) without values to measure makes the verdict ``diverged``, saying why, rather
    than ``equivalent`` on the strength of the losses alone."""
    for e in entries:
        if e.kind == "params" and e.step >= final_step - 1 and e.delta is None and e.reason is None:
            e.reason = reason


def _command(run: Run) -> str:
    command = run.manifest.get("command")
    return " ".join(map(str, command)) if isinstance(command, list) else str(Path(run.path))

