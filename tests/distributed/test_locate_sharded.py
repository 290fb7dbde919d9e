"""The op tracer and --locate on sharded training (FSDP2 under torchrun, gloo, CPU).

FSDP2 gathers each layer's shards with ``c10d._allgather_base_``, whose output the process group writes after the
op returns, into a buffer that ``fsdp.all_gather_copy_in`` hands out with only this rank's part written; it frees and
reallocates unsharded parameters by resizing storages, which no traced op does. Read as they were, those bytes
differed from run to run and --locate named a view of them instead of the line that differs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.inprocess import torchrepro as in_process
from torchrepro.analysis.locate import alias_op, locate_ops

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
FSDP = str(SCRIPTS / "fsdp2_train.py")
NOISE_LINE = "model.fc1.weight.to_local().view(-1)[0] += (int.from_bytes(os.urandom(2), \"little\") + 1) * 1e-6"


def _op(op, ins, outs, line=1, rng=False):
    return {"op": op, "in": ins, "out": outs, "file": "f.py", "line": line, "step": 1, "rng": rng, "phase": "forward"}


def test_a_view_of_memory_no_op_wrote_is_never_named_and_hides_no_later_origin():
    """FSDP2's unsharded parameter buffer, reallocated by a storage resize: its bytes differ; views of it, and the
    copy that overwrites it (its out= argument), are not where the runs part."""
    assert alias_op("aten.view") and alias_op("aten.t") and not alias_op("aten.add_") and not alias_op("x.y")
    a = [_op("aten.view", ["garbage1"], ["v1"]), _op("fsdp.split_with_sizes_copy", ["w", "v1"], ["None"]),
         _op("aten.empty", [], ["uninitialized"]), _op("aten.view", ["uninitialized"], ["u1"]),
         _op("fsdp.chunk_cat", ["g", "u1"], ["None"]), _op("aten.add_", ["p"], ["p1"], line=9)]
    b = [_op("aten.view", ["garbage2"], ["v2"]), _op("fsdp.split_with_sizes_copy", ["w", "v2"], ["None"]),
         _op("aten.empty", [], ["uninitialized"]), _op("aten.view", ["uninitialized"], ["u2"]),
         _op("fsdp.chunk_cat", ["g", "u2"], ["None"]), _op("aten.add_", ["p"], ["p2"], line=9)]
    res = locate_ops(a, b)
    assert res.verdict == "origin" and res.op_a["op"] == "aten.add_" and res.op_a["line"] == 9
    assert res.fix.startswith("aten.add_ is not a known nondeterministic op, and its tensor inputs were identical: a "
                              "Python number given to it (a scalar argument, which the tracer does not record) may "
                              "differ between the runs, drawn from os.urandom")
    assert locate_ops(a[:-1], b[:-1]).verdict == "not-reproduced"  # nothing but those bytes differs


def test_the_all_gather_buffer_is_unknown_until_the_collective_fills_it():
    a = [_op("aten.empty", [], ["uninitialized"]),
         _op("fsdp.all_gather_copy_in", ["w", "b", "uninitialized"], ["in", "buf1"]),
         _op("c10d._allgather_base_", ["buf1", "in"], ["full"]), _op("aten.addmm", ["full", "x"], ["h"])]
    b = [dict(o) for o in a]
    b[1] = {**b[1], "out": ["in", "buf2"]}
    b[2] = {**b[2], "in": ["buf2", "in"]}
    assert locate_ops(a, b).verdict == "not-reproduced"
    b[2] = {**b[2], "out": ["other"]}  # the gathered tensor differs while this rank gave the same shard
    b[3] = {**b[3], "in": ["other", "x"], "out": ["h2"]}
    res = locate_ops(a, b)
    assert res.verdict == "origin" and res.op_a["op"] == "c10d._allgather_base_"
    assert res.title == "another rank's difference, received through a collective"
    assert res.deterministic_kernel is None
    assert res.fix.startswith("c10d._allgather_base_ (f.py:1) received other values from another rank while this "
                              "rank's inputs were identical: the difference began on another rank.")


ARGS = ("--steps", "3", "--noise-rank", "1", "--noise-step", "2")


@pytest.fixture(scope="module")
def located(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """`check --locate --nproc-per-node 2` of an FSDP2 script whose rank 1 adds a number from os.urandom to its shard
    in step 2: (the command's result, its --out). Its locate/run1 and locate/run2 are two recordings of every rank
    with the op trace of step 2."""
    out = tmp_path_factory.mktemp("fsdp_located") / "out"
    p = in_process("check", "--locate", "--json", "--nproc-per-node", "2", "--out", str(out), "--", "python", FSDP,
                   *ARGS, timeout=600)
    return p, out


@pytest.fixture(scope="module")
def traced(located, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two recordings with the op trace of step 2: ``a`` made by `torchrepro run --trace-steps 2` under torchrun,
    ``b`` the second of the check's --locate recordings."""
    root = tmp_path_factory.mktemp("fsdp_traced")
    p = in_process("run", "--record", str(root / "a"), "--nproc-per-node", "2", "--trace-steps", "2", "--", "python",
                   FSDP, *ARGS, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    (root / "b").symlink_to(located[1] / "locate" / "run2")
    return root


def _locate(traced: Path, rank: int, out: Path) -> str:
    p = in_process("diff", "--locate", str(traced / "a" / f"rank{rank}"), str(traced / "b" / f"rank{rank}"),
                   "--out", str(out), timeout=300)
    assert p.returncode == 1, p.stderr[-3000:]
    return p.stdout


def test_locate_on_the_rank_that_diverged_names_the_line_that_adds_the_noise(traced, tmp_path):
    text = _locate(traced, 1, tmp_path / "d1")
    assert "Locate: nondeterministic operation" in text
    assert "  op      aten.add_  (forward," in text and f"          {NOISE_LINE}" in text
    assert f"fsdp2_train.py:{_line(NOISE_LINE)}" in text


def test_locate_on_the_other_rank_finds_no_false_difference_in_the_gathered_shards(traced, tmp_path):
    text = _locate(traced, 0, tmp_path / "d0")
    assert "Locate: every traced op agrees in the two recorded runs" in text, text


def _line(code: str) -> int:
    return next(i for i, line in enumerate(Path(FSDP).read_text().splitlines(), start=1) if line.strip() == code)


def test_check_locate_under_torchrun_traces_every_rank_and_names_the_lead_ranks_op(located, tmp_path):
    """`check --locate --nproc-per-node 2` (refused before): the rank that diverged first is traced in two more
    launches and its op named, in the text, check.json and report.html."""
    p, out = located
    assert p.returncode == 1, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["lead_rank"] == 1 and doc["locate"]["rank"] == 1
    assert doc["locate"]["verdict"] == "origin" and doc["locate"]["op"]["op"] == "aten.add_"
    assert doc["locate"]["op"]["line"] == _line(NOISE_LINE) and doc["locate"]["traced_steps"] == [2]
    html = (out / "report.html").read_text()
    assert "aten.add_" in html and 'id="locate"' in html
    text = in_process("diff", "--locate", str(out / "locate" / "run1" / "rank1"), str(out / "locate" / "run2" /
                      "rank1"), "--out", str(tmp_path / "d"), timeout=300).stdout
    assert "  op      aten.add_  (forward," in text  # the traced re-runs are kept, rank by rank
