"""Text rendering of ``torchrepro compare`` (and of the comparison ``bisect`` ends with)."""

from __future__ import annotations

from typing import Any

from .._core.table import printable
from ..analysis.compare import LABELS
from ..analysis.crossrun import CompareResult, Entry
from ._render import _final_line, _fmt, _names

_HEADS = {"identical": "IDENTICAL", "equivalent": "EQUIVALENT", "diverged": "DIVERGED"}
GROWTH_ROWS = 12


def _what(result: CompareResult) -> str:
    a, b = result.commands
    return f"A `{a}` and B `{b}`"


def _entry(e: Entry, result: CompareResult) -> str:
    """``parameters 2.weight at step 3: |Δ| 2.4e-07, relative 1.1e-06, 0.85x the tolerance (rtol 1.3e-06, ...)``."""
    when = "the final parameters" if e.step == result.final_step and e.kind == "params" else f"step {e.step}"
    head = f"{LABELS[e.kind]} {printable(e.tensor)} at {when}"
    if e.delta is None:
        return f"{head}: {e.reason or 'compared bitwise only (no values kept)'}"
    d = e.delta
    text = (f"{head}: |Δ| {_fmt(d.max_abs)}, relative {_fmt(d.max_rel)}, {d.ratio:.3g}x the tolerance "
            f"(rtol {d.rtol:g}, atol {d.atol:g}; {d.differing} of {d.elements} elements differ)")
    return text + (f"; {d.note}" if d.note else "")


def _from(first: Entry, result: CompareResult) -> str:
    """``from step 3 on``, or ``in the final parameters`` when only what the script did after its last step (e.g.
    a change to the weights after training) is out."""
    if first.step == result.final_step and first.kind == "params":
        return "in the final parameters (changed after the last step)"
    return f"from step {first.step} on"


def _headline(result: CompareResult) -> str:
    check = result.check
    unit = "steps" if check.step_mode == "optimizer" else "backward() calls"
    if result.verdict == "identical":
        return (f"torchrepro: IDENTICAL - {_what(result)}, {check.steps[0]} {unit} each; every recorded loss, batch, "
                "parameter, gradient and optimizer-state tensor is bitwise equal.")
    if result.verdict == "equivalent":
        return (f"torchrepro: EQUIVALENT - {_what(result)} differ bitwise from step {check.first_step} on, but every "
                f"value compared is within the tolerance ({result.tolerance.describe()}).")
    first = result.first_out
    if result.tolerance.bitwise:
        worst = result.worst("ratio")
        out = (f"; even out of the per-dtype default tolerance {_from(first, result)}" if first is not None else
               f"; every difference measured is within the per-dtype default tolerance ({worst.delta.ratio:.2g}x of "
               "it at most): `--rtol dtype` would accept them" if worst is not None and worst.delta else "")
    else:
        out = f"; out of tolerance {_from(first, result)}" if first is not None else ""
    return (f"torchrepro: DIVERGED at step {check.first_step} - {_what(result)} ({unit}: {check.steps[0]} and "
            f"{check.steps[1]}){out}.")


def _growth(result: CompareResult) -> list[str]:
    check, per_step = result.check, result.per_step()
    lines = ["How the difference grew:",
             f"  {'step':>6}  {'max |Δ loss|':>12}  {'max |Δ param|':>13}  {'x tolerance':>11}"]
    rows = sorted(set(range(1, len(check.loss_delta) + 1)) | set(check.param_delta) | set(per_step))
    rows = [k for k in rows if k <= max(check.steps)]
    if len(rows) > GROWTH_ROWS:
        start = rows.index(check.first_step) if check.first_step in rows else 0
        rows = sorted(set(rows[start:start + 8] + rows[-3:]))
    for k in rows:
        ld = check.loss_delta[k - 1] if 1 <= k <= len(check.loss_delta) else None
        ratio = per_step.get(k, {}).get("ratio")
        lines.append(f"  {k:>6}  {_fmt(ld):>12}  {_fmt(check.param_delta.get(k)):>13}  "
                     f"{'-' if ratio is None else f'{ratio:.3g}':>11}")
    if check.final_max_abs_delta is not None:
        lines.append(_final_line(check))
    return lines


def _bitwise_only(result: CompareResult) -> str | None:
    steps = sorted({e.step for e in result.bitwise_only})
    if not steps:
        return None
    shown = ", ".join(map(str, steps[:8])) + (f" (+{len(steps) - 8} more)" if len(steps) > 8 else "")
    if result.without_values:
        sides = " and ".join(result.without_values) + (" was" if len(result.without_values) == 1 else " were")
        return (f"Bitwise only: step(s) {shown}: tensors differ there but {sides} recorded without values, so they "
                "could not be compared within the tolerance; "
                "record with values (`torchrepro run --keep-values --record DIR -- ...`), or give compare the "
                "commands instead of run directories (it keeps values itself).")
    return (f"Bitwise only: step(s) {shown}: tensors differ there but no values were kept (outside the sampled steps "
            "or the values budget), so they could not be compared within the tolerance; raise --values-budget, or "
            "use --max-steps, to compare them by value.")


def render_compare(result: CompareResult, *, environment: str | None = None,
                   located: dict[str, Any] | None = None) -> str:
    """The text summary of ``torchrepro compare``."""
    check = result.check
    lines = [_headline(result)]
    if result.verdict != "identical":
        lines += ["", "What differed first (bitwise, causal order):"]
        lines += [f"  {i}. {d.label:<18} step {d.step:<5} {_names(d.names)}" for i, d in enumerate(check.first, 1)]
        lines += ["", f"Tolerance: {result.tolerance.describe()}"]
        first = result.first_out
        if first is not None:
            lines.append(f"  first out of tolerance: {_entry(first, result)}")
        worst: dict[int, tuple[Entry, list[str]]] = {}  # one line per entry, naming each way it is the largest
        for label, attr in (("|Δ|", "max_abs"), ("relative |Δ|", "max_rel"), ("x tolerance", "ratio")):
            e = result.worst(attr)
            if e is not None:
                worst.setdefault(id(e), (e, []))[1].append(label)
        for e, labels in worst.values():
            lines.append(f"  largest {', '.join(labels)}: {_entry(e, result)}")
        lines.append(f"  compared by value: {len(result.compared)} differing tensor(s) at "
                     f"{len({e.step for e in result.compared})} step(s)")
        lines += [""] + _growth(result)
        for side, regions in zip("AB", result.compiled):
            if regions:
                shown = "; ".join(f"{r.get('target')} at {r.get('file')}:{r.get('line')}" for r in regions[:3])
                lines += ["", f"Compiled in {side}: {shown}"]
        only = _bitwise_only(result)
        if only:
            lines += ["", only]
        cause = result.cause
        if cause:
            lines += ["", f"Cause: {cause} - {result.explanation}"]
            if located is None:
                lines.append(f"Next:  {result.action}")
    for note in check.notes:
        lines.append(f"Note:  {note}")
    if result.warning:
        lines.append(f"Warning: {result.warning}")
    if environment:
        lines += ["", environment]
    if located is not None:
        from ._compare_locate_render import render_compare_locate

        lines.append(render_compare_locate(located))
    lines.append("Runs:  " + ", ".join(f"{k} = {r}" for k, r in zip("AB", check.runs)))
    return "\n".join(lines)
