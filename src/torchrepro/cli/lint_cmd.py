"""``torchrepro lint PATH...``: static checks for reproducibility pitfalls in training code (docs/lint.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .._core.errors import ReproError
from .._version import __version__
from ..lint import FORMATS, ConfigError, LintConfig, lint_paths, load_config, render
from ..lint.formats import summary_line
from ._options import add_json_option
from ._usage import SUMMARIES


class LintUsageError(ReproError):
    """A lint command line or configuration that cannot be used (exit 2)."""


class _FormatAction(argparse.Action):
    """``--format json`` also sets ``json`` so that errors are reported as a JSON document."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        namespace.format = values
        namespace.json = values == "json"


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


EXAMPLES = """\
Examples:
  torchrepro lint train.py
  torchrepro lint src/ --select TR1 --format json
  torchrepro lint --exit-zero .               # report, never fail"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "lint", help=SUMMARIES["lint"],
        description="Check Python files for reproducibility pitfalls: unseeded or late-seeded generators, "
                    "nondeterministic CUDA ops and cuDNN settings, data order, distributed sampling, checkpoints "
                    "without RNG state. `torchrepro rule CODE` explains a rule. Configuration: "
                    "[tool.torchrepro.lint] in pyproject.toml. Suppress one line with `# torchrepro: noqa: CODE`. "
                    "Exit codes: 0 clean, 1 findings, 2 usage or configuration error.",
        epilog=EXAMPLES)
    p.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                   help="files and directories to check (default: the current directory)")
    p.add_argument("--format", choices=FORMATS, default="text", action=_FormatAction,
                   help="output format (default: text)")
    add_json_option(p, "same as --format json")
    p.add_argument("--select", type=_csv, action="extend", default=None, metavar="CODES",
                   help="comma-separated rule codes or prefixes to run (replaces the configured selection)")
    p.add_argument("--extend-select", type=_csv, action="extend", default=[], metavar="CODES",
                   help="rule codes or prefixes to run in addition")
    p.add_argument("--ignore", type=_csv, action="extend", default=[], metavar="CODES",
                   help="rule codes or prefixes to skip")
    p.add_argument("--exclude", type=_csv, action="extend", default=None, metavar="PATTERNS",
                   help="gitignore-style patterns to skip (replaces the configured exclude)")
    p.add_argument("--extend-exclude", type=_csv, action="extend", default=[], metavar="PATTERNS",
                   help="gitignore-style patterns to skip in addition")
    p.add_argument("--force-exclude", action="store_true",
                   help="apply excludes to files named on the command line too (useful with pre-commit)")
    p.add_argument("--config", type=Path, metavar="PYPROJECT", help="read [tool.torchrepro.lint] from this file")
    p.add_argument("--isolated", action="store_true", help="ignore pyproject.toml; use command-line options only")
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    p.add_argument("--quiet", "-q", action="store_true", help="do not print the summary line on stderr")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    fmt = "json" if args.json else args.format
    try:
        config = LintConfig(base=Path.cwd()) if args.isolated else load_config(args.config)
        config = config.with_cli(select=args.select, ignore=args.ignore, extend_select=args.extend_select,
                                 exclude=args.exclude, extend_exclude=args.extend_exclude,
                                 force_exclude=args.force_exclude)
        result = lint_paths(args.paths, config)
    except ConfigError as exc:
        raise LintUsageError(str(exc)) from None
    sys.stdout.write(render(result, fmt, tool_version=__version__))
    sys.stdout.flush()
    if fmt == "text" and not args.quiet:
        print(summary_line(result), file=sys.stderr)
    return 0 if args.exit_zero else result.exit_code
