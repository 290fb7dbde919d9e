"""End to end: `torchrepro check --resume-at K` on scripts with their own loop, Lightning and transformers Trainer
scripts (unchanged), and scripts that never reach step K or never checkpoint."""

from __future__ import annotations

import hashlib
import html
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inprocess import torchrepro

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
LOOP = str(SCRIPTS / "resume_loop.py")
NEVER_SAVES = str(SCRIPTS / "check_resume_at_never_saves.py")  # resume_loop.py that never saves, without torch.optim
SCHEMA = "torchrepro.check-resume/1"
K = 4


def resume_check(tmp_path: Path, *script: str, k: int = K, json_out: bool = True, args: tuple[str, ...] = (),
                 ) -> tuple[int, dict, str, str]:
    """Run the check (in this process: tests/inprocess.py); return (exit code, the JSON document -- stdout's, else
    check.json's --, stdout, stderr)."""
    out = tmp_path / "out"
    p = torchrepro("check", "--resume-at", str(k), "--out", str(out), *(["--json"] if json_out else []), *args,
                   "--", "python", *script, timeout=900, cwd=tmp_path)
    if json_out:
        doc = json.loads(p.stdout)  # exactly one JSON document, errors included
    else:
        doc = json.loads((out / "check.json").read_text()) if (out / "check.json").is_file() else {}
    return p.returncode, doc, p.stdout, p.stderr


def restored(doc: dict) -> dict[str, bool | None]:
    return {r["what"]: r["restored"] for r in doc["restored"]}


def test_own_loop_that_resumes_exactly_is_identical(tmp_path):
    rc, doc, _, err = resume_check(tmp_path, LOOP)
    assert rc == 0, err
    assert doc["schema"] == SCHEMA and doc["verdict"] == "identical" and doc["exit_code"] == 0
    assert doc["cause"] is None and doc["first_divergent_step"] is None
    assert doc["resume_at"] == K and doc["trainer"] == "script"
    assert doc["steps"] == {"uninterrupted": 8, "before_checkpoint": K, "after_resume": 8 - K}
    assert Path(doc["checkpoint"]).is_file() and Path(doc["checkpoint"]).parent.name == "run2-checkpoint"
    assert all(restored(doc).values()), doc["restored"]
    assert doc["comparison"]["schema"] == "torchrepro.check/1" and doc["comparison"]["verdict"] == "identical"
    assert doc["comparison"]["steps"] == [8, 8]
    assert {Path(p).name for p in doc["runs"].values()} == {"run1", "run2", "run2-resumed"}
    # the script skipped the 4 batches it had trained on: they are not compared with step 5's
    assert any("fetched 4 more batch" in n for n in doc["notes"]), doc["notes"]


def test_forgotten_optimizer_state_is_named_at_step_k_plus_1(tmp_path):
    rc, doc, _, err = resume_check(tmp_path, LOOP, "--forget", "optimizer", "--protocol", "env")
    assert rc == 1, err
    assert doc["verdict"] == "diverged" and doc["cause"] == "optimizer-state" and doc["step"] == K + 1
    assert doc["first_divergent_step"] == K + 1
    assert restored(doc) == {"parameters": True, "optimizer-state": False, "scheduler-state": True, "data": True,
                             "rng-state": True}
    page = html.unescape(Path(doc["report"]).read_text())  # the verdict, what was not restored, the fix
    assert ">DIVERGED</span>at step 5 - " in page and f"Not restored: {doc['what']}" in page
    assert ">NO<" in page and doc["fix"] in page
    assert "0.weight.exp_avg" in doc["tensors"] and "started with no state" in doc["explanation"]
    assert "optimizer.state_dict()" in doc["fix"]


def test_forgotten_rng_state_with_dropout_text_output(tmp_path):
    rc, doc, out, err = resume_check(tmp_path, LOOP, "--forget", "rng", json_out=False)
    assert rc == 1, err
    assert doc["schema"] == SCHEMA and doc["cause"] == "rng-state" and doc["step"] == K + 1
    rows = restored(doc)
    assert rows["rng-state"] is False and rows["data"] is True and rows["optimizer-state"] is True
    assert doc["tensors"] == ["torch"]  # Python's random and NumPy's differ too, but training never drew from them
    assert f"RESUME DIVERGED at step {K + 1}" in out
    assert f"Not restored: RNG state (first divergent step {K + 1}" in out
    assert "5. RNG state" in out and "NO   differs: torch's global generator" in out
    assert "Fix:   Save every RNG state" in out


def test_shuffled_loader_with_workers_restarting_the_epoch_is_the_data_position(tmp_path):
    rc, doc, _, err = resume_check(tmp_path, LOOP, "--forget", "data", "--workers", "2")
    assert rc == 1, err
    assert doc["cause"] == "data-position" and doc["step"] == K + 1
    data = next(r for r in doc["restored"] if r["what"] == "data")
    assert "the order differs" in data["text"] and "saw at step 1" in data["text"]
    assert restored(doc)["optimizer-state"] is True and restored(doc)["parameters"] is True
    assert "ResumableLoader" in doc["fix"]


def test_script_that_never_reaches_step_k_is_exit_2(tmp_path):
    rc, doc, _, err = resume_check(tmp_path, LOOP, "--steps", "3")
    assert rc == 2
    assert doc["schema"] == SCHEMA and doc["verdict"] == "error" and doc["exit_code"] == 2
    assert f"never reaches step {K}: it ended after 3 optimizer steps" in doc["error"]
    assert doc["stderr"].endswith("stderr.txt")
    rc, doc, _, _ = resume_check(tmp_path, LOOP, "--steps", str(K))
    assert rc == 2 and f"ends at step {K}: nothing is left to train" in doc["error"]


def test_script_that_never_checkpoints_is_exit_2(tmp_path):
    rc, doc, _, err = resume_check(tmp_path, NEVER_SAVES)
    assert rc == 2, err
    assert doc["schema"] == SCHEMA and doc["verdict"] == "error"
    assert "never checkpointed" in doc["error"] and "TORCHREPRO_CHECKPOINT" in doc["error"]
    assert "torchrepro.resume_point()" in doc["error"]


@pytest.mark.parametrize("extra, message", [
    (("--runs", "3"), "drop --runs 3"),
    (("--locate",), "--locate does not go with --resume-at"),
    (("--max-steps", str(K)), "--max-steps 4 ends the runs at or before the checkpoint"),
])
def test_options_that_do_not_go_with_resume_at(tmp_path, extra, message):
    rc, doc, _, _ = resume_check(tmp_path, LOOP, args=extra)
    assert rc == 2 and doc["schema"] == SCHEMA and doc["verdict"] == "error" and message in doc["error"]
    assert not (tmp_path / "out" / "run1").exists()


def test_usage_error_json_has_the_resume_schema(tmp_path):
    p = subprocess.run([sys.executable, "-m", "torchrepro", "check", "--resume-at", "0", "--json", "--", "python",
                        LOOP], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    doc = json.loads(p.stdout)
    assert p.returncode == 2 and doc["schema"] == SCHEMA and "--resume-at" in doc["error"]


LIGHTNING = """
import torch, lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                       torch.nn.Linear(16, 1))
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)

class Seen(pl.Callback):  # a callback of the user's own: the trigger goes beside it
    def on_train_start(self, trainer, module):
        print("user callback ran")

pl.seed_everything(0)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
trainer = pl.Trainer(max_steps=8, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[Seen()],
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
trainer.fit(Model(), DataLoader(data, batch_size=8, shuffle=True))
"""


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs lightning")
def test_lightning_script_without_callback_restarts_its_epoch(tmp_path):
    """Lightning's own mid-epoch resume (ckpt_path=) restores weights, optimizer and LR scheduler, but re-creates
    the DataLoader iterator: step K+1 gets the epoch's first batch again. The verdict names that first; the RNG
    state (Lightning does not save it; dropout draws from it) is the next thing not restored."""
    (tmp_path / "train_pl.py").write_text(LIGHTNING)
    rc, doc, _, err = resume_check(tmp_path, "train_pl.py")
    assert rc == 1, err
    assert doc["trainer"] == "lightning" and doc["cause"] == "data-position" and doc["step"] == K + 1
    assert restored(doc) == {"parameters": True, "optimizer-state": True, "scheduler-state": True, "data": False,
                             "rng-state": False}
    assert "saw at step 1" in next(r["text"] for r in doc["restored"] if r["what"] == "data")
    assert "lightning.ReproducibleCallback" in doc["fix"]
    assert doc["checkpoint"].endswith(f"run2-checkpoint/checkpoint-{K}")
    stdout = (tmp_path / "out" / "run2" / "stdout.txt").read_text() + (tmp_path / "out" / "run2-resumed" /
                                                                       "stdout.txt").read_text()
    assert stdout.count("user callback ran") == 2


TRANSFORMERS = """
import torch
from transformers import Trainer, TrainingArguments

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                       torch.nn.Linear(16, 1))
    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
X, Y = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
args = TrainingArguments(output_dir="hf_out", max_steps=8, per_device_train_batch_size=8, save_strategy="no",
                         report_to=[], use_cpu=True, seed=0, disable_tqdm=True, logging_steps=100)
Trainer(model=Model(), args=args, train_dataset=[{"x": X[i], "labels": Y[i]} for i in range(64)]).train()
"""


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_transformers_trainer_resumes_with_its_own_checkpoint(tmp_path):
    """The Trainer's own checkpoint-K (model, optimizer, scheduler, RNG states, trainer state) and its data skip
    make this script resume exactly: the check must say so (no false alarm), with the Trainer's folder."""
    (tmp_path / "train_hf.py").write_text(TRANSFORMERS)
    rc, doc, _, err = resume_check(tmp_path, "train_hf.py")
    assert rc == 0, (err, doc.get("restored"))
    assert doc["trainer"] == "transformers" and doc["verdict"] == "identical"
    assert doc["checkpoint"] == str(tmp_path / "out" / "run2-checkpoint" / f"checkpoint-{K}")
    assert (tmp_path / "out" / "run2-checkpoint" / f"checkpoint-{K}" / "optimizer.pt").is_file()
    assert list((tmp_path / "hf_out").glob("*")) == []  # the forced save went to torchrepro's folder, not output_dir
    assert all(restored(doc).values()), doc["restored"]
    assert doc["comparison"]["working_directory"]["read_from_earlier_run"] == []


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under ``root``: its relative path -> the SHA-256 of a file's bytes, or "dir"."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_transformers_forced_save_leaves_the_users_checkpoints_alone(tmp_path):
    """output_dir already holds the user's own checkpoint-K (and an older one that save_total_limit=1 would rotate
    away): the checkpoint torchrepro forces at step K goes to its own directory, and the resume reads it from there;
    the user's files are untouched, byte for byte."""
    (tmp_path / "train_hf.py").write_text(TRANSFORMERS.replace('save_strategy="no",',
                                                               'save_strategy="no", save_total_limit=1,'))
    users = tmp_path / "hf_out"
    for step in (2, K):
        ckpt = users / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "sentinel.txt").write_text(f"the user's own checkpoint of step {step}\n")
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": [],
                                                             "best_model_checkpoint": None}))
        (ckpt / "optimizer.pt").write_bytes(b"not a real optimizer state " + bytes([step]))
    before = tree_digest(users)
    rc, doc, _, err = resume_check(tmp_path, "train_hf.py")
    assert tree_digest(users) == before
    assert rc == 0, (err, doc.get("restored"))
    assert doc["trainer"] == "transformers" and doc["verdict"] == "identical"
    assert doc["checkpoint"] == str(tmp_path / "out" / "run2-checkpoint" / f"checkpoint-{K}")
    assert all(restored(doc).values()), doc["restored"]


def test_a_checkpoint_folder_torchrepro_did_not_make_is_never_deleted(tmp_path):
    """OUT/run2-checkpoint is replaced only when torchrepro made it (its mark is inside); else exit 2, untouched."""
    theirs = tmp_path / "out" / "run2-checkpoint"
    theirs.mkdir(parents=True)
    (theirs / "model.pt").write_bytes(b"precious")
    rc, doc, _, _ = resume_check(tmp_path, LOOP)
    assert rc == 2 and doc["verdict"] == "error", doc
    assert "run2-checkpoint" in doc["error"] and "did not make" in doc["error"], doc["error"]
    assert (theirs / "model.pt").read_bytes() == b"precious" and {p.name for p in theirs.iterdir()} == {"model.pt"}
    assert not (tmp_path / "out" / "run1").exists()


# --- the trainer integrations under check --resume-at: without the callback the resume differs for the reason
# the integration fixes, with it the check says identical (tests/scripts/{lightning,hf}_train.py: 2 workers whose
# dataset draws augmentation noise, dropout, mid-epoch checkpoint) --------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs lightning")
@pytest.mark.parametrize("sanity, loaders", [("0", ()), ("1", ()), ("0", ("--samples", "24", "--second", "8"))],
                         ids=["plain", "sanity", "two-loaders"])
def test_lightning_script_with_the_callback_resumes_identically(tmp_path, sanity, loaders):
    """Its validation (after step K; with --sanity 1 also Lightning's sanity check before fit, which the resumed
    process does not repeat) fetches batches with autograd off: they are not training data and not recorded (the
    sanity check's loader, seen first, shifted every training batch's loader number: RESUME DIVERGED). With two
    train loaders (6 and 2 batches, the short one cycled) the resume was refused: exit 2."""
    rc, doc, _, err = resume_check(tmp_path, str(SCRIPTS / "lightning_train.py"), "--steps", "8", "--callback",
                                   "--sanity", sanity, *loaders)
    assert rc == 0, (err, doc.get("restored"))
    assert doc["trainer"] == "lightning" and doc["verdict"] == "identical"
    assert all(restored(doc).values()), doc["restored"]
    assert not any("batch(es)" in note for note in doc["notes"]), doc["notes"]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
@pytest.mark.parametrize(("callback", "rc", "cause"), [(False, 1, "data-values"), (True, 0, None)])
def test_transformers_script_with_augmenting_workers(tmp_path, callback, rc, cause):
    """The Trainer skips the consumed batches without loading them, so its workers' augmentation streams restart:
    same samples, other values (the integration replays them instead)."""
    script = [str(SCRIPTS / "hf_train.py"), "--out", "hf_out", "--steps", "8", "--save-steps", "100"]
    code, doc, _, err = resume_check(tmp_path, *script, *(["--callback"] if callback else []), k=3)
    assert code == rc, (err, doc.get("restored"))
    assert doc["trainer"] == "transformers" and doc.get("cause") == cause
    if cause:
        assert doc["step"] == 4 and restored(doc)["data"] is False
        assert {k: v for k, v in restored(doc).items() if k != "data"} == {
            "parameters": True, "optimizer-state": True, "scheduler-state": True, "rng-state": True}
        assert "transformers.ReproducibleCallback" in doc["fix"]
