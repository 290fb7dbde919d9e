"""``compare --locate`` when a command runs ``torch.compile``'d code: capture its graphs, measure them against eager.

One side compiled (eager vs ``torch.compile``): only that command is re-run, capturing the graphs inductor compiled
at the first divergent step; each graph's compiled nodes are measured against the same graph run eagerly
(:func:`torchrepro.analysis.compiledvs.compiled_vs_eager`). Both compiled: both are re-run and their graph nodes
aligned as op streams.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..record.launcher import LaunchOptions
from ..record.store import Run
from ._sides import Side, record_side

if TYPE_CHECKING:
    from ..analysis.crossrun import CompareResult

CAPTURE_REPEATS = 2  # each graph run twice: enough to see a compiled kernel that also varies by itself


def capture_options(opts: LaunchOptions, step: int, mode: str) -> LaunchOptions:
    from ..record.compiled import CAPTURE_ENV

    stop_at = step if mode == "optimizer" else opts.max_steps
    capture = {"repeats": CAPTURE_REPEATS, "deltas": True}
    return dataclasses.replace(opts.with_values(keep=False), max_steps=stop_at,
                               extra_env={**opts.extra_env, CAPTURE_ENV: json.dumps(capture)})


def _captured(side: Side, out: Path, opts: LaunchOptions) -> dict[str, Any]:
    from ..record.compiled import GRAPHS_FILE

    if side.recorded is not None:
        if not (side.recorded / GRAPHS_FILE).exists():
            from .._core.errors import RunDirError

            raise RunDirError(side.recorded, f"runs torch.compile'd code but holds no {GRAPHS_FILE}, so --locate "
                              "cannot look into it.", "Give the command itself instead of the run directory.")
        return read_graphs(side.recorded)
    return read_graphs(record_side(side, out / "locate" / side.label.lower(), opts, quiet=True))


def read_graphs(run_dir: Path) -> dict[str, Any]:
    """A re-run's compiled_graphs.json (written by torchrepro itself moments ago), or {} when none was written."""
    from ..record.compiled import GRAPHS_FILE

    path = run_dir / GRAPHS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def locate_compiled_sides(sides: list[Side], runs: list[Run], compiled: list[bool], result: CompareResult,
                          out: Path, opts: LaunchOptions, step: int) -> dict[str, Any]:
    """The ``locate`` document when one or both commands run compiled code."""
    from ..analysis.compiledvs import compiled_vs_eager, graph_ops

    capture = capture_options(opts, step, result.check.step_mode)
    which = [s.label for s, c in zip(sides, compiled) if c]
    print(f"torchrepro: --locate: command {' and '.join(which)} runs torch.compile'd code: capturing the graphs "
          f"inductor compiled and measuring them at step {step} against eager PyTorch", file=sys.stderr, flush=True)
    if all(compiled):
        from ..analysis.proglocate import locate_programs

        docs = [_captured(side, out, capture) for side in sides]
        found = locate_programs(graph_ops(docs[0]), graph_ops(docs[1]), {}, {}, result.tolerance)
        return found.to_json() | {"step": step, "compiled": False, "compiled_nodes": True,
                                  "traced_in": "the graphs inductor compiled in both commands (instrumented compiles: "
                                               "every node an output), compared bitwise"}
    side = sides[compiled.index(True)]
    doc = compiled_vs_eager(_captured(side, out, capture), step=step, side=side.label)
    return doc | {"side": side.label, "eager_side": sides[compiled.index(False)].label}
