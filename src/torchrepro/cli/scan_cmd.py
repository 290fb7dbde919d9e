"""``torchrepro scan``: list the ops of one training step that would be nondeterministic on a target device.

The script runs once, unmodified, in a child process (the launcher's, so signals reach it and it dies with us),
scanned from its start to the end of its first optimizer step (``--steps N``: N steps), then stopped. Exit codes:
0 clean, 1 ops found, 2 usage error or a script that failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from .._core.errors import ScriptError, StateFileError
from .._core.readjson import read_json
from ..analysis.scan import DEVICES, SCAN_ENV, ScanError, ScanReport, child_code
from ..record.launcher import LaunchOptions, launch, parse_python_command
from ..record.launchers import several_processes_error
from ._checkrun import tail_lines
from ._options import add_json_option, positive_int
from ._usage import SUMMARIES

_STDERR_FD = 2  # with --json the script's stdout goes to our stderr (a file descriptor: works under any sys.stderr)


EXAMPLES = """\
Examples:
  torchrepro scan -- python train.py                 # checked for CUDA, even on a CPU-only machine
  torchrepro scan --device cpu --json -- python train.py"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "scan", help=SUMMARIES["scan"],
        usage="torchrepro scan [--device cuda|cpu] [--steps N] [--json] -- python train.py [ARGS]",
        description="Run one training step of the script under an op scanner and list each op that would be "
                    "nondeterministic, raise or warn under deterministic mode on the target device -- also when "
                    "the scan itself runs on CPU -- with its module, source line, count and a fix. The script "
                    "is stopped after the step. Exit codes: 0 clean, 1 found, 2 usage error or failed script.",
        epilog=EXAMPLES)
    p.add_argument("--device", choices=DEVICES, default="cuda",
                   help="the device kind to check the ops for (default: cuda); the script runs wherever it runs")
    p.add_argument("--steps", type=positive_int, default=1, metavar="N",
                   help="scan up to the end of optimizer step N (or backward() call N without an optimizer); "
                        "default 1")
    add_json_option(p, "print one JSON document on stdout (the script's stdout goes to stderr)")
    p.add_argument("user_command", nargs=argparse.REMAINDER, metavar="-- python train.py [ARGS]",
                   help="the training command; everything from the script on belongs to the script")
    p.set_defaults(handler=run, accepts_command=True)


def _launch_command(command: list[str]) -> tuple[list[str], dict[str, str]]:
    """``python -c <scan child> KIND TARGET ARGS`` with the user's interpreter and python options, and the variables
    the user's launcher sets for the script (``accelerate launch`` of one process)."""
    target = parse_python_command(command)
    if target.launcher:  # accelerate launch of several processes: scan runs one
        raise several_processes_error(target.launcher)
    return [target.interpreter, *target.python_flags, "-c", child_code(), target.kind, target.target,
            *target.argv[1:]], dict(target.env)


def scan_script(command: list[str], *, device: str, steps: int = 1, stdout: Any = None) -> ScanReport:
    """Run ``command`` under the scanner in a child process and return its report.

    Raises :class:`~torchrepro._core.errors.ScriptError` (with the tail of the script's stderr) when it fails.
    """
    launch_command, launcher_env = _launch_command(command)  # a bad command is refused before anything runs
    with tempfile.TemporaryDirectory(prefix="torchrepro-scan-") as tmp:
        out, err_path = Path(tmp) / "scan.json", Path(tmp) / "stderr.txt"
        scan = json.dumps({"out": str(out), "device": device, "steps": steps})
        opts = LaunchOptions(extra_env={**launcher_env, SCAN_ENV: scan})
        with open(err_path, "wb") as err:
            result = launch(launch_command, opts, stdout=stdout, stderr=err)
        what = f"`{' '.join(command)}`"
        doc = _read_report(out)
        if result.returncode != 0:
            how = (f"was killed by signal {-result.returncode}" if result.returncode < 0 else
                   f"failed with exit code {result.returncode}")
            raise ScriptError(f"the script {what} {how} before the scan was complete. Fix the script so that it "
                              f"runs on its own (`python ...`), then scan again.{_found_before(doc)}\n"
                              f"Last lines of its stderr:\n{tail_lines(err_path)}")
        if doc is None:
            raise ScanError(f"the script {what} exited with 0 but left no scan report (did it end the process with "
                            f"os._exit?). Last lines of its stderr:\n{tail_lines(err_path)}")
    report = ScanReport.from_dict(doc)
    if report.step_mode == "script":
        report.notes.append("the script ended before its first optimizer step or backward() call, so all of it "
                            "was scanned; ops of a training step that it never ran cannot be listed.")
    elif report.steps < steps:
        report.notes.append(f"the script ended after {report.steps} of the {steps} steps asked for (--steps).")
    return report


def _read_report(path: Path) -> dict[str, Any] | None:
    """The report the scanned child wrote, or None when it is missing or unusable (the child was killed)."""
    try:
        doc = read_json(path)
    except StateFileError:
        return None
    return doc if isinstance(doc, dict) else None


def _found_before(doc: dict[str, Any] | None) -> str:
    """The ops the scan had found before the script failed (an op that raises under deterministic mode may be
    why it failed), as a sentence; empty when none."""
    if not doc or not doc.get("findings"):
        return ""
    report = ScanReport.from_dict(doc)
    found = "; ".join(f"{f.op} at {f.source()} (deterministic mode {f.deterministic_mode})" for f in report.findings)
    return f" Before it failed, the scan had found these ops that are nondeterministic on {report.device}: {found}."


def run(args: argparse.Namespace) -> int:
    command = list(args.user_command)
    sys.stdout.flush()
    report = scan_script(command, device=args.device, steps=args.steps, stdout=_STDERR_FD if args.json else None)
    if args.json:
        print(json.dumps({**report.to_json(), "command": command}, indent=2))
    else:
        print(report.render())
    return report.exit_code
