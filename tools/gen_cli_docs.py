"""The CLI reference page, generated from torchrepro's argparse parser (``torchrepro.cli.build_parser``).

The documentation build calls :func:`cli_reference` through the MkDocs hook ``tools/mkdocs_hooks.py`` at every
build, so the page (``reference/cli.md`` on the site) cannot drift from the parser. To read it without a build:

    python tools/gen_cli_docs.py              # Markdown on stdout
    python tools/gen_cli_docs.py -o cli.md
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from collections.abc import Iterator

WIDTH = 100  # usage lines are wrapped at this width, whatever the terminal
_DEFAULT_GROUPS = {"positional arguments": "Arguments", "options": "Options", "optional arguments": "Options"}
_CODE = re.compile(r"(`[^`]*`)")

HEADER = """\
# Command line

<!-- Generated from torchrepro.cli.build_parser() by tools/gen_cli_docs.py at every docs build: do not edit. -->

Every command is `torchrepro COMMAND [OPTIONS]`; `torchrepro COMMAND --help` prints the same text in the
terminal. Exit codes: 0 clean or identical, 1 divergence or findings, 2 usage or input error (the script failed,
a file could not be read or written), 3 internal error (a bug in torchrepro), 128+N when stopped by signal N.
The commands {script_commands} take the training command after their own options: everything from
the script on belongs to the script, with or without `--`. With `--json`, a command prints exactly one JSON document on
stdout, failures included. [Help, typos, shell completion](../cli.md): `--help`'s examples, "did you mean",
and `torchrepro completion bash|zsh`.
"""


def _text(value: str) -> str:
    """Help text as Markdown: backquoted parts stay code, everything else is escaped (``<DIR>``, ``*``)."""
    parts = _CODE.split(" ".join(value.split()))
    return "".join(p if p.startswith("`") else html.escape(p, quote=False).replace("*", r"\*").replace("_", r"\_")
                   for p in parts)


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(parser.prog, width=WIDTH, max_help_position=40)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = _formatter(parser)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in --help order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases share their parser
                    seen.add(id(sub))
                    yield name, helps.get(name, ""), sub


def documented_actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The arguments of ``parser`` that the page lists (all but --help and the subcommand selector)."""
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        yield action


def takes_command(parser: argparse.ArgumentParser) -> bool:
    """Whether the subcommand runs a training command given after its options (``-- python train.py``)."""
    return bool(parser.get_default("accepts_command")) or any(a.nargs == argparse.REMAINDER for a in parser._actions)


def _describe(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = _formatter(parser)
    invocation = formatter._format_action_invocation(action)
    if action.nargs == argparse.REMAINDER:
        invocation = action.metavar or action.dest
    help_text = formatter._expand_help(action) if action.help else ""
    extra = []
    if action.choices is not None and action.metavar is not None:  # else the invocation shows {a,b,c}
        extra.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    default = action.default
    if (action.option_strings and default not in (None, False, argparse.SUPPRESS, [], ())
            and not isinstance(action, argparse._VersionAction) and "default" not in help_text):
        extra.append(f"default `{default}`")
    if isinstance(action, argparse._VersionAction):
        help_text = help_text or "print the version and exit"
    line = f"- `{invocation}`"
    text = "; ".join([_text(help_text)] * bool(help_text) + extra)
    return f"{line}: {text}" if text else line


def epilog(text: str) -> list[str]:
    r"""An epilog as Markdown: its indented lines (example commands) as code blocks, the others as text.

    >>> epilog("Examples:\n  torchrepro check -- python train.py")
    ['Examples:', '', '```text', 'torchrepro check -- python train.py', '```', '']
    """
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith(" "):
            if out[-2:] == ["```", ""]:
                out[-2:] = []  # the next line of the same block
            else:
                out.append("```text")
            out += [line[2:] if line.startswith("  ") else line.lstrip(), "```", ""]
        elif line.strip():
            out += [_text(line), ""]
    return out


def _section(parser: argparse.ArgumentParser, title: str, summary: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{title}`", ""]
    if summary:
        out += [_text(summary[:1].upper() + summary[1:]) + ("" if summary.endswith(".") else "."), ""]
    if parser.description:
        out += [_text(parser.description), ""]
    out += ["```text", _usage(parser), "```", ""]
    groups = [(group.title or "", [a for a in group._group_actions if a in set(documented_actions(parser))])
              for group in parser._action_groups]
    for group_title, actions in groups:
        if not actions:
            continue
        label = _DEFAULT_GROUPS.get(group_title, group_title[:1].upper() + group_title[1:])
        out += [f"**{_text(label)}**", ""]
        out += [_describe(parser, a) for a in actions] + [""]
    if parser.epilog:
        out += epilog(parser.epilog)
    for name, sub_help, sub in _subcommands(parser):
        out += _section(sub, f"{title} {name}", sub_help, level + 1)
    return out


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """The Markdown page: a section per subcommand (and sub-subcommand), with usage and every argument."""
    if parser is None:
        from torchrepro.cli import build_parser

        parser = build_parser()
    commands = list(_subcommands(parser))
    takes_script = [f"`{name}`" for name, _, sub in commands if takes_command(sub)]
    listed = ", ".join(takes_script[:-1]) + " and " + takes_script[-1] if len(takes_script) > 1 else takes_script[0]
    out = [HEADER.format(script_commands=listed), "```text", _usage(parser), "```", ""]
    out += [_describe(parser, a) for a in documented_actions(parser)] + [""]
    out += ["| Command | What it does |", "|---|---|"]
    out += [f"| [`{name}`](#torchrepro-{name}) | {_text(sub_help)} |" for name, sub_help, _ in commands]
    out += [""]
    for name, sub_help, sub in commands:
        out += _section(sub, f"torchrepro {name}", sub_help, 2)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", metavar="FILE", help="write the page to FILE (default: stdout)")
    args = ap.parse_args(argv)
    page = cli_reference()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
