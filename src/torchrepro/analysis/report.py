"""Plots of a comparison. matplotlib is optional: without it, no plot is written."""

from __future__ import annotations

from pathlib import Path

from .._core.io import atomic_write
from .compare import CheckResult


def plot_check(result: CheckResult, path: str | Path) -> Path | None:
    """Write a PNG: loss curves of all runs overlaid, and per-step max |Δ weight| on a log scale.

    Returns the path, or None when matplotlib is not installed.
    """
    try:  # the object API with the Agg canvas: no pyplot (its import and global figure state cost time)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    for i, losses in enumerate(result.losses):
        xs = [k + 1 for k, v in enumerate(losses) if v is not None]
        ys = [v for v in losses if v is not None]
        ax1.plot(xs, ys, label=f"run {i + 1}", linestyle="-" if i == 0 else "--", alpha=0.85)
    if result.first_step:
        ax1.axvline(result.first_step, color="red", linewidth=0.8, label=f"first divergence (step {result.first_step})")
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss")
    ax1.set_title("Loss per step (all runs)")
    ax1.legend(fontsize=8)
    steps = sorted(result.param_delta)
    deltas = [result.param_delta[k] for k in steps]
    positive = [(k, d) for k, d in zip(steps, deltas) if d > 0]
    if positive:
        ax2.semilogy([k for k, _ in positive], [d for _, d in positive], marker="o", markersize=3)
    else:
        if result.verdict == "identical":
            text = "all parameters bitwise equal"
        elif not steps:
            text = "no parameter values saved"
        elif any(e.get("tensor") != "loss" for e in result.nonfinite):
            text = "finite values equal;\nNaN/Inf positions differ (see the summary)"
        else:
            text = "all parameters bitwise equal"
        ax2.text(0.5, 0.5, text, ha="center", va="center", transform=ax2.transAxes)
    ax2.set_xlabel("step (0 = initial parameters)")
    ax2.set_ylabel("max |Δ weight| vs run 1")
    ax2.set_title("How the difference grew")
    fig.suptitle(f"torchrepro check: {result.verdict}")
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.86, wspace=0.28)  # fixed: tight_layout is slow
    path = Path(path)
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100), durable=False)
    return path
