"""Text tables for summaries: rich's box drawing when rich is installed, plain columns otherwise."""

from __future__ import annotations

import io
import unicodedata


def render_table(headers: list[str], rows: list[list[str]], *, right: set[int] | frozenset[int] = frozenset(),
                 width: int = 160) -> str:
    """A table as text (no colour codes). Columns whose index is in ``right`` are right-aligned."""
    try:
        from rich import box
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return _plain(headers, rows, right)
    table = Table(*headers, box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    for i, column in enumerate(table.columns):
        column.justify = "right" if i in right else "left"
        column.no_wrap = True
    for row in rows:
        table.add_row(*row)
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False).print(table)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()).strip("\n")


def _plain(headers: list[str], rows: list[list[str]], right: set[int] | frozenset[int]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join(line(r).rstrip() for r in [headers, *rows])


# Characters that a terminal acts on or that reorder what is shown: controls (ANSI escapes, newlines), format
# characters (bidi overrides and isolates, zero-width marks), line/paragraph separators, lone surrogates.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_SHORT_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def printable(text: str) -> str:
    """``text`` safe to print: control, bidi/format and separator characters escaped as Python would write them.

    For strings torchrepro did not write itself (recorded environment values, variable names, file contents):

    >>> printable("\\x1b[31mred\\u202e")
    '\\\\x1b[31mred\\\\u202e'
    """
    if text.isprintable():
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) in _ESCAPED_CATEGORIES else ch for ch in text)


def printable_lines(text: str) -> str:
    """``text`` with every line made :func:`printable` (its line breaks kept): what a command prints, so that no
    string it quotes (a parameter, module or file name from a run directory) can move the cursor, recolour the
    terminal or reverse the text.

    >>> printable_lines("torchrepro: DIVERGED\\nname \\x1b[32mok\\r")
    'torchrepro: DIVERGED\\nname \\\\x1b[32mok\\\\r'
    """
    return "\n".join(printable(line) for line in text.split("\n"))


def _escape(ch: str) -> str:
    code = ord(ch)
    long = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    return _SHORT_ESCAPES.get(ch, long)
