"""The ``torchrepro`` command line (layer L6, see docs/architecture.md): one module per subcommand.

Exit codes: 0 clean/identical, 1 divergence or findings, 2 usage or input error, 3 internal error.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from .._core.errors import InternalError, Interrupted, ReproError
from .._core.table import printable_lines
from .._version import __version__
from ._usage import SUMMARIES, HelpFormatter

# Subcommand modules (in --help order), each with add_parser(subparsers) and run(args) -> int. They are imported
# only when needed: lint and rule run without importing torch (fast enough for pre-commit hooks).
COMMANDS = ["run_cmd", "check_cmd", "diff_cmd", "env_cmd", "audit_cmd", "lint_cmd", "rule_cmd", "bench_cmd",
            "variance_cmd", "scan_cmd", "compare_cmd", "bisect_cmd", "invariance_cmd", "completion_cmd"]
NAMES = [name.removesuffix("_cmd") for name in COMMANDS]  # each module's subcommand, known without importing it
# Options that give a command's JSON another schema, errors included: (command, option) -> schema
OPTION_SCHEMAS = {("check", "--resume-at"): "torchrepro.check-resume/1"}


class UsageError(ReproError):
    """A command line that argparse rejected (exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are raised (so ``--json`` can report them as a JSON document), a mistyped option
    gets a suggestion, and help keeps example lines as written (:class:`HelpFormatter`). Subcommands' parsers are
    of this class too (argparse makes them of their parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if not hasattr(parsed, _CHOSEN):  # the deepest subcommand parses first: its parser is the one kept
            setattr(parsed, _CHOSEN, self)
        return parsed, extras

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        chosen = vars(parsed).pop(_CHOSEN, self)  # the parser of the subcommand given (`env diff`'s for env diff)
        if extras:
            raise UsageError(f"{chosen.prog}: error: unrecognized arguments: {' '.join(extras)}"
                             + did_you_mean(extras, long_options(chosen)))
        return parsed


_CHOSEN = "_torchrepro_parser"  # set on the namespace while parsing: the parser of the subcommand given


def long_options(parser: argparse.ArgumentParser) -> list[str]:
    """Every ``--option`` of ``parser``, in definition order."""
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


def did_you_mean(words: Sequence[str], options: Sequence[str]) -> str:
    """``"; did you mean --max-steps?"`` for the mistyped long options among ``words`` (empty if none is close).

    >>> did_you_mean(["--max-stepz", "3"], ["--runs", "--max-steps"])
    '; did you mean --max-steps?'
    """
    close = [match for word in words if word.startswith("--")
             for match in difflib.get_close_matches(word.split("=", 1)[0], options, n=1)]
    return f"; did you mean {' or '.join(dict.fromkeys(close))}?" if close else ""


def unknown_command(word: str) -> str:
    """What ``torchrepro WORD`` says when WORD is no command: the closest command, else the list.

    >>> unknown_command("chek")
    "torchrepro: unknown command 'chek'. Did you mean 'check'? (torchrepro --help lists the commands)"
    """
    close = difflib.get_close_matches(word, NAMES, n=2)
    if close:
        suggestion = " or ".join(f"'{name}'" for name in close)
        return (f"torchrepro: unknown command '{word}'. Did you mean {suggestion}? "
                "(torchrepro --help lists the commands)")
    script = f"python {word}" if word.endswith(".py") else "python train.py"
    hint = (f" To check a script, name the command first: torchrepro check -- {script}."
            if word.endswith(".py") or os.path.basename(word).startswith("python") else "")
    return f"torchrepro: unknown command '{word}'; expected one of: {', '.join(NAMES)}.{hint}"


EXAMPLES = """\
Examples:
  torchrepro check -- python train.py                          # two runs, compared bit for bit
  torchrepro check --locate --max-steps 5 -- python train.py   # the first nondeterministic op, and its line
  torchrepro lint train.py                                     # pitfalls found without running anything
  torchrepro check --help                                      # one command's options and examples

Shell completion: torchrepro completion bash (or zsh); see `torchrepro completion --help`."""


def build_parser(only: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of the subcommand modules named in ``only``."""
    parser, sub = _top_parser()
    for name in only or COMMANDS:
        importlib.import_module(f".{name}", __name__).add_parser(sub)
    return parser


def summary_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command as a bare entry (its ``--help`` line, no options): what ``torchrepro``,
    ``torchrepro --help`` and ``--version`` need, without importing a command's module (some import torch)."""
    parser, sub = _top_parser()
    for name in NAMES:
        sub.add_parser(name, help=SUMMARIES[name])
    return parser


def _top_parser() -> tuple[argparse.ArgumentParser, Any]:
    parser = _Parser(
        prog="torchrepro",
        description="Make PyTorch training bitwise reproducible, prove it, and find where it is not.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--version", action="version", version=f"torchrepro {__version__}")
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND")


def _own_words(argv: list[str]) -> list[str]:
    """The words after the subcommand up to the user's command (``--``, a ``.py`` script, ``python...``,
    ``torchrun``): torchrepro's own options and their values."""
    words = []
    for word in argv[1:]:
        if word == "--" or word.endswith(".py") or os.path.basename(word).startswith(("python", "torchrun")):
            break  # the user's command: its options are the script's
        words.append(word)
    return words


def _wants_json(argv: list[str]) -> bool:
    """Whether ``--json`` was given to torchrepro (not to the user's script), for errors found before parsing
    (``check --resume-at 0 --json -- ...`` too: an option's value does not end the search)."""
    return "--json" in _own_words(argv)


def _option_schema(argv: list[str], command: str | None) -> dict[str, str]:
    """``{"schema": ...}`` when one of torchrepro's own options (before the script) changes the JSON's schema."""
    for word in _own_words(argv):
        schema = OPTION_SCHEMAS.get((command or "", word.split("=", 1)[0]))
        if schema is not None:
            return {"schema": schema}
    return {}


def error_document(command: str | None, message: str, exit_code: int, **extra: object) -> dict[str, object]:
    """The one JSON document ``--json`` prints when a command fails (``"verdict": "error"``)."""
    return {"schema": f"torchrepro.{command or 'cli'}/1", "verdict": "error", "error": message,
            "exit_code": exit_code, **extra}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit code.

    For ``run`` and ``check`` everything from the script on belongs to the script
    (``torchrepro check python train.py --runs 3`` passes ``--runs 3`` to train.py); ``--`` may separate them.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _argv[:] = argv
    first = next((word for word in argv if not word.startswith("-")), None)
    if first is not None and first not in NAMES:  # a typo: said before importing every command (and torch)
        return _fail(None, _wants_json(argv), "", unknown_command(first), 2)
    # Only the named subcommand's module is imported (the others may import torch); without one (--help,
    # --version) none is: the commands are listed from their summaries.
    parser = build_parser([f"{first}_cmd"]) if first is not None else summary_parser()
    as_json = _wants_json(argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    try:
        args = parser.parse_args(argv)
        command, as_json = args.command, bool(getattr(args, "json", False))
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        if getattr(args, "accepts_command", False):
            user_command = list(args.user_command)
            if user_command[:1] == ["--"]:
                user_command = user_command[1:]
            if not user_command:
                raise UsageError(f"torchrepro {args.command}: error: no command given; usage: torchrepro "
                                 f"{args.command} [OPTIONS] -- python train.py [ARGS]")
            args.user_command = user_command
        return int(args.handler(args))
    except UsageError as exc:
        return _fail(command, as_json, "", str(exc), 2)
    except Interrupted as exc:
        return _fail(command, as_json, "torchrepro: ", str(exc), 128 + exc.signum)
    except InternalError as exc:
        return _fail(command, as_json, "torchrepro: internal error: ", str(exc), 3,
                     stderr=exc.stderr_path)
    except ReproError as exc:
        return _fail(command, as_json, "torchrepro: error: ", str(exc), 2, stderr=exc.stderr_path)
    except KeyboardInterrupt:
        return _fail(command, as_json, "torchrepro: ", "interrupted", 130)
    except BrokenPipeError:  # `torchrepro ... | head`: the reader left; not an error of ours
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        traceback.print_exc()
        return _fail(command, as_json, "torchrepro: ", f"internal error (a bug in torchrepro: {type(exc).__name__}: "
                     f"{exc}); please report it with the traceback printed on stderr.", 3)


def _fail(command: str | None, as_json: bool, prefix: str, message: str, exit_code: int, **extra: object) -> int:
    print(printable_lines(prefix + message), file=sys.stderr, flush=True)  # it may quote file or command names
    if as_json:
        doc = error_document(command, message, exit_code, **extra) | _option_schema(_argv, command)
        print(json.dumps(doc, indent=2), flush=True)
    return exit_code


_argv: list[str] = []  # the command line main() is handling (for _option_schema)


def console_main() -> int:
    code = main()
    from ..record.launcher import freeze_heap

    freeze_heap()  # after check/diff the parent holds torch and matplotlib: exit without long collections
    return code
