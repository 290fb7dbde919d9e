"""The values budget covers every snapshot (the initial one included), and gradient accumulation before the
first optimizer step spends none of it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from torchrepro.record import Recorder
from torchrepro.store import load_run, write_manifest

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
