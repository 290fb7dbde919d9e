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
from tests.inprocess import torchrepro as in_process
from torchrepro.cli import main

# the bisect processes run in the generated repository: they must import this torchrepro whatever the cwd
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(torchrepro.__file__).resolve().parents[1]),
                                                     os.environ.get("PYTHONPATH", "")])}

# SGD by hand: torch.optim's first use imports torch._dynamo, ~1 s of CPU for each commit's run
BASE = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 32)
lr = 0.05
x, y = torch.randn(64, 8), torch.randn(64, 1)
for _ in range(3):
    model.zero_grad(set_to_none=True)
    h = torch.tanh(model(x))
    out = h.sum(1, keepdim=True)
    loss = ((out - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(lr * p.grad)
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


def make_repo(root: Path, history: list[tuple[str, dict[str, str | None]]] = HISTORY) -> Path:
    """A repository whose commits write each file given (None: delete it)."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    for message, files in history:
        for name, text in files.items():
            if text is None:
                (root / name).unlink()
            else:
                (root / name).parent.mkdir(parents=True, exist_ok=True)
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
    # in this process (tests/inprocess.py; each commit's run is a process of its own): its worktrees are named by
    # this process's pid
    p = _in_process(root, "--json", "--good", "HEAD~5", "--bad", "HEAD", "--max-steps", "2", "--out", str(out), "--",
                    "python", "train.py")
    return p.returncode, (json.loads(p.stdout) if p.stdout.strip() else {}), p.stderr, root, before, os.getpid()


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
    p = _in_process(root, "--json", "--good", "HEAD~1", "--max-steps", "2", "--", "python", "train.py")
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


def _in_process(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`torchrepro bisect ARGS` in ``root``, in this process (tests/inprocess.py); each commit's run is a process of
    its own."""
    return in_process("bisect", *args, cwd=root, env={"PYTHONPATH": ENV["PYTHONPATH"]}, timeout=600)


def _run_bisect(root: Path, *args: str) -> tuple[int, dict, str]:
    p = _in_process(root, "--json", "--max-steps", "2", "--no-locate", "--out", str(root.parent / "out"), *args,
                    "--", "python", "train.py")
    return p.returncode, (json.loads(p.stdout) if p.stdout.strip() else {}), p.stderr


def test_good_on_a_side_branch_merged_later(tmp_path):
    """Good is a commit of a side branch (not its tip) merged into main later: bad's first-parent history never
    reaches it (`git log --first-parent --ancestry-path good..bad` is empty). Before the fix: no commit between,
    NONE DIFFERS, with good's sha shown as bad's and HEAD never run."""
    root = make_repo(tmp_path / "r", [("base", {"train.py": BASE})])
    git(root, "checkout", "-q", "-b", "side")
    for message, name in (("side: notes", "NOTES.md"), ("side: more notes", "MORE.md")):
        (root / name).write_text(message + "\n")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", message)
    git(root, "checkout", "-q", "main")
    (root / "train.py").write_text("# trains a tiny model\n" + BASE)
    git(root, "commit", "-q", "-am", "main: a comment")
    git(root, "merge", "-q", "--no-ff", "side", "-m", "merge side")
    (root / "train.py").write_text("# trains a tiny model\n" + REVERSED)
    git(root, "commit", "-q", "-am", "sum in reverse")
    (root / "train.py").write_text("# trains a tiny model, reversed\n" + REVERSED)
    git(root, "commit", "-q", "-am", "another comment")
    good, head = git(root, "rev-parse", "side~1").strip(), git(root, "rev-parse", "HEAD").strip()

    rc, doc, err = _run_bisect(root, "--good", "side~1")
    assert rc == 0 and doc["verdict"] == "found", err
    assert doc["good"]["sha"] == good and doc["bad"] == {"sha": head, "subject": "another comment"}
    assert [c["subject"] for c in doc["chain"]] == ["side: notes", "merge side", "sum in reverse", "another comment"]
    assert doc["first_bad_commit"]["subject"] == "sum in reverse"
    assert doc["first_bad_commit"]["parent"]["subject"] == "merge side"
    assert {t["subject"]: t["verdict"] for t in doc["tested"]} == {
        "side: notes": "good", "another comment": "bad", "merge side": "good", "sum in reverse": "bad"}
    assert f"good {good[:12]} is not on bad's first-parent history; it came in with the merge " in err


RENAMABLE = BASE.replace("model = nn.Linear(8, 32)", """class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 32)

    def forward(self, x):
        return self.fc(x)


model = Net()""")
RENAMED = RENAMABLE.replace("self.fc", "self.proj")
WIDER = RENAMED.replace("self.proj = nn.Linear(8, 32)", "self.proj = nn.Linear(8, 32)\n        self.extra = "
                        "nn.Linear(32, 32)").replace("return self.proj(x)", "return self.extra(self.proj(x))")


def test_a_renamed_layer_is_compared_by_position_and_an_other_model_is_skipped(tmp_path):
    """A commit that only renames a layer builds the same model under other names: compared with good by position
    (and said so), never counted as BAD. A commit whose model has other parameters cannot be compared: skipped, its
    reason on one line. Before the fix both were BAD and FOUND named the rename; the real culprit was never run."""
    root = make_repo(tmp_path / "r", [
        ("good", {"train.py": RENAMABLE}),
        ("rename the layer", {"train.py": RENAMED}),
        ("an extra layer", {"train.py": WIDER}),
        ("drop the extra layer", {"train.py": RENAMED + "\n"}),
        ("sum in reverse", {"train.py": RENAMED.replace("out = h.sum(1,", "out = h.flip(1).sum(1,")}),
        ("a comment", {"train.py": "# reversed\n" + RENAMED.replace("out = h.sum(1,", "out = h.flip(1).sum(1,")}),
    ])
    rc, doc, err = _run_bisect(root, "--good", "HEAD~5")
    assert rc == 0 and doc["verdict"] == "found", err
    assert doc["first_bad_commit"]["subject"] == "sum in reverse"
    assert doc["first_bad_commit"]["parent"]["subject"] == "drop the extra layer"
    tested = {t["subject"]: t for t in doc["tested"]}
    assert {s: t["verdict"] for s, t in tested.items()} == {
        "good": "good", "a comment": "bad", "an extra layer": "skip", "drop the extra layer": "good",
        "sum in reverse": "bad"}
    renamed = {"proj.weight": "fc.weight", "proj.bias": "fc.bias"}
    assert tested["drop the extra layer"]["compare"]["verdict"] == "identical"
    assert tested["drop the extra layer"]["compare"]["renamed"] == renamed
    assert tested["sum in reverse"]["compare"]["renamed"] == renamed
    assert tested["an extra layer"]["reason"] == (
        "not comparable with good: good's model has 2 parameter(s) that this commit's lacks: fc.weight, fc.bias; this "
        "commit's model has 4 parameter(s) that good's lacks: proj.weight, proj.bias, extra.weight, extra.bias")

    from torchrepro.cli._bisect_render import render_bisect

    lines = render_bisect(doc).splitlines()
    table = lines[lines.index("Commits (oldest first; - = not tested):") + 1:][:6]
    assert len(table) == 6 and all(line.startswith("  ") for line in table)
    assert table[2].split()[:2] == ["2", "skip"] and table[2].endswith(
        "  not comparable with good: good's model has 2 parameter(s) that this commit's lacks: fc.weight, fc...")
    assert table[3].endswith("  identical (2 parameter(s) renamed since good, compared by position: proj.weight "
                             "was fc.weight, ...)")


def test_a_bad_commit_not_comparable_with_good_is_exit_2(tmp_path):
    """Bad's model has other parameters than good's: its run says nothing about good's, so bisect stops with the
    reason (before the fix: FOUND, naming the commit that added a layer as the one whose run differs)."""
    root = make_repo(tmp_path / "r", [("good", {"train.py": RENAMED}), ("an extra layer", {"train.py": WIDER})])
    rc, doc, err = _run_bisect(root, "--good", "HEAD~1")
    assert rc == 2 and doc["verdict"] == "error", err
    assert doc["error"].startswith("the runs are not comparable:\n  - bad's model has 2 parameter(s) that good's "
                                   "lacks: extra.weight, extra.bias\nBisect compares each commit's run with good's (")
    assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_a_multi_line_reason_stays_on_its_row():
    from torchrepro.cli._bisect_render import render_bisect

    chain = [{"sha": "a" * 40, "subject": "good", "verdict": "good"},
             {"sha": "b" * 40, "subject": "odd", "verdict": "skip"},
             {"sha": "c" * 40, "subject": "bad", "verdict": "bad"}]
    reason = "not comparable with good:\n  - run 2's model differs\n" + "x" * 200
    doc = {"verdict": "ambiguous", "tolerance": {"bitwise": True}, "candidates": chain[1:], "good": chain[0],
           "bad": chain[2], "commits": 2, "recordings": 3, "command": "python train.py", "out": "out",
           "tested": [{"sha": c["sha"], "reason": reason if c["verdict"] == "skip" else None,
                       "compare": None if c["verdict"] == "skip" else {"verdict": "identical"}} for c in chain],
           "chain": chain}
    lines = render_bisect(doc).splitlines()
    row = lines[lines.index("Commits (oldest first; - = not tested):") + 2]
    assert row == (f"    1  skip  {'b' * 12} 'odd'{' ' * 52}  not comparable with good: - run 2's model differs "
                   + "x" * 47 + "...")
    assert lines[lines.index("Commits (oldest first; - = not tested):") + 3].startswith("    2  BAD ")


@pytest.mark.parametrize("how", ["deleted", "renamed"])
def test_a_script_deleted_or_renamed_before_bad_is_said_so(tmp_path, monkeypatch, capsys, how):
    """The script exists at good and is deleted (or renamed) by a later commit: bad's error names that commit and
    what to do. Before the fix: "it was added in a later commit" (checkout at good) or "it is not committed in
    your checkout" (checkout at bad)."""
    gone = {"train.py": None} if how == "deleted" else {"train.py": None, "scripts/train.py": BASE}
    root = make_repo(tmp_path / "r", [*HISTORY[:2], (f"{how} the script", gone), ("notes", {"NOTES.md": "n\n"})])
    if how == "deleted":
        git(root, "checkout", "-q", "--detach", "HEAD~3")  # the script is tracked in the checkout
    monkeypatch.chdir(root)
    rc, doc = _bisect_json(["--good", "HEAD~3" if how == "renamed" else "HEAD", "--bad", "main", "--no-locate",
                            "--max-steps", "1", "--", "python", "train.py"], capsys)
    bad, by = (git(root, "rev-parse", rev).strip()[:12] for rev in ("main", "main~1"))
    what = "deleted" if how == "deleted" else "renamed to scripts/train.py"
    assert rc == 2 and doc["error"].startswith(
        f"the command fails at bad ({bad}): train.py is not in commit {bad} (it was {what} in commit {by} "
        f"'{how} the script'). Bisect runs the same command at every commit, so the script must be in each: give a "
        f"bad commit before {by} (`--bad {by}~1`)"), doc["error"]
    assert "added in a later commit" not in doc["error"] and "not committed in your checkout" not in doc["error"]
    assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_interpreter_options_with_values_are_accepted(tmp_path):
    """`python -W ignore /abs/train.py`: -W's value is not the script, and the script is each commit's copy (before
    the fix: "the command fails at good", python option '-W' is not supported)."""
    root = make_repo(tmp_path / "r", [("good", {"train.py": BASE}), ("reversed", {"train.py": REVERSED})])
    p = _in_process(root, "--json", "--max-steps", "2", "--no-locate", "--good", "HEAD~1", "--out",
                    str(tmp_path / "out"), "--", "python", "-W", "ignore", "-X", "faulthandler", str(root / "train.py"))
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["verdict"] == "found", p.stderr
    assert doc["first_bad_commit"]["subject"] == "reversed"


SUBMODULE_TRAIN = BASE.replace("from torch import nn\n", "from torch import nn\n\nimport mylib\n").replace(
    "loss = ((out - y) ** 2).mean()", "loss = ((out * mylib.SCALE - y) ** 2).mean()")


def _repo_with_a_submodule(tmp: Path) -> Path:
    """good: train.py imports the submodule `mylib` (SCALE = 1.0); then the submodule moves to SCALE = 2.0."""
    lib = make_repo(tmp / "lib", [("scale 1", {"__init__.py": "SCALE = 1.0\n"})])
    root = make_repo(tmp / "r", [("train", {"train.py": SUBMODULE_TRAIN})])
    git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "mylib")
    git(root, "commit", "-q", "-m", "good")
    (root / "mylib" / "__init__.py").write_text("SCALE = 2.0\n")
    git(root / "mylib", "commit", "-q", "-am", "scale 2")
    git(root, "commit", "-q", "-am", "bump mylib")
    return root


def test_a_submodule_is_named_when_the_worktrees_lack_it(tmp_path, monkeypatch, capsys):
    """Before the fix the failure was blamed on the script alone: bisect's worktrees leave submodules empty."""
    root = _repo_with_a_submodule(tmp_path)
    monkeypatch.chdir(root)
    rc, doc = _bisect_json(["--good", "HEAD~1", "--no-locate", "--max-steps", "1", "--", "python", "train.py"],
                           capsys)
    good = git(root, "rev-parse", "HEAD~1").strip()[:12]
    assert rc == 2 and doc["error"].startswith(f"the command fails at good ({good}): "), doc["error"]
    assert doc["error"].endswith(
        f" Commit {good} has git submodule(s) mylib (from .gitmodules), which bisect's worktrees do not check out "
        "(they are left empty). If the command needs them, run bisect again with --submodules: each worktree then "
        "gets them at the commit's recorded revision, copied from your checkout's submodules (no network; run `git "
        "submodule update --init --recursive` in your checkout first if they are not there)."), doc["error"]
    assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_submodules_are_checked_out_with_the_option(tmp_path):
    """--submodules: each worktree gets the submodule at its commit's revision (copied from the checkout's), so
    the commit that moved the submodule is found; the checkout, the submodule's repository and the worktree lists
    are left as they were."""
    root = _repo_with_a_submodule(tmp_path)
    before = (git(root, "status", "--porcelain"), git(root / "mylib", "rev-parse", "HEAD"),
              git(root / "mylib", "worktree", "list", "--porcelain"), git(root / "mylib", "status", "--porcelain"))
    p = _in_process(root, "--json", "--max-steps", "2", "--no-locate", "--submodules", "--good", "HEAD~1", "--out",
                    str(tmp_path / "out"), "--", "python", "train.py")
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["verdict"] == "found", p.stderr
    assert doc["first_bad_commit"]["subject"] == "bump mylib"
    assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert (git(root, "status", "--porcelain"), git(root / "mylib", "rev-parse", "HEAD"),
            git(root / "mylib", "worktree", "list", "--porcelain"), git(root / "mylib", "status", "--porcelain")) \
        == before


def test_worktrees_with_submodules_are_removed_also_when_a_killed_bisect_left_them(tmp_path, monkeypatch):
    """A worktree's submodule is checked out at the commit's revision; the worktree, its submodule clone included,
    goes without a trace (git's notes too), by the bisect that made it or by the next one when it was killed; the
    checkout's submodule is left as it was."""
    from torchrepro.record import gitrepo

    root = _repo_with_a_submodule(tmp_path)
    repo = gitrepo.Repo.find(root)
    good = repo.commit("HEAD~1")
    with gitrepo.Worktrees(repo, submodules=True) as trees:
        path = trees.add(good.sha)
        assert (path / "mylib" / "__init__.py").read_text() == "SCALE = 1.0\n"  # the commit's revision, not HEAD's
        assert trees.submodules[path] == [gitrepo.Submodule("mylib", "mylib", git(root, "rev-parse", "HEAD~1:mylib")
                                                            .strip())]
        trees.remove(path)
        assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 1
        trees.add(good.sha)
        monkeypatch.setattr(gitrepo, "_alive", lambda pid: False)  # as if the bisect that made it was killed
        assert len(gitrepo.remove_stale(repo)) == 1
        assert git(root, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert (root / "mylib" / "__init__.py").read_text() == "SCALE = 2.0\n"
    assert git(root / "mylib", "worktree", "list", "--porcelain").count("worktree ") == 1
