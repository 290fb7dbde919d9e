"""``torchrepro audit``: the reproducibility checklist, judged on this process or on a script at its first step.

``torchrepro audit [--json]`` judges the environment a script would start in here; ``torchrepro audit -- python
train.py [ARGS]`` runs the script through the launcher until its first optimizer step (its output goes to
stderr) and judges what the script set up by then. Exit 0 when nothing is found, 1 on findings.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from .._core.errors import Interrupted, ScriptError
from .._core.table import printable
from ..env.audit import AuditReport, audit, audit_recorded
from ..record.launcher import LaunchOptions, launch, parse_python_command
from ._html.reports import audit_report
from ._options import add_json_option
from ._report import html_fields, html_option, write_html_option
from ._usage import SUMMARIES

_MARK = {"ok": "ok    ", "info": "info  ", "advice": "ADVICE", "threat": "THREAT"}


EXAMPLES = """\
Examples:
  torchrepro audit
  torchrepro audit --html audit.html -- python train.py"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("audit", help=SUMMARIES["audit"],
                       usage="torchrepro audit [--json] [--html PATH] [-- python train.py [ARGS]]",
                       description="Evaluate the reproducibility checklist (RNG seeds, DataLoader workers, cuDNN/"
                       "cuBLAS algorithm choice, collective communication, mixed precision, hardware). With a "
                       "command, run it to its first training step and audit what it set up. Exit 0 clean, 1 "
                       "findings, 2 usage error or a script that fails before its first step.",
                       epilog=EXAMPLES)
    add_json_option(p)
    html_option(p, "the checklist")
    p.add_argument("user_command", nargs=argparse.REMAINDER, metavar="-- python train.py [ARGS]",
                   help="a training command to audit at its first step (its output goes to stderr)")
    p.set_defaults(handler=run)


def render_report(report: AuditReport) -> str:
    """The checklist as text: one line per item, then the state and fix of every finding."""
    what = f"`{printable(' '.join(report.command))}` at its first step" if report.command else "this environment"
    lines = [f"torchrepro audit of {what}: "
             + (f"{len(report.findings)} finding(s)" if report.findings else "no findings")]
    for item in report.items:  # states and fixes quote recorded values (variables, seeds): printed escaped
        lines.append(f"  {_MARK[item.severity]}  {item.area:<31} {item.title}")
        lines.append(f"          {printable(item.state)}")
        if item.finding and item.fix:
            lines.append(f"          fix: {printable(item.fix)}")
    lines += [f"Note:  {printable(note)}" for note in report.notes]
    return "\n".join(lines)


def _audit_script(command: list[str]) -> AuditReport:
    parse_python_command(command)
    what = f"`{' '.join(command)}`"
    with tempfile.TemporaryDirectory(prefix="torchrepro-audit-") as tmp:
        record = Path(tmp) / "run"
        try:
            result = launch(command, LaunchOptions(record=str(record), max_steps=1, audit=True), stdout=sys.stderr)
        except Interrupted as exc:  # its partial recording is in the temporary directory, removed on the way out
            name = signal.Signals(exc.signum).name
            raise Interrupted(exc.signum, f"interrupted by {name}: stopped the script {what} before it could be "
                              "audited; nothing was kept.") from None
        if result.returncode != 0 or result.manifest is None:
            raise ScriptError(f"the script {what} failed with exit code {result.returncode} before it could be "
                              "audited (its output is above). Fix it so that it runs on its own, then audit again.")
        return audit_recorded(result.manifest, launch_env=dict(os.environ), source=f"the recording of {what}")


def run(args: argparse.Namespace) -> int:
    command = list(args.user_command)
    if command[:1] == ["--"]:
        command = command[1:]
    report = _audit_script(command) if command else audit()
    text = render_report(report)
    written = write_html_option(args.html, lambda: audit_report(report.to_json(), text))
    print(json.dumps(html_fields(report.to_json(), args.html, written), indent=2) if args.json else text)
    return written[0] or report.exit_code
