"""`check` knows when its runs share a working directory that one run wrote and a later one read (a script that
resumes from its own snapshot), says so with what to do, and `--fresh-cwd` gives each run its own copy."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.inprocess import torchrepro
from torchrepro.analysis.compare import CheckResult
from torchrepro.record.workdir import WorkdirWatch, fs_now_ns, walk

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}

# The DDP tutorial's pattern: resume from snapshot.pt if it exists, save it every epoch. It also keeps a cache it
# writes and reads itself (a downloaded data set): both runs read the same bytes, so that is not reported.
# It updates its parameters by hand (no torch.optim, whose first optimizer imports torch._dynamo: about 1 CPU
# second a run): one step per backward().
RESUMES = textwrap.dedent("""
    import os, sys, torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    start = 0
    if os.path.exists("snapshot.pt"):
        snap = torch.load("snapshot.pt", weights_only=True)
        model.load_state_dict(snap["model"])
        start = snap["epoch"]
    if not os.path.exists("cache.txt"):
        with open("cache.txt", "w") as f:
            f.write("0.5")
    with open("cache.txt") as f:
        scale = float(f.read())
    x, y = torch.randn(8, 4) * scale, torch.randn(8, 1)
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else start + 3
    for epoch in range(start, epochs):
        ((model(x) - y) ** 2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)
                p.grad = None
        torch.save({"model": model.state_dict(), "epoch": epoch + 1}, "snapshot.pt")
""")
PLAIN = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()
""")
ADVICE = ("Delete those files before each run, point the script's output elsewhere, or rerun with "
          "`torchrepro check --fresh-cwd -- ...` (each run in its own copy of the working directory).")


def check(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`torchrepro check ARGS` in ``cwd``, in this process (tests/inprocess.py)."""
    return torchrepro("check", *args, timeout=600, cwd=cwd, env={"PYTHONPATH": ENV["PYTHONPATH"]})


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(RESUMES)
    (tmp_path / "data.txt").write_text("untouched")
    return tmp_path


def test_a_run_that_resumes_from_the_previous_runs_snapshot_is_named(project):
    p = check(project, "--out", "out", "--", "python", "train.py")
    assert p.returncode == 1, p.stderr
    assert "DIVERGED at step 0" in p.stdout
    assert ("Cause: shared-working-directory - The runs shared the working directory and a later run read what "
            "an earlier one wrote there: run 2 opened snapshot.pt (created by run 1). The runs did not start "
            "from the same state, so this comparison does not show whether the script is reproducible.") in p.stdout
    # Next names this check's own command with --fresh-cwd added, ready to paste
    assert f"Next:  {ADVICE.replace('--fresh-cwd -- ...', '--fresh-cwd -- python train.py')}" in p.stdout
    assert "initial-weights" not in p.stdout and "cache.txt" not in p.stdout
    doc = json.loads((project / "out" / "check.json").read_text())
    wd = doc["working_directory"]
    assert doc["cause"] == "shared-working-directory" and wd["cause_otherwise"] == "initial-weights"
    assert wd["isolated"] is False and wd["watch_truncated"] is False
    assert wd["read_from_earlier_run"] == [{"run": 2, "path": "snapshot.pt", "how": "opened", "change": "created"}]


def test_a_snapshot_written_through_a_symlinked_folder_outside_the_cwd_is_named(tmp_path):
    """``out/`` links to a folder outside the working directory: run 2 loading run 1's snapshot from it is shared
    state, not unseeded initial weights (the watch follows symlinked folders)."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "out").symlink_to(elsewhere, target_is_directory=True)
    (project / "train.py").write_text(RESUMES.replace('"snapshot.pt"', '"out/snapshot.pt"'))
    p = check(project, "--json", "--out", str(tmp_path / "check"), "--", "python", "train.py")
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert doc["cause"] == "shared-working-directory", doc["cause"]
    assert doc["working_directory"]["read_from_earlier_run"] == [
        {"run": 2, "path": "out/snapshot.pt", "how": "opened", "change": "created"}]


def test_walk_follows_symlinked_folders_once(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.txt").write_text("a")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "real" / "loop").symlink_to(tmp_path, target_is_directory=True)  # a cycle back to the root
    entries = walk(tmp_path).entries
    assert {"link", "real", "real/a.txt", "real/loop"} <= set(entries)
    assert "link/a.txt" in entries  # walked through the link (first in name order), and through real/ again
    assert not any(p.startswith("real/loop/") for p in entries)


def test_fresh_cwd_gives_each_run_its_own_copy(project):
    p = check(project, "--fresh-cwd", "--json", "--out", "out", "--", "python", "train.py")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "identical" and doc["cause"] is None and doc["steps"] == [3, 3]
    wd = doc["working_directory"]
    assert wd["isolated"] is True and wd["read_from_earlier_run"] == [] and wd["warning"] is None
    # the user's working directory is untouched
    assert not (project / "snapshot.pt").exists() and not (project / "cache.txt").exists()
    for i in (1, 2):
        copy = project / "out" / f"run{i}-cwd"
        assert wd["copies"][i - 1] == str(copy.resolve())
        assert (copy / "train.py").read_text() == RESUMES and (copy / "data.txt").read_text() == "untouched"
        assert (copy / "snapshot.pt").is_file() and not (copy / "out").exists()
    # the same --out again: the old copies are torchrepro's own output and are replaced; a script named by its
    # absolute path under the working directory is the copy's own (paths relative to __file__ land in the copy)
    p = check(project, "--fresh-cwd", "--out", "out", "--", "python", str(project / "train.py"))
    assert p.returncode == 0, p.stderr
    assert "IDENTICAL" in p.stdout and "Warning" not in p.stdout
    manifest = json.loads((project / "out" / "run2" / "manifest.json").read_text())
    assert manifest["command"][1] == str((project / "out" / "run2-cwd").resolve() / "train.py")
    assert manifest["cwd"] == str((project / "out" / "run2-cwd").resolve())


def test_a_run_left_nothing_to_do_by_the_previous_one_says_why(project):
    # range(start, 3): run 2 finds epoch 3 in snapshot.pt and trains nothing (the DDP tutorial at max_epochs)
    p = check(project, "--out", "out", "--", "python", "train.py", "3")
    assert p.returncode == 2
    assert "run 2 of 2 finished but recorded no optimizer step" in p.stderr
    assert "run 2 opened snapshot.pt (created by run 1)" in p.stderr and ADVICE in p.stderr


def test_walk_is_bounded_and_skips_what_is_not_the_users(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name).write_text(name)
    for skipped in (".git", "__pycache__", "torchrepro-runs", "venv", "out"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "x").write_text("x")
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr")
    snap = walk(tmp_path, skip=[tmp_path / "out"])
    assert sorted(snap.entries) == ["a", "b", "c"] and not snap.truncated
    flat = tmp_path / "flat"
    flat.mkdir()
    for name in ("c", "a", "b"):
        (flat / name).write_text(name)
    snap = walk(flat, limit=2)
    assert list(snap.entries) == ["a", "b"] and snap.truncated


def test_walk_of_a_folder_larger_than_the_limit_is_truncated_even_when_some_entries_are_skipped(tmp_path):
    """A folder is listed only up to the limit; skipped entries in the part read (torchrepro's own output, which
    check creates before it walks) must not hide that the folder goes on (before: 10,054 files passed --fresh-cwd)."""
    skip = [tmp_path / f"skip{i}" for i in range(20)]
    for d in skip:
        d.mkdir()
    for name in "abcdef":
        (tmp_path / name).write_text(name)
    snap = walk(tmp_path, skip=skip, limit=5)
    assert snap.truncated and len(snap.entries) <= 5


def _reads(opened: dict[str, bool], root: Path) -> list[dict]:
    return [{"root": str(root), "opened": opened, "listed": {}, "truncated": False}]


def test_only_files_run_1_changed_and_did_not_read_back_itself_are_reported(tmp_path):
    (tmp_path / "old.txt").write_text("old")
    watch = WorkdirWatch(tmp_path)
    watch.start()
    (tmp_path / "snap.pt").write_text("s")  # run 1 writes, never reads
    (tmp_path / "data.bin").write_text("d")  # run 1 writes, then reads it itself (fresh)
    (tmp_path / "old.txt").write_text("older")  # run 1 rewrites a file it had read before (not fresh)
    watch.reads[1] = _reads({"data.bin": True, "old.txt": False}, tmp_path)
    watch.run_done(1, tmp_path / "nowhere")
    watch.reads[1] = _reads({"data.bin": True, "old.txt": False}, tmp_path)
    watch.reads[2] = _reads({"data.bin": False, "old.txt": False, "snap.pt": False, "x.pt": False}, tmp_path)
    assert watch.shared() == [{"run": 2, "path": "old.txt", "how": "opened", "change": "changed"},
                              {"run": 2, "path": "snap.pt", "how": "opened", "change": "created"}]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's coarse clock")
def test_a_file_made_after_fs_now_is_never_older_than_it(tmp_path):
    """The kernel stamps file times from its coarse clock, up to a tick behind time.time_ns(): read from the fine
    clock, "now" is later than the ctime of every file made in the same tick (an audit's own writes then looked like
    another run's). No file is stat-ed until all are made: a stat-ed inode's next ctime is fine-grained."""
    made = []
    for i in range(300):
        now = fs_now_ns()
        path = tmp_path / f"f{i}"
        path.touch()
        made.append((path, now))
    assert [p.name for p, now in made if p.stat().st_ctime_ns < now] == []


def test_the_audit_records_reads_under_the_cwd_changed_since_the_start(tmp_path):
    (tmp_path / "before.txt").write_text("b")
    code = textwrap.dedent("""
        import json, os, time
        from torchrepro.record.workdir import ReadAudit, fs_now_ns
        time.sleep(0.02)  # before.txt's ctime is a tick or more before the start
        audit = ReadAudit(fs_now_ns()).install()  # file times come from the kernel's coarse clock
        open("new.txt", "w").write("n")
        open("new.txt").read()
        open("before.txt").read()
        open("w.txt", "w").close()
        fd = os.open("new.txt", os.O_RDONLY); os.close(fd)
        os.mkdir("sub")
        try:
            import not_a_module_anywhere  # the import system lists the cwd: not the script's doing
        except ImportError:
            pass
        os.listdir("sub"); os.listdir(os.path.dirname(os.__file__))
        open("missing.txt", "a").close()  # appended, never read
        print(json.dumps(audit.facts()))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=ENV,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    facts = json.loads(p.stdout)
    assert facts == {"root": str(tmp_path.resolve()), "opened": {"new.txt": True}, "listed": {"sub": True},
                     "truncated": False}


def test_enospc_on_check_json_prints_the_verdict_and_exits_2(tmp_path, monkeypatch, capsys):
    from torchrepro.cli import _output, main

    (tmp_path / "train.py").write_text(PLAIN)

    def full(path, obj):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(_output, "atomic_write_json", full)  # the one verdict writer saves check.json
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    out = tmp_path / "out"
    message = (f"torchrepro: error: could not write {out / 'check.json'} (No space left on device, ENOSPC); the "
               "verdict above is complete, only the file(s) named are missing. Free disk space (or pass --out DIR "
               "on another disk) and run the check again.")
    assert main(["check", "--out", str(out), "--", "python", "train.py"]) == 2
    captured = capsys.readouterr()
    assert "torchrepro: IDENTICAL - 2 runs of `python train.py`, 3 steps each" in captured.out
    assert message in captured.err and "internal error" not in captured.err
    assert main(["check", "--json", "--out", str(out), "--", "python", "train.py"]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # one JSON document
    assert doc["verdict"] == "identical" and doc["exit_code"] == 2 and doc["error"] == message.split(": ", 2)[2]
    assert message in captured.err and "internal error" not in captured.err


def test_a_plot_that_cannot_be_written_is_said_and_check_json_says_so(tmp_path, monkeypatch, capsys):
    from torchrepro.analysis import report
    from torchrepro.analysis.compare import CheckResult
    from torchrepro.cli.check_cmd import finish

    def full(result, path):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), str(path))

    monkeypatch.setattr(report, "plot_check", full)
    result = CheckResult(verdict="diverged", runs=["a", "b"], step_mode="optimizer", steps=[2, 2], first_step=1,
                         cause="compute", losses=[[1.0, 0.5], [1.0, 0.6]], loss_delta=[0.0, 0.1])
    assert finish(result, tmp_path, what="`python t.py`", as_json=False) == 2
    captured = capsys.readouterr()
    message = (f"could not write {tmp_path / 'check.png'} ({os.strerror(errno.EDQUOT)}, EDQUOT); the verdict above "
               "is complete, only the file(s) named are missing. Free space within your disk quota (or pass --out "
               "DIR on another disk) and run the check again.")
    assert "torchrepro: DIVERGED at step 1" in captured.out and "Cause: compute" in captured.out
    assert captured.err == f"torchrepro: error: {message}\n"
    doc = json.loads((tmp_path / "check.json").read_text())
    assert doc["exit_code"] == 2 and doc["error"] == message and doc["plot"] is None


def _identical() -> CheckResult:
    return CheckResult(verdict="identical", runs=["a", "b"], step_mode="optimizer", steps=[2, 2],
                       losses=[[1.0, 0.5], [1.0, 0.5]], loss_delta=[0.0, 0.0])


def test_ranks_check_json_on_a_full_disk_prints_one_document_and_exits_2(tmp_path, monkeypatch, capsys):
    from torchrepro.analysis.rankcompare import RanksCheck
    from torchrepro.cli import _output, _ranks

    def full(path, obj):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(_output, "atomic_write_json", full)
    check_ = RanksCheck(nproc=2, per_rank=[_identical(), _identical()], desync=[None, None])
    assert _ranks.finish_ranks(check_, tmp_path, what="`python t.py`", as_json=True) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["verdict"] == "identical" and doc["exit_code"] == 2
    assert doc["error"].startswith(f"could not write {tmp_path / 'check.json'} (No space left on device, ENOSPC)")
    assert captured.err == f"torchrepro: error: {doc['error']}\n"


def test_an_identical_verdict_that_read_an_earlier_runs_output_is_warned(tmp_path):
    from torchrepro.analysis.compare import note_shared_workdir
    from torchrepro.cli._render import render

    result = _identical()
    note_shared_workdir(result, {"read_from_earlier_run": [
        {"run": 2, "path": "out/checkpoint-10", "how": "listed", "change": "created"}]})
    assert result.verdict == "identical" and result.cause is None
    text = render(result, what="`python t.py`")
    assert text.splitlines()[1] == (
        "Warning: The runs shared the working directory and a later run read what an earlier one wrote there: run 2 "
        "listed out/checkpoint-10 (created by run 1). The runs did not start from the same state, so this comparison "
        f"does not show whether the script is reproducible. {ADVICE}")


def test_fresh_cwd_on_a_directory_too_large_to_copy_is_refused_before_anything_is_made(tmp_path, monkeypatch,
                                                                                          capsys):
    import torchrepro.record.workdir as wd
    from torchrepro.cli import main

    monkeypatch.setattr(wd, "COPY_FILES", 5)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('never run')\n")
    for i in range(8):
        (tmp_path / f"data{i}.txt").write_text(str(i))
    assert main(["check", "--json", "--fresh-cwd", "--", "python", "train.py"]) == 2
    doc = json.loads(capsys.readouterr().out)  # exactly one JSON document
    assert doc["verdict"] == "error" and doc["exit_code"] == 2
    assert doc["error"].startswith(f"--fresh-cwd copies the working directory {tmp_path} for every run, but it "
                                   "holds more than 5 files")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["train.py", *(f"data{i}.txt" for i in range(8))])


def test_a_folder_a_later_run_only_listed_is_not_shared_state(tmp_path):
    """Lightning lists lightning_logs/ to number its next version_N: every Lightning script was warned that the
    comparison showed nothing. Only what a later run opened of what run 1 wrote counts; the listing is kept as
    information."""
    watch = WorkdirWatch(tmp_path)
    watch.start()
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)
    (tmp_path / "lightning_logs" / "version_0" / "hparams.yaml").write_text("lr: 0.1")
    watch.reads[1] = []
    watch.run_done(1, tmp_path / "nowhere")
    watch.reads[2] = [{"root": str(tmp_path), "opened": {}, "listed": {"lightning_logs": False},
                       "truncated": False}]
    assert watch.shared() == []
    doc = watch.to_json()
    assert doc["read_from_earlier_run"] == []
    assert doc["listed_from_earlier_run"] == [{"run": 2, "path": "lightning_logs", "how": "listed",
                                               "change": "created"}]
    watch.reads[2][0]["opened"] = {"lightning_logs/version_0/hparams.yaml": False}  # reading what run 1 wrote counts
    assert watch.shared() == [{"run": 2, "path": "lightning_logs/version_0/hparams.yaml", "how": "opened",
                               "change": "created"}]
