"""The values budget covers every snapshot (the initial one included), and gradient accumulation before the
first optimizer step spends none of it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from torchrepro.record.recorder import Recorder
from torchrepro.record.store import load_run, write_manifest

SIZE = (50 * 40 + 40) * 4  # bytes of one snapshot of nn.Linear(50, 40)


def _record(run_dir: Path, budget: int, *, steps: int = 3, micro: int = 1, optimizer: bool = True) -> dict:
    torch.manual_seed(0)
    model = nn.Linear(50, 40)
    opt = torch.optim.SGD(model.parameters(), lr=0.01) if optimizer else None
    rec = Recorder(run_dir, models={"": model}, keep_values=True, values_budget=budget).install()
    try:
        for _ in range(steps):
            for _ in range(micro):
                model(torch.ones(2, 50)).sum().backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
                        p.grad = None
    finally:
        summary = rec.finish()
    write_manifest(run_dir, {"command": ["test"], **summary})
    return summary


def _bytes_on_disk(run_dir: Path) -> int:
    return sum(t.numel() * t.element_size() for f in (run_dir / "values").glob("*.pt")
               for t in torch.load(f, weights_only=True).values())


def test_the_budget_covers_the_initial_snapshot_and_keeps_room_for_the_final_one(tmp_path):
    for budget, saved in [(SIZE - 1, []), (SIZE, ["final"]), (2 * SIZE, ["init", "final"]),
                          (3 * SIZE, ["init", "step_000001", "final"]), (100 * SIZE, None)]:
        d = tmp_path / str(budget)
        summary = _record(d, budget)
        if saved is not None:
            assert summary["values_saved"] == saved, budget
        assert _bytes_on_disk(d) <= budget
    assert summary["values_saved"] == ["init", "step_000001", "step_000002", "step_000003", "final"]


def test_gradient_accumulation_before_the_first_step_spends_no_budget(tmp_path):
    summary = _record(tmp_path / "r", 4 * SIZE, micro=40)
    assert summary["values_saved"] == ["init", "step_000001", "step_000002", "final"]
    assert summary["values_skipped"] == 1 and summary["backward_calls"] == 120
    run = load_run(tmp_path / "r")
    provisional = run.of_kind("backward")
    assert len(provisional) == 40 and all(e["params"] == {} and e["grads"] == {} for e in provisional)
    assert all(e["loss"]["fp"] for e in provisional)  # the losses are still there
    steps = run.steps()
    assert len(steps) == 3 and set(steps[0]["params"]) == {"weight", "bias"} and len(steps[0]["losses"]) == 40


def test_without_an_optimizer_each_backward_is_a_step_with_its_values(tmp_path):
    summary = _record(tmp_path / "r", 100 * SIZE, optimizer=False)
    assert summary["step_mode"] == "backward"
    assert summary["values_saved"] == ["init", "backward_000001", "backward_000002", "backward_000003", "final"]
    assert all(e["params"] for e in load_run(tmp_path / "r").steps())


def test_at_most_one_extra_copy_a_large_snapshot_is_skipped_while_the_writer_is_busy(tmp_path, monkeypatch):
    """While a large snapshot is being written, the next is skipped (no second host copy); the final one waits."""
    from torchrepro.record import valuewriter

    release = threading.Event()
    copies: list[int] = []
    real = valuewriter.atomic_write

    def slow(path, write, **kwargs):
        copies.append(writer._inflight)
        release.wait(10)
        real(path, write, **kwargs)

    monkeypatch.setattr(valuewriter, "atomic_write", slow)
    monkeypatch.setattr(valuewriter.ValueWriter, "SMALL", SIZE - 1)  # every snapshot of the test model is "large"
    writer = valuewriter.ValueWriter(tmp_path / "values", 100 * SIZE)
    params = dict(nn.Linear(50, 40).named_parameters())
    writer.submit("init", params)
    writer.submit("step_000001", params)  # the writer is blocked on init: skipped, no second copy
    writer.submit("step_000002", params)
    assert writer.skipped_busy == 2 and writer._inflight == SIZE
    release.set()
    writer.submit("final", params, force=True)  # waits for init to be written, then copies
    writer.close()
    assert writer.saved == ["init", "final"] and writer.skipped_busy == 2 and writer.error is None
    assert max(copies) == SIZE  # never more than one snapshot in flight
    assert sorted(p.name for p in (tmp_path / "values").iterdir()) == ["final.pt", "init.pt"]


def test_small_snapshots_queue_behind_a_busy_writer_and_none_is_lost(tmp_path, monkeypatch):
    from torchrepro.record import valuewriter

    release = threading.Event()
    real = valuewriter.atomic_write
    monkeypatch.setattr(valuewriter, "atomic_write", lambda p, w, **kw: (release.wait(10), real(p, w, **kw)))
    writer = valuewriter.ValueWriter(tmp_path / "values", 100 * SIZE)
    params = dict(nn.Linear(50, 40).named_parameters())
    for i in range(5):
        writer.submit(f"step_{i:06d}", params)
    release.set()
    writer.close()
    assert writer.skipped_busy == 0 and writer.saved == [f"step_{i:06d}" for i in range(5)]


MANUAL = str(Path(__file__).resolve().parents[1] / "scripts" / "manual_sgd.py")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchrepro", *args], capture_output=True, text=True, timeout=300)


def test_values_budget_on_the_command_line(tmp_path):
    params = (4 * 8 + 8 + 8 * 1 + 1) * 4  # bytes of one snapshot of the script's model
    p = _cli("run", "--record", str(tmp_path / "r"), "--keep-values", "--values-budget", str(3 * params),
             "--json", "--", "python", MANUAL)
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout)
    assert m["values_saved"] == ["init", "backward_000001", "final"] and m["values_skipped"] == 3
    p = _cli("check", "--json", "--values-budget", "0", "--out", str(tmp_path / "c"), "--", "python", MANUAL)
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["verdict"] == "identical"
    assert not list((tmp_path / "c").glob("run*/values/*.pt"))
    assert json.loads((tmp_path / "c" / "run1" / "manifest.json").read_text())["values_skipped"] == 6


@pytest.mark.parametrize("size,expected", [("512", 512), ("4K", 4096), ("1.5G", 3 << 29), ("2GiB", 2 << 30)])
def test_size_argument(size, expected):
    from torchrepro.cli._options import size_arg

    assert size_arg(size) == expected


def test_bad_values_budget_is_a_usage_error(tmp_path):
    p = _cli("check", "--values-budget", "lots", "--", "python", MANUAL)
    assert p.returncode == 2
    assert "expected a size in bytes such as 4G, 512M or 1073741824, got 'lots'" in p.stderr
    p = _cli("run", "--values-budget", "1G", "--", "python", MANUAL)
    assert p.returncode == 2 and "--values-budget limits the value snapshots of a recorded run" in p.stderr


def test_check_starts_its_first_run_before_importing_torch(tmp_path):
    """The parent's torch import (1.5 s) overlaps run 1 instead of preceding it (issue 14: check wall time)."""
    code = f"""
import sys
import torchrepro.cli._checkrun as cc
import torchrepro.record.runs as runs  # where check starts its runs
cc.prefetch_analysis = lambda: None   # the background import would race with this check

def launch(*args, **kwargs):
    print("torch imported before run 1:", "torch" in sys.modules)
    raise SystemExit(0)

runs.launch = launch
from torchrepro.cli import main
main(["check", "--out", {str(tmp_path / "out")!r}, "--", "python", {MANUAL!r}])
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "torch imported before run 1: False", p.stderr


def test_check_samples_value_snapshots_on_a_fixed_schedule(tmp_path):
    """check's runs snapshot steps 1-16, then 8 per doubling: the same steps in every run, O(log n) files."""
    torch.manual_seed(0)
    model = nn.Linear(50, 40)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(tmp_path / "r", models={"": model}, keep_values=True, values_budget=1 << 30,
                   value_schedule="sampled").install()
    try:
        for _ in range(70):
            model(torch.ones(2, 50)).sum().backward()
            opt.step()
            opt.zero_grad()
    finally:
        summary = rec.finish()
    steps = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44, 48,
             52, 56, 60, 64]
    assert summary["values_saved"] == ["init", *(f"step_{n:06d}" for n in steps), "final"]
    assert summary["values_skipped"] == 0 and summary["steps"] == 70
    with pytest.raises(ValueError, match="value_schedule\\) must be one of \\['every', 'sampled'\\], got 'often'"):
        Recorder(tmp_path / "x", value_schedule="often")
