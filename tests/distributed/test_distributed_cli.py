"""`torchrepro check/run --nproc-per-node 2` and `check -- torchrun ...` end to end (gloo, CPU, 2 ranks)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.inprocess import torchrepro as torchrepro_here
from torchrepro._core.errors import RunDirError
from torchrepro.analysis.rankcompare import rank_desync
from torchrepro.cli import main
from torchrepro.record.launcher import CommandError, parse_torchrun_command, ranks_command, torchrun_failures
from torchrepro.record.outdir import check_run_dir
from torchrepro.record.store import Run, load_ranks, load_run

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "ddp_train.py")
LIMIT_S = 300


def in_process(*args: str) -> subprocess.CompletedProcess:
    """``torchrepro`` for `check` and `diff` (their ranks' output goes to the run directories), in this process
    (tests/inprocess.py)."""
    return torchrepro_here(*args, timeout=LIMIT_S)


def masks(out: Path, run: int, rank: int) -> list[str]:
    """The dropout-mask fingerprints rank ``rank`` printed in run ``run`` (its own stdout.txt)."""
    lines = (out / f"run{run}" / f"rank{rank}" / "stdout.txt").read_text().splitlines()
    return json.loads(next(line for line in lines if line.startswith("masks "))[len("masks "):])


def test_check_of_a_ddp_script_identical_with_per_rank_dropout(tmp_path):
    out = tmp_path / "out"
    p = in_process("check", "--json", "--out", str(out), "--nproc-per-node", "2", "--", "python", SCRIPT,
                   "--steps", "4")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "identical" and doc["nproc_per_node"] == 2 and doc["exit_code"] == 0
    assert [r["verdict"] for r in doc["ranks"]] == ["identical", "identical"]
    assert [r["steps"] for r in doc["ranks"]] == [[4, 4], [4, 4]]
    assert doc["desync"] == [None, None]
    # dropout masks differ between the ranks of a run, and each rank's masks repeat across runs
    for run in (1, 2):
        assert all(a != b for a, b in zip(masks(out, run, 0), masks(out, run, 1)))
    for rank in (0, 1):
        assert masks(out, 1, rank) == masks(out, 2, rank) and len(masks(out, 1, rank)) == 4
    # the layout: one run directory per rank, the run's manifest lists them
    top, ranks = load_ranks(out / "run1")
    assert top.manifest["ranks"] == ["rank0", "rank1"] and top.manifest["status"] == "ok"
    assert [r.manifest["steps"] for r in ranks] == [4, 4]
    with pytest.raises(RunDirError, match=r"is a run of 2 ranks \(torchrun\).*Pass one rank's directory"):
        load_run(out / "run1")
    d = in_process("diff", "--json", "--out", str(out.parent / "diff"), str(out / "run1" / "rank1"),
                   str(out / "run2" / "rank1"))  # its output beside the check's, not in the cwd
    assert d.returncode == 0 and json.loads(d.stdout)["verdict"] == "identical", d.stderr
    check_run_dir(out / "run1", flag="--out")  # a later check may replace it


def test_check_under_torchrun_names_the_desynchronised_rank_tensor_and_step(tmp_path):
    out = tmp_path / "out"
    p = in_process("check", "--out", str(out), "--", "torchrun", "--nproc-per-node", "2", SCRIPT, "--steps", "5",
                   "--perturb-rank", "1", "--perturb-step", "3", "--check-every", "1")
    assert p.returncode == 1, p.stderr
    assert "torchrepro: DESYNCHRONISED" in p.stdout and "replicas part at step 3" in p.stdout
    assert "run 1: rank 1 differs from rank 0 at step 3: parameters module.fc1.weight" in p.stdout
    assert "run 2: rank 1 differs from rank 0 at step 3: parameters module.fc1.weight" in p.stdout
    for r in (0, 1):  # every tensor of each rank was compared (none unreadable), and the count is said
        assert re.search(rf"rank {r}: identical \(5 steps; \d+ tensors compared: \d+ parameters, \d+ gradients, "
                         rf"\d+ optimizer-state\)", p.stdout), p.stdout
    doc = json.loads((out / "check.json").read_text())
    assert doc["verdict"] == "desynchronised" and doc["exit_code"] == 1 and doc["nproc_per_node"] == 2
    assert [(d["run"], d["step"], d["kind"], d["names"], d["ranks"], d["reference"]) for d in doc["desync"]] == [
        (1, 3, "params", ["module.fc1.weight"], [1], [0]), (2, 3, "params", ["module.fc1.weight"], [1], [0])]
    assert doc["desync_cause"]["action"]
    page = (out / "report.html").read_text()  # the report says it as the terminal does
    assert doc["report"] == str(out / "report.html") and "DESYNCHRONISED" in page
    assert "run 1: rank 1 differs from rank 0 at step 3: parameters module.fc1.weight" in page
    # the script's own check_consistency (every step, in every rank) names the same rank, tensor and step
    for rank in (0, 1):
        text = (out / "run1" / f"rank{rank}" / "stdout.txt").read_text()
        assert "ranks [0, 1] agree at step 2" in text
        assert "ranks [0, 1] disagree at step 3 on 1 of" in text
        assert "parameter 'fc1.weight': rank 1 differs from rank 0" in text


def test_check_when_a_rank_exits_early_names_it_and_shows_its_stderr(tmp_path):
    out = tmp_path / "out"
    t0 = time.monotonic()
    p = in_process("check", "--out", str(out), "--nproc-per-node", "2", "--", "python", SCRIPT, "--steps", "5",
                   "--exit-rank", "1", "--exit-step", "2", "--check-every", "1", "--timeout", "60")
    assert p.returncode == 2, p.stdout + p.stderr
    assert time.monotonic() - t0 < 60  # well within the collectives' 60 s limit: nobody hung
    assert "run 1 of 2 failed: rank 1 exited with code 3 first" in p.stderr
    assert f"Last lines of its stderr ({out / 'run1' / 'rank1' / 'stderr.txt'}):\nrank 1 exits early at step 2" in \
        p.stderr
    top = json.loads((out / "run1" / "manifest.json").read_text())
    assert top["failed_rank"] == 1 and top["rank_status"]["rank1"]["exit_code"] == 3
    # the surviving rank was waiting in check_consistency: it reported the dead rank at once, unless torchrun
    # stopped it (SIGTERM) first
    survivor = top["rank_status"]["rank0"]
    err0 = (out / "run1" / "rank0" / "stderr.txt").read_text()
    assert ("CollectiveError: check_consistency: the all-gather over ranks [0, 1] failed on rank 0" in err0
            and survivor["exit_code"] == 1) or survivor["exit_code"] == -15, (survivor, err0[-2000:])
    assert not (out / "run2").exists()


def test_a_rank_that_exits_0_early_is_named_not_the_peer_left_waiting(tmp_path):
    out = tmp_path / "out"
    p = in_process("check", "--out", str(out), "--nproc-per-node", "2", "--", "python", SCRIPT, "--steps", "3",
                   "--exit-rank", "1", "--exit-step", "1", "--exit-code", "0", "--timeout", "60")
    assert p.returncode == 2, p.stdout + p.stderr
    top = json.loads((out / "run1" / "manifest.json").read_text())
    assert top["ended_early"] == [1] and top["failed_rank"] == 0, top
    assert [top["rank_status"][f"rank{r}"]["steps"] for r in (0, 1)] == [1, 1]
    assert ("run 1 of 2 failed: rank 1 ended early (exit code 0 after 1 step) while rank 0 was still running; "
            "then rank 0 failed (1) after 1 step: RuntimeError: ") in p.stderr
    assert "A rank that ends before the others leaves them waiting in collectives" in p.stderr
    assert "rank 0 exited with code" not in p.stderr


def test_run_records_each_rank_and_stops_every_rank_at_max_steps(tmp_path, capfd):
    """`run` in this process (main): with --json its ranks' stdout goes to its stderr, a file descriptor that
    capfd captures (tests/inprocess.py's StringIO has none to give them)."""
    record = tmp_path / "rec"
    rc = main(["run", "--json", "--record", str(record), "--max-steps", "2", "--seed", "3", "--", "torchrun",
               "--nproc_per_node=2", SCRIPT, "--steps", "6"])
    p = subprocess.CompletedProcess(["torchrepro", "run"], rc, *capfd.readouterr())
    assert p.returncode == 0, p.stderr
    top = json.loads(p.stdout)
    assert top["status"] == "stopped-at-max-steps" and top["nproc_per_node"] == 2 and top["seed"] == 3
    assert top["command"] == ["python", SCRIPT, "--steps", "6"]
    _, ranks = load_ranks(record)
    for r, run in enumerate(ranks):
        assert run.manifest["steps"] == 2 and run.manifest["status"] == "stopped-at-max-steps"
        assert run.path.name == f"rank{r}" and len(run.steps()) == 2
    assert ranks[0].steps()[-1]["params"] == ranks[1].steps()[-1]["params"]
    assert ranks[0].steps()[0]["batches"] != ranks[1].steps()[0]["batches"]  # one data shard per rank


# --- commands and reports, without launching anything ----------------------------------------------------------
@pytest.mark.parametrize("command, expected", [
    (["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "0.1"], (["python", "train.py", "--lr", "0.1"], 2)),
    (["torchrun", "--standalone", "--nproc_per_node=3", "-m", "pkg.train"], (["python", "-m", "pkg.train"], 3)),
    (["/usr/bin/torchrun", "--nnodes", "1", "--master-port", "1234", "t.py"], (["python", "t.py"], 1)),
    (["python3", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py", "--x"],
     (["python3", "t.py", "--x"], 2)),
    (["python", "train.py", "--nproc-per-node", "2"], None),
])
def test_torchrun_commands_are_unwrapped(command, expected):
    assert parse_torchrun_command(command) == expected


@pytest.mark.parametrize("command, message", [
    (["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "t.py"], "remove --nnodes 2"),
    (["torchrun", "--max-restarts", "3", "t.py"], "remove --max-restarts 3"),
    (["torchrun", "--no-python", "bash", "x.sh"], "remove --no-python True"),
    (["torchrun", "--nproc-per-node", "gpu", "t.py"], "--nproc-per-node gpu is not a number"),
    (["torchrun", "--bogus", "t.py"], "cannot read the torchrun command"),
])
def test_torchrun_commands_that_cannot_be_recorded(command, message):
    with pytest.raises(CommandError, match=message):
        parse_torchrun_command(command)


def test_ranks_command_agreement():
    assert ranks_command(["python", "t.py"], None) == (["python", "t.py"], None)
    assert ranks_command(["python", "t.py"], 4) == (["python", "t.py"], 4)
    assert ranks_command(["torchrun", "--nproc-per-node", "2", "t.py"], 2) == (["python", "t.py"], 2)
    with pytest.raises(CommandError, match="--nproc-per-node 3 disagrees with the torchrun command's --nproc-per-no"):
        ranks_command(["torchrun", "--nproc-per-node", "2", "t.py"], 3)


def test_torchrun_failure_report_is_read():
    report = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
[1]:
  time      : 2026-11-29_19:15:18
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 22943)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_19:15:18
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 22944)
"""
    assert torchrun_failures(report) == ({0: -15, 1: 3}, 1)
    assert torchrun_failures("") == ({}, None)


def test_locate_with_ranks_of_identical_runs_has_nothing_to_locate(tmp_path, capsys):
    """`check --locate` under torchrun (refused before; a divergence is located in
    tests/distributed/test_locate_sharded.py): identical runs are not traced again."""
    rc = main(["check", "--locate", "--out", str(tmp_path / "o"), "--nproc-per-node", "2", "--", "python", SCRIPT])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "\nLocate (rank 0): the runs are identical: nothing to locate" in out
    assert json.loads((tmp_path / "o" / "check.json").read_text())["locate"]["verdict"] == "nothing-to-locate"
    assert not (tmp_path / "o" / "locate").exists()  # no traced re-runs


def _rank(steps: int) -> Run:
    """A rank's run with ``steps`` identical optimizer steps (no initial parameters recorded)."""
    return Run(Path("rank"), {}, [{"kind": "step", "step": k, "params": {"w": "same"}} for k in range(1, steps + 1)])


@pytest.mark.parametrize("counts, early, reference, text", [
    ([1, 3], [0], [1], "run 1: rank 0 stopped early: the ranks ran different numbers of steps (rank 0: 1, "
                       "rank 1: 3)"),
    ([3, 1], [1], [0], "run 1: rank 1 stopped early: the ranks ran different numbers of steps (rank 0: 3, "
                       "rank 1: 1)"),
    ([1, 3, 3], [0], [1, 2], "run 1: rank 0 stopped early: the ranks ran different numbers of steps (rank 0: 1, "
                             "rank 1: 3, rank 2: 3)"),
    ([2, 1, 3], [0, 1], [2], "run 1: rank 0 and rank 1 stopped early: the ranks ran different numbers of steps "
                             "(rank 0: 2, rank 1: 1, rank 2: 3)"),
])
def test_a_rank_that_ran_fewer_steps_is_the_one_named(counts, early, reference, text):
    d = rank_desync([_rank(c) for c in counts])
    assert d is not None and (d.kind, d.step, d.ranks, d.reference) == ("steps", min(counts) + 1, early, reference)
    assert d.describe() == text
