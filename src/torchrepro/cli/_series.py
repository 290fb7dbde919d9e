"""What ``bench`` and ``variance`` share around their series of runs (the runs: :func:`torchrepro.record.runs.
run_series`): their output directory and their figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._core.errors import OutputDirError
from .._core.io import atomic_write
from ..record.outdir import LOCK, NEXT, RUN_NAME, check_run_dir, make_dir, unique_dir
from ..record.runs import Launched, run_series

__all__ = ["Launched", "output_dir", "pyplot", "run_series", "save_figure"]


def output_dir(given: str | None, prefix: str, own_files: set[str]) -> Path:
    """``--out`` checked (only run directories and this command's ``own_files`` may be replaced), or a new one."""
    if given is None:
        return unique_dir(Path("torchrepro-runs"), prefix)
    out = Path(given)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"--out {out}: exists and is not a directory. {NEXT}")
    if out.is_dir():
        foreign = []
        for entry in sorted(out.iterdir(), key=lambda p: p.name):
            if RUN_NAME.fullmatch(entry.name) and entry.is_dir():
                check_run_dir(entry, flag="--out")
            elif entry.name not in own_files | {LOCK} or entry.is_dir():
                foreign.append(entry.name)
        if foreign:
            raise OutputDirError(f"--out {out}: the directory holds files that torchrepro {prefix} did not write "
                                 f"({foreign[:5]}); torchrepro replaces only its own output. {NEXT}")
    return make_dir(out, flag="--out")


def pyplot() -> Any:
    """matplotlib.pyplot with the file-only backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` atomically and close it."""
    plt = pyplot()
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100), durable=False)
    finally:
        plt.close(fig)
    return path
