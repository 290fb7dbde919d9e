"""Source: files that cannot be analysed. The engine reports these while reading files; they have no check."""

from __future__ import annotations

from ..rule import Rule


class SyntaxErrorRule(Rule):
    code = "TR001"
    name = "syntax-error"
    family = "source"
    summary = "A file that cannot be parsed (syntax error, or unreadable) is reported, and the run goes on."
    what = """
        A Python file with a syntax error (for the Python version running the linter), one that cannot be
        read, or one too large or too deeply nested to parse.
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


RULES = (SyntaxErrorRule, NotUtf8, NullBytes)
