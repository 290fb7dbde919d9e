"""Text of ``compare --locate`` (and of ``bisect``'s localization): the op or program difference on both sides."""

from __future__ import annotations

from typing import Any

from ._render import NOT_TRACED, failure_lines


def _fmt(x: float | None) -> str:
    return "-" if x is None else ("0" if x == 0 else f"{x:.3e}")


def _where(site: dict[str, Any] | None) -> str:
    if not site:
        return "(no op)"
    return f"{site['file']}:{site['line']}" if site.get("file") else "(no user source line)"


def _site_lines(label: str, site: dict[str, Any] | None) -> list[str]:
    """``  A  sum_order.py:23  return h.sum(1)`` (op #12, forward, module -)."""
    if site is None:
        return [f"  {label}  (not in this program)"]
    how = f"{site.get('phase')}, op #{site.get('index')}, module {site.get('module') or '-'}"
    lines = [f"  {label}  {site['op']}  ({how})  {_where(site)}"]
    if site.get("code"):
        lines.append(f"        {site['code']}")
    return lines


def _delta(d: dict[str, Any] | None, what: str) -> str | None:
    if not d:
        return None
    ratio = d.get("ratio")
    ratio_text = "" if ratio is None else f", {ratio:.3g}x the tolerance (rtol {d['rtol']:g}, atol {d['atol']:g})"
    return (f"  {what} differ by |Δ| {_fmt(d.get('max_abs'))} (relative {_fmt(d.get('max_rel'))}{ratio_text}; "
            f"{d.get('differing')} of {d.get('elements')} elements)")


def _tolerance_lines(doc: dict[str, Any]) -> list[str]:
    tol = doc.get("tolerance") or {}
    scope = "per-dtype default tolerance" if tol.get("bitwise") else "tolerance"
    op = doc.get("tolerance_op")
    if op is None:
        unknown = doc.get("compared_bitwise_only") or 0
        tail = f" ({unknown} op(s) could be compared bitwise only: no values kept)" if unknown else ""
        if doc.get("verdict") == "program":  # the values part where the programs do, not in a shared op
            return [f"  No op that both commands run gave outputs past the {scope} from inputs within it: the "
                    f"difference comes from the program difference above{tail}."]
        return [f"  Within the {scope}: every aligned op whose inputs agree within it gave outputs within it{tail}."]
    lines = [f"  First op past the {scope} (inputs within it, outputs not):"]
    lines += _site_lines("A", op["a"]) + _site_lines("B", op["b"])
    text = _delta(doc.get("tolerance_difference"), "outputs")
    return lines + ([text] if text else [])


def _counts(doc: dict[str, Any]) -> str:
    c = doc.get("aligned") or {}
    return (f"{c.get('same', 0)} aligned, {c.get('changed', 0)} called differently, {c.get('deleted', 0)} only in A, "
            f"{c.get('inserted', 0)} only in B")


def render_compare_locate(doc: dict[str, Any]) -> str:
    """The --locate section of ``compare``'s summary."""
    if doc.get("compiled"):
        return render_compiled_locate(doc)
    lines = ["", f"Locate: {doc['title']}"]
    if doc["verdict"] in NOT_TRACED:
        return "\n".join(lines + failure_lines(doc))
    traced = ", ".join(map(str, doc.get("traced_steps") or [])) or "-"
    n = doc.get("ops_traced") or [0, 0]
    lines[-1] += f" (traced step {traced}: {n[0]} ops in A, {n[1]} in B; {_counts(doc)})"
    cause, op = doc.get("cause"), doc.get("op")
    if doc["verdict"] == "program" and cause is not None:
        lines.append(f"  where the programs part ({cause['kind']}):")
        lines += _site_lines("A", cause["a"]) + _site_lines("B", cause["b"])
        if op is not None and op["row"] != cause["row"]:
            lines.append("  the first value it changes:")
            lines += _site_lines("A", op["a"]) + _site_lines("B", op["b"])
    elif op is not None:
        same = {"origin": "identical", "rng": "identical"}.get(doc["verdict"], "DIFFERENT")
        lines += _site_lines("A", op["a"]) + _site_lines("B", op["b"])
        lines.append(f"  inputs {same} in both commands; outputs differ")
    elif cause is not None:
        lines.append("  the programs differ, but no value did in the traced step; the first difference:")
        lines += _site_lines("A", cause["a"]) + _site_lines("B", cause["b"])
    text = _delta(doc.get("difference"), "outputs")
    if text:
        lines.append(text)
    if doc["verdict"] != "not-reproduced":
        lines += _tolerance_lines(doc)
    named = {d["row"] for d in (cause, op) if d}
    more = [d for d in doc.get("program_differences") or [] if d["row"] not in named]
    if more:
        shown = "; ".join(f"{d['kind']} {(d['b'] or d['a'])['op']} ({(d['b'] or d['a']).get('phase')}) at "
                          f"{_where(d['b'] or d['a'])}" for d in more[:4])
        lines.append(f"  other program differences: {shown}" + (" ..." if len(more) > 4 else ""))
    if doc.get("op_table"):
        lines.append(f"  Ops around it: {doc['op_table']}")
    return "\n".join(lines)


_MARKS = {"equal": "=", "differ": "≠", None: " "}


def render_aligned_table(rows: list[dict[str, Any]]) -> str:
    """The aligned ops around the finding, A and B side by side."""
    out = [f"{'':2}{'#A':>6} {'#B':>6}  {'kind':<8} {'op A':<28} {'op B':<28} {'line A':>6} {'line B':>6}  in out  "
           "code"]
    for r in rows:
        a, b = r.get("a") or {}, r.get("b") or {}
        code = (b.get("code") if r["kind"] != "deleted" else a.get("code")) or ""
        if r["kind"] == "changed" and a.get("code") != b.get("code"):
            code = f"A: {(a.get('code') or '')[:40]} | B: {code}"
        out.append(f"{r.get('mark', ''):<2}{_num(a.get('index')):>6} {_num(b.get('index')):>6}  {r['kind']:<8} "
                   f"{(a.get('op') or '-')[:28]:<28} {(b.get('op') or '-')[:28]:<28} {_num(a.get('line')):>6} "
                   f"{_num(b.get('line')):>6}  {_MARKS[r.get('inputs')]:^2} {_MARKS[r.get('outputs')]:^3}  "
                   f"{code[:100]}")
    return "\n".join(out)


def _num(x: Any) -> str:
    return "-" if x is None else str(x)


def render_compiled_locate(doc: dict[str, Any]) -> str:
    """The --locate section when one command is compiled (eager vs torch.compile)."""
    side, other = doc.get("side", "B"), doc.get("eager_side", "A")
    lines = ["", f"Locate: {doc['title']} ({side}'s torch.compile'd code, step {doc.get('step')}; "
                 f"{doc.get('graphs', 0)} graph(s) captured)"]
    region, op = doc.get("region"), doc.get("op")
    if region:
        where = f"{region.get('file')}:{region.get('line')}" if region.get("file") else "(call site unknown)"
        lines.append(f"  region  {region.get('target')}, compiled at {where}"
                     + (f": {region['code']}" if region.get("code") else ""))
    if op:
        lowered = f" (lowered from {op['original_aten']})" if op.get("original_aten") not in (None, op["op"]) else ""
        lines.append(f"  op      {op['op']}{lowered}, {op.get('phase')} graph, node {op.get('node')}")
        lines.append(f"  module  {op.get('module') or '-'}")
        lines.append(f"  source  {op.get('file')}:{op.get('line')}" if op.get("file") else
                     "  source  (no user source line)")
        if op.get("code"):
            lines.append(f"          {op['code']}")
    d = doc.get("difference")
    if d:
        lines.append(f"  compiled vs eager on identical inputs: |Δ| {d['max_abs']:.3e} (relative {d['max_rel']:.3e})")
    if doc["verdict"] == "compiled-kernel":
        varies = "; the compiled kernel also varies from run to run" if doc.get("compiled_varies") else ""
        lines.append(f"  {other} computes this op eagerly: the same graph run eagerly, ATen op by ATen op, in {side}'s "
                     f"process, on the same inputs, gives other bits{varies}")
    elif doc["verdict"] == "compiled-rng":
        lines.append(f"  {side}'s compiled code draws its random numbers through this op (inductor's own stream); "
                     f"{other}, eager, draws them through torch's random ops: other masks, whatever the arithmetic")
    lines.append(f"  Fix: {doc['fix']}")
    if doc.get("op_table"):
        lines.append(f"  Nodes around it: {doc['op_table']}")
    return "\n".join(lines)
