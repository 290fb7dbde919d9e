"""Text rendering of comparison results, shared by ``check`` and ``diff``."""

from __future__ import annotations

from ..compare import LABELS, CheckResult


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def _fmt(x: float | None) -> str:
    return "-" if x is None else ("0" if x == 0 else f"{x:.3e}")


def render(result: CheckResult, *, what: str, plot: str | None = None) -> str:
    lines: list[str] = []
    unit = "steps" if result.step_mode == "optimizer" else "backward() calls"
    if result.verdict == "identical":
        lines.append(f"torchrepro: IDENTICAL - {len(result.runs)} runs of {what}, {result.steps[0]} {unit} each; "
                     "every recorded loss, batch, parameter, gradient and optimizer-state tensor is bitwise equal.")
    else:
        lines.append(f"torchrepro: DIVERGED at step {result.first_step} "
                     f"({len(result.runs)} runs of {what}; steps per run: {result.steps})")
        if result.first_step == 0:
            lines[-1] += " - step 0 means the initial parameters, before the first update"
        lines.append("")
        lines.append("What diverged first (causal order):")
        for i, d in enumerate(result.first, start=1):
            lines.append(f"  {i}. {d.label:<18} step {d.step:<5} {_names(d.names)}")
        later = {k: s for k, s in result.kind_first_steps.items() if s != result.first_step}
        if later:
            lines.append("  then: " + ", ".join(f"{LABELS[k]} at step {s}" for k, s in later.items()))
        lines.append("")
        lines.append("How the difference grew:")
        lines.append(f"  {'step':>6}  {'max |Δ loss|':>12}  {'max |Δ param|':>13}")
        rows = sorted(set(range(1, len(result.loss_delta) + 1)) | set(result.param_delta))
        if len(rows) > 12:
            start = max(0, rows.index(result.first_step) if result.first_step in rows else 0)
            rows = rows[start:start + 8] + rows[-3:]
            rows = sorted(set(rows))
        for k in rows:
            ld = result.loss_delta[k - 1] if 1 <= k <= len(result.loss_delta) else None
            lines.append(f"  {k:>6}  {_fmt(ld):>12}  {_fmt(result.param_delta.get(k)):>13}")
        if result.final_max_abs_delta is not None:
            lines.append(f"  final max |Δ weight| = {result.final_max_abs_delta:.6g} "
                         f"({result.final_max_abs_delta_tensor}); largest ULP distance = {result.max_ulp} "
                         f"({result.max_ulp_tensor})")
        lines.append("")
        lines.append(f"Cause: {result.cause} - {result.explanation}")
        lines.append(f"Next:  {result.action}")
    for note in result.notes:
        lines.append(f"Note:  {note}")
    if plot:
        lines.append(f"Plot:  {plot}")
    lines.append("Runs:  " + ", ".join(result.runs))
    return "\n".join(lines)
