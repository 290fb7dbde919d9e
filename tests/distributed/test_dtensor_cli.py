"""`torchrepro check --nproc-per-node N` of FSDP2 and tensor-parallel scripts end to end (gloo, CPU, 2 ranks; 4 for
FSDP x TP).

Each check is recorded once per module (a fixture) and read by several tests: FSDP2 reproducible, FSDP2 with noise
on one rank's shard, tensor parallel with a Replicate() parameter nudged on one rank, HSDP (a 2-D mesh whose
replicate dimension makes both ranks hold the same shard) nudged on one rank, and FSDP x TP on a 2 x 2 mesh with a
parameter replicated along tp nudged on one rank; and the shards and random draws against their placements: FSDP2 with
the dropout reseeded alike on every rank (correlated random numbers), tensor parallel with a shard initialised alike on
every rank and a dropout on a replicated activation (a broken shard, correlated draws, replicas drawing apart)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.inprocess import torchrepro as in_process
from torchrepro.record.store import GRAD_VALUES_ENV, load_ranks, load_values

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
FSDP = str(SCRIPTS / "fsdp2_train.py")
TP = str(SCRIPTS / "tp_train.py")
LIMIT_S = 300
STEPS = "3"


def torchrepro(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``torchrepro ARGS`` in this process (tests/inprocess.py); the runs and their ranks are processes."""
    return in_process(*args, env=env, timeout=LIMIT_S)


class Checked:
    """One `torchrepro check` of 2 runs on 2 ranks: its exit code, text, check.json, and each run's rank traces."""

    def __init__(self, out: Path, *script: str, env: dict[str, str] | None = None, nproc: int = 2) -> None:
        self.out = out
        self.proc = torchrepro("check", "--out", str(out), "--nproc-per-node", str(nproc), "--", "python", *script,
                               "--steps", STEPS, env=env)
        self.text = self.proc.stdout
        self.doc: dict[str, Any] = json.loads((out / "check.json").read_text()) if (out / "check.json").exists() \
            else {}

    def ranks(self, run: int) -> list[Any]:
        return load_ranks(self.out / f"run{run}")[1]


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    return Checked(tmp_path_factory.mktemp("fsdp") / "out", FSDP)


@pytest.fixture(scope="module")
def fsdp_noise(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    # gradients and optimizer state are kept as values for 3 steps (each rank's shards): how large is their |Δ|
    return Checked(tmp_path_factory.mktemp("fsdp_noise") / "out", FSDP, "--noise-rank", "1", "--noise-step", "2",
                   env={GRAD_VALUES_ENV: "3"})


@pytest.fixture(scope="module")
def tp_nudge(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    return Checked(tmp_path_factory.mktemp("tp") / "out", TP, "--nudge-rank", "1", "--nudge-step", "2")


@pytest.fixture(scope="module")
def hsdp_nudge(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    return Checked(tmp_path_factory.mktemp("hsdp") / "out", FSDP, "--hsdp", "--nudge-rank", "1", "--nudge-step", "2")


@pytest.fixture(scope="module")
def fsdp_tp_nudge(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    # 4 ranks on a (dp=2, tp=2) mesh: fc2.bias is (Shard(0), Replicate()), nudged on rank 3 only
    return Checked(tmp_path_factory.mktemp("fsdp_tp") / "out", FSDP, "--tp", "--nudge-rank", "3", "--nudge-step", "2",
                   "--nudge-tensor", "fc2.bias", nproc=4)


@pytest.fixture(scope="module")
def fsdp_reseed(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    # every rank reseeds its generator alike just before the dropout: correlated dropout masks across the ranks
    return Checked(tmp_path_factory.mktemp("fsdp_reseed") / "out", FSDP, "--reseed-dropout")


@pytest.fixture(scope="module")
def tp_broken(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    # fc1.weight (Shard(0)) re-initialised after sharding from the same state on every rank (equal shards, correlated
    # uniform_ draws), and a dropout on fc2's replicated output drawing each rank's own mask (replicas part)
    return Checked(tmp_path_factory.mktemp("tp_broken") / "out", TP, "--init-after-shard", "--replicated-dropout")


FSDP_COUNTS = {"compared": 20, "params": 4, "grads": 4, "state": 12, "dtensors": 16, "unreadable": 0}
LOCAL_SHAPES = {"fc1.weight": [8, 8], "fc1.bias": [8], "fc2.weight": [2, 16], "fc2.bias": [2]}  # half the rows


def test_fsdp2_check_is_identical_with_every_tensor_compared(fsdp: Checked) -> None:
    assert fsdp.proc.returncode == 0, fsdp.proc.stderr
    assert fsdp.text.startswith("torchrepro: IDENTICAL - 2 runs of `python ")
    assert "on 2 ranks, 3 steps each" in fsdp.text
    assert "run 1: in sync at every step" in fsdp.text and "run 2: in sync at every step" in fsdp.text
    doc = fsdp.doc
    assert doc["verdict"] == "identical" and doc["desync"] == [None, None]
    assert [r["tensors"] for r in doc["ranks"]] == [FSDP_COUNTS, FSDP_COUNTS]  # parameters, gradients, AdamW state
    for run in (1, 2):
        for r, rank in enumerate(fsdp.ranks(run)):
            assert "unreadable" not in (rank.path / "trace.jsonl").read_text()
            init = rank.of_kind("init")[0]
            for name, lay in init["layouts"]["params"].items():
                assert (lay["placements"], lay["mesh_shape"], lay["coordinate"]) == (["Shard(0)"], [2], [r]), name
            step = rank.steps()[0]
            assert step["layouts"]["grads"]["fc1.weight"]["placements"] == ["Shard(0)"]
            assert step["layouts"]["state"]["fc1.weight.exp_avg"]["coordinate"] == [r]
            assert "fc1.weight.step" not in step["layouts"]["state"]  # a plain tensor
            assert all("layouts" not in s for s in rank.steps()[1:])  # written once, carried forward
    # the shards differ between the ranks (and are not a desynchronisation); each rank saved its shard, plainly
    r0, r1 = fsdp.ranks(1)
    assert r0.of_kind("init")[0]["params"]["fc1.weight"] != r1.of_kind("init")[0]["params"]["fc1.weight"]
    for name in ("init", "step_000001", "final"):
        values = load_values(r1.path / "values" / f"{name}.pt")
        assert {k: list(v.shape) for k, v in values.items()} == LOCAL_SHAPES
        assert all(type(v).__name__ == "Tensor" for v in values.values())


def test_fsdp2_runs_diff_identical(fsdp: Checked) -> None:
    d = torchrepro("diff", "--json", "--out", str(fsdp.out.parent / "diff"), str(fsdp.out / "run1"),
                   str(fsdp.out / "run2"))
    assert d.returncode == 0, d.stderr
    doc = json.loads(d.stdout)
    assert doc["verdict"] == "identical" and [r["verdict"] for r in doc["ranks"]] == ["identical", "identical"]
    assert [r["tensors"] for r in doc["ranks"]] == [FSDP_COUNTS, FSDP_COUNTS]


def test_fsdp2_noise_on_one_rank_is_named_with_rank_step_tensor_and_shard(fsdp_noise: Checked) -> None:
    p, doc = fsdp_noise.proc, fsdp_noise.doc
    assert p.returncode == 1, p.stderr
    # rank 1's shard of fc1.weight differs at step 2; rank 0 follows at step 3 (through FSDP's all-gather)
    assert p.stdout.startswith("torchrepro: DIVERGED at step 2 on rank 1 (")
    assert "rank 1: DIVERGED at step 2 (parameters fc1.weight); cause:" in p.stdout
    assert "rank 0: DIVERGED at step 3 (" in p.stdout
    assert doc["verdict"] == "diverged" and doc["lead_rank"] == 1 and doc["first_divergent_step"] == 2
    assert doc["lead_mesh"] == "mesh coordinate (1,), shard 1 of 2 of fc1.weight Shard(0)"
    assert [(d["kind"], d["names"]) for d in doc["diverged_first"]] == [("params", ["fc1.weight"])]
    note = ("On rank 1 the first differing tensors are DTensors, fingerprinted and compared by this rank's local "
            "shard: fc1.weight: Shard(0) on mesh (dp=2) at (1,), shard 1 of 2.")
    assert note in doc["notes"] and f"Note:  {note}" in p.stdout
    # rank 0: its gradients and its shard of AdamW's exp_avg differ from step 3 on (sharded, compared by shard)
    rank0 = doc["ranks"][0]
    assert rank0["first_divergent_step"] == 3
    first = {d["kind"]: d["names"] for d in rank0["diverged_first"]}
    assert "fc1.weight" in first["grads"] and "fc1.weight.exp_avg" in first["state"]
    assert rank0["first_layouts"]["fc1.weight"]["coordinate"] == [0]
    # their values: this rank's shards, saved plainly, and how far apart they are
    deltas = {d["kind"]: d for d in rank0["value_deltas"]}
    assert deltas["grads"]["step"] == 3 and deltas["state"]["step"] == 3 and deltas["grads"]["max_abs_delta"] > 0
    assert deltas["state"]["max_abs_delta"] > 0
    for name in ("grads_000003", "state_000003"):
        values = load_values(fsdp_noise.out / "run1" / "rank0" / "values" / f"{name}.pt")
        assert list(values["fc1.weight" if name.startswith("grads") else "fc1.weight.exp_avg"].shape) == [8, 8]
    assert doc["desync"] == [None, None]  # shards differ by design: never a desynchronisation


def test_tensor_parallel_replica_nudged_on_one_rank_is_a_desync_named_with_its_mesh(tp_nudge: Checked) -> None:
    p, doc = tp_nudge.proc, tp_nudge.doc
    assert p.returncode == 1, p.stderr
    assert "torchrepro: DESYNCHRONISED - " in p.stdout and "replicas part at step 2" in p.stdout
    # each rank repeats itself across runs: the tensor-parallel run is recorded reproducibly, every tensor compared
    for r in (0, 1):
        assert f"rank {r}: identical (3 steps; 30 tensors compared: 6 parameters, 6 gradients, 18 optimizer-state " \
               "(16 DTensors, by local shard))" in p.stdout, p.stdout
    line = ("rank 1 differs from rank 0 at step 2: parameters fc2.bias [Replicate() on mesh (tp=2); rank 1 at (1,), "
            "rank 0 at (0,)]")
    assert f"run 1: {line}" in p.stdout and f"run 2: {line}" in p.stdout
    assert [(d["step"], d["kind"], d["names"][0], d["ranks"], d["placements"]) for d in doc["desync"]] == [
        (2, "params", "fc2.bias", [1], ["Replicate()"])] * 2
    counts = doc["ranks"][0]["tensors"]
    # fc1 (Shard(0)) and fc2 (weight Shard(1), bias Replicate()): DTensors, their gradients and AdamW moments too;
    # head and the optimizer's step counters: plain tensors
    assert counts == {"compared": 30, "params": 6, "grads": 6, "state": 18, "dtensors": 16, "unreadable": 0}
    r0, r1 = tp_nudge.ranks(1)
    assert r0.of_kind("init")[0]["layouts"]["params"]["fc2.weight"]["placements"] == ["Shard(1)"]
    assert r1.steps()[0]["layouts"]["grads"]["fc2.bias"]["placements"] == ["Replicate()"]


def test_hsdp_replicas_of_one_shard_must_agree(hsdp_nudge: Checked) -> None:
    p = hsdp_nudge.proc
    assert p.returncode == 1, p.stderr
    assert "torchrepro: DESYNCHRONISED - " in p.stdout
    assert ("run 1: rank 1 differs from rank 0 at step 2: parameters fc1.weight [(Replicate(), Shard(0)) on mesh "
            "(replicate=2, shard=1); rank 1 at (1, 0), rank 0 at (0, 0)]") in p.stdout


def test_runs_sharded_differently_are_refused_before_comparing(fsdp: Checked, hsdp_nudge: Checked) -> None:
    d = torchrepro("diff", "--out", str(fsdp.out.parent / "diff_mixed"), str(fsdp.out / "run1"),
                   str(hsdp_nudge.out / "run1"))
    assert d.returncode == 2, d.stdout
    assert "the runs are not comparable" in d.stderr
    assert ("rank 0: fc1.weight is Shard(0) on mesh (dp=2) at (0,) (global shape (16, 8)) in run 1 and (Replicate(), "
            "Shard(0)) on mesh (replicate=2, shard=1) at (0, 0) (global shape (16, 8)) in run 2") in d.stderr


def test_fsdp_x_tp_on_a_2x2_mesh_compares_the_replicas_along_tp_only(fsdp_tp_nudge: Checked) -> None:
    p, doc = fsdp_tp_nudge.proc, fsdp_tp_nudge.doc
    assert p.returncode == 1, p.stderr
    # every rank repeats itself across runs; fully sharded tensors (fc1: (StridedShard, Shard), fc2.weight:
    # (Shard(0), Shard(1))) differ on every rank and are never named
    assert [r["verdict"] for r in doc["ranks"]] == ["identical"] * 4
    assert all(r["tensors"]["unreadable"] == 0 and r["tensors"]["dtensors"] == 16 for r in doc["ranks"])
    line = ("rank 3 differs from rank 2 at step 2: parameters fc2.bias [(Shard(0), Replicate()) on mesh (dp=2, tp=2); "
            "rank 3 at (1, 1), rank 2 at (1, 0)]")
    assert f"run 1: {line}" in p.stdout and f"run 2: {line}" in p.stdout
    lays = fsdp_tp_nudge.ranks(1)[3].of_kind("init")[0]["layouts"]["params"]
    assert lays["fc1.weight"]["placements"][1] == "Shard(0)" and lays["fc2.weight"]["placements"] == ["Shard(0)",
                                                                                                       "Shard(1)"]


# --- shards and random draws against their placements (analysis/shardcheck, record/draws) --------------------------
def _placement(checked: Checked) -> list[dict[str, Any]]:
    return [p for run in checked.doc["placement"] for p in run["problems"]]


def test_sharded_runs_with_independent_draws_report_no_broken_shard_and_no_correlated_draw(
        fsdp: Checked, tp_nudge: Checked) -> None:
    for checked in (fsdp, tp_nudge):
        assert _placement(checked) == [] and "than their placements say" not in checked.text
        runs = checked.doc["placement"]
        assert [r["run"] for r in runs] == [1, 2] and all(r["draws_compared"] >= 2 for r in runs)  # dropout, 2 steps
        assert "run 1: no broken shard; " in checked.text
    # each rank recorded which sharded parameters are constant (none: every one was drawn), and its dropout draws
    rank0 = fsdp.ranks(1)[0]
    assert rank0.of_kind("init")[0]["constant"] == [] and all(s["constant"] == [] for s in rank0.steps())
    draws = [e for e in rank0.events if e.get("kind") == "draw" and e["site"] == "drop"]
    assert [(d["op"], d["during_step"], d["layout"]) for d in draws] == [("bernoulli_", 1, None),
                                                                         ("bernoulli_", 2, None)]
    assert not [e for e in rank0.events if e.get("kind") == "draw" and e["during_step"] > 2]  # the first 2 steps only


def test_dropout_reseeded_alike_on_every_rank_is_reported_as_correlated_random_numbers(fsdp_reseed: Checked) -> None:
    p, doc = fsdp_reseed.proc, fsdp_reseed.doc
    assert p.returncode == 0, p.stderr  # the runs repeat each other: the verdict stands, the warning is beside it
    assert doc["verdict"] == "identical"
    assert "Warning: correlated random numbers in runs 1, 2 (below)" in p.stdout
    line = ("correlated random numbers: bernoulli_ #0 in drop during step 1 drew bitwise identical values on ranks 0 "
            "and 1, which hold different inputs (+1 more)")
    assert f"run 1: {line}" in p.stdout and f"run 2: {line}" in p.stdout
    assert "Cause: correlated random numbers - " in p.stdout
    assert [(x["kind"], x["name"], x["site"], x["step"], x["ranks"], x["more"]) for x in _placement(fsdp_reseed)] == [
        ("correlated", "bernoulli_", "drop", 1, [0, 1], 1)] * 2


def test_a_shard_initialised_alike_on_every_rank_and_replicas_drawing_apart_are_reported(tp_broken: Checked) -> None:
    p = tp_broken.proc
    assert p.returncode == 1, p.stderr  # the replicated region's own masks desynchronise the replicas
    assert "Warning: broken shard and correlated random numbers and replicas drew different random numbers" in p.stdout
    assert ("run 1: broken shard in the initial parameters: fc1.weight [Shard(0) on mesh (tp=2)] has bitwise identical "
            "shards on ranks 0 and 1 although the tensor is not constant") in p.stdout
    assert ("outside any module's forward by the end of step 1 [Shard(0) on mesh (tp=2)] drew bitwise identical "
            "values on ranks 0 and 1, which hold other shards") in p.stdout
    assert ("run 1: replicas drew different random numbers: bernoulli_ #0 in drop2 during step 1 differs between "
            "ranks 0 and 1, which hold bitwise equal inputs") in p.stdout
    kinds = [(x["kind"], x["name"], x["placements"]) for x in _placement(tp_broken)]
    assert kinds == [("broken-shard", "fc1.weight", ["Shard(0)"]), ("correlated", "uniform_", ["Shard(0)"]),
                     ("replicas-drew", "bernoulli_", None)] * 2


def test_fsdp2_compiled_with_torch_compile_is_recorded_and_its_noise_named(tmp_path: Path) -> None:
    """torch.compile on top of FSDP2 (inductor, CPU): the compiled model's DTensor parameters are recorded by local
    shard (named as torch.compile names them, ``_orig_mod.`` first, as in one process), and the noise on rank 1's
    shard is found as without compile."""
    checked = Checked(tmp_path / "out", FSDP, "--compile", "--noise-rank", "1", "--noise-step", "2")
    p, doc = checked.proc, checked.doc
    assert p.returncode == 1, p.stderr
    assert p.stdout.startswith("torchrepro: DIVERGED at step 2 on rank 1 (")
    assert doc["lead_rank"] == 1 and doc["first_divergent_step"] == 2
    assert [(d["kind"], d["names"]) for d in doc["diverged_first"]] == [("params", ["_orig_mod.fc1.weight"])]
    assert "rank 0: DIVERGED at step 3 (" in p.stdout
    compiled = json.loads((tmp_path / "out" / "run1" / "rank0" / "manifest.json").read_text())["compiled"]
    assert [(c["kind"], c["backend"]) for c in compiled] == [("module", "inductor")]
