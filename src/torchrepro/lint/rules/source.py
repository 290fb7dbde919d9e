"""Source: files that cannot be analysed. The engine reports these while reading files; they have no check."""

from __future__ import annotations

from ..reading import MAX_SOURCE_BYTES
from ..rule import Rule


class SyntaxErrorRule(Rule):
    code = "TR001"
    name = "syntax-error"
    family = "source"
    summary = "A file that cannot be parsed (a syntax error) is reported, and the run goes on."
    what = """
        A Python file with a syntax error (for the Python version running the linter), or one too deeply
        nested to parse. (A file that cannot be read at all is TR004.)
        """
    why = """
        Nothing in the file can be checked, so its pitfalls stay hidden; and a file Python cannot parse will
        not run either.
        """
    example = """
        def main(:                                  # TR001
        """
    instead = """
        def main():
        """
    help = "fix the syntax error (or exclude the file if it is not Python for this interpreter)"


class NotUtf8(Rule):
    code = "TR002"
    name = "not-utf8"
    family = "source"
    summary = "A file that is not valid UTF-8 (or not valid in its declared `coding:` encoding)."
    what = """
        A file whose bytes do not decode as UTF-8 — or as the encoding its `# -*- coding: ... -*-` line declares
        — or that declares an unknown encoding. The position is that of the first bad byte.
        """
    why = """
        Python refuses to run such a file, and the linter cannot read it, so it is not checked.
        """
    example = """
        name = "caf\\xe9"     # saved as Latin-1 without a coding line   # TR002
        """
    instead = """
        name = "café"         # saved as UTF-8
        """
    help = "save the file as UTF-8 (or declare its encoding on the first or second line)"


class NullBytes(Rule):
    code = "TR003"
    name = "null-bytes"
    family = "source"
    summary = "A file that contains a null byte."
    what = """
        A `.py` file with a NUL (0x00) byte, such as a binary file with a `.py` name or a file saved as UTF-16.
        """
    why = """
        Python cannot compile source with null bytes, and the linter cannot analyse it.
        """
    example = """
        b'x = 1\\x00'                                # TR003: the bytes of the file
        """
    instead = """
        b'x = 1\\n'                                  # the same code saved as UTF-8 text
        """
    help = "re-save the file as UTF-8 text (or exclude it)"


class UnreadableFile(Rule):
    code = "TR004"
    name = "unreadable-file"
    family = "source"
    summary = "A file or directory that is not read: not a regular file, too large, or not permitted."
    what = f"""
        A `*.py` path (found by the directory search or named on the command line) that is not a regular file —
        a FIFO, a device, a socket, or a symbolic link to one — or is over {MAX_SOURCE_BYTES:,} bytes, or cannot
        be opened or read (permission denied); also a directory that cannot be listed. Symbolic links to regular
        files are linted; dangling ones (such as editors' lock files, `.#name.py`) are skipped.
        """
    why = """
        The linter never opens what is not a regular file (a FIFO would block it, a device such as /dev/zero
        would never end) and measures a file before reading it, so none of them is checked; the finding says
        so instead of passing in silence.
        """
    example = """
        $ mkfifo x.py && torchrepro lint .
        x.py:1:1: TR004 it is a FIFO (named pipe), not a regular file; it was not read
        """
    instead = """
        [tool.torchrepro.lint]
        extend-exclude = ["x.py"]          # or remove it; or `chmod +r` a file you cannot read
        """
    help = (f"lint only regular files of at most {MAX_SOURCE_BYTES:,} bytes that you can read: exclude this path "
            "(extend-exclude), or fix its permissions")


RULES = (SyntaxErrorRule, NotUtf8, NullBytes, UnreadableFile)
