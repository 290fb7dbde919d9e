"""End to end: `torchrepro bisect` on a small generated git history where exactly one commit changes the numerics.

History (oldest first): good; a comment (shifts every line); a commit where the script fails (skipped); a print and
a new file; THE change (a sum taken in reverse order); another comment (bad = HEAD). The working tree has an
uncommitted change and a stash, which bisect must leave as they are. One bisect runs for the module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import torchrepro
from torchrepro.cli import main

# the bisect processes run in the generated repository: they must import this torchrepro whatever the cwd
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(torchrepro.__file__).resolve().parents[1]),
                                                     os.environ.get("PYTHONPATH", "")])}

BASE = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for _ in range(3):
    opt.zero_grad()
    h = torch.tanh(model(x))
    out = h.sum(1, keepdim=True)
    loss = ((out - y) ** 2).mean()
    loss.backward()
    opt.step()
"""
REVERSED = BASE.replace("out = h.sum(1, keepdim=True)", "out = h.flip(1).sum(1, keepdim=True)")
HISTORY = [
    ("good", {"train.py": BASE}),
    ("a comment", {"train.py": "# trains a tiny model\n" + BASE}),
    ("break the script", {"train.py": "# trains a tiny model\nimport no_such_module\n" + BASE}),
    ("a print and notes", {"train.py": "# trains a tiny model\n" + BASE + "print('done')\n", "NOTES.md": "n\n"}),
    ("sum in reverse", {"train.py": "# trains a tiny model\n" + REVERSED + "print('done')\n"}),
    ("another comment", {"train.py": "# trains a tiny model, reversed\n" + REVERSED + "print('done')\n"}),
]
CHANGED_LINE = 12  # `out = ...` once the first comment is there


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout


def make_repo(root: Path, history: list[tuple[str, dict[str, str]]] = HISTORY) -> Path:
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    for message, files in history:
        for name, text in files.items():
            (root / name).write_text(text)
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", message)
    return root


def state(root: Path) -> tuple[str, ...]:
    """Everything bisect must not change: HEAD, branch, index + working tree status, stash, worktrees."""
    return (git(root, "rev-parse", "HEAD"), git(root, "symbolic-ref", "HEAD"), git(root, "status", "--porcelain"),
            git(root, "stash", "list"), git(root, "worktree", "list", "--porcelain"), (root / "NOTES.md").read_text())


def leftovers(pid: int) -> list[str]:
    return [p for p in os.listdir(tempfile.gettempdir()) if p.startswith(f"torchrepro-bisect-{pid}-")]


@pytest.fixture(scope="module")
def bisected(tmp_path_factory):
    root = make_repo(tmp_path_factory.mktemp("hist") / "repo")
    (root / "NOTES.md").write_text("uncommitted\n")
    (root / "scratch.txt").write_text("stash me\n")
    git(root, "stash", "push", "-q", "-u", "-m", "mine", "--", "scratch.txt")
    before = state(root)
    out = root.parent / "out"
    p = subprocess.Popen([sys.executable, "-m", "torchrepro", "bisect", "--json", "--good", "HEAD~5", "--bad", "HEAD",
                          "--max-steps", "2", "--out", str(out), "--", "python", "train.py"], cwd=root,
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = p.communicate(timeout=900)
    return p.returncode, (json.loads(stdout) if stdout.strip() else {}), stderr, root, before, p.pid


def test_finds_the_commit_and_line_and_skips_the_failing_one(bisected):
    rc, doc, err, root, _, _ = bisected
    assert rc == 0, err
    assert doc["schema"] == "torchrepro.bisect/1" and doc["verdict"] == "found" and doc["exit_code"] == 0
    assert doc["first_bad_commit"]["subject"] == "sum in reverse"
    assert doc["first_bad_commit"]["parent"]["subject"] == "a print and notes"
    verdicts = {t["subject"]: t["verdict"] for t in doc["tested"]}
    assert verdicts == {"good": "good", "another comment": "bad", "break the script": "skip",
                        "a print and notes": "good", "sum in reverse": "bad"}
    skipped = next(t for t in doc["tested"] if t["verdict"] == "skip")
    assert "failed with exit code 1" in skipped["reason"] and "no_such_module" in skipped["reason"]
    assert doc["recordings"] == 5 and doc["commits"] == 5
    loc = doc["locate"]
    assert loc["verdict"] == "program" and loc["cause"]["b"]["op"] == "aten.flip"
    assert loc["cause"]["b"]["file"] == "train.py" and loc["cause"]["b"]["line"] == CHANGED_LINE
    touched = {(t["checkout"], t["line"], t["change"]) for t in loc["diff"]["touches"]}
    assert touched == {("parent", CHANGED_LINE, "removed"), ("commit", CHANGED_LINE, "added")}


def test_the_checkout_is_untouched_and_worktrees_are_gone(bisected):
    rc, _, err, root, before, pid = bisected
    assert rc == 0, err
    assert state(root) == before
    assert leftovers(pid) == []


def test_text_report(bisected, capsys):
    from torchrepro.cli._bisect_render import render_bisect

    text = render_bisect(bisected[1])
    assert text.startswith("torchrepro: FOUND - the first commit whose run differs from good's (bitwise): ")
    assert "'sum in reverse'" in text and "skip" in text
    assert f"commit  train.py:{CHANGED_LINE}  + out = h.flip(1).sum(1, keepdim=True)" in text
    assert f"parent  train.py:{CHANGED_LINE}  - out = h.sum(1, keepdim=True)" in text


def test_the_report_shows_the_commit_line_and_the_located_op(bisected, tmp_path):
    """report.html, rendered: each commit with its verdict word in order, the first bad one marked, the op."""
    from tests.cli.browser import dump_dom, ink, network_references, screenshot

    doc = bisected[1]
    page = Path(doc["report"])
    assert page == Path(doc["out"]) / "report.html"
    dom = dump_dom(page)
    chain = dom[dom.index('class="chain"'):dom.index("</ol>")]
    subjects = (">good<", "a comment", "break the script", "a print and notes", "sum in reverse",
                "another comment")
    at = [chain.find(s) for s in subjects]
    assert -1 not in at and at == sorted(at), at  # every commit, oldest first
    words = [chain.find(w) for w in ("GOOD", "NOT TESTED", "SKIP", "FIRST BAD", "BAD<")]
    assert -1 not in words and words[:4] == sorted(words[:4]) and chain.count("FIRST BAD") == 1, words
    assert "aten.flip" in dom and f"train.py:{CHANGED_LINE}" in dom
    assert network_references(page.read_text()) == []
    assert ink(screenshot(page, tmp_path / "bisect.png", height=1200))[0] > 0.02


def _bisect_json(args: list[str], capsys) -> tuple[int, dict]:
    rc = main(["bisect", "--json", *args])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("args, message", [
    (["--good", "nope", "--bad", "HEAD"], "unknown revision 'nope'"),
    (["--good", "HEAD", "--bad", "HEAD"], "are the same commit"),
    (["--good", "HEAD", "--bad", "HEAD~1"], "is not an ancestor of"),
])
def test_bad_revisions_are_exit_2_with_the_reason(args, message, tmp_path, monkeypatch, capsys):
    root = make_repo(tmp_path / "r", HISTORY[:2])
    monkeypatch.chdir(root)
    rc, doc = _bisect_json([*args, "--", "python", "train.py"], capsys)
    assert rc == 2 and doc["verdict"] == "error" and doc["schema"] == "torchrepro.bisect/1"
    assert message in doc["error"]
    assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_a_command_that_fails_at_good_is_exit_2_with_its_whole_error(tmp_path, monkeypatch, capsys):
    """The reason a skipped commit gets in the table is shortened; the error for good gives the whole of it, with the
    fix (here: an interpreter without torchrepro, whose message is longer than the table's reason)."""
    root = make_repo(tmp_path / "r", HISTORY[:2])
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    monkeypatch.chdir(root)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    rc, doc = _bisect_json(["--good", "HEAD~1", "--", str(bare / "bin" / "python"), "train.py"], capsys)
    assert rc == 2 and doc["verdict"] == "error"
    assert doc["error"].startswith("the command fails at good (")
    assert "torchrepro is not installed for the interpreter in your command" in doc["error"]
    assert "-m pip install torchrepro`), or run the script with the Python that has torchrepro" in doc["error"]
    assert doc["error"].endswith(". Give a good commit where it runs.")
    assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_outside_a_repository_is_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, doc = _bisect_json(["--good", "HEAD~1", "--", "python", "train.py"], capsys)
    assert rc == 2 and "is not inside a git repository" in doc["error"]


def test_sigterm_removes_the_worktrees(tmp_path):
    """SIGTERM while a commit's run is under way: the run stops, every worktree goes, exit 143."""
    root = make_repo(tmp_path / "r", [(m, {"train.py": "import time\ntime.sleep(60)\n" + f["train.py"]})
                                      for m, f in HISTORY[:2]])
    p = subprocess.Popen([sys.executable, "-m", "torchrepro", "bisect", "--good", "HEAD~1", "--", "python",
                          "train.py"], cwd=root, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while "torchrepro-bisect-" not in git(root, "worktree", "list") and time.monotonic() < deadline \
            and p.poll() is None:
        time.sleep(0.5)
    time.sleep(2)  # the run starts in the worktree
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert leftovers(p.pid) == []


def test_the_default_output_directory_holds_each_commits_recording(tmp_path):
    """No --out: the recordings go to ./torchrepro-runs/bisect-*, a relative path, while each commit's run starts
    in its worktree (before the fix, every run recorded into the worktree, which was then removed: 0 steps)."""
    root = make_repo(tmp_path / "r", [("good", {"train.py": BASE}), ("reversed", {"train.py": REVERSED})])
    p = subprocess.run([sys.executable, "-m", "torchrepro", "bisect", "--json", "--good", "HEAD~1", "--max-steps",
                        "2", "--", "python", "train.py"], cwd=root, env=ENV, capture_output=True, text=True,
                       timeout=600)
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["verdict"] == "found", p.stderr
    assert doc["first_bad_commit"]["subject"] == "reversed"
    out = Path(doc["out"])
    assert (root / out if not out.is_absolute() else out).parent == root / "torchrepro-runs"
    assert {t["verdict"] for t in doc["tested"]} == {"good", "bad"}
    for t in doc["tested"]:
        manifest = json.loads((root / t["run"] / "manifest.json").read_text())
        assert manifest["steps"] == 2 and (root / t["run"] / "trace.jsonl").is_file()


def test_a_script_the_commit_does_not_hold_is_named(tmp_path, monkeypatch, capsys):
    root = make_repo(tmp_path / "r", HISTORY[:2])
    (root / "untracked.py").write_text(BASE)
    monkeypatch.chdir(root)
    rc, doc = _bisect_json(["--good", "HEAD~1", "--", "python", "untracked.py"], capsys)
    good = git(root, "rev-parse", "HEAD~1").strip()[:12]
    assert rc == 2 and doc["error"] == (
        f"the command fails at good ({good}): untracked.py is not in commit {good} (it is not committed in your "
        "checkout). Commit it, or run a script from outside the repository. Give a good commit where it runs.")
    assert "torchrepro-bisect-" not in doc["error"]
