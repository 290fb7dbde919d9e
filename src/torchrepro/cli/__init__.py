"""The ``torchrepro`` command line (layer L4): one module per subcommand.

Exit codes: 0 clean/identical, 1 divergence or findings, 2 usage or input error, 3 internal error.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from .._version import __version__
from ..errors import ReproError
from . import check_cmd, diff_cmd, env_cmd, run_cmd

# Subcommand modules, each with add_parser(subparsers) and run(args) -> int.
COMMANDS = [run_cmd, check_cmd, diff_cmd, env_cmd]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchrepro",
        description="Make PyTorch training bitwise reproducible, prove it, and find where it is not.",
    )
    parser.add_argument("--version", action="version", version=f"torchrepro {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMANDS:
        mod.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:  # everything after the first `--` is the user's command, untouched
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    takes_command = getattr(args, "accepts_command", False)
    if extra and not takes_command:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if takes_command:
        args.user_command = extra + command
        if not args.user_command:
            print(f"torchrepro {args.command}: error: no command given; usage: torchrepro {args.command} "
                  "[OPTIONS] -- python train.py [ARGS]", file=sys.stderr)
            return 2
    try:
        return int(args.handler(args))
    except ReproError as exc:
        print(f"torchrepro: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torchrepro: interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print("torchrepro: internal error (a bug in torchrepro); please report it with the traceback above.",
              file=sys.stderr)
        return 3


def console_main() -> int:
    return main()
