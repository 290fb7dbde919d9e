"""One verdict writer: every command that ends in a verdict goes out the same way.

``check`` (one process, ranks, ``--resume-at``), ``diff``, ``compare`` and ``bisect`` hand :func:`emit` a
:class:`Verdict` and get the same sequence: the plot, the JSON document, ``report.html``, the document saved,
the terminal text (or the JSON) and the exit code (``--locate``'s files: :func:`save_locate`). A file that
cannot be written never loses the verdict: it is printed all the same, the document says ``"exit_code": 2`` and
why (on stdout and, when it could be written, on disk), and the process exits 2.

Example:
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> v = Verdict(doc={"verdict": "identical"}, exit_code=0, json_name="x.json",
    ...             summary=lambda plot: "torchrepro: IDENTICAL")
    >>> emit(v, out, as_json=False)
    torchrepro: IDENTICAL
    0
    >>> sorted(p.name for p in out.iterdir())
    ['x.json']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._core.io import atomic_write_bytes, atomic_write_json
from ._checkrun import WriteErrors, print_verdict, saved, unsaved_message, wrote

PLOT = "check.png"


@dataclass
class Verdict:
    """What a command found, and how to show it (see :func:`emit`)."""

    doc: dict[str, Any]  # the JSON document; ``plot``, ``report``, ``exit_code`` (and ``error``) are filled in
    exit_code: int  # 0 identical/equivalent, 1 diverged (2 is emit's, when a file cannot be written)
    json_name: str  # e.g. "check.json"
    summary: Callable[[str | None], str]  # the terminal summary, given the plot's path (None: no plot)
    report: Callable[[dict[str, Any], str], str] | None = None  # report.html's page, given (doc, summary)
    plot: Callable[[Path], Any] | None = None  # writes the plot to the path it is given
    # the full terminal text from (summary, plot, report); default: the summary and a "Report: PATH" line
    text: Callable[[str, str | None, Path | None], str] | None = None


def write_file(path: Path, data: bytes, errors: WriteErrors) -> bool:
    """Write ``data`` atomically; whether it was written (a failure joins ``errors``, see :func:`emit`)."""
    return wrote(path, lambda: atomic_write_bytes(path, data), errors)


def emit(v: Verdict, out: Path, *, as_json: bool, errors: WriteErrors | None = None) -> int:
    """Save and print ``v`` (the sequence in the module docs); return the exit code. ``errors``: writes that
    already failed before the verdict (they make the exit code 2 too)."""
    from ._report import REPORT, write_report

    errors = list(errors or [])
    doc = v.doc
    plot = None
    draw = v.plot
    if draw is not None:
        made = saved(out / PLOT, lambda: draw(out / PLOT), errors)
        plot = str(made) if made else None
        doc["plot"] = plot
    doc["exit_code"] = v.exit_code
    summary = v.summary(plot)
    build = v.report
    report = write_report(out / REPORT, lambda: build(doc, summary), errors) if build is not None else None
    if build is not None:
        doc["report"] = str(report) if report else None
    if errors:  # the document on disk says so too
        doc["exit_code"], doc["error"] = 2, unsaved_message(errors)
    saved(out / v.json_name, lambda: atomic_write_json(out / v.json_name, doc), errors)
    text = ""
    if not as_json:
        text = v.text(summary, plot, report) if v.text else summary + (f"\nReport: {report}" if report else "")
    return print_verdict(doc, text, as_json, errors)


def save_locate(out: Path, doc: dict[str, Any], table: str | None, errors: WriteErrors) -> dict[str, Any]:
    """Save what ``--locate`` found: ``locate_ops.txt`` (the op table, when there is one; ``doc["op_table"]``
    names it once written) and ``locate.json``, both under the verdict's guard (a failure joins ``errors``)."""
    path = out / "locate_ops.txt"
    if table is not None and write_file(path, (table + "\n").encode(), errors):
        doc["op_table"] = str(path)
    saved(out / "locate.json", lambda: atomic_write_json(out / "locate.json", doc), errors)
    return doc




def locate_failed(exc: Exception, rerun: str) -> dict[str, Any]:
    """The ``locate`` document when ``--locate``'s traced re-runs failed: the verdict already found is kept and
    this is reported beside it (``rerun`` names the command to try by hand)."""
    first = str(exc).split("\n", 1)[0]
    return {"verdict": "failed", "title": f"the traced re-runs failed, so no op could be named: {first}",
            "error": str(exc), "stderr": getattr(exc, "stderr_path", None),
            "note": f"The verdict above stands (it comes from the compared runs). Fix what made the re-run fail, "
                    f"then run `{rerun}` again."}
