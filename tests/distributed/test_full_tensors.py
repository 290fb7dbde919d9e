"""`--full-tensors`: the full-tensor view of FSDP2 runs, and `torchrepro compare` across world sizes (2 vs 4 ranks).

One `torchrepro compare --full-tensors 'torchrun --nproc-per-node 2 ...' 'torchrun --nproc-per-node 4 ...'` is run
per module (the fixture: two torchrun launches, 2 steps of a tiny FSDP2 MLP on gloo/CPU); every other test reads
the runs it recorded (compare of run directories, copies without the full view, the refusal)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.inprocess import torchrepro as in_process
from torchrepro._core.errors import RunsNotComparableError
from torchrepro.analysis.rankcompare import compare_rank_runs
from torchrepro.record.fullview import FULL
from torchrepro.record.options import LaunchOptions
from torchrepro.record.settings import ValueSettings
from torchrepro.record.store import load_ranks, load_run, load_values

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "fsdp2_train.py")
LIMIT_S = 300
STEPS = 2
# fsdp2_train.py --global-batch: one batch of 8 rows per step, the same on every rank, each rank training on its
# rows, dropout off: the same model and the same data on 2 and on 4 ranks; only the sharding differs
A = f"torchrun --nproc-per-node 2 {SCRIPT} --steps {STEPS} --global-batch"
B = f"torchrun --nproc-per-node 4 {SCRIPT} --steps {STEPS} --global-batch"
FULL_SHAPES = {"fc1.weight": [16, 8], "fc1.bias": [16], "fc2.weight": [4, 16], "fc2.bias": [4]}


def torchrepro(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``torchrepro ARGS`` in this process (tests/inprocess.py); the runs and their ranks are processes."""
    return in_process(*args, cwd=cwd, timeout=LIMIT_S)


class Compared:
    def __init__(self, out: Path) -> None:
        self.out = out
        # run in a directory of its own: compare watches what B reads of what A wrote in the working directory
        out.parent.joinpath("cwd").mkdir()
        self.proc = torchrepro("compare", "--seed", "0", "--full-tensors", "--json", "--out", str(out), A, B,
                               cwd=out.parent / "cwd")
        self.doc: dict[str, Any] = json.loads(self.proc.stdout) if self.proc.stdout.strip().startswith("{") else {}
        self.a, self.b = out / "a" / "run1", out / "b" / "run1"


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Compared:
    return Compared(tmp_path_factory.mktemp("fullview") / "out")


def _without_full_view(run: Path, where: Path) -> Path:
    """A copy of a run of several ranks as if recorded without --full-tensors."""
    shutil.copytree(run, where)
    shutil.rmtree(where / "rank0" / FULL)
    return where


def test_full_tensors_setting_travels_to_the_child() -> None:
    opts = LaunchOptions(values=ValueSettings(keep=True, full_tensors=True))
    assert LaunchOptions.from_json(json.loads(json.dumps(opts.to_json()))).values.full_tensors is True
    with pytest.raises(TypeError, match="full_tensors"):
        ValueSettings(full_tensors="yes")  # type: ignore[arg-type]


def test_rank0_writes_the_full_tensors_that_the_shards_make_up(compared: Compared) -> None:
    assert compared.proc.returncode in (0, 1), compared.proc.stderr[-3000:]
    for run, world in ((compared.a, 2), (compared.b, 4)):
        top, ranks = load_ranks(run)
        assert len(ranks) == world
        assert all(not (r.path / FULL).exists() for r in ranks[1:])  # written once, by rank 0
        full = load_run(run / "rank0" / FULL)
        facts = full.manifest["full_view"]
        # gathered on every kept step: 4 initial parameters, then 4 parameters and 4 gradients per step
        assert facts["world_size"] == world and facts["gathered"] == 4 + 8 * STEPS and facts["gather_s"] > 0
        assert [e["kind"] for e in full.events] == ["init", *["step"] * STEPS, "final"]
        assert set(full.steps()[0]["grads"]) == set(FULL_SHAPES) and full.steps()[0]["losses"] == []
        for name in ("init", "step_000001", f"step_{STEPS:06d}", "final", "grads_000001"):
            values = load_values(full.path / "values" / f"{name}.pt")
            assert {k: list(v.shape) for k, v in values.items()} == FULL_SHAPES, name
        # the full tensor is the shards, in mesh order, bit for bit (Shard(0): rows)
        for name in ("init", f"step_{STEPS:06d}"):
            whole = load_values(full.path / "values" / f"{name}.pt")
            shards = [load_values(r.path / "values" / f"{name}.pt") for r in ranks]
            for k, t in whole.items():
                assert torch.equal(torch.cat([s[k] for s in shards]), t), (run, name, k)


def test_compare_across_world_sizes_says_whether_and_where_the_numerics_depend_on_the_shard_count(
        compared: Compared, tmp_path: Path) -> None:
    doc = compared.doc
    assert doc, compared.proc.stderr[-3000:]
    a, b = (load_run(run / "rank0" / FULL) for run in (compared.a, compared.b))
    # the same initial weights whatever the sharding (seeded, built whole, then sharded)
    assert a.of_kind("init")[0]["params"] == b.of_kind("init")[0]["params"]
    # What is true on CPU/gloo (torch 2.13): NOT bitwise equal. The loss of each rank is the mean over its rows
    # (4 rows on 2 ranks, 2 on 4) and FSDP2's reduce-scatter sums the ranks' gradients and divides by the world
    # size: float32 sums in another grouping, so the gradients part in the last bits at step 1 (|Δ| ~1e-7, about
    # 1% of torch.testing's float32 tolerance) and the parameters follow. The expectation is read from the
    # recorded full tensors, independently of compare, so that a torch whose reduction gives equal bits (or a
    # machine where it does not) is asserted as it is.
    ga = load_values(a.path / "values" / "grads_000001.pt")
    gb = load_values(b.path / "values" / "grads_000001.pt")
    bitwise = all(torch.equal(ga[k], gb[k]) for k in ga)
    steps_equal = [x["params"] == y["params"] and x["grads"] == y["grads"] for x, y in zip(a.steps(), b.steps())]
    if bitwise and all(steps_equal):
        assert doc["verdict"] == "identical" and compared.proc.returncode == 0
    else:
        first = steps_equal.index(False) + 1
        assert doc["verdict"] == "diverged" and compared.proc.returncode == 1
        assert doc["first_divergent_step"] == first
        assert doc["cause"] == "compute"
        kinds = [d["kind"] for d in doc["bitwise"]["diverged_first"]]
        assert kinds[0] == ("grads" if not bitwise else "params")
        assert "--locate" not in (doc["action"] or "").split("; ")[0]  # not offered for torchrun commands
    assert any("Compared the full-tensor views (A on 2 ranks, B on 4 ranks)" in n for n in doc["bitwise"]["notes"])
    assert doc["runs"] == [str(compared.a / "rank0" / FULL), str(compared.b / "rank0" / FULL)]
    # within torch.testing's per-dtype tolerance: the recorded run directories, compared again
    tol = torchrepro("compare", "--json", "--rtol", "dtype", "--out", str(tmp_path / "tol"), str(compared.a),
                     str(compared.b))
    assert tol.returncode == 0, tol.stdout[-2000:] + tol.stderr[-2000:]
    assert json.loads(tol.stdout)["verdict"] in ("identical", "equivalent")


def test_runs_sharded_differently_without_the_full_view_are_refused_saying_to_add_it(
        compared: Compared, tmp_path: Path) -> None:
    b = _without_full_view(compared.b, tmp_path / "b-nofull")
    for extra in ([], ["--full-tensors"]):
        p = torchrepro("compare", *extra, "--out", str(tmp_path / f"o{len(extra)}"), str(compared.a), str(b))
        assert p.returncode == 2, p.stdout + p.stderr
        assert "the runs are not comparable" in p.stderr and "--full-tensors" in p.stderr
        assert "A ran on 2 rank(s) and B on 4" in p.stderr or "in run 1 and" in p.stderr
        if extra:
            assert "B (`" in p.stderr and "recorded without the full-tensor view" in p.stderr
    # check and diff of runs of several ranks: refused before comparing, pointing at the full view too
    with pytest.raises(RunsNotComparableError, match="--full-tensors"):
        compare_rank_runs([load_ranks(compared.a)[1], load_ranks(b)[1]])


def test_same_sharding_without_the_full_view_is_compared_rank_by_rank(compared: Compared, tmp_path: Path) -> None:
    a2 = _without_full_view(compared.a, tmp_path / "a-nofull")
    p = torchrepro("compare", "--json", "--out", str(tmp_path / "o"), str(compared.a), str(a2))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "identical"
    notes = doc["bitwise"]["notes"]
    assert any(n.startswith("Compared rank by rank (2 ranks on each side, sharded alike; DTensors by local shard): "
                            "rank 0 identical, rank 1 identical") for n in notes), notes
