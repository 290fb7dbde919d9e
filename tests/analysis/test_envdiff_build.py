"""Environment differences are ranked by what can matter on the builds compared, and say "can break", with the
evidence of the runs (issue 40: OMP_NUM_THREADS "breaks bitwise equality" under an IDENTICAL verdict;
CUBLAS_WORKSPACE_CONFIG ranked as breaking on a CPU-only torch while `audit` says it is not needed)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchrepro
from torchrepro.analysis.envdiff import BENIGN, BREAKS, RANK_TITLES, diff_environments
from torchrepro.cli._render import render_env_diff

SRC = str(Path(torchrepro.__file__).resolve().parents[1])
CPU_ONLY = ("no effect here: both torch builds are CPU-only (torch_build.cuda: not available); on CUDA: decides "
            "whether cuBLAS uses deterministic workspaces")


def _pair(*, cuda: tuple[bool, bool], build: str = "not available") -> tuple[dict, dict]:
    doc = torchrepro.environment().to_json()
    a, b = copy.deepcopy(doc), copy.deepcopy(doc)
    for side, available in zip((a, b), cuda):
        side["cuda"]["available"] = available
        side["torch_build"]["cuda"] = build
        side["env"].pop("CUBLAS_WORKSPACE_CONFIG", None)
        side["determinism"]["cublas_workspace_config"] = None
    b["env"]["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    b["determinism"]["cublas_workspace_config"] = ":4096:8"
    return a, b


def test_cuda_only_settings_are_benign_when_neither_side_can_use_cuda():
    diff = diff_environments(*_pair(cuda=(False, False)))
    assert [(c.key, c.rank, c.reason) for c in diff.changes] == [
        ("determinism.cublas_workspace_config", BENIGN, CPU_ONLY), ("env.CUBLAS_WORKSPACE_CONFIG", BENIGN, CPU_ONLY)]
    assert not diff.breaks_bitwise and diff.exit_code == 0


def test_a_cuda_build_without_a_gpu_on_both_sides_says_so():
    diff = diff_environments(*_pair(cuda=(False, False), build="12.4"))
    assert {c.reason for c in diff.changes} == {
        "no effect here: neither environment can use CUDA (cuda.available false in both); on CUDA: decides whether "
        "cuBLAS uses deterministic workspaces"}


@pytest.mark.parametrize("cuda", [(True, True), (True, False), (False, True)])
def test_cuda_only_settings_can_break_where_a_side_can_use_cuda(cuda):
    diff = diff_environments(*_pair(cuda=cuda, build="12.4"))
    assert [(c.key, c.rank, c.reason) for c in diff.changes if c.key.endswith(("config", "CONFIG"))] == [
        ("determinism.cublas_workspace_config", BREAKS, "decides whether cuBLAS uses deterministic workspaces"),
        ("env.CUBLAS_WORKSPACE_CONFIG", BREAKS, "decides whether cuBLAS uses deterministic workspaces")]


def test_the_rank_says_can_break_and_an_identical_verdict_is_its_evidence():
    doc = torchrepro.environment().to_json()
    a, b = copy.deepcopy(doc), copy.deepcopy(doc)
    a["threads"]["intra_op"], b["threads"]["intra_op"] = 1, 2
    diff = diff_environments(a, b)
    assert RANK_TITLES[BREAKS] == "can break bitwise equality"
    assert render_env_diff(diff).splitlines()[:2] == [
        "Environment differences (A → B): can break bitwise equality 1", "  Can break bitwise equality:"]
    assert render_env_diff(diff, verdict="identical").splitlines()[1] == (
        "  Can break bitwise equality (not in these runs: they are bitwise identical):")


SCRIPT = """\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
for _ in range(2):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
"""


def test_compare_of_identical_runs_under_other_thread_counts_on_a_cpu_only_torch(tmp_path):
    """The first user's run: OMP_NUM_THREADS 1 vs 2 (and CUBLAS_WORKSPACE_CONFIG on a CPU-only torch) gave
    `Breaks bitwise equality:` under IDENTICAL, with CUBLAS_WORKSPACE_CONFIG among them."""
    if torchrepro.environment().to_json()["cuda"]["available"]:
        pytest.skip("needs a torch that cannot use CUDA")
    (tmp_path / "train.py").write_text(SCRIPT)
    py = sys.executable
    env = {**os.environ, "PYTHONPATH": SRC}
    p = subprocess.run([py, "-m", "torchrepro", "compare", "--out", "out", f"OMP_NUM_THREADS=1 {py} train.py",
                        f"OMP_NUM_THREADS=2 CUBLAS_WORKSPACE_CONFIG=:4096:8 {py} train.py"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("torchrepro: IDENTICAL")
    at = lines.index("Environment differences (A → B): can break bitwise equality 2")
    assert lines[at + 1] == "  Can break bitwise equality (not in these runs: they are bitwise identical):"
    assert [line.split()[0] for line in lines[at + 2:at + 4]] == ["threads.intra_op", "env.OMP_NUM_THREADS"]
    assert "CUBLAS" not in "\n".join(lines[1:])  # benign here: the text leaves benign differences out
    doc = json.loads((tmp_path / "out" / "compare.json").read_text())
    ranks = {c["key"]: (c["rank"], c["reason"]) for c in doc["environment_diff"]["changes"]}
    assert ranks["env.CUBLAS_WORKSPACE_CONFIG"] == (BENIGN, CPU_ONLY)
