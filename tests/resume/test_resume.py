from __future__ import annotations

import argparse
import errno
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import torchrepro
from torchrepro._core.errors import CheckpointError, ReproWarning
from torchrepro.resume.checkpoint import read_checkpoint
from torchrepro.resume.verify import ResumeRunError

from . import resume_setup


def _amp_supported() -> bool:
    try:
        torch.amp.GradScaler("cpu")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pass
        return True
    except Exception:
        return False


def test_resume_at_epoch_boundary_is_bitwise(tmp_path):
    report = torchrepro.verify_resume(resume_setup.build, resume_setup.step, steps=16, resume_at=8,
                                      workdir=tmp_path)
    assert report.identical, str(report)
    assert len(report.losses_straight) == 16 and report.losses_straight == report.losses_resumed
    assert "bitwise exact" in str(report)


def test_resume_mid_epoch_is_bitwise(tmp_path):
    report = torchrepro.verify_resume(resume_setup.build, resume_setup.step, steps=13, resume_at=5,
                                      workdir=tmp_path)
    assert report.identical, str(report)
    assert (tmp_path / "checkpoint.pt").is_file()  # a workdir the caller names is kept, with the checkpoint


@pytest.mark.skipif(not _amp_supported(), reason="this torch has no CPU GradScaler / bf16 autocast")
def test_resume_with_bf16_autocast_and_grad_scaler(tmp_path):
    report = torchrepro.verify_resume(resume_setup.build_amp, resume_setup.step_amp, steps=10, resume_at=4,
                                      workdir=tmp_path)
    assert report.identical, str(report)


def test_plain_torch_save_is_caught(tmp_path):
    report = torchrepro.verify_resume(resume_setup.build, resume_setup.step, steps=10, resume_at=4,
                                      save=resume_setup.plain_save, load=resume_setup.plain_load, workdir=tmp_path)
    assert not report.identical
    assert report.first_step == 5 and report.what == "loss"
    assert report.losses_straight[:4] == report.losses_resumed[:4]
    assert "first at step 5" in str(report)


def test_verify_resume_argument_errors():
    with pytest.raises(ValueError, match="need 0 < resume_at < steps"):
        torchrepro.verify_resume(resume_setup.build, resume_setup.step, steps=4, resume_at=4)
    with pytest.raises(TypeError, match="must be a module-level function"):
        torchrepro.verify_resume(lambda: {}, resume_setup.step, steps=4, resume_at=2)


def test_a_step_whose_batches_run_out_is_told_to_use_next_batch(tmp_path):
    with pytest.raises(ResumeRunError, match=r"the straight run \(steps 1\.\.10\) failed with exit code 2:\n"
                                             r"verify_resume: step\(\) raised StopIteration at step 9: .*"
                                             r"state\['loader'\]\.next_batch\(\)") as info:
        torchrepro.verify_resume(resume_setup.build_points, resume_setup.step_iter, steps=10, resume_at=4,
                                 workdir=tmp_path)
    assert "Traceback" not in str(info.value)


def test_build_must_return_what_save_checkpoint_takes(tmp_path):
    with pytest.raises(ResumeRunError, match=r"returned keys \['batches'\] that save_checkpoint cannot take"):
        torchrepro.verify_resume(resume_setup.build_with_iterator, resume_setup.step_points, steps=2, resume_at=1,
                                 workdir=tmp_path)
    with pytest.raises(ResumeRunError, match=r"build\(\) \(.*:build_not_a_dict\) returned a tuple, expected a dict"):
        torchrepro.verify_resume(resume_setup.build_not_a_dict, resume_setup.step_tiny, steps=2, resume_at=1,
                                 workdir=tmp_path)


def _resume_dirs(root) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("torchrepro-resume-"))


def test_verify_resume_removes_its_temporary_directory_also_on_error(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    keep = tmp_path / "torchrepro-resume-not-ours"  # someone else's directory of the same prefix stays
    keep.mkdir()
    report = torchrepro.verify_resume(resume_setup.build_tiny, resume_setup.step_tiny, steps=2, resume_at=1)
    assert report.identical, str(report)
    assert _resume_dirs(tmp_path) == ["torchrepro-resume-not-ours"]
    with pytest.raises(ResumeRunError, match=r"the straight run \(steps 1\.\.2\) failed with exit code 1:\n"
                                             r"(.|\n)*RuntimeError: the training step broke"):
        torchrepro.verify_resume(resume_setup.build_tiny, resume_setup.step_fails, steps=2, resume_at=1)
    assert _resume_dirs(tmp_path) == ["torchrepro-resume-not-ours"]


def test_verify_resume_timeout_names_the_run_and_kills_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("TORCHREPRO_TEST_PID_FILE", str(pid_file))
    # The child needs about 3 s to start and reach step(), which writes its pid and hangs: the 8 s limit is seldom
    # too short (then the child is killed before its step; a loaded machine gets 30 s in a second try).
    for limit in (8, 30):
        with pytest.raises(ResumeRunError) as info:
            torchrepro.verify_resume(resume_setup.build_tiny, resume_setup.step_hangs, steps=3, resume_at=1,
                                     timeout=limit)
        if pid_file.exists():
            break
    assert str(info.value) == (f"verify_resume: the straight run (steps 1..3) did not finish within {limit} s and "
                               "was killed. Pass a larger timeout= if training is that slow, or look for a hang in "
                               "build, step, save or load.")
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert _resume_dirs(tmp_path) == []

# --- checkpoint files --------------------------------------------------------------------------------
def _small():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def test_round_trip_restores_everything_and_rng(tmp_path):
    model, opt = _small()
    loader = torchrepro.ResumableLoader(list(range(10)), batch_size=3, seed=1)
    next(iter(loader))
    path = tmp_path / "c.pt"
    torchrepro.save_checkpoint(path, model=model, optimizer=opt, loader=loader, step=7, extra={"best": 0.5})
    expected = torch.rand(3)
    model2, opt2 = nn.Linear(4, 2), torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1, momentum=0.9)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    loader2 = torchrepro.ResumableLoader(list(range(10)), batch_size=3, seed=99)
    out = torchrepro.load_checkpoint(path, model=model2, optimizer=opt2, loader=loader2)
    assert out == {"step": 7, "extra": {"best": 0.5}}
    assert torch.equal(torch.rand(3), expected)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    assert loader2.state_dict() == loader.state_dict()
    assert read_checkpoint(path)["format"] == "torchrepro.checkpoint"


def test_missing_components_and_bad_files(tmp_path):
    model, opt = _small()
    path = tmp_path / "c.pt"
    torchrepro.save_checkpoint(path, model=model, step=1)
    with pytest.raises(CheckpointError, match="has no optimizer state, but a optimizer was passed"):
        torchrepro.load_checkpoint(path, model=model, optimizer=opt)
    loader = torchrepro.ResumableLoader(list(range(4)))
    with pytest.raises(CheckpointError, match=r"has no data position \(loader state\)"):
        torchrepro.load_checkpoint(path, model=model, loader=loader)

    data = torch.load(path, weights_only=True)
    data["rng"] = None
    torch.save(data, tmp_path / "norng.pt")
    with pytest.raises(CheckpointError, match="has no RNG state"):
        torchrepro.load_checkpoint(tmp_path / "norng.pt", model=model)

    torch.save({"model": model.state_dict()}, tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="is not a torchrepro checkpoint: format None"):
        torchrepro.load_checkpoint(tmp_path / "plain.pt", model=model)

    raw = path.read_bytes()
    (tmp_path / "trunc.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match="trunc.pt: cannot be read: it is corrupt, truncated"):
        torchrepro.load_checkpoint(tmp_path / "trunc.pt", model=model)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="cannot be read"):
        torchrepro.load_checkpoint(tmp_path / "garbage.pt", model=model)
    with pytest.raises(CheckpointError, match="does not exist"):
        torchrepro.load_checkpoint(tmp_path / "nope.pt", model=model)
    with pytest.raises(CheckpointError, match="does not fit the objects passed"):
        torchrepro.load_checkpoint(path, model=nn.Linear(5, 2))
    with pytest.raises(TypeError, match="extra=dict holds objects that cannot be loaded safely"):
        torchrepro.save_checkpoint(tmp_path / "x.pt", model=model, step=1, extra={"cfg": argparse.Namespace(a=1)})
    assert not (tmp_path / "x.pt").exists()
    with pytest.raises(TypeError, match="Wrap your data in torchrepro.ResumableLoader"):
        torchrepro.save_checkpoint(path, model=model, loader=torch.utils.data.DataLoader(range(3)), step=1)


def test_unsafe_pickle_is_refused(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"format": "torchrepro.checkpoint", "version": 1, "x": Evil()}, path, pickle_module=pickle)
    with pytest.raises(CheckpointError, match="not safe"):
        torchrepro.load_checkpoint(path, model=nn.Linear(1, 1))


def test_environment_change_warns(tmp_path):
    model, _ = _small()
    path = tmp_path / "c.pt"
    torchrepro.save_checkpoint(path, model=model, step=1)
    data = torch.load(path, weights_only=True)
    data["env"]["torch"] = "1.13.0"
    torch.save(data, path)
    with pytest.warns(ReproWarning, match=r"torch 1.13.0 -> .*bitwise equality .* is not expected"):
        torchrepro.load_checkpoint(path, model=model)
    data["env"]["torch"] = str(torch.__version__)
    torch.save(data, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReproWarning)
        torchrepro.load_checkpoint(path, model=model)


KILLER = r"""
import sys, time, torch, torchrepro
from torchrepro.resume import checkpoint

model = torch.nn.Linear(256, 256)
torchrepro.save_checkpoint(sys.argv[1], model=model, step=1)
real_save = torch.save

def slow_save(obj, f, *a, **k):
    import io
    buf = io.BytesIO()
    real_save(obj, buf)
    data = buf.getvalue()
    f.write(data[: len(data) // 2])
    f.flush()
    print("WRITING", flush=True)
    time.sleep(60)
    f.write(data[len(data) // 2:])

checkpoint.torch.save = slow_save
torch.nn.init.zeros_(model.weight)
torchrepro.save_checkpoint(sys.argv[1], model=model, step=2)
"""


def test_kill_during_save_leaves_previous_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    proc = subprocess.Popen([sys.executable, "-c", KILLER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "WRITING"
        proc.kill()  # SIGKILL mid-write
    finally:
        proc.wait(timeout=30)
    model = nn.Linear(256, 256)
    assert torchrepro.load_checkpoint(path, model=model)["step"] == 1
    assert model.weight.abs().sum() > 0  # the old weights, not the zeroed ones
    leftovers = [p for p in tmp_path.iterdir() if p.name != "ckpt.pt"]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(f".ckpt.pt.torchrepro-{proc.pid}-")
    unrelated = tmp_path / ".ckpt.pt.backup.tmp"
    unrelated.write_bytes(b"keep")
    old = time.time() - 120  # a dead writer's temp is removed once it is a minute old
    for p in (leftovers[0], unrelated):
        os.utime(p, (old, old))
    torchrepro.save_checkpoint(path, model=model, step=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.pt.backup.tmp", "ckpt.pt"]


class _FullDisk:
    """The file torch.save writes into, on a disk that is full after ``room`` bytes."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room = f, room

    def write(self, b) -> int:
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def test_full_disk_during_save_says_so_and_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    model = nn.Linear(64, 64)
    path = tmp_path / "ckpt.pt"
    torchrepro.save_checkpoint(path, model=model, step=1)
    old = path.read_bytes()
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: real_save(obj, _FullDisk(f, 4096)))
    for target, kept in ((path, f"The previous checkpoint at {path} is intact."),
                         (tmp_path / "new.pt", f"Nothing was written at {tmp_path / 'new.pt'}.")):
        with pytest.raises(CheckpointError) as info:
            torchrepro.save_checkpoint(target, model=model, step=2)
        assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
        assert re.fullmatch(rf"{re.escape(str(target))}: could not be saved: no space left on device \(the write "
                            rf"failed after \d+ bytes of the new checkpoint\)\. {re.escape(kept)} Free space on that "
                            r"disk \(or raise the file-size limit or quota\), or save elsewhere, then save again\.",
                            str(info.value)), str(info.value)
        assert "enforce fail" not in str(info.value)
    monkeypatch.undo()
    assert path.read_bytes() == old and torchrepro.load_checkpoint(path, model=nn.Linear(64, 64))["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no temp file left, no new.pt


FILE_SIZE_LIMIT = r"""
import resource, signal, sys, torch, torchrepro
model = torch.nn.Linear(256, 256)
torchrepro.save_checkpoint(sys.argv[1], model=model, step=1)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
try:
    torchrepro.save_checkpoint(sys.argv[1], model=model, step=2)
except torchrepro._core.errors.CheckpointError as exc:
    print(exc)
"""


def test_file_size_limit_during_save_says_so(tmp_path):
    path = tmp_path / "ckpt.pt"
    p = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMIT, str(path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"{path}: could not be saved: file too large (a file-size limit such as `ulimit "
                               "-f`, or the filesystem's maximum) (the write failed after 65536 bytes of the new "
                               f"checkpoint). The previous checkpoint at {path} is intact."), p.stdout
    assert torchrepro.load_checkpoint(path, model=nn.Linear(256, 256))["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


# --- resumable loader ----------------------------------------------------------------------------------
class Counting(torch.utils.data.Dataset):
    def __init__(self, n: int = 20) -> None:
        self.n, self.calls = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.calls += 1
        return torch.tensor(float(i)) + torch.rand(())


def test_loader_resumes_mid_epoch_without_loading_skipped_samples():
    full = torchrepro.ResumableLoader(Counting(), batch_size=4, seed=3)
    straight = [b.tolist() for _ in range(2) for b in full]
    first = torchrepro.ResumableLoader(Counting(), batch_size=4, seed=3)
    it = iter(first)
    head = [next(it).tolist() for _ in range(2)]
    state = first.state_dict()
    assert state["epoch"] == 0 and state["batches_consumed"] == 2
    ds = Counting()
    second = torchrepro.ResumableLoader(ds, batch_size=4, seed=3)
    second.load_state_dict(json.loads(json.dumps(state)))
    tail = [b.tolist() for b in second] + [b.tolist() for b in second]
    assert head + tail == straight
    assert ds.calls == 20 - 8 + 20  # the 8 skipped samples were never loaded


def test_loader_workers_match_main_process_and_keep_global_rng():
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    a = [b.tolist() for b in torchrepro.ResumableLoader(Counting(), batch_size=4, seed=5, num_workers=2)]
    assert torch.equal(torch.rand(1), before)  # the loader never drew from the global torch RNG
    b = [b.tolist() for b in torchrepro.ResumableLoader(Counting(), batch_size=4, seed=5, num_workers=0)]
    assert a == b
    c = [b.tolist() for b in torchrepro.ResumableLoader(Counting(), batch_size=4, seed=6, num_workers=0)]
    assert a != c


def test_loader_state_mismatch():
    loader = torchrepro.ResumableLoader(Counting(), batch_size=4)
    with pytest.raises(ValueError, match="batch_size=8 but this loader has 4"):
        loader.load_state_dict({**loader.state_dict(), "batch_size": 8})
    next(iter(loader))
    before = loader.state_dict()
    bad = {**before, "batch_size": 8, "shuffle": False, "epoch": -1, "seed": 2**32}
    del bad["batches_consumed"]
    with pytest.raises(ValueError) as info:
        loader.load_state_dict(bad)
    assert str(info.value) == (
        "loader state has batch_size=8 but this loader has 4; loader state has shuffle=False but this loader has "
        "True; loader state lacks batches_consumed; loader state has epoch=-1, expected a non-negative integer; "
        "loader state seed must be an integer in [0, 4294967295], got 4294967296; resuming would not give the "
        "same batches. Build the loader as in the saved run.")
    assert loader.state_dict() == before
    with pytest.raises(TypeError, match="sets sampler itself"):
        torchrepro.ResumableLoader(Counting(), sampler=None)


class Augmenting(torch.utils.data.Dataset):
    """Every sample draws from random, NumPy and torch, as augmentations do."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.tensor([float(i), random.random(), float(np.random.rand()), torch.rand(()).item()],
                            dtype=torch.float64)


def _caller_draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(()).item()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_leaves_the_callers_rng_streams_alone(num_workers):
    """Between batches the training loop draws (dropout, noise...): the loader must not shift those draws."""
    def seed():
        random.seed(11), np.random.seed(11), torch.manual_seed(11)

    seed()
    expected = [_caller_draws() for _ in range(4)]
    seed()
    loader = torchrepro.ResumableLoader(Augmenting(), batch_size=2, seed=3, num_workers=num_workers)
    got = [_caller_draws() for _ in loader]
    assert got == expected  # random, NumPy and torch, each compared exactly


def test_unwritable_checkpoint_directory_is_named(tmp_path):
    model = nn.Linear(2, 2)
    with pytest.raises(CheckpointError, match=r"could not be saved: Not a directory.* Nothing was written at .*"
                                              r"Check that the directory exists and is writable"):
        (tmp_path / "file").write_text("x")
        torchrepro.save_checkpoint(tmp_path / "file" / "c.pt", model=model, step=1)
