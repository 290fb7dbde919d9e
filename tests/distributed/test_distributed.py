"""torchrepro.distributed.ranks on 2 real processes (gloo, CPU): rank-aware seeding, RNG sync, consistency checks,
collective time limits, and the sharded ResumableLoader (single process, explicit ranks)."""

from __future__ import annotations

import datetime
import json
import os
import random
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import torchrepro
from torchrepro._core.errors import CollectiveError, RankMismatchError, ReproWarning
from torchrepro.distributed import ranks as trd

from ..conftest import run_python

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SPAWN_LIMIT_S = 240


# --- running a scenario on 2 ranks ---------------------------------------------------------------------------
def _entry(rank: int, scenarios: list[str], tmp: str, world: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), PYTHONHASHSEED="0")
    warnings.simplefilter("ignore", ReproWarning)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    results: dict = {}
    for scenario in scenarios:  # one start-up (imports, rendezvous) for several scenarios
        try:
            t0 = time.monotonic()
            results[scenario] = SCENARIOS[scenario](rank, Path(tmp))
            print(f"rank {rank}: {scenario} took {time.monotonic() - t0:.1f}s", file=sys.stderr)
        except BaseException:
            results[scenario] = {"error": traceback.format_exc()}
            break
        finally:  # after each scenario: a rank that a later one ends on purpose (dead_rank) keeps what it did
            Path(tmp, f"result{rank}.json").write_text(json.dumps(results))
    if any(r.get("no_destroy") for r in results.values()):
        os._exit(0)  # a group broken on purpose: its destructor would abort the process at exit
    dist.destroy_process_group()


def on_ranks(tmp_path: Path, *scenarios: str, world: int = 2) -> dict[str, list[dict]]:
    """Run each SCENARIOS[name](rank, tmp) on ``world`` spawned processes; return {name: [result of each rank]}."""
    tmp = tmp_path / f"{'-'.join(scenarios)}-{time.monotonic_ns()}"
    tmp.mkdir(parents=True)
    ctx = torch.multiprocessing.start_processes(_entry, args=(list(scenarios), str(tmp), world), nprocs=world,
                                                join=False, start_method="spawn")
    deadline = time.monotonic() + SPAWN_LIMIT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"scenarios {scenarios} did not finish within {SPAWN_LIMIT_S}s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    files = [tmp / f"result{r}.json" for r in range(world)]
    per_rank = [json.loads(f.read_text()) if f.exists() else {} for f in files]  # a rank may die on purpose
    for r, res in enumerate(per_rank):
        for name, value in res.items():
            assert "error" not in value, f"scenario {name}, rank {r}:\n{value['error']}"
    return {name: [res.get(name, {}) for res in per_rank] for name in scenarios}


# stuck_rank leaves the process group unusable (rank 0's all-gather timed out): the last of its launch
BATCH = ("seeding", "consistency", "dtensor", "sync", "watch", "stuck_rank")


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> dict[str, list[dict]]:
    """The scenarios that leave the process group usable, then stuck_rank, run in one launch of 2 ranks."""
    return on_ranks(tmp_path_factory.mktemp("ranks"), *BATCH)


@pytest.fixture(scope="module")
def second_launch(tmp_path_factory) -> dict[str, list[dict]]:
    """A second launch of 2 new processes: seeding again (its draws must repeat the first launch's bit for bit),
    then dead_rank (rank 1 dies: the last of its launch)."""
    return on_ranks(tmp_path_factory.mktemp("ranks-again"), "seeding", "dead_rank")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))


def _fps(model: nn.Module) -> dict[str, str]:
    return {k: torchrepro.fingerprint(v) for k, v in model.state_dict().items()}


# --- scenarios (run in each rank) --------------------------------------------------------------------------------
def _seeding(rank: int, tmp: Path) -> dict:
    out: dict = {}
    for label, shared in (("default", None), ("all-shared", ("init", "dropout", "workers"))):
        torchrepro.seed_everything(0, shared=shared)
        model = Net()
        init = _fps(model)
        ddp = nn.parallel.DistributedDataParallel(model)
        pending = trd.rng_streams()["switch"]
        mask = torchrepro.fingerprint(model.drop(torch.ones(64)) != 0)  # the first forward: the switch happens
        ddp(torch.ones(4, 6)).sum().backward()
        draws = {"after": torch.rand(3).tolist(), "python": random.random(), "numpy": float(np.random.rand())}
        # what a DataLoader worker's worker_init_fn does (worker 1, loader base seed 777); real workers are not
        # started here: forking DataLoader workers from a torch.multiprocessing child takes ~10 s (see
        # test_seeding.py for real workers)
        torch.manual_seed(777 + 1)
        torchrepro.seed_worker(1)
        draws["workers"] = [torch.rand(2).tolist(), random.random()]
        out[label] = {"init": init, "pending": pending, "mask": mask, "streams": trd.rng_streams(), **draws}
    # RNGs re-seeded (or restored from a checkpoint) before the first forward keep their state: no switch
    torch.manual_seed(1234 + rank)
    nn.Linear(2, 2)
    expected = torch.rand(2).tolist()
    torchrepro.seed_everything(0)
    torch.manual_seed(1234 + rank)
    nn.Linear(2, 2)(torch.ones(2))
    out["restored"] = {"switch": trd.rng_streams()["switch"], "draw": torch.rand(2).tolist(), "expected": expected}
    return out


def _consistency(rank: int, tmp: Path) -> dict:
    torchrepro.seed_everything(0)
    model = Net()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    out: dict = {"reports": []}
    g = torch.Generator().manual_seed(rank)
    for step in range(1, 5):
        opt.zero_grad()
        ddp(torch.randn(8, 6, generator=g)).pow(2).mean().backward()
        if step == 3 and rank == 1:
            with torch.no_grad():
                model.fc2.bias[0] += 1e-4  # after the gradients' all-reduce, before the update
        opt.step()
        report = trd.check_consistency(ddp, opt, step=step, timeout=30)
        out["reports"].append(report.to_json() | {"summary": report.summary()})
    try:
        trd.check_consistency(ddp, opt, step=4, raise_on_mismatch=True, timeout=30)
    except RankMismatchError as exc:
        out["raised"] = str(exc)
    # buffers are compared when the model is not a DDP with broadcast_buffers (rank-local BN statistics differ)
    out["inner"] = trd.check_consistency(model, what=("buffers",), timeout=30).to_json()
    # a gradient present on one rank only: the ranks hold different tensors
    opt.zero_grad()
    ddp(torch.randn(8, 6, generator=g)).sum().backward()
    if rank == 1:
        model.fc1.bias.grad = None
    out["structure"] = trd.check_consistency(ddp, what=("grads",), timeout=30).to_json()
    return out


def _dtensor(rank: int, tmp: Path) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    m = nn.Module()
    torch.manual_seed(0)
    full = torch.randn(4, 3)
    m.shard = nn.Parameter(distribute_tensor(full, mesh, [Shard(0)]))  # rows 0-1 on rank 0, rows 2-3 on rank 1
    m.rep = nn.Parameter(distribute_tensor(full, mesh, [Replicate()]))
    first = trd.check_consistency(m, what=("params",), timeout=30).to_json()
    if rank == 1:
        with torch.no_grad():
            m.rep.to_local()[0, 0] += 1.0
    second = trd.check_consistency(m, what=("params",), timeout=30).to_json()
    return {"first": first, "second": second}


def _sync(rank: int, tmp: Path) -> dict:
    random.seed(rank)
    np.random.seed(rank)
    torch.manual_seed(100 + rank)
    before = torch.rand(2).tolist()
    trd.sync_rng_states(src=1, timeout=30)
    return {"before": before, "torch": torch.rand(3).tolist(), "python": random.random(),
            "numpy": float(np.random.rand())}


def _dead_rank(rank: int, tmp: Path) -> dict:
    model = nn.Linear(3, 3)
    if rank == 1:
        os._exit(0)  # dies without a word: no collective, no clean shutdown
    t0 = time.monotonic()
    try:
        trd.check_consistency(model, timeout=8)
    except CollectiveError as exc:
        print(exc, file=sys.stderr)
        return {"error_text": str(exc), "seconds": time.monotonic() - t0, "no_destroy": True}
    return {"error_text": None, "no_destroy": True}


def _stuck_rank(rank: int, tmp: Path) -> dict:
    model = nn.Linear(3, 3)
    if rank == 1:
        time.sleep(6)  # alive but late: never calls the check in time
        return {"no_destroy": True}
    t0 = time.monotonic()
    try:
        trd.check_consistency(model, step=7, timeout=2)
    except CollectiveError as exc:
        return {"error_text": str(exc), "seconds": time.monotonic() - t0, "ranks": exc.ranks, "no_destroy": True}
    return {"error_text": None, "no_destroy": True}


def _watch(rank: int, tmp: Path) -> dict:
    torchrepro.seed_everything(0)
    model = nn.Linear(4, 2)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torchrepro.watch(ddp, opt, run_dir=tmp / f"rank{rank}", keep_values=False, check_ranks_every=2):
            for step in range(1, 5):
                opt.zero_grad()
                ddp(torch.ones(2, 4)).sum().backward()
                if step == 3 and rank == 1:
                    with torch.no_grad():
                        model.weight[1, 1] -= 0.5
                opt.step()
    events = [json.loads(line) for line in (tmp / f"rank{rank}" / "trace.jsonl").read_text().splitlines()]
    return {"ranks_events": [e for e in events if e["kind"] == "ranks"],
            "warnings": [str(w.message) for w in caught if issubclass(w.category, ReproWarning)]}


SCENARIOS = {"seeding": _seeding, "consistency": _consistency, "dtensor": _dtensor, "sync": _sync,
             "dead_rank": _dead_rank, "stuck_rank": _stuck_rank, "watch": _watch}


# --- tests -------------------------------------------------------------------------------------------------------
def test_rank_seeding_identical_init_per_rank_dropout_repeatable(batch, second_launch):
    a, b = batch["seeding"]
    again = second_launch["seeding"]
    assert again == [a, b]  # a second launch draws bitwise the same numbers on each rank
    d0, d1 = a["default"], b["default"]
    assert d0["init"] == d1["init"]  # model initialisation: the same on every rank
    assert d0["pending"] == d1["pending"] == "pending"
    assert d0["streams"]["switch"] == "switched"
    assert d0["mask"] != d1["mask"], "ranks drew the same dropout mask"
    for source in ("after", "python", "numpy", "workers"):
        assert d0[source] != d1[source], f"ranks drew the same {source} numbers"
    assert d0["streams"]["dropout"] == torchrepro.control.seeding.stream_seed(0, "dropout", rank=0)
    assert d1["streams"]["dropout"] == torchrepro.derive_seed(0, "dropout", "rank", 1)
    s0, s1 = a["all-shared"], b["all-shared"]
    assert s0["init"] == s1["init"] == d0["init"]
    assert s0["streams"]["switch"] == "none"
    for source in ("mask", "after", "python", "numpy", "workers"):
        assert s0[source] == s1[source], f"shared streams: ranks drew different {source} numbers"
    for res in (a, b):  # re-seeded before the first forward: the program's own state is kept
        assert res["restored"]["switch"] == "skipped"
        assert res["restored"]["draw"] == res["restored"]["expected"]


def test_check_consistency_names_rank_tensor_and_step(batch):
    r0, r1 = batch["consistency"]
    assert r0["reports"] == r1["reports"]  # every rank gets the same report
    oks = [rep["ok"] for rep in r0["reports"]]
    assert oks == [True, True, False, False]
    first = r0["reports"][2]
    assert first["step"] == 3 and first["ranks"] == [0, 1]
    # step 3: fc2.bias was nudged on rank 1 after the all-reduce, so only the parameter differs (Adam's moments
    # were computed from the same reduced gradients); BatchNorm buffers of a DDP model are not compared
    assert [(m["kind"], m["name"], m["ranks"], m["reference"]) for m in first["mismatches"]] == [
        ("params", "fc2.bias", [1], [0])]
    assert "parameter 'fc2.bias': rank 1 differs from rank 0" in first["summary"]
    assert "disagree at step 3" in first["summary"]
    assert set(first["mismatches"][0]["fingerprints"]) == {"0", "1"}
    assert "at step 4" in r0["raised"] and "parameter 'fc2.bias': rank 1 differs from rank 0" in r0["raised"]
    assert "parameter 'fc2.bias': rank 1 differs from rank 0" in r1["raised"]
    # the inner module's BatchNorm running statistics were updated with each rank's own batch
    assert {m["name"] for m in r0["inner"]["mismatches"]} == {"bn.running_mean", "bn.running_var"}
    assert r0["structure"]["problems"] == [
        "ranks 0 and 1 hold different tensors: only rank 0 has gradient 'fc1.bias'; only rank 1 has no gradient "
        "'fc1.bias'"]
    assert r0["structure"]["ok"] is False and r0["structure"]["checked"] == 0


def test_check_consistency_compares_shards_only_with_their_replicas(batch):
    r0, r1 = batch["dtensor"]
    assert r0["first"]["ok"] and r0["first"]["checked"] == 1 and r0["first"]["unreplicated"] == 1
    assert [m["name"] for m in r0["second"]["mismatches"]] == ["rep"]
    assert r0["second"]["mismatches"][0]["ranks"] == [1]
    assert r0["second"] == r1["second"]


def test_sync_rng_states_broadcasts_from_src(batch):
    r0, r1 = batch["sync"]
    assert r0["before"] != r1["before"]
    for source in ("torch", "python", "numpy"):
        assert r0[source] == r1[source], source
    torch.manual_seed(101)  # rank 1's seed: rank 0 now continues rank 1's stream
    torch.rand(2)
    assert r0["torch"] == torch.rand(3).tolist()


def test_dead_rank_gives_a_clear_error_not_a_hang(second_launch):
    r0, _ = second_launch["dead_rank"]
    assert r0["error_text"] is not None, "check_consistency returned although rank 1 was dead"
    assert r0["seconds"] < 20
    assert "check_consistency: the all-gather over ranks [0, 1] failed on rank 0 after" in r0["error_text"]
    assert "Another rank has exited or crashed before reaching it" in r0["error_text"]


def test_stuck_rank_times_out_at_the_limit(batch):
    r0, _ = batch["stuck_rank"]
    assert r0["error_text"] is not None, "check_consistency returned although rank 1 never called it"
    assert 1.5 < r0["seconds"] < 5.5, r0["seconds"]
    assert "the all-gather over ranks [0, 1] did not complete on rank 0 within 2s" in r0["error_text"]
    assert "Another rank has exited, crashed, or is stuck before reaching it" in r0["error_text"]
    assert r0["ranks"] == [0, 1]
    assert "TORCHREPRO_DIST_TIMEOUT" in r0["error_text"]


def test_watch_checks_ranks_every_n_steps(batch):
    r0, r1 = batch["watch"]
    for res in (r0, r1):
        events = res["ranks_events"]
        assert [(e["step"], e["ok"]) for e in events] == [(2, True), (4, False)]
        assert [(m["name"], m["ranks"]) for m in events[1]["mismatches"]] == [("weight", [1])]
        assert any("ranks [0, 1] disagree at step 4" in w and "parameter 'weight': rank 1 differs from rank 0" in w
                   for w in res["warnings"]), res["warnings"]


def test_single_process_check_and_seeding_unchanged():
    report = trd.check_consistency(nn.Linear(2, 2), step=1)
    assert report.ok and report.ranks == (0,) and report.checked == 0
    torchrepro.seed_everything(5)
    assert trd.rng_streams()["switch"] == "none" and trd.rng_streams()["init"] == 5
    a = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(a, torch.rand(3))  # exactly the old single-process seeding
    with pytest.raises(ValueError, match="unknown stream\\(s\\) 'weights'"):
        torchrepro.seed_everything(5, shared=("weights",))
    with pytest.raises(ValueError, match="choose from"):
        trd.check_consistency(nn.Linear(2, 2), what=("weights",))


def test_rank_seeds_and_explicit_rank():
    assert trd.rank_seed(3, "augment", rank=0) != trd.rank_seed(3, "augment", rank=1)
    g0, g1 = trd.rank_generator(3, rank=0), trd.rank_generator(3, rank=1)
    assert not torch.equal(torch.rand(4, generator=g0), torch.rand(4, generator=g1))
    torchrepro.seed_everything(9, rank=3)  # an explicit rank turns the scheme on in one process
    streams = trd.rng_streams()
    assert streams["rank"] == 3 and streams["switch"] == "pending" and os.environ["TORCHREPRO_STREAM_RANK"] == "3"
    target = trd.start_rank_streams()
    assert target == torchrepro.derive_seed(9, "dropout", "rank", 3) == torch.initial_seed()
    assert trd.rng_streams()["switch"] == "switched"
    nn.Linear(1, 1)(torch.ones(1))  # no pending hook is left to switch again
    assert torch.initial_seed() == target


def test_public_functions_survive_importing_their_submodules():
    """Importing the modules that define ``fingerprint`` and ``audit`` leaves ``torchrepro.fingerprint`` and
    ``torchrepro.audit`` the functions (the package's lazy attributes are not shadowed by submodules)."""
    proc = run_python("import torchrepro.distributed.ranks, torchrepro._core.fingerprint, torchrepro.env.audit\n"
                      "import torchrepro\n"
                      "print(callable(torchrepro.fingerprint), callable(torchrepro.audit))")
    assert proc.returncode == 0 and proc.stdout.split() == ["True", "True"], proc.stderr


def test_collective_timeout_sources(monkeypatch):
    assert trd.collective_timeout(3).total_seconds() == 3
    monkeypatch.setenv("TORCHREPRO_DIST_TIMEOUT", "12.5")
    assert trd.collective_timeout().total_seconds() == 12.5
    monkeypatch.setenv("TORCHREPRO_DIST_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TORCHREPRO_DIST_TIMEOUT='soon' is not a number"):
        trd.collective_timeout()
    with pytest.raises(ValueError, match="positive"):
        trd.collective_timeout(0)


# --- the sharded ResumableLoader ------------------------------------------------------------------------------
def _indices(loader: torchrepro.ResumableLoader) -> list[int]:
    return [int(i) for batch in loader for i in batch]


@pytest.mark.parametrize("n", [24, 23])
def test_loader_shards_are_disjoint_complete_and_equal_sized(n):
    shards = [_indices(torchrepro.ResumableLoader(range(n), batch_size=4, seed=5, num_replicas=3, rank=r))
              for r in range(3)]
    assert len({len(s) for s in shards}) == 1 == len({len(torchrepro.ResumableLoader(
        range(n), batch_size=4, seed=5, num_replicas=3, rank=r)) for r in range(3)})
    everything = [i for s in shards for i in s]
    assert sorted(set(everything)) == list(range(n))  # complete
    assert len(everything) - n == (-n) % 3  # disjoint but for the padding (DistributedSampler's)
    whole = _indices(torchrepro.ResumableLoader(range(n), batch_size=4, seed=5, num_replicas=1, rank=0))
    assert everything != whole and sorted(whole) == list(range(n))


def test_loader_shard_resumes_mid_epoch_and_refuses_another_rank():
    class Aug(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 20

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.tensor([float(i)]) + torch.rand(1)

    straight = torchrepro.ResumableLoader(Aug(), batch_size=3, seed=1, num_replicas=2, rank=1)
    expected = [b for _, b in zip(range(6), iter(lambda: straight.next_batch(), None))]
    first = torchrepro.ResumableLoader(Aug(), batch_size=3, seed=1, num_replicas=2, rank=1)
    got = [first.next_batch() for _ in range(2)]
    state = first.state_dict()
    assert state["num_replicas"] == 2 and state["rank"] == 1
    resumed = torchrepro.ResumableLoader(Aug(), batch_size=3, seed=1, num_replicas=2, rank=1)
    resumed.load_state_dict(state)
    got += [resumed.next_batch() for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected)) and len(got) == len(expected)
    other = torchrepro.ResumableLoader(Aug(), batch_size=3, seed=1, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="loader state has rank=1 but this loader has 0"):
        other.load_state_dict(state)
    # sample randomness depends on the position in the whole epoch, not on the rank that loads it
    r0 = torchrepro.ResumableLoader(Aug(), batch_size=10, seed=1, num_replicas=2, rank=0, shuffle=False)
    whole = torchrepro.ResumableLoader(Aug(), batch_size=20, seed=1, num_replicas=1, rank=0, shuffle=False)
    assert torch.equal(next(iter(r0)), next(iter(whole))[0::2])


def test_loader_takes_ranks_from_the_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    loader = torchrepro.ResumableLoader(range(8), batch_size=2, seed=0)
    assert (loader.num_replicas, loader.rank, len(loader)) == (2, 1, 2)
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 1\]"):
        torchrepro.ResumableLoader(range(8), num_replicas=2, rank=2)


# --- bitwise resume of a 2-rank DDP run --------------------------------------------------------------------------
def torchrun(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *args], capture_output=True, text=True, timeout=timeout, cwd=str(ROOT), env=env)


def test_ddp_resume_is_bitwise_equal_to_the_straight_run(tmp_path):
    """The straight run saves per-rank checkpoints at step 4 (saving draws no random number) and goes on to step 8;
    new processes resume from step 4 and must end with bitwise the same weights and dropout masks on each rank."""
    script = str(SCRIPTS / "ddp_train.py")
    for name in ("straight", "resumed"):
        (tmp_path / name).mkdir()
    p = torchrun(script, "--steps", "8", "--save", str(tmp_path / "ckpt"), "--save-at", "4",
                 "--out", str(tmp_path / "straight"))
    assert p.returncode == 0, p.stderr[:2000] + "\n...\n" + p.stderr[-2000:]
    p = torchrun(script, "--steps", "8", "--resume", str(tmp_path / "ckpt"), "--out", str(tmp_path / "resumed"))
    assert p.returncode == 0, p.stderr[:2000] + "\n...\n" + p.stderr[-2000:]
    for rank in (0, 1):
        straight, resumed = (json.loads((tmp_path / d / f"rank{rank}.json").read_text())
                             for d in ("straight", "resumed"))
        assert len(resumed["masks"]) == 4
        assert resumed["masks"] == straight["masks"][4:], f"rank {rank}: dropout masks after the resume differ"
        assert resumed["final"] == straight["final"], f"rank {rank}: resumed weights differ from the straight run"
        assert resumed["streams"]["switch"] == "skipped"  # the restored per-rank RNG state was kept
    r0, r1 = (json.loads((tmp_path / "straight" / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["final"] == r1["final"]
    assert all(a != b for a, b in zip(r0["masks"], r1["masks"]))
