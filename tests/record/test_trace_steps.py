"""``run --record DIR --trace-steps N`` keeps the op trace of a step in the middle of a run.

The tracer starts and stops at step boundaries, which the recorder finds inside an optimizer step's post hooks:
registering or removing a global optimizer hook there broke torch's iteration over them ("OrderedDict mutated
during iteration": every --trace-steps N >= 2 of a run that went on after step N failed)."""

from __future__ import annotations

import json

from tests.inprocess import torchrepro

SCRIPT = """\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.randn(8, 4)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_step_in_the_middle_of_a_run_is_traced_and_the_run_goes_on(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    for n in (2, 3):
        p = torchrepro("run", "--record", f"r{n}", "--trace-steps", str(n), "--", "python", "train.py", cwd=tmp_path,
                       timeout=300)
        assert p.returncode == 0, p.stderr
        assert json.loads((tmp_path / f"r{n}" / "manifest.json").read_text())["steps"] == 5
        ops = [json.loads(line) for line in (tmp_path / f"r{n}" / "ops.jsonl").read_text().splitlines()]
        assert {op["step"] for op in ops} == {n}
        names = [op["op"] for op in ops]
        assert "aten.randn" in names and "aten.addmm" in names  # the step's batch and forward
        assert any(op["phase"] == "optimizer" for op in ops)  # and its update


def test_two_recordings_of_a_middle_step_compare_with_diff_locate(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    for name in ("a", "b"):
        p = torchrepro("run", "--record", name, "--trace-steps", "3", "--", "python", "train.py", cwd=tmp_path,
                       timeout=300)
        assert p.returncode == 0, p.stderr
    p = torchrepro("diff", "a", "b", "--out", "d", cwd=tmp_path, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("torchrepro: IDENTICAL"), p.stdout + p.stderr
