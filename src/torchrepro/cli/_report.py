"""Write ``report.html`` beside a command's JSON document (the page itself: :mod:`torchrepro.cli._html`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._core.io import atomic_write_bytes
from ._checkrun import WriteErrors, wrote

REPORT = "report.html"


def write_report(path: Path, build: Callable[[], str], errors: WriteErrors) -> Path | None:
    """Build the page and write it atomically; the path, or None when it could not be written.

    A file system error joins ``errors`` (the command exits 2, the verdict printed all the same); a failure while
    building the page is printed as a warning: the verdict and the JSON document never depend on the report."""
    try:
        page = build()
    except Exception as exc:  # noqa: BLE001 - the report is a view of a result that is already complete
        print(f"torchrepro: warning: {path} was not written: building it failed ({type(exc).__name__}: {exc}). The "
              "verdict and the JSON document are complete; please report this at the project's issue tracker.",
              file=sys.stderr, flush=True)
        return None
    return path if wrote(path, lambda: atomic_write_bytes(path, page.encode("utf-8")), errors) else None


def html_option(p: Any, what: str) -> None:
    """``--html PATH`` for the commands without an output directory (``env diff``, ``audit``)."""
    p.add_argument("--html", metavar="PATH", help=f"also write {what} as a self-contained HTML page to PATH")


def write_html_option(given: str | None, build: Callable[[], str]) -> tuple[int, str | None]:
    """Write ``--html PATH`` (nothing without it): ``(0, None)``, or ``(2, why)`` after printing why PATH could not be
    written."""
    if not given:
        return 0, None
    errors: WriteErrors = []
    path = Path(given)
    if path.is_dir():
        errors.append((f"--html {given} is a directory, expected a file name such as {path / REPORT}", None))
    elif write_report(path, build, errors) is not None:
        print(f"torchrepro: wrote {path}", file=sys.stderr, flush=True)
        return 0, None
    why = "; ".join(e for e, _ in errors) or f"could not write {given}"
    print(f"torchrepro: error: {why}. The output above is complete; only the page is missing: give --html a file "
          "name in a folder you can write to.", file=sys.stderr, flush=True)
    return 2, why


def html_fields(doc: dict[str, Any], given: str | None, outcome: tuple[int, str | None]) -> dict[str, Any]:
    """``doc`` (a command's JSON document) saying where ``--html`` wrote the page (``"report"``), or why it could
    not (``"report_error"``, and ``exit_code`` 2 as the process exits)."""
    if not given:
        return doc
    code, why = outcome
    doc = {**doc, "report": None if code else str(given)}
    if code:
        doc["report_error"] = why
        if "exit_code" in doc:
            doc["exit_code"] = code
    return doc
