"""``torchrepro env``: the environment fingerprint; ``torchrepro env diff A B``: its risk-ranked differences.

``torchrepro env [--json] [-o FILE] [--include-host]`` prints (or writes) :func:`torchrepro.environment`.
``torchrepro env diff A B [--json]`` compares two env files or run directories; exit 1 when a difference breaks
bitwise equality, 0 otherwise, 2 for an input that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .._core.errors import OutputDirError
from .._core.io import atomic_write_json
from .._core.table import printable
from ..analysis.envdiff import BENIGN, diff_environments, flatten, load_environment, rank_of
from ..env.info import environment
from ._options import add_json_option
from ._render import print_env_diff
from ._report import html_fields, html_option, write_html_option
from ._usage import SUMMARIES

# Sections printed as "key value" rows, in this order; packages are summarised (all of them with --json).
_TEXT_SECTIONS = ("python", "platform", "torch_build", "cuda", "accelerators", "cpu", "config", "threads",
                  "determinism", "precision", "backends", "env", "git", "host")


EXAMPLES = """\
Examples:
  torchrepro env
  torchrepro env --json -o here.json
  torchrepro env diff here.json there.json"""
DIFF_EXAMPLES = """\
Examples:
  torchrepro env --json -o here.json          # on each machine, then:
  torchrepro env diff here.json there.json
  torchrepro env diff runs/a runs/b --json    # two recorded runs' environments"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("env", help=SUMMARIES["env"], usage="torchrepro env [--json] [-o FILE] [--include-host]\n"
                       "       torchrepro env diff A B [--json]",
                       description="Show the environment facts that can change numerics: versions, determinism flags, "
                                   "threads, hardware and variables. `torchrepro env diff A B` ranks the differences "
                                   "between two environments.",
                       epilog=EXAMPLES)
    add_json_option(p)
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the JSON document to FILE instead of printing the table (with --json: print it too)")
    p.add_argument("--include-host", action="store_true",
                   help="also record host name, user name, home and working directory (left out by default)")
    p.set_defaults(handler=run)
    actions = p.add_subparsers(dest="env_action", metavar="diff")
    d = actions.add_parser("diff", prog="torchrepro env diff", help="rank the differences between two environments",
                           description="Compare two environments: env JSON files (`torchrepro env --json -o FILE`) "
                           "or run directories (`torchrepro run --record DIR`). Exit 1 when a difference breaks "
                           "bitwise equality, 0 otherwise, 2 when an input cannot be read.",
                           epilog=DIFF_EXAMPLES)
    d.add_argument("a", metavar="A", help="env JSON file or run directory")
    d.add_argument("b", metavar="B", help="env JSON file or run directory")
    d.add_argument("--json", action="store_true", default=argparse.SUPPRESS,  # `env --json diff A B` works too
                   help="write one JSON document to stdout")
    html_option(d, "the ranked differences")
    d.set_defaults(handler=run_diff, command="env-diff")


def _value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (dict, list)) or v is None else str(v)


def render_environment(doc: dict[str, Any]) -> str:
    """The fingerprint as aligned ``section.key  value`` rows, packages summarised."""
    rows: list[tuple[str, str]] = [("torch", doc["torch"]), ("device_kind", doc["device_kind"]),
                                   ("torchrepro", doc["torchrepro"])]
    for section in _TEXT_SECTIONS:
        if section in doc:
            flat = flatten(doc[section], section)
            rows += [(k, _value(v)) for k, v in flat.items() if not (section == "env" and v is None)]
    packages = doc["packages"]
    in_path = [f"{name} {version}" for name, version in packages.items() if _compute_path(name)]
    rows.append(("packages", f"{len(packages)} installed; in the compute path: {', '.join(in_path) or 'none'} "
                             "(--json lists all)"))
    rows = [(printable(k), printable(v)) for k, v in rows]  # recorded strings: no escapes reach the terminal
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _compute_path(name: str) -> bool:
    return rank_of(f"packages.{name}").rank != BENIGN


def run(args: argparse.Namespace) -> int:
    doc = environment(include_host=args.include_host).to_json()
    if args.output:
        path = Path(args.output)
        if path.is_dir():
            raise OutputDirError(f"-o {path}: is a directory; name a file to write the environment to.")
        try:
            atomic_write_json(path, doc)
        except OutputDirError as exc:  # a socket or device that is not written through
            raise OutputDirError(f"-o {exc}") from None
        except OSError as exc:
            raise OutputDirError(f"-o {path}: cannot be written ({exc.strerror or exc}).") from None
        print(f"torchrepro: wrote the environment to {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=2))
    elif not args.output:
        print(render_environment(doc))
    return 0


def run_diff(args: argparse.Namespace) -> int:
    a, b = load_environment(args.a), load_environment(args.b)
    diff = diff_environments(a, b, label_a=args.a, label_b=args.b)
    written = write_html_option(args.html, lambda: _html(diff))
    if args.json:
        print(json.dumps(html_fields(diff.to_json(), args.html, written), indent=2))
    else:
        print_env_diff(diff)
        if diff.breaks_bitwise:
            print(f"\n{_BREAKS.format(summary=diff.summary())}")
    return written[0] or diff.exit_code


_BREAKS = ("B differs from A in settings that can break bitwise equality: {summary}. Whether they do depends on what "
           "the script runs: record a run in each (`torchrepro run --record DIR`) and `torchrepro diff` them.")


def _html(diff: Any) -> str:
    """The page of ``env diff --html``: the terminal's first line, the ranked table, the closing sentence."""
    from ._html.reports import env_diff_report
    from ._render import render_env_diff

    head = render_env_diff(diff).splitlines()[0]
    return env_diff_report(diff.to_json(), a=str(diff.a), b=str(diff.b), headline=head,
                           conclusion=_BREAKS.format(summary=diff.summary()) if diff.breaks_bitwise else None)

