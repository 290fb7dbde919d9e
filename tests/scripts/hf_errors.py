"""Several resumes that ReproducibleCallback must refuse, in one process (each fails before its first step).

    python tests/scripts/hf_errors.py NAME=ARGS [NAME=ARGS ...]

``ARGS`` are hf_train.py's options, separated by spaces. Prints ``ERROR {...}`` or ``RESULT {...}`` per scenario,
prefixed with its name: ``NAME ERROR {"type": ..., "message": ...}``.
"""

from __future__ import annotations

import contextlib
import io
import sys

import hf_train


def main(scenarios: list[str]) -> int:
    for scenario in scenarios:
        name, _, options = scenario.partition("=")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            hf_train.run(hf_train.parser().parse_args(options.split()))
        lines = [ln for ln in out.getvalue().splitlines() if ln.startswith(("ERROR ", "RESULT "))]
        print(f"{name} {lines[-1] if lines else 'NOTHING'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
