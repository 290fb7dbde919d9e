"""Output formats: ``text`` (ruff-like), ``json`` (one document, schema :data:`JSON_SCHEMA`), ``github``
(workflow annotations) and ``sarif`` (SARIF 2.1.0, for code-scanning tools)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path, PurePath
from urllib.parse import quote

from .engine import LintResult
from .rules import RULES

FORMATS = ("text", "json", "github", "sarif")
JSON_SCHEMA_ID = "torchrepro.lint/1"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"

_POSITIVE_INT = {"type": "integer", "minimum": 1}
JSON_SCHEMA: dict[str, object] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": JSON_SCHEMA_ID,
    "title": "torchrepro lint --format json",
    "type": "object",
    "required": ["schema", "verdict", "exit_code", "files_checked", "summary", "diagnostics", "rules"],
    "additionalProperties": False,
    "properties": {
        "schema": {"const": JSON_SCHEMA_ID},
        "verdict": {"enum": ["clean", "findings"]},
        "exit_code": {"enum": [0, 1]},
        "files_checked": {"type": "integer", "minimum": 0},
        "summary": {
            "type": "object", "required": ["findings", "files_with_findings", "by_code"], "additionalProperties": False,
            "properties": {
                "findings": {"type": "integer", "minimum": 0},
                "files_with_findings": {"type": "integer", "minimum": 0},
                "by_code": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}},
            },
        },
        "diagnostics": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["code", "message", "help", "path", "line", "column", "end_line", "end_column"],
                "additionalProperties": False,
                "properties": {
                    "code": {"type": "string", "pattern": "^TR[0-9]{3}$"},
                    "message": {"type": "string", "minLength": 1},
                    "help": {"type": "string"},
                    "path": {"type": "string", "minLength": 1},
                    "line": _POSITIVE_INT, "column": _POSITIVE_INT,
                    "end_line": _POSITIVE_INT, "end_column": _POSITIVE_INT,
                },
            },
        },
        "rules": {
            "type": "object",
            "additionalProperties": {
                "type": "object", "required": ["name", "family", "summary"], "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "family": {"type": "string"}, "summary": {"type": "string"}},
            },
        },
    },
}


def render_text(result: LintResult, **_: object) -> str:
    lines = []
    for d in result.diagnostics:
        lines.append(f"{d.path}:{d.line}:{d.column}: {d.code} {d.message}")
        if d.help:
            lines.append(f"  help: {d.help}")
    return "\n".join(lines) + ("\n" if lines else "")


def summary_line(result: LintResult) -> str:
    """The one-line summary (the CLI prints it on stderr)."""
    n, files = len(result.diagnostics), len(result.files)
    checked = f"{files} file{'s' if files != 1 else ''} checked"
    if not n:
        return f"All checks passed ({checked})."
    with_findings = len({d.path for d in result.diagnostics})
    return (f"Found {n} finding{'s' if n != 1 else ''} in {with_findings} file{'s' if with_findings != 1 else ''} "
            f"({checked}). `torchrepro rule CODE` explains a rule.")


def as_document(result: LintResult) -> dict[str, object]:
    by_code = Counter(d.code for d in result.diagnostics)
    return {
        "schema": JSON_SCHEMA_ID,
        "verdict": "findings" if result.diagnostics else "clean",
        "exit_code": result.exit_code,
        "files_checked": len(result.files),
        "summary": {"findings": len(result.diagnostics),
                    "files_with_findings": len({d.path for d in result.diagnostics}),
                    "by_code": dict(sorted(by_code.items()))},
        "diagnostics": [d.to_json() for d in result.diagnostics],
        "rules": {code: {"name": RULES[code].name, "family": RULES[code].family, "summary": RULES[code].summary}
                  for code in sorted(by_code)},
    }


def render_json(result: LintResult, **_: object) -> str:
    return json.dumps(as_document(result), indent=2) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(result: LintResult, **_: object) -> str:
    lines = []
    for d in result.diagnostics:
        props = ",".join(f"{k}={_escape_property(str(v))}" for k, v in (
            ("title", f"torchrepro ({d.code})"), ("file", d.path), ("line", d.line), ("col", d.column),
            ("endLine", d.end_line or d.line), ("endColumn", d.end_column or d.column)))
        lines.append(f"::error {props}::{_escape_data(f'{d.code} {d.message} (help: {d.help})')}")
    return "\n".join(lines) + ("\n" if lines else "")


def _uri(path: str) -> tuple[str, bool]:
    """A SARIF artifact URI: relative (to the current directory) when possible, else a file:// URI."""
    pure = PurePath(path)
    if not pure.is_absolute():
        return quote(pure.as_posix()), True
    try:
        return quote(Path(path).relative_to(Path.cwd()).as_posix()), True
    except ValueError:
        return Path(path).as_uri(), False


def sarif_rule(code: str) -> dict[str, object]:
    rule = RULES[code]
    doc = rule.to_json()
    markdown = (f"**{rule.code} {rule.name}** — {rule.summary}\n\n**What it finds.** {doc['what']}\n\n"
                f"**Why it matters.** {doc['why']}\n\n**Example**\n```python\n{doc['example']}\n```\n\n"
                f"**Use instead**\n```python\n{doc['instead']}\n```")
    return {
        "id": code, "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": doc["what"]},
        "help": {"text": rule.documentation(), "markdown": markdown},
        "defaultConfiguration": {"level": "warning"},
        "properties": {"tags": ["reproducibility", rule.family]},
    }


def as_sarif(result: LintResult, tool_version: str = "0") -> dict[str, object]:
    codes = sorted(RULES)
    index = {code: i for i, code in enumerate(codes)}
    results = []
    for d in result.diagnostics:
        uri, relative = _uri(d.path)
        location: dict[str, object] = {"uri": uri}
        if relative:
            location["uriBaseId"] = "%SRCROOT%"
        results.append({
            "ruleId": d.code, "ruleIndex": index[d.code], "level": "warning",
            "message": {"text": f"{d.message}. Fix: {d.help}" if d.help else d.message},
            "locations": [{"physicalLocation": {
                "artifactLocation": location,
                "region": {"startLine": d.line, "startColumn": d.column, "endLine": d.end_line or d.line,
                           "endColumn": d.end_column or d.column},
            }}],
        })
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "torchrepro", "version": tool_version,
                                "rules": [sarif_rule(code) for code in codes]}},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().as_uri() + "/"}},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    }


def render_sarif(result: LintResult, tool_version: str = "0", **_: object) -> str:
    return json.dumps(as_sarif(result, tool_version), indent=2) + "\n"


RENDERERS: dict[str, Callable[..., str]] = {
    "text": render_text, "json": render_json, "github": render_github, "sarif": render_sarif,
}


def render(result: LintResult, fmt: str = "text", *, tool_version: str = "0") -> str:
    """``result`` in one of :data:`FORMATS`."""
    return RENDERERS[fmt](result, tool_version=tool_version)
