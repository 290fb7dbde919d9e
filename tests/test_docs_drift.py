"""Docs that drifted from the code (issue 40): leftover notes, missing links, self-contradictions, stale samples, a
placeholder URL, and a site whose search did not work opened from disk."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_docs import _sample, _shows

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def test_no_doc_ships_a_note_to_whoever_merges_next():
    """resume.md ended with `<!-- merge: link resume-at.md ... -->`: invisible on the site, visible on GitHub."""
    left = [str(p.relative_to(ROOT)) for p in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
            if "<!--" in p.read_text(encoding="utf-8")]
    assert left == []


def test_resume_md_links_resume_at_and_the_trainer_integrations():
    text = _read("docs/resume.md")
    assert "[Prove resume: check --resume-at](resume-at.md)" in text
    assert "[Resume inside your trainer](integrations.md)" in text


def test_make_test_is_described_as_the_makefile_runs_it():
    """index.md and the README say what `make test` runs: every prerequisite of the Makefile's `test` target."""
    makefile = _read("Makefile")
    prerequisites = re.search(r"^test:(.*)$", makefile, re.M).group(1).split()  # type: ignore[union-attr]
    words = {"lint": "ruff", "docs": "mkdocs build --strict", "typecheck": "mypy",
             "package-check": "the wheel's install check"}
    assert set(prerequisites) == set(words), f"the Makefile's test target changed: {prerequisites}"
    for doc in ("docs/index.md", "README.md"):
        line = next(x for x in _read(doc).splitlines() if x.startswith("make test   #"))
        missing = [w for w in words.values() if w not in line and not (w.startswith("mkdocs") and "docs build" in line)]
        assert missing == [] and "test suite" in line, f"{doc}: {line}"


def test_distributed_md_says_one_thing_about_diff_of_runs_of_several_ranks():
    """It said both that `diff` compares runs of several ranks rank by rank and that it compares single-rank
    directories only (pass RUN_A/rank0 RUN_B/rank0); the first is what diff does."""
    text = " ".join(_read("docs/distributed.md").split())
    assert "`torchrepro diff RUN_A RUN_B` of two runs of several ranks" in text
    assert "`torchrepro diff` compares single-rank run directories" not in text
    assert ("`check` of several nodes (record each run with `torchrepro run` on every node and compare two runs with "
            "`torchrepro diff RUN_A RUN_B`, as above)") in text


def _script_of(doc: str, first_line: str) -> str:
    for block in re.findall(r"```python\n(.*?)```", _read(doc), flags=re.S):
        if block.startswith(first_line + "\n"):
            return block
    raise AssertionError(f"{doc} has no python block starting with {first_line!r}")


def test_the_scan_sample_is_what_scan_prints_on_the_script_shown(tmp_path):
    """scan.md's sample was hand-written and stale (2 ops where scan finds 4); it is now the real output of the
    script shown above it, run here."""
    (tmp_path / "train.py").write_text(_script_of("docs/scan.md", "# train.py"))
    bin_dir = str(Path(sys.executable).parent)  # `python` in the command: the interpreter that has torchrepro
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop("FORCE_COLOR", None)
    p = subprocess.run([sys.executable, "-m", "torchrepro", "scan", "--", "python", "train.py"], capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    sample = _sample("scan.md", "torchrepro scan -- python train.py")
    assert len(sample) > 15
    _shows(p.stdout, sample)


def _yaml_after(doc: str, heading: str) -> str:
    text = _read(doc)
    return re.search(r"```yaml\n(.*?)```", text[text.index(heading):], flags=re.S).group(1)  # type: ignore[union-attr]


def test_the_pre_commit_configuration_works_as_written():
    """The snippet had `repo: <URL of the torchrepro repository>` and `rev: <a release tag>`: nothing to paste.
    Now it is a complete `repo: local` configuration: the repository's system hook, declared locally."""
    snippet = _yaml_after("docs/lint.md", "### pre-commit")
    assert "<" not in snippet and ">" not in snippet
    config = yaml.safe_load(snippet)
    (repo,) = config["repos"]
    assert repo["repo"] == "local"
    (hook,) = repo["hooks"]
    declared = {h["id"]: h for h in yaml.safe_load(_read(".pre-commit-hooks.yaml"))}
    system = declared["torchrepro-lint-system"]
    assert {k: hook[k] for k in ("entry", "language", "types", "require_serial")} == \
        {k: system[k] for k in ("entry", "language", "types", "require_serial")}
    assert "<URL" not in _read(".pre-commit-hooks.yaml")


def _mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # !ENV and other tags: not needed here
    return yaml.load(_read("mkdocs.yml"), Loader=Loader)


def test_the_site_is_configured_to_search_from_disk_with_nothing_from_the_network():
    """mkdocs.yml said the site reads from file:// but search needs a server: the search index is fetched, and
    browsers start no Web Worker from a file. The offline plugin writes the index as a script too; the Worker
    shim it needs comes from docs/ (else the plugin links a copy on the network)."""
    config = _mkdocs_config()
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]]
    assert plugins.index("search") < plugins.index("offline")
    polyfills = config["extra"]["polyfills"]
    assert polyfills == ["assets/javascripts/iframe-worker-shim.js"]
    shim = (DOCS / polyfills[0]).read_text(encoding="utf-8")
    assert "iframe-worker" in polyfills[0]  # the offline plugin adds the network copy unless such a URL is there
    assert "MIT License" in shim and 'location.protocol==="file:"&&(window.Worker=o)' in shim


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium to open the built site from disk")
def test_search_finds_pages_in_the_site_opened_from_disk(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    mkdocs = Path(sys.executable).parent / "mkdocs"
    subprocess.run([str(mkdocs), "build", "--strict", "-q", "--site-dir", str(site)], cwd=ROOT, env=env,
                   check=True, timeout=600)
    assert (site / "search" / "search_index.js").is_file()
    assert "unpkg" not in (site / "index.html").read_text(encoding="utf-8")
    dom = subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                          f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
                          (site / "index.html").as_uri() + "?q=verify_resume"],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'md-search-result__meta">(\d+) matching document', dom)
    assert found is not None and int(found.group(1)) >= 1, dom[-2000:]
