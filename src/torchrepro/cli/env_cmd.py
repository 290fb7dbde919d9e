"""``torchrepro env``: print the environment facts that matter for numerics."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..envinfo import environment_summary


def add_parser(sub: Any) -> None:
    p = sub.add_parser("env", help="show the environment facts that matter for reproducibility")
    p.add_argument("--json", action="store_true", help="write one JSON document to stdout")
    p.set_defaults(handler=run)


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _flatten(v, f"{prefix}{k}.")
        else:
            rows.append((prefix + k, v))
    return rows


def run(args: argparse.Namespace) -> int:
    info = environment_summary()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    rows = _flatten(info)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0
