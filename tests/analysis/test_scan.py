"""torchrepro scan: the ops of one training step that would be nondeterministic on a target device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

import torchrepro
from torchrepro.analysis.scan import ScanError, ScanReport
from torchrepro.cli import main

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
INTERP = SCRIPTS / "scan_interp.py"
INTERP_LINE = 19  # F.interpolate(..., mode="bilinear"): its backward upsample_bilinear2d_backward raises on CUDA
INDEX_ADD_LINE = 29  # index_add_ with duplicate indices: atomicAdd on CUDA
INDEX_PUT = SCRIPTS / "scan_index_put.py"
INDEX_PUT_LINE = 11


def _line(path: Path, n: int) -> str:
    return path.read_text().splitlines()[n - 1]


def test_the_line_constants_point_at_the_ops():
    assert "F.interpolate(" in _line(INTERP, INTERP_LINE) and "bilinear" in _line(INTERP, INTERP_LINE)
    assert ".index_add_(" in _line(INTERP, INDEX_ADD_LINE)
    assert "accumulate=True" in _line(INDEX_PUT, INDEX_PUT_LINE)


def scan(capsys, *args: str, command: list[str]) -> tuple[int, str, str]:
    rc = main(["scan", *args, "--", sys.executable, *command])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_scan_for_cuda_on_cpu_lists_index_add_and_bilinear_backward_with_their_lines(capsys):
    rc, out, _ = scan(capsys, "--device", "cuda", command=[str(INTERP)])
    assert rc == 1, out
    assert "FOUND" in out and "on cuda" in out and "1 optimizer step" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip().startswith("aten.")}
    assert rows["aten.index_add_"][1:4] == ["forward", "-", f"tests/scripts/scan_interp.py:{INDEX_ADD_LINE}"]
    assert rows["aten.upsample_bilinear2d_backward"][1:4] == ["backward", "Net",
                                                              f"tests/scripts/scan_interp.py:{INTERP_LINE}"]
    assert rows["aten.upsample_bilinear2d_backward"][4:] == ["1", "raises"]
    assert "fix: torchrepro.nn.functional.index_add" in out
    assert f"tests/scripts/scan_interp.py:{INDEX_ADD_LINE}: pooled = torch.zeros(4, 4).index_add_(0, idx, out)" in out


def test_json_document_and_steps_option(capsys):
    rc, out, _ = scan(capsys, "--json", "--steps", "2", command=[str(INTERP), "--allow-steps", "2"])
    doc = json.loads(out)  # exactly one document: the script's own prints went to stderr
    assert rc == 1 and doc["exit_code"] == 1 and doc["verdict"] == "found"
    assert (doc["schema"], doc["device"], doc["step_mode"], doc["steps"]) == (
        "torchrepro.scan/1", "cuda", "optimizer", 2)
    assert doc["command"] == [sys.executable, str(INTERP), "--allow-steps", "2"]
    by_op = {f["op"]: f for f in doc["findings"]}
    add, up = by_op["aten.index_add_"], by_op["aten.upsample_bilinear2d_backward"]
    assert (add["file"], add["line"], add["phase"], add["module"], add["count"]) == (
        str(INTERP), INDEX_ADD_LINE, "forward", "", 2)
    assert (up["file"], up["line"], up["phase"], up["module"], up["count"]) == (
        str(INTERP), INTERP_LINE, "backward", "Net", 2)
    assert add["alternative"] == "torchrepro.nn.functional.index_add" and add["deterministic_mode"] == "switches kernel"
    assert up["deterministic_mode"] == "raises" and up["when"].startswith("backward only")
    assert add["ran_on"] == "cpu" and add["verified_on"].startswith("not verified")
    assert set(add) >= {"op", "phase", "module", "file", "line", "code", "count", "when", "deterministic_mode",
                        "alternative", "verified_on", "fix"}
    assert by_op["aten.convolution_backward"]["module"] == "conv"  # the backward of self.conv, not of Net


def test_a_clean_script_exits_0_and_a_short_one_gets_a_note(capsys):
    rc, out, _ = scan(capsys, "--steps", "5", command=[str(SCRIPTS / "scan_clean.py")])  # it makes 3 steps
    assert rc == 0
    assert out.startswith("torchrepro scan: CLEAN - no op in 3 optimizer steps (")
    assert "on cuda" in out and "Note: the script ended after 3 of the 5 steps asked for (--steps)." in out


def test_device_cpu_lists_index_put_accumulate_in_a_script_without_optimizer(capsys):
    rc, out, _ = scan(capsys, "--device", "cpu", "--json", command=[str(INDEX_PUT)])
    doc = json.loads(out)
    assert rc == 1 and doc["step_mode"] == "backward" and doc["steps"] == 1  # no optimizer: the first backward()
    assert [(f["op"], f["line"], f["phase"], f["count"]) for f in doc["findings"]] == [
        ("aten.index_put_", INDEX_PUT_LINE, "forward", 1)]
    assert doc["findings"][0]["alternative"] == "torchrepro.nn.functional.index_put"
    # the same script scanned for CUDA (the default) would be clean: on CUDA index_put_(accumulate=True) is
    # deterministic -- the library test below checks that the target device, not the running one, decides


def test_a_failing_script_is_an_input_error_with_its_stderr_tail_and_what_was_found(capsys):
    rc, out, err = scan(capsys, "--json", "--device", "cpu", command=[str(SCRIPTS / "scan_fails.py")])
    doc = json.loads(out)
    assert rc == 2 and doc["verdict"] == "error" and doc["exit_code"] == 2
    assert "failed with exit code 1 before the scan was complete" in doc["error"] and "Fix the script" in doc["error"]
    # put_ raised under the script's own deterministic mode; the scan had seen it first and says so
    assert ("Before it failed, the scan had found these ops that are nondeterministic on cpu: aten.put_ at "
            "tests/scripts/scan_fails.py:7 (deterministic mode raises).") in doc["error"]
    assert "RuntimeError: put_ does not have a deterministic implementation" in doc["error"]
    assert 'scan_fails.py", line 7, in <module>' in doc["error"]
    assert "launcher.py" not in doc["error"] and "torchrepro/analysis/scan.py" not in doc["error"]  # user frames only
    assert "put_ does not have a deterministic implementation" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--device", "tpu", "--", "python", "x.py"], "argument --device: invalid choice: 'tpu'"),
    (["--steps", "0", "--", "python", "x.py"], "argument --steps: expected a positive integer, got '0'"),
    ([], "no command given"),
    (["--", "python", "no_such_script.py"], "script 'no_such_script.py' does not exist"),
    (["--", "bash", "train.sh"], "torchrepro records Python training scripts"),
])
def test_bad_arguments_exit_2(capsys, args, message):
    rc = main(["scan", *args])
    assert rc == 2 and message in capsys.readouterr().err


def test_bad_arguments_with_json_print_one_error_document():
    p = subprocess.run([sys.executable, "-m", "torchrepro", "scan", "--json", "--device", "tpu", "--", "python",
                        "x.py"], capture_output=True, text=True)
    doc = json.loads(p.stdout)
    assert p.returncode == 2 and doc["verdict"] == "error" and doc["schema"] == "torchrepro.scan/1"
    assert "invalid choice: 'tpu'" in doc["error"]


# --- the library function ------------------------------------------------------------------------------
class Pool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear")

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        pooled = torch.zeros(3, 4).index_add_(0, idx, h)  # POOL
        return self.up(pooled.view(1, 1, 3, 4))  # UP


def _this_line(marker: str) -> int:
    return next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith(marker))


def _modes_off() -> bool:
    return _get_current_dispatch_mode() is None and torch._C._len_torch_function_stack() == 0


def test_library_scan_of_a_small_model_restores_its_state():
    torch.manual_seed(0)
    model = Pool()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = (torch.randn(5, 4), torch.tensor([0, 0, 1, 2, 2]))
    rng = torch.get_rng_state()
    report = torchrepro.scan(model, inputs, opt, device="cuda:0")
    assert isinstance(report, ScanReport) and report.device == "cuda" and not report.clean
    assert [(f.op, f.phase, f.module, f.line, f.count) for f in report.findings] == [
        ("aten.index_add_", "forward", "Pool", _this_line("# POOL"), 1),
        ("aten.upsample_bilinear2d_backward", "backward", "up", _this_line("# UP"), 1)]
    assert report.findings[0].file == __file__ and report.findings[0].code.endswith("# POOL")
    assert report.exit_code == 1 and "aten.upsample_bilinear2d_backward" in str(report)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and opt.state_dict()["state"] == {}
    assert torch.equal(torch.get_rng_state(), rng) and _modes_off()
    assert ScanReport.from_dict(json.loads(json.dumps(report.to_json()))).findings == report.findings

    assert torchrepro.scan(model, inputs, device="cpu").clean  # neither op is nondeterministic on CPU


def test_library_scan_with_a_loss_fn_and_errors():
    model = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    report = torchrepro.scan(model, x, loss_fn=lambda out: F.cross_entropy(out, torch.tensor([0, 1, 1, 0])))
    assert report.clean and report.ops_seen > 5
    with pytest.raises(ScanError, match="device kind 'cpu' or 'cuda'.*got 'tpu'"):
        torchrepro.scan(model, x, device="tpu")
    with pytest.raises(ScanError, match="holds no tensor that requires grad"):
        torchrepro.scan(model.requires_grad_(False), x)
    model.requires_grad_(True)
    with pytest.raises(ScanError, match=r"scalar tensor that requires grad, got a tensor of shape \(4, 2\)"):
        torchrepro.scan(model, x, loss_fn=lambda out: out)
    assert _modes_off() and all(p.grad is None for p in model.parameters())


def test_the_target_device_decides_not_the_device_the_step_runs_on():
    model = nn.Linear(4, 8)
    idx = torch.tensor([0, 0, 1])

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return torch.zeros(8).index_put_((idx,), out[0, :3], accumulate=True).sum()  # LOSS

    found = torchrepro.scan(model, torch.randn(1, 4), device="cpu", loss_fn=loss_fn).findings
    assert [(f.op, f.phase, f.module, f.line) for f in found] == [("aten.index_put_", "forward", "",
                                                                  _this_line("# LOSS"))]
    assert torchrepro.scan(model, torch.randn(1, 4), device="cuda", loss_fn=loss_fn).clean
