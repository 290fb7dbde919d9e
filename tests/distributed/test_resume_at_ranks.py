"""`torchrepro check --resume-at K` of a DDP script on 2 ranks (gloo, CPU): each rank's stopped and restarted
processes joined at step K and compared with its uninterrupted run; the verdict names the first rank that did not
resume exactly (tests/scripts/ddp_resume.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.distributed.resumecheck import K, restored, resume_check

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "ddp_resume.py")
SCHEMA = "torchrepro.check-resume/1"


def test_ddp_loop_with_resume_point_resumes_identically_on_every_rank(tmp_path):
    rc, doc, _, err = resume_check(tmp_path, "python", SCRIPT, "--steps", "4", args=("--nproc-per-node", "2"))
    assert rc == 0, err + json.dumps(doc)[:3000]
    assert doc["schema"] == SCHEMA and doc["verdict"] == "identical" and doc["exit_code"] == 0
    assert doc["nproc_per_node"] == 2 and doc["lead_rank"] == 0 and doc["resume_at"] == K
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert r["verdict"] == "identical" and r["cause"] is None, r
        assert r["steps"] == {"uninterrupted": 4, "before_checkpoint": K, "after_resume": 4 - K}
        assert all(restored(r).values()), r["restored"]
        assert Path(r["runs"]["resumed"]).name == f"rank{r['rank']}"
    # one checkpoint folder, under torchrepro's output, each rank's file in it
    checkpoint = Path(doc["checkpoint"])
    assert checkpoint == tmp_path / "out" / "run2-checkpoint" / f"checkpoint-{K}"
    assert sorted(p.name for p in checkpoint.iterdir()) == ["rank0.pt", "rank1.pt"]
    assert (checkpoint.parent / ".torchrepro-checkpoints").is_file()
    for run in ("run1", "run2", "run2-resumed"):
        assert sorted(p.name for p in (tmp_path / "out" / run).glob("rank*")) == ["rank0", "rank1"]


def test_ddp_loop_that_forgets_the_optimizer_state_diverges_on_every_rank(tmp_path):
    """Run under `torchrun` (the other spelling); text output names the rank."""
    rc, doc, out, err = resume_check(tmp_path, "torchrun", "--nproc-per-node", "2", SCRIPT, "--steps", "4",
                                     "--forget", "optimizer", json_out=False)
    assert rc == 1, err
    assert doc["schema"] == SCHEMA and doc["verdict"] == "diverged" and doc["exit_code"] == 1
    assert doc["lead_rank"] == 0 and doc["cause"] == "optimizer-state" and doc["step"] == K + 1
    for r in doc["ranks"]:
        assert r["cause"] == "optimizer-state" and r["step"] == K + 1, r
        assert restored(r) == {"parameters": True, "optimizer-state": False, "scheduler-state": True, "data": True,
                               "rng-state": True}
        assert any(name.endswith("momentum_buffer") for name in r["tensors"]), r["tensors"]
    assert f"torchrepro: RESUME DIVERGED at step {K + 1} on rank 0 - " in out
    assert "rank 0: DIVERGED at step 3; not restored: optimizer state" in out
    assert "rank 1: DIVERGED at step 3; not restored: optimizer state" in out
    assert "optimizer.state_dict()" in out


def test_one_checkpoint_of_rank_0_leaves_the_other_ranks_unrestored(tmp_path):
    """Rank 0 saves one file that every rank loads: rank 0's state is restored, rank 1 gets rank 0's RNG state and
    starts its data shard again. Rank 1's gradients reach rank 0 through DDP's all-reduce, so both diverge at step
    K+1; the verdict's lead is rank 1, the rank that names what was not restored, and rank 0 follows it."""
    rc, doc, out, err = resume_check(tmp_path, "python", SCRIPT, "--steps", "4", "--save-on", "rank0",
                                     args=("--nproc-per-node", "2"), json_out=False)
    assert rc == 1, err
    assert doc["lead_rank"] == 1 and doc["verdict"] == "diverged"
    assert [r["verdict"] for r in doc["ranks"]] == ["diverged", "diverged"]  # rank 1 reaches rank 0 by DDP
    assert doc["cause"] == doc["ranks"][1]["cause"] == "data-position", doc["ranks"][1]["restored"]
    assert Path(doc["checkpoint"]).is_file()
    assert "on rank 1 - " in out.splitlines()[0]
    assert doc["ranks"][0]["follows_rank"] == 1 and doc["ranks"][0]["cause"] == "compute"
    assert "rank 1 did not resume exactly" in doc["ranks"][0]["explanation"]
    assert ("rank 0: DIVERGED at step 3; everything recorded was restored, but its gradients are averaged with "
            "rank 1's") in out


def test_snapshot_script_without_resume_point_is_told_what_to_change(tmp_path):
    """minGPT-ddp style: rank 0 saves snapshot.pt itself every 2 steps, every rank loads it at start. torchrepro
    cannot tell its checkpoint from another file it writes: exit 2 naming the file and what to change."""
    rc, doc, _, err = resume_check(tmp_path, "torchrun", "--nproc-per-node", "2", SCRIPT, "--steps", "4",
                                   "--snapshot", args=("--fresh-cwd",))
    assert rc == 2, err
    assert doc["schema"] == SCHEMA and doc["verdict"] == "error"
    message = doc["error"]
    assert "never checkpointed" in message
    assert "snapshot.pt" in message and f"rank 0, after step {K}" in message, message
    assert "rp.resume_from" in message and "rp.checkpoint" in message and "rp.due()" in message
    assert not (tmp_path / "snapshot.pt").exists()  # --fresh-cwd: the runs wrote into their copies


def test_resume_at_under_torchrun_is_not_refused(tmp_path):
    """It used to be refused before anything ran ("does not go with --nproc-per-node or torchrun yet")."""
    rc, doc, _, _ = resume_check(tmp_path, "torchrun", "--nproc-per-node", "2", SCRIPT, "--steps", str(K))
    assert rc == 2 and "does not go with" not in doc["error"]
    assert f"ends at step {K}: nothing is left to train" in doc["error"]
