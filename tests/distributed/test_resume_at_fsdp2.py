"""`torchrepro check --resume-at K` of FSDP2 training on 2 ranks (gloo, CPU) that checkpoints with
torch.distributed.checkpoint (DCP): every rank saves its shards into the folder `rp.checkpoint` and loads them
from `rp.resume_from` (tests/scripts/fsdp2_dcp_resume.py). Each rank's resume is judged by its local shards."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch

from tests.distributed.resumecheck import K, restored, resume_check
from torchrepro.record.store import load_ranks

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "fsdp2_dcp_resume.py")
SCHEMA = "torchrepro.check-resume/1"
STEPS = 4
PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
ADAMW_STATE = sorted(f"{p}.{k}" for p in PARAMS for k in ("exp_avg", "exp_avg_sq", "step"))


def test_fsdp2_script_that_restores_everything_with_dcp_resumes_identically(tmp_path):
    rc, doc, _, err = resume_check(tmp_path, "python", SCRIPT, "--steps", str(STEPS), args=("--nproc-per-node", "2"))
    assert rc == 0, err + json.dumps(doc)[:3000]
    assert doc["schema"] == SCHEMA and doc["verdict"] == "identical" and doc["exit_code"] == 0
    assert doc["nproc_per_node"] == 2 and doc["lead_rank"] == 0
    for r in doc["ranks"]:
        assert r["verdict"] == "identical" and r["cause"] is None, r
        # DCP's get_state_dict gives the fresh optimizer its state with an optimizer.step() at lr 0: not a step
        assert r["steps"] == {"uninterrupted": STEPS, "before_checkpoint": K, "after_resume": STEPS - K}
        assert restored(r) == {"parameters": True, "optimizer-state": True, "scheduler-state": True, "data": True,
                               "rng-state": True}, r["restored"]
        text = {x["what"]: x["text"] for x in r["restored"]}
        assert text["parameters"] == "4 tensors bitwise equal"
        assert text["optimizer-state"] == f"{len(ADAMW_STATE)} entries bitwise equal"
        assert text["rng-state"].startswith("equal (torch)")  # dropout draws from each rank's own stream
    # one folder, under torchrepro's output, that every rank wrote its shards into (DCP's own layout)
    checkpoint = Path(doc["checkpoint"])
    assert checkpoint == tmp_path / "out" / "run2-checkpoint" / f"checkpoint-{K}"
    assert sorted(p.name for p in checkpoint.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    # compared by local shard: the optimizer state the restarted rank started from is its DTensor shards, read
    _, ranks = load_ranks(tmp_path / "out" / "run2-resumed")
    for rank, run in enumerate(ranks):
        first = run.steps()[0]
        assert sorted(first["state_before"]) == ADAMW_STATE
        assert not [v for v in first["state_before"].values() if "unreadable" in str(v)], first["state_before"]
        assert first["layouts"]["state"]["fc1.weight.exp_avg"]["placements"] == ["Shard(0)"]
        assert first["layouts"]["state"]["fc1.weight.exp_avg"]["coordinate"] == [rank]


def test_fsdp2_script_that_loads_only_the_model_names_the_optimizer_state_on_every_rank(tmp_path):
    """`--forget-optimizer`: the restarted process loads the model's shards only (set_model_state_dict); AdamW
    starts without exp_avg/exp_avg_sq. Run under `torchrun` (the other spelling); the text names the rank."""
    rc, doc, out, err = resume_check(tmp_path, "torchrun", "--nproc-per-node", "2", SCRIPT, "--steps", str(STEPS),
                                     "--forget-optimizer", json_out=False)
    assert rc == 1, err + out
    assert doc["schema"] == SCHEMA and doc["verdict"] == "diverged" and doc["exit_code"] == 1
    assert doc["lead_rank"] == 0 and doc["cause"] == "optimizer-state" and doc["step"] == K + 1
    for r in doc["ranks"]:
        assert r["cause"] == "optimizer-state" and r["step"] == K + 1, r
        assert restored(r) == {"parameters": True, "optimizer-state": False, "scheduler-state": True, "data": True,
                               "rng-state": True}, r["restored"]
        assert sorted(r["tensors"]) == ADAMW_STATE
        optimizer = next(x for x in r["restored"] if x["what"] == "optimizer-state")
        assert optimizer["text"].startswith(f"the resumed optimizer started with no state ({len(ADAMW_STATE)} "
                                            "entries missing: "), optimizer
    assert f"torchrepro: RESUME DIVERGED at step {K + 1} on rank 0 - " in out
    assert f"rank 0: DIVERGED at step {K + 1}; not restored: optimizer state" in out
    assert f"rank 1: DIVERGED at step {K + 1}; not restored: optimizer state" in out


def test_rng_state_saved_by_every_rank_under_one_dcp_key_is_named(tmp_path):
    """`--shared-rng-key`: every rank saves its RNG state under the key "rng"; DCP keeps one copy of it and every
    rank loads that copy, so one rank resumes with another rank's dropout stream (rng-state). The other rank
    follows it through FSDP2's reduce-scatter; the note says what DCP did and what to change."""
    rc, doc, out, err = resume_check(tmp_path, "python", SCRIPT, "--steps", str(STEPS), "--shared-rng-key",
                                     args=("--nproc-per-node", "2"), json_out=False)
    assert rc == 1, err + out
    lead = doc["lead_rank"]
    assert doc["cause"] == "rng-state" and doc["step"] == K + 1
    assert doc["ranks"][lead]["cause"] == "rng-state"
    assert restored(doc["ranks"][lead])["rng-state"] is False
    other = doc["ranks"][1 - lead]
    assert other["cause"] == "compute" and other["follows_rank"] == lead and other["step"] == K + 1
    assert all(restored(other).values()), other["restored"]  # its own RNG state is the copy DCP kept
    assert "FSDP's reduce-scatter" in other["explanation"]
    note = next(n for n in doc["notes"] if "torch.distributed.checkpoint" in n)
    assert note.startswith(f"The checkpoint was written with torch.distributed.checkpoint ({doc['checkpoint']}): "
                           "DCP keeps one copy of a key that every rank saves")
    assert f"RESUME DIVERGED at step {K + 1} on rank {lead} - " in out


def test_fsdp2_script_that_saves_each_ranks_shards_with_save_checkpoint_resumes_identically(tmp_path):
    """`--save-with-torchrepro`: torchrepro.save_checkpoint / load_checkpoint, one file per rank (rank{R}.pt: its
    DTensor shards with their layouts, its RNG states, its data position in `extra`) instead of DCP."""
    rc, doc, _, err = resume_check(tmp_path, "python", SCRIPT, "--steps", str(STEPS), "--save-with-torchrepro",
                                   args=("--nproc-per-node", "2"))
    assert rc == 0, err + json.dumps(doc)[:3000]
    assert doc["verdict"] == "identical" and [r["verdict"] for r in doc["ranks"]] == ["identical", "identical"]
    for r in doc["ranks"]:
        assert all(restored(r).values()), r["restored"]
        assert next(x for x in r["restored"] if x["what"] == "optimizer-state")["text"] == \
            f"{len(ADAMW_STATE)} entries bitwise equal"
    checkpoint = Path(doc["checkpoint"])
    assert sorted(p.name for p in checkpoint.iterdir()) == ["rank0.pt", "rank1.pt"]
    importlib.import_module("torch.distributed.tensor")  # the files hold DTensors: the safe loader needs it imported
    for rank in (0, 1):
        layouts = torch.load(checkpoint / f"rank{rank}.pt", weights_only=True)["layouts"]
        assert layouts["model.fc1.weight"]["coordinate"] == [rank]
        assert layouts["model.fc1.weight"]["placements"] == ["Shard(0)"]
