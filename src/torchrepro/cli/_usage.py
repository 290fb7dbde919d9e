"""Usage lines made from a subcommand's own argparse options, so that they cannot leave an option out.

argparse's own usage line for a command that ends in ``-- python train.py [ARGS]`` (``argparse.REMAINDER``) is
hard to read; this one lists every option as ``[--flag METAVAR]`` in definition order, then the command's tail.
"""

from __future__ import annotations

import argparse
import textwrap

COMMAND_TAIL = "-- python train.py [ARGS]"

# Each command's line in `torchrepro --help` (its parser's help=, in --help order). Kept here, not in the command's
# module, so that `torchrepro --help` and `--version` list the commands without importing their modules: six of them
# import torch (about 2 s), which `torchrepro check --help` or `lint` never pay either.
SUMMARIES = {
    "run": "run a script with seeding/determinism and optional recording",
    "check": "run a training script N times and compare the runs bit for bit",
    "diff": "compare two recorded run directories (and their environments)",
    "env": "show the environment facts that change numerics; `env diff A B` ranks the differences between two",
    "audit": "judge the reproducibility checklist here, or for a script at its first step",
    "lint": "find reproducibility pitfalls in training code (static; exit 1 on findings)",
    "rule": "explain a lint rule (torchrepro rule TR101); without a code, list the rules",
    "bench": "time a training script's steps under default and deterministic settings",
    "variance": "same-seed nondeterminism vs seed-to-seed spread, and the smallest difference two configurations can "
                "show",
    "scan": "list the ops of one training step that are nondeterministic on a device (exit 1 if any)",
    "compare": "run two different commands and compare them step by step (bitwise or within a tolerance)",
    "bisect": "find the first commit whose run differs from a good commit's (git worktrees; your checkout is never "
              "touched)",
    "invariance": "check that a model gives a row (a prompt) the same bits alone as inside any batch",
    "completion": "print the shell completion script (bash or zsh) of every command",
}


def option_usage(action: argparse.Action) -> str:
    """``[--flag]`` or ``[--flag METAVAR]`` (the first option string, as argparse shows it)."""
    flag = action.option_strings[0]
    if action.nargs == 0:
        return f"[{flag}]"
    if action.metavar is not None:
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = action.dest.upper()
    return f"[{flag} {metavar}]"


def usage_line(parser: argparse.ArgumentParser, prog: str, tail: str, *, leave_out: tuple[str, ...] = ()) -> str:
    """``prog [--a A] [--b] ... tail``, wrapped at 110 columns; options whose first string is in ``leave_out``
    are left for ``tail`` to show (e.g. alternatives)."""
    options = [option_usage(a) for a in parser._actions
               if a.option_strings and a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
               and a.option_strings[0] not in leave_out]
    indent = " " * (len("usage: ") + len(prog) + 1)
    unbroken = [o.replace(" ", _KEEP) for o in options]  # never "[--flag" on one line and "METAVAR]" on the next
    words = [prog, *unbroken, tail.replace(COMMAND_TAIL, COMMAND_TAIL.replace(" ", _KEEP))]
    text = textwrap.fill(" ".join(words), width=110 - len("usage: "), subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)
    return text.replace(_KEEP, " ")


_KEEP = "\xa0"  # a space that textwrap does not break at (it splits on ASCII whitespace only)


def set_usage(parser: argparse.ArgumentParser, prog: str, tail: str, *, leave_out: tuple[str, ...] = ()) -> None:
    """Give ``parser`` the usage line of :func:`usage_line` (call it after the last ``add_argument``)."""
    parser.usage = usage_line(parser, prog, tail, leave_out=leave_out)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, except that a line of a description or epilog that starts with a space (an example command)
    is kept as it is written; every other line is wrapped as usual. ``--help`` of every command uses it::

        Examples:
          torchrepro check -- python train.py        # kept on its own line, never joined to the next
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(self._fill_line(line, width, indent) for line in text.splitlines())

    def _fill_line(self, line: str, width: int, indent: str) -> str:
        if not line.strip():
            return ""
        return indent + line if line.startswith(" ") else super()._fill_text(line, width, indent)
