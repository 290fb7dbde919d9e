"""``torchrepro lint`` on programs written in the styles of real training code (tests/lint/lint_fixtures/styles/).

Each project is linted alone with every rule and compared with the answer key in its comments (``# expect``,
``# also``, ``# ok``; see the fixtures' README): every expected finding must be reported (recall) and nothing
else may be (precision). Its full text output is kept as a snapshot, ``styles/<project>.snap``; write or
refresh them with ``TORCHREPRO_UPDATE_SNAPSHOTS=1`` and review the diff. ``tools/lint_precision.py`` prints the
same comparison as a table.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

from torchrepro.lint import Diagnostic, render

ROOT = Path(__file__).resolve().parents[2]
STYLES = ROOT / "tests" / "lint" / "lint_fixtures" / "styles"
UPDATE = os.environ.get("TORCHREPRO_UPDATE_SNAPSHOTS") == "1"


def _load_tool() -> types.ModuleType:
    """tools/lint_precision.py, which holds the key's parser and the scoring."""
    name = "torchrepro_tools_lint_precision"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "lint_precision.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules[name]


tool = _load_tool()
PROJECTS = tool.projects(STYLES)


def test_there_are_style_projects_and_each_has_a_key() -> None:
    assert len(PROJECTS) >= 6
    for project in PROJECTS:
        key = tool.read_inline_key(project)
        assert key.ok, f"{project.name} marks no near miss with '# ok: <reason>'"
        assert key.expected or project.name.endswith("_greedy"), f"{project.name} expects no finding"
    assert sum(len(tool.read_inline_key(p).expected) for p in PROJECTS) >= 15


@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.name)
def test_findings_match_the_key(project: Path) -> None:
    """Every ``# expect`` is found, and nothing is flagged outside ``# expect``/``# also`` lines."""
    key = tool.read_inline_key(project)
    result = tool.lint_project(project)
    assert result.files == [shown for shown, _path in tool.project_files(project)]
    problems = tool.score(project.name, key, result.diagnostics).problems()
    if problems:
        pytest.fail(f"{project.name} differs from its key:\n{problems}", pytrace=False)


@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.name)
def test_snapshot(project: Path) -> None:
    text = render(tool.lint_project(project), "text")
    snapshot = STYLES / f"{project.name}.snap"
    if UPDATE:
        snapshot.write_text(text)
    if not snapshot.exists():
        pytest.fail(f"no snapshot {snapshot.relative_to(ROOT)}: write it with TORCHREPRO_UPDATE_SNAPSHOTS=1 "
                    f".venv/bin/python -m pytest tests/lint/test_lint_styles.py, then review it", pytrace=False)
    assert text == snapshot.read_text()


def test_no_snapshot_without_project() -> None:
    names = {p.name.removesuffix(".py") for p in PROJECTS}
    assert sorted(p.name for p in STYLES.glob("*.snap") if p.stem not in names) == []


# --- the key's parser and the scoring, on small inputs ---------------------------------------------------------

SOURCE = '''\
import torch
a = f()  # expect: TR301 TR302 - reason
b = g()  # expect: TR101|TR106
c = h()  # expect[s]: TR105
d = i()  # expect[s]: TR105
e = j()  # also: TR203
f = k()  # ok: a near miss
s = "# expect: TR999 (in a string, not a comment)"
g = l()  # noqa: F401  (an unrelated comment)
'''


def _d(line: int, code: str, path: str = "p/m.py") -> Diagnostic:
    return Diagnostic(path, line, 1, code, "message")


def test_parser_reads_codes_alternatives_groups_also_and_ok(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "m.py").write_text(SOURCE)
    key = tool.read_inline_key(tmp_path / "p")
    assert sorted(str(e) for e in key.expected) == [
        "p/m.py:2: TR301", "p/m.py:2: TR302", "p/m.py:3: TR101|TR106", "p/m.py:4, p/m.py:5: TR105 [s]"]
    assert key.also == {("p/m.py", 6, "TR203")}
    assert key.ok == {("p/m.py", 7): "a near miss"}


@pytest.mark.parametrize("comment", ["# expect TR101", "# expect:", "# expect: tr101", "# ok", "# ok:",
                                     "# also[x]: TR203", "# expect[a]: TR101 TR102"])
def test_parser_refuses_malformed_markers(tmp_path: Path, comment: str) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "m.py").write_text(f"x = 1  {comment}\n")
    with pytest.raises(tool.MarkerError):
        tool.read_inline_key(tmp_path / "p")


def test_parser_refuses_a_group_with_two_codes_and_a_line_both_expected_and_ok(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "m.py").write_text("x = 1  # expect[g]: TR101\ny = 2  # expect[g]: TR102\n")
    with pytest.raises(tool.MarkerError, match=r"\[g\]"):
        tool.read_inline_key(tmp_path / "p")
    (tmp_path / "p" / "m.py").write_text("x = 1  # expect: TR101  # ok: no\n")
    with pytest.raises(tool.MarkerError, match="both"):
        tool.read_inline_key(tmp_path / "p")


def test_scoring_counts_true_false_and_neutral_findings(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "m.py").write_text(SOURCE)
    key = tool.read_inline_key(tmp_path / "p")
    found = [_d(2, "TR301"), _d(2, "TR303"), _d(3, "TR106"), _d(5, "TR105"), _d(4, "TR105"), _d(6, "TR203"),
             _d(7, "TR301"), _d(2, "TR301", path="q/m.py")]
    score = tool.score("p", key, found)
    assert (score.expected, score.found, score.true_positives, score.neutral) == (4, 8, 4, 1)
    assert [(d.path, d.line, d.code) for d in score.false_positives] == [
        ("p/m.py", 2, "TR303"), ("p/m.py", 7, "TR301"), ("q/m.py", 2, "TR301")]
    assert [str(e) for e in score.missed] == ["p/m.py:2: TR302"]
    assert score.precision == 4 / 7 and score.recall == 3 / 4
    empty = tool.score("p", tool.Key(), [])
    assert empty.precision is None and empty.recall is None


def test_key_file_entries(tmp_path: Path) -> None:
    text = ("# KEY\n\nSome prose: not an entry.\n"
            "- p/m.py:2: TR301 - a shuffle without generator\n"
            "- `p/m.py:4,5`: TR105 - the seed is drawn\n"
            "p/m.py:6: also TR203\n"
            "p/m.py:7: ok - a near miss\n"
            "q/n.py:3: TR101|TR106\n")
    keys = tool.read_key_file(text)
    assert sorted(keys) == ["p", "q"]
    assert sorted(str(e) for e in keys["p"].expected) == ["p/m.py:2: TR301", "p/m.py:4, p/m.py:5: TR105 [p/m.py:4,5]"]
    assert keys["p"].also == {("p/m.py", 6, "TR203")} and keys["p"].ok == {("p/m.py", 7): "a near miss"}
    assert [str(e) for e in keys["q"].expected] == ["q/n.py:3: TR101|TR106"]


def test_the_tool_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\n"
        "if __name__ == '__main__':\n"
        "    torch.manual_seed(0)\n"
        "    loader = DataLoader(list(range(8)), shuffle=True)  # expect: TR301\n"
        "    torch.backends.cudnn.benchmark = False  # ok: turned off\n")
    assert tool.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["project", "expected", "found", "TP", "FP", "FN", "also", "precision",
                                           "recall"]
    assert out.splitlines()[2].split() == ["p", "1", "1", "1", "0", "0", "0", "100.0%", "100.0%"]
