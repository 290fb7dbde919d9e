"""Every lint rule against its fixtures: exact output (snapshots) and the lines marked in the fixtures.

A fixture line ending in ``# expect: CODE`` must be flagged (on that line) and a line with ``# ok`` must not;
a line with ``# grouped into line N`` is not flagged itself but named by the finding at line N (a rule that
reports several places of one cause once), and no ``# ok`` line is named by any finding; a fixture named
``CODE_ok_*`` must give no finding at all. Regenerate snapshots after an intended change with
``TORCHREPRO_UPDATE_SNAPSHOTS=1`` and review the diff.
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from torchrepro.lint import RULES, LintConfig, lint_paths, render

FIXTURES = Path(__file__).resolve().parent / "lint_fixtures" / "rules"
UPDATE = os.environ.get("TORCHREPRO_UPDATE_SNAPSHOTS") == "1"
ALL_FIXTURES = sorted(p for p in FIXTURES.iterdir() if p.suffix == ".py" or p.is_dir())
_EXPECT = re.compile(r"#\s*expect:\s*(TR\d{3})")
_OK = re.compile(r"#\s*ok\b")
_LINE_END = re.compile(r"\r\n?|\n")  # where Python ends lines (str.splitlines also splits at U+2028, \f, ...)
# Rules whose fixtures a repository cannot hold, and where their tests are instead.
NO_FIXTURES = {"TR004": "FIFOs, devices, 4 GiB files, permissions: tests/lint/test_lint_cli.py"}
_GROUPED = re.compile(r"#\s*grouped into line (\d+)")
_GROUP = re.compile(r"\(and \d+ more [^:]*: (.*?)\): ")  # "nn.Conv2d (and 2 more in class Net: lines 12, 14): "
_NAMED_LINES = re.compile(r"\blines? (\d+(?:, \d+)*)")


def _code(fixture: Path) -> str:
    return fixture.name[:5]


def _sources(fixture: Path) -> list[tuple[str, Path]]:
    """(display path as the linter prints it, file) of each file of a fixture."""
    if fixture.is_file():
        return [(fixture.name, fixture)]
    return [(f"{fixture.name}/{p.relative_to(fixture).as_posix()}", p) for p in sorted(fixture.rglob("*.py"))]


def _markers(fixture: Path) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    expected, ok = set(), set()
    code = _code(fixture)
    for shown, path in _sources(fixture):
        text = path.read_bytes().decode("utf-8", "replace")
        for lineno, line in enumerate(_LINE_END.split(text), 1):
            match = _EXPECT.search(line)
            if match:
                assert match.group(1) == code, f"{shown}:{lineno} expects {match.group(1)} in a {code} fixture"
                expected.add((shown, lineno))
            if _OK.search(line):
                ok.add((shown, lineno))
    return expected, ok


def _grouped(fixture: Path) -> set[tuple[str, int, int]]:
    """(file, line, line of the finding that must name it) for each ``# grouped into line N`` marker."""
    return {(shown, lineno, int(match.group(1))) for shown, path in _sources(fixture)
            for lineno, line in enumerate(path.read_bytes().decode("utf-8", "replace").splitlines(), 1)
            if (match := _GROUPED.search(line))}


def _named(message: str) -> set[int]:
    """The other lines a grouped finding names in its message."""
    return {int(n) for group in _GROUP.findall(message) for found in _NAMED_LINES.findall(group)
            for n in found.split(", ")}


def _lint(fixture: Path, monkeypatch: pytest.MonkeyPatch, select: str | None = None):
    monkeypatch.chdir(fixture.parent)
    return lint_paths([fixture.name], LintConfig(select=(select or _code(fixture),), base=fixture.parent))


@pytest.mark.parametrize("fixture", ALL_FIXTURES, ids=lambda p: p.name)
def test_snapshot(fixture: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = render(_lint(fixture, monkeypatch), "text")
    snapshot = fixture.with_name(fixture.name.removesuffix(".py") + ".snap")
    if UPDATE:
        snapshot.write_text(text)
    assert snapshot.exists(), f"no snapshot for {fixture.name}; run with TORCHREPRO_UPDATE_SNAPSHOTS=1"
    assert text == snapshot.read_text()


@pytest.mark.parametrize("fixture", ALL_FIXTURES, ids=lambda p: p.name)
def test_marked_lines(fixture: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exactly the ``# expect`` lines are flagged, by the fixture's rule; no ``# ok`` line is."""
    result = _lint(fixture, monkeypatch)
    expected, ok = _markers(fixture)
    flagged = {(d.path, d.line) for d in result.diagnostics}
    assert {d.code for d in result.diagnostics} <= {_code(fixture)}
    assert flagged == expected
    assert not flagged & ok
    named = {(d.path, line, d.line) for d in result.diagnostics for line in _named(d.message)}
    assert _grouped(fixture) <= named, "a '# grouped into line N' line is not named by the finding at line N"
    assert not {(path, line) for path, line, _at in named} & ok, "a '# ok' line is named by a grouped finding"
    if "_ok_" in fixture.name:
        assert not expected and ok, f"{fixture.name} is a near miss: it must mark its near-miss lines with # ok"


def test_near_misses_are_not_flagged_by_any_rule_of_their_family(monkeypatch: pytest.MonkeyPatch) -> None:
    """A near miss of one rule is not merely moved to a sibling rule of the same family."""
    for fixture in ALL_FIXTURES:
        if "_ok_" not in fixture.name:
            continue
        result = _lint(fixture, monkeypatch, select=_code(fixture)[:3])
        assert [f"{d.path}:{d.line} {d.code}" for d in result.diagnostics] == [], fixture.name


@pytest.mark.parametrize("code", sorted(RULES))
def test_every_rule_has_documentation_and_fixtures(code: str) -> None:
    rule = RULES[code]
    assert re.fullmatch(r"TR\d{3}", rule.code) and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name)
    for field in ("summary", "what", "why", "example", "instead", "help"):
        assert len(textwrap.dedent(getattr(rule, field)).strip()) > 10, f"{code}.{field} is missing"
    doc = rule.documentation()
    assert doc.startswith(f"{code} {rule.name} ({rule.family})") and "Use instead" in doc
    if code in NO_FIXTURES:
        return
    fixtures = [f for f in ALL_FIXTURES if _code(f) == code]
    marks = [_markers(f) for f in fixtures]
    assert any(expected for expected, _ok in marks), f"{code} has no fixture line marked '# expect: {code}'"
    assert any(ok for _expected, ok in marks), f"{code} has no near miss marked '# ok'"
    assert all(f.with_name(f.name.removesuffix(".py") + ".snap").exists() for f in fixtures)


def test_no_snapshot_without_fixture() -> None:
    stems = {f.name.removesuffix(".py") for f in ALL_FIXTURES}
    orphans = sorted(p.name for p in FIXTURES.glob("*.snap") if p.stem not in stems)
    assert not orphans


def test_docs_describe_every_rule() -> None:
    """docs/lint.md has a section per rule (heading ``#### CODE name``) with the rule's summary and fix."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "lint.md").read_text()
    for code, rule in RULES.items():
        assert f"#### {code} {rule.name}\n\n{rule.summary}\n" in docs, code
        assert f"**Fix:** {rule.help}\n" in docs, code
