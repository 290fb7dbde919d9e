"""Where the op streams of two different commands part, and why (layer L4).

The two streams (one traced step of each command, see :mod:`torchrepro.record.optrace`) are aligned with
insertions and deletions (:mod:`.align`). Walking the alignment in program order:

* the first aligned op whose inputs are bitwise equal while its outputs differ is the **origin**: the op computes
  differently (another kernel, precision or thread count), or draws other random numbers (**rng**);
* when the inputs of the first op whose outputs differ already differ, the op that produced them is looked for
  among the ops only one program runs: that is where the **program** differs (an op inserted, deleted, or called
  differently), reported with its source line on both sides;
* inputs that differ although no traced op made them are an **external input** (data, values computed outside
  torch).

With the values the tracer kept (``op_values.pt``, :mod:`torchrepro.record.opvalues`), every aligned op is also
compared within the tolerance: the first op whose inputs agree within it and whose outputs do not is where the
difference grows past what is accepted (``tolerance_op``). Without values an op is compared bitwise only.

Example:
    >>> found = locate_programs(ops_a, ops_b, {}, {}, Tolerance())   # doctest: +SKIP
    >>> found.verdict, found.cause_side()                            # doctest: +SKIP
    ('program', 'B')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .align import Row, align_ops
from .tolerance import Tolerance, ValueDelta, scalar_delta, value_delta

VERDICTS = {
    "origin": "an operation computes differently: identical inputs, different outputs",
    "rng": "random draws differ: a random op drew other numbers from identical inputs",
    "program": "the programs differ",
    "external-input": "inputs differ, but no traced operation produced them",
    "not-reproduced": "every aligned op gave the same bits in both commands in the traced step",
}
_KIND_TEXT = {"inserted": "B runs an op A does not", "deleted": "A runs an op B does not",
              "changed": "the same op is called differently"}
Values = dict[str, torch.Tensor]


def _inputs(op: dict[str, Any]) -> list[str]:
    """The inputs that matter: an in-place random fill does not read its first argument's old value."""
    inputs: list[str] = op["in"]
    return inputs[1:] if op.get("rng") and op["op"].endswith("_") else inputs


def _writes(op: dict[str, Any]) -> bool:
    return bool(op.get("rng")) or op["op"].endswith("_")


def _scalar(text: str) -> float | None:
    """A number the tracer wrote for a non-tensor result (``float.hex()``: ``0x1.8p+1``), else None (a 32-digit
    fingerprint is hex too, but no number)."""
    if not text.lstrip("-").startswith(("0x", "inf", "nan")):
        return None
    try:
        return float.fromhex(text)
    except (ValueError, OverflowError):
        return None


def closeness(fps_a: list[str], fps_b: list[str], va: Values, vb: Values,
              tol: Tolerance) -> tuple[bool | None, ValueDelta | None]:
    """Whether every pair of fingerprints is equal or its values agree within ``tol`` (None: some pair has no
    values kept), and the pair furthest apart."""
    if len(fps_a) != len(fps_b):
        return False, None
    worst: ValueDelta | None = None
    unknown = False
    for fa, fb in zip(fps_a, fps_b):
        if fa == fb:
            continue
        x, y = va.get(fa), vb.get(fb)
        if x is not None and y is not None:
            d = value_delta(x, y, tol)
        else:
            sa, sb = _scalar(fa), _scalar(fb)  # a non-tensor result, e.g. .item(): its exact text
            d = scalar_delta(sa, sb, tol) if sa is not None and sb is not None else None
            if d is None and x is None and y is None and (len(fa) != 32 or len(fb) != 32):
                return False, worst  # other non-tensor results (objects, shapes)
            if d is None:
                unknown = True
                continue
        if d is None:
            return False, worst
        if worst is None or d.ratio > worst.ratio:
            worst = d
    if worst is not None and not worst.within:
        return False, worst
    return (None if unknown else True), worst


@dataclass
class ProgramLocate:
    """What the alignment of two traced steps shows (module docstring)."""

    verdict: str
    rows: list[Row]
    ops_a: list[dict[str, Any]]
    ops_b: list[dict[str, Any]]
    tolerance: Tolerance
    at: int | None = None  # row of the first aligned op whose outputs differ
    cause: int | None = None  # "program": the row of the program difference behind it
    out_delta: ValueDelta | None = None  # how far apart the outputs at ``at`` are (values kept)
    tolerance_at: int | None = None  # row of the first op whose inputs agree within tolerance, outputs not
    tolerance_delta: ValueDelta | None = None
    tolerance_unknown: int = 0  # aligned ops with differing outputs that could be compared bitwise only
    values_kept: tuple[int, int] = (0, 0)
    traced_steps: list[int] = field(default_factory=list)

    @property
    def title(self) -> str:
        if self.verdict == "program" and self.cause is not None:
            return f"{VERDICTS['program']}: {_KIND_TEXT[self.rows[self.cause].kind]}"
        return VERDICTS[self.verdict]

    def op(self, r: int | None, side: str) -> dict[str, Any] | None:
        if r is None:
            return None
        i = self.rows[r].a if side == "a" else self.rows[r].b
        return (self.ops_a if side == "a" else self.ops_b)[i] if i is not None else None

    def counts(self) -> dict[str, int]:
        out = {"same": 0, "changed": 0, "deleted": 0, "inserted": 0}
        for row in self.rows:
            out[row.kind] += 1
        return out

    def program_differences(self, limit: int = 10) -> list[dict[str, Any]]:
        """The first rows where the programs differ (inserted, deleted or changed ops), both sides."""
        return [_row_doc(self, r) for r, row in enumerate(self.rows) if row.kind != "same"][:limit]

    def context(self, radius: int = 4) -> list[dict[str, Any]]:
        center = self.cause if self.verdict == "program" and self.cause is not None else self.at
        if center is None:
            return []
        marks = {self.at: "=>", self.cause: "*"} if self.cause is not None else {self.at: "=>"}
        lo, hi = max(0, center - radius), min(len(self.rows), max(center, self.at or 0) + radius + 1)
        return [_row_doc(self, r) | {"mark": marks.get(r, "")} for r in range(lo, hi)]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "title": self.title, "traced_steps": self.traced_steps,
            "ops_traced": [len(self.ops_a), len(self.ops_b)], "aligned": self.counts(),
            "op": _row_doc(self, self.at) if self.at is not None else None,
            "cause": _row_doc(self, self.cause) if self.cause is not None else None,
            "difference": self.out_delta.to_json() if self.out_delta is not None else None,
            "tolerance": self.tolerance.to_json(),
            "tolerance_op": _row_doc(self, self.tolerance_at) if self.tolerance_at is not None else None,
            "tolerance_difference": self.tolerance_delta.to_json() if self.tolerance_delta is not None else None,
            "compared_bitwise_only": self.tolerance_unknown, "values_kept": list(self.values_kept),
            "program_differences": self.program_differences(), "context": self.context(),
        }


def _site(op: dict[str, Any] | None) -> dict[str, Any] | None:
    if op is None:
        return None
    return {"op": op["op"], "index": op.get("i"), "phase": op.get("phase"), "module": op.get("module"),
            "file": op.get("file"), "line": op.get("line"), "code": op.get("code") or "", "step": op.get("step")}


def _row_doc(found: ProgramLocate, r: int) -> dict[str, Any]:
    row = found.rows[r]
    a, b = found.op(r, "a"), found.op(r, "b")
    doc = {"row": r, "kind": row.kind, "a": _site(a), "b": _site(b), "inputs": None, "outputs": None}
    if a is not None and b is not None:
        doc["inputs"] = "equal" if _inputs(a) == _inputs(b) else "differ"
        doc["outputs"] = "equal" if a["out"] == b["out"] else "differ"
    return doc


def locate_programs(ops_a: list[dict[str, Any]], ops_b: list[dict[str, Any]], values_a: Values, values_b: Values,
                    tol: Tolerance) -> ProgramLocate:
    """Align two traced steps of two commands and name where they part (module docstring)."""
    rows = align_ops(ops_a, ops_b)
    found = ProgramLocate("not-reproduced", rows, ops_a, ops_b, tol, values_kept=(len(values_a), len(values_b)),
                          traced_steps=sorted({int(o["step"]) for o in ops_a + ops_b if o.get("step") is not None}))
    made_by: dict[str, int] = {}  # fingerprint -> row of the one-sided op that produced it
    first_writer: int | None = None  # the first one-sided op that writes state (in place, or a random draw)
    first_change: int | None = None
    for r, row in enumerate(rows):
        if row.a is None or row.b is None:
            op = ops_a[row.a] if row.a is not None else ops_b[row.b]  # type: ignore[index]
            first_writer = r if first_writer is None and _writes(op) else first_writer
            for fp in op["out"]:
                made_by.setdefault(fp, r)
            continue
        a, b = ops_a[row.a], ops_b[row.b]
        if row.kind == "changed" and first_change is None:
            first_change = r
        if a["out"] == b["out"]:
            continue
        if found.tolerance_at is None:
            _tolerance_step(found, r, a, b, values_a, values_b)
        if found.at is None:
            _classify(found, r, a, b, made_by, first_writer, first_change)
            found.out_delta = closeness(a["out"], b["out"], values_a, values_b, tol)[1]
        if found.tolerance_at is not None:
            break
    if found.at is None and any(row.kind != "same" for row in rows):
        found.cause = next(r for r, row in enumerate(rows) if row.kind != "same")
    return found


def _tolerance_step(found: ProgramLocate, r: int, a: dict[str, Any], b: dict[str, Any], va: Values,
                    vb: Values) -> None:
    """Note row ``r`` when its inputs agree within the tolerance and its outputs do not."""
    ins, _ = closeness(_inputs(a), _inputs(b), va, vb, found.tolerance)
    if ins is not True:
        found.tolerance_unknown += ins is None
        return
    outs, delta = closeness(a["out"], b["out"], va, vb, found.tolerance)
    if outs is None:
        found.tolerance_unknown += 1
    elif outs is False:
        found.tolerance_at, found.tolerance_delta = r, delta


def _classify(found: ProgramLocate, r: int, a: dict[str, Any], b: dict[str, Any], made_by: dict[str, int],
              first_writer: int | None, first_change: int | None) -> None:
    """The first aligned op whose outputs differ: origin, rng, or the program difference behind it."""
    found.at = r
    if _inputs(a) == _inputs(b):
        if a.get("rng") and first_writer is not None:  # an extra draw before it moved the generator
            found.verdict, found.cause = "program", first_writer
        elif found.rows[r].kind == "changed":  # same inputs, another call (other arguments)
            found.verdict, found.cause = "program", r
        else:
            found.verdict = "rng" if a.get("rng") else "origin"
        return
    shared = set(a["in"]) & set(b["in"])
    made = [made_by[fp] for fp in a["in"] + b["in"] if fp not in shared and fp in made_by]
    cause = min(made) if made else first_writer if first_writer is not None else first_change
    if cause is not None:
        found.verdict, found.cause = "program", cause
    else:
        found.verdict = "external-input"
