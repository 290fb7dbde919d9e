"""`check --resume-at`'s stop phase notes the files a script gives torch.save (a snapshot of its own), so that a
script that never wrote torchrepro's checkpoint is told which file it wrote instead."""

from __future__ import annotations

import io
import os

import torch

from torchrepro.record.resumeat import ResumePlan, _saved_path


def test_saved_path_names_the_file_written(tmp_path):
    assert _saved_path("snapshot.pt") == os.path.abspath("snapshot.pt")
    assert _saved_path(tmp_path / "a.pt") == str(tmp_path / "a.pt")
    with open(tmp_path / "b.pt", "wb") as f:
        assert _saved_path(f) == str(tmp_path / "b.pt")
    # _core.io.atomic_write's temporary file is named for the file it becomes
    assert _saved_path(str(tmp_path / ".ckpt.pt.torchrepro-123-ab_c9.tmp")) == str(tmp_path / "ckpt.pt")
    assert _saved_path(io.BytesIO()) is None


def test_stop_phase_notes_saves_outside_torchrepros_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", torch.save)  # the watch replaces both: put them back after the test
    monkeypatch.setattr(torch.serialization, "save", torch.serialization.save)
    checkpoint = tmp_path / "run2-checkpoint" / "checkpoint-2"
    plan = ResumePlan.from_options({"phase": "stop", "step": 2, "checkpoint": str(checkpoint)})
    plan._watch_saves()  # what install() does in the stop phase (without its trainer hooks and variables)
    checkpoint.mkdir(parents=True)
    torch.save({"w": torch.zeros(1)}, tmp_path / "snapshot.pt")
    torch.save({"w": torch.zeros(1)}, checkpoint / "rank0.pt")  # torchrepro's own checkpoint: not noted
    torch.save({"w": torch.zeros(1)}, io.BytesIO())
    assert plan.facts()["script_saves"] == [{"path": str(tmp_path / "snapshot.pt"), "step": 0}]
    assert plan.facts()["checkpoint_written"] is True


def test_uninstall_puts_torch_save_back(tmp_path):
    original = torch.save
    plan = ResumePlan.from_options({"phase": "stop", "step": 2, "checkpoint": str(tmp_path / "ckpt")})
    plan._watch_saves()
    assert torch.save is not original and torch.serialization.save is torch.save
    plan.uninstall()
    assert torch.save is original and torch.serialization.save is original
