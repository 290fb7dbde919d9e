"""Output formats of ``torchrepro lint``: the JSON document validates against ``JSON_SCHEMA``, the SARIF log
against the SARIF 2.1.0 fields it uses, GitHub annotations are escaped.

``jsonschema`` is not a dependency, so :func:`validate` implements the JSON Schema keywords these schemas use;
a test checks that it rejects what it should.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torchrepro.lint import JSON_SCHEMA, RULES, LintConfig, LintResult, lint_paths, render
from torchrepro.lint.formats import SARIF_SCHEMA
from torchrepro.lint.rule import Diagnostic

_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "boolean": bool}


def validate(value: object, schema: dict, path: str = "$") -> list[str]:
    """Errors of ``value`` against ``schema`` (keywords: type, const, enum, required, properties,
    additionalProperties, items, minItems, minimum, minLength, pattern, format=uri)."""
    errors: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        ok = isinstance(value, _TYPES[kind]) and not (kind in ("integer", "number") and isinstance(value, bool))
        if not ok:
            return [f"{path}: expected {kind}, got {type(value).__name__}"]
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                errors.append(f"{path}: missing {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                errors += validate(item, props[key], f"{path}.{key}")
            elif extra is False:
                errors.append(f"{path}: unexpected {key!r}")
            elif isinstance(extra, dict):
                errors += validate(item, extra, f"{path}.{key}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                errors += validate(item, schema["items"], f"{path}[{i}]")
    if isinstance(value, (int, float)) and "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: {value} < {schema['minimum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if schema.get("format") == "uri" and not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", value):
            errors.append(f"{path}: {value!r} is not an absolute URI")
    return errors


def _text(required: bool = True) -> dict:
    return {"type": "object", "required": ["text"] if required else [],
            "properties": {"text": {"type": "string", "minLength": 1}, "markdown": {"type": "string"}},
            "additionalProperties": False}


# The parts of the SARIF 2.1.0 schema (https://json.schemastore.org/sarif-2.1.0.json, OASIS SARIF 2.1.0
# sections 3.13-3.30) for the objects torchrepro writes, with their property names and constraints.
_REGION = {"type": "object", "additionalProperties": False, "properties": {
    "startLine": {"type": "integer", "minimum": 1}, "startColumn": {"type": "integer", "minimum": 1},
    "endLine": {"type": "integer", "minimum": 1}, "endColumn": {"type": "integer", "minimum": 1}}}
_ARTIFACT_LOCATION = {"type": "object", "additionalProperties": False, "properties": {
    "uri": {"type": "string", "minLength": 1}, "uriBaseId": {"type": "string"}, "index": {"type": "integer"}}}
_RESULT = {"type": "object", "required": ["message"], "additionalProperties": False, "properties": {
    "ruleId": {"type": "string"}, "ruleIndex": {"type": "integer", "minimum": -1},
    "level": {"enum": ["none", "note", "warning", "error"]}, "message": _text(),
    "locations": {"type": "array", "items": {"type": "object", "additionalProperties": False, "properties": {
        "physicalLocation": {"type": "object", "additionalProperties": False, "properties": {
            "artifactLocation": _ARTIFACT_LOCATION, "region": _REGION}}}}}}}
_RULE = {"type": "object", "required": ["id"], "additionalProperties": False, "properties": {
    "id": {"type": "string", "minLength": 1}, "name": {"type": "string"}, "shortDescription": _text(),
    "fullDescription": _text(), "help": _text(), "helpUri": {"type": "string", "format": "uri"},
    "defaultConfiguration": {"type": "object", "additionalProperties": False, "properties": {
        "level": {"enum": ["none", "note", "warning", "error"]}, "enabled": {"type": "boolean"}}},
    "properties": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}}}}
SARIF_SUBSET = {"type": "object", "required": ["version", "runs"], "additionalProperties": False, "properties": {
    "$schema": {"type": "string", "format": "uri"}, "version": {"const": "2.1.0"},
    "runs": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["tool"],
             "additionalProperties": False, "properties": {
        "tool": {"type": "object", "required": ["driver"], "additionalProperties": False, "properties": {
            "driver": {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
                "name": {"type": "string", "minLength": 1}, "version": {"type": "string"},
                "informationUri": {"type": "string", "format": "uri"},
                "rules": {"type": "array", "items": _RULE}}}}},
        "results": {"type": "array", "items": _RESULT},
        "columnKind": {"enum": ["utf16CodeUnits", "unicodeCodePoints"]},
        "originalUriBaseIds": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": False, "properties": {
                "uri": {"type": "string", "format": "uri"}}}}}}}}}


@pytest.fixture
def result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LintResult:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\n\ndef main(ds):\n"
        "    note = 'été'; model = torch.nn.Linear(2, 2)  # columns count characters, not UTF-8 bytes\n"
        "    return model, DataLoader(ds, shuffle=True)\n\n\nif __name__ == '__main__':\n    main(None)\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "clean.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    return lint_paths(["."], LintConfig(base=tmp_path))


def test_json_document_validates(result: LintResult) -> None:
    doc = json.loads(render(result, "json"))
    assert validate(doc, JSON_SCHEMA) == []
    assert doc["verdict"] == "findings" and doc["exit_code"] == 1 and doc["files_checked"] == 3
    assert doc["summary"] == {"findings": 3, "files_with_findings": 2, "by_code": {"TR001": 1, "TR101": 1, "TR301": 1}}
    assert [(d["path"], d["line"], d["column"], d["code"]) for d in doc["diagnostics"]] == [
        ("broken.py", 1, 7, "TR001"), ("train.py", 6, 27, "TR101"), ("train.py", 7, 19, "TR301")]
    assert doc["rules"]["TR301"]["name"] == "data-order-global-rng"
    clean = json.loads(render(LintResult(files=["x.py"]), "json"))
    assert validate(clean, JSON_SCHEMA) == [] and clean["verdict"] == "clean" and clean["diagnostics"] == []


def test_validator_rejects_what_it_should() -> None:
    doc = json.loads(render(LintResult(files=["x.py"], diagnostics=[
        Diagnostic("x.py", 1, 1, "TR101", "m", "h", 1, 2)]), "json"))
    assert validate(doc, JSON_SCHEMA) == []
    bad = json.loads(json.dumps(doc))
    bad["diagnostics"][0]["line"] = 0
    bad["diagnostics"][0]["code"] = "X1"
    bad["extra"] = True
    del bad["summary"]["by_code"]
    assert sorted(validate(bad, JSON_SCHEMA)) == [
        "$.diagnostics[0].code: 'X1' does not match ^TR[0-9]{3}$", "$.diagnostics[0].line: 0 < 1",
        "$.summary: missing 'by_code'", "$: unexpected 'extra'"]


def test_sarif_log_validates(result: LintResult) -> None:
    log = json.loads(render(result, "sarif", tool_version="9.9"))
    assert validate(log, SARIF_SUBSET) == []
    assert log["$schema"] == SARIF_SCHEMA and log["version"] == "2.1.0"
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert run["tool"]["driver"]["version"] == "9.9" and [r["id"] for r in rules] == sorted(RULES)
    for res in run["results"]:
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
        assert run["originalUriBaseIds"][res["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"]]
    regions = [(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
                r["locations"][0]["physicalLocation"]["region"]) for r in run["results"]]
    assert regions[1] == ("train.py", {"startLine": 6, "startColumn": 27, "endLine": 6, "endColumn": 48})
    bad = json.loads(json.dumps(log))
    bad["runs"][0]["results"][0]["level"] = "fatal"
    assert validate(bad, SARIF_SUBSET) == ["$.runs[0].results[0].level: 'fatal' not in ['none', 'note', 'warning', "
                                           "'error']"]


def test_github_annotations_are_escaped() -> None:
    diag = Diagnostic("dir,a/x:y.py", 3, 5, "TR301", "50% of it\nbroken", "fix: it", 3, 9)
    out = render(LintResult(files=["x"], diagnostics=[diag]), "github")
    assert out == ("::error title=torchrepro (TR301),file=dir%2Ca/x%3Ay.py,line=3,col=5,endLine=3,endColumn=9::"
                   "TR301 50%25 of it%0Abroken (help: fix: it)\n")
