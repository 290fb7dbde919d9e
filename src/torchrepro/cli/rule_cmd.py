"""``torchrepro rule [CODE]``: the documentation of a lint rule; without a code, the list of rules."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._core.errors import ReproError
from ..lint import RULES, get_rule
from ._options import add_json_option
from ._usage import SUMMARIES


class UnknownRuleError(ReproError):
    """A rule code or name that no rule has (exit 2)."""


EXAMPLES = """\
Examples:
  torchrepro rule TR101
  torchrepro rule unseeded-rng
  torchrepro rule                             # every rule, one a line"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("rule", help=SUMMARIES["rule"],
                       description="Explain a lint rule: what it finds, why it breaks reproducibility and how to fix "
                                   "it; without a code, list the rules.",
                       epilog=EXAMPLES)
    p.add_argument("code", nargs="?", help="a rule code (TR101) or name (unseeded-rng)")
    p.add_argument("--all", action="store_true", help="print the documentation of every rule")
    add_json_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.code is None:
        rules = list(RULES.values())
        if args.json:
            print(json.dumps({"schema": "torchrepro.rules/1", "rules": [r.to_json() for r in rules]}, indent=2))
        elif args.all:
            print("\n".join(r.documentation() for r in rules), end="")
        else:
            width = max(len(r.name) for r in rules)
            for r in rules:
                print(f"{r.code}  {r.name:<{width}}  {r.summary}")
        return 0
    rule = get_rule(args.code)
    if rule is None:
        raise UnknownRuleError(f"unknown rule {args.code!r}; `torchrepro rule` lists the rules "
                               f"({min(RULES)}..{max(RULES)})")
    if args.json:
        print(json.dumps({"schema": "torchrepro.rules/1", "rules": [rule.to_json()]}, indent=2))
    else:
        print(rule.documentation(), end="")
    return 0
