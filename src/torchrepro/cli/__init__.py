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
from . import env_cmd

# Subcommand modules, each with add_parser(subparsers) and run(args) -> int.
COMMANDS = [env_cmd]


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
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if extra and not getattr(args, "accepts_command", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "accepts_command", False):
        if extra and extra[0] == "--":
            extra = extra[1:]
        args.user_command = list(extra)
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
