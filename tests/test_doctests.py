"""The documented examples run, so that they cannot rot.

* Docstrings: every ``>>>`` example in the modules of ``src/torchrepro`` (as ``pytest --doctest-modules`` would).
* README.md and docs/**/*.md: every fenced code block written as a session -- its first line starts with ``>>>``,
  whether the fence says ``pycon`` or ``python`` -- is run; blocks of plain code are illustrations and are not.
  The sessions of one file run in order, sharing their names, with ``torchrepro`` already imported.

An example that cannot run here (it needs a GPU, a training script, files) says ``# doctest: +SKIP`` on each of its
``>>>`` lines. Output is compared as doctest does, with ``...`` matching anything (ELLIPSIS).
"""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

import torchrepro

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(torchrepro.__file__).resolve().parent  # the tree under test (an editable install of this checkout)
FLAGS = doctest.ELLIPSIS
SKIP_MODULES = {"torchrepro.__main__"}  # runs the CLI when imported

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<lang>[\w+-]*)[^\n]*$")


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name not in SKIP_MODULES:
            names.append(name)
    return names


def session_blocks(text: str) -> str:
    """``text`` with everything but its session code blocks blanked out (line numbers kept for the report)."""
    lines = text.split("\n")
    keep = [""] * len(lines)
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, indent = m["fence"], m["indent"]
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence[0] * len(fence))
                                        and lines[end].strip().strip(fence[0]) == ""):
            end += 1
        body = lines[i + 1:end]
        first = next((line for line in body if line.strip()), "")
        if first.strip().startswith(">>>"):
            for k, line in enumerate(body, start=i + 1):
                keep[k] = line[len(indent):] if line.startswith(indent) else line.lstrip()
        i = end + 1
    return "\n".join(keep)


def _docs_with_sessions() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if p.is_file() and session_blocks(p.read_text(encoding="utf-8")).strip()]


def _run(tests: list[doctest.DocTest]) -> doctest.TestResults:
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in tests:
        runner.run(test, out=report.append)
    if runner.failures:
        pytest.fail("".join(report), pytrace=False)
    return doctest.TestResults(runner.failures, runner.tries)


@pytest.mark.parametrize("name", _modules_with_examples())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, name) if t.examples]
    assert tests, f"{name} has '>>>' in its text but no docstring example was found"
    _run(tests)


@pytest.mark.parametrize("page", _docs_with_sessions(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_examples(page: Path) -> None:
    text = session_blocks(page.read_text(encoding="utf-8"))
    test = doctest.DocTestParser().get_doctest(text, {"torchrepro": torchrepro}, str(page.relative_to(ROOT)),
                                               str(page), 0)
    _run([test])


def test_session_blocks_finds_only_sessions() -> None:
    text = "\n".join(["intro", "```python", "x = 1", "```", "", "```pycon", ">>> 1 + 1", "2", "```",
                      "- item", "  ```python", "  >>> 2", "  2", "  ```"])
    kept = session_blocks(text).split("\n")
    assert kept[6:8] == [">>> 1 + 1", "2"] and kept[11:13] == [">>> 2", "2"]
    assert "x = 1" not in kept and "intro" not in kept
