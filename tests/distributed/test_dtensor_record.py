"""DTensors as torchrepro records them (``_core/dtensor``): fingerprint and values of the local shard, the layout
beside it, and the placement-aware comparison of ranks (``analysis/rankcompare``) on hand-made traces.

The end-to-end checks of FSDP2 and tensor-parallel scripts under torchrun are in test_dtensor_cli.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchrepro._core.dtensor import describe_layout, replica_key
from torchrepro._core.errors import RunsNotComparableError
from torchrepro.analysis.compare import CheckResult
from torchrepro.analysis.rankcompare import (
    RanksCheck,
    compare_rank_runs,
    layouts_at,
    rank_desync,
    shard_text,
    tensor_counts,
)
from torchrepro.record.store import Run, event_problems

from ..conftest import run_python

# One process, a world of one rank (gloo): real DTensors on a (1,) and a (1, 1) mesh.
_REAL = r'''
import datetime, io, json, os, sys, tempfile, warnings
from pathlib import Path
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, Partial, distribute_tensor, DTensor
from torchrepro import fingerprint
from torchrepro._core.dtensor import LayoutTracker, layout, local_shards, local_tensor, placement_text
from torchrepro._core.fingerprint import fingerprint_many, fingerprint_object
from torchrepro.record.opvalues import OpValues
from torchrepro.record.store import load_values
from torchrepro._core.errors import RunDirError

tmp = Path(sys.argv[1])
dist.init_process_group("gloo", init_method=f"file://{tmp}/rdzv", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=30))
out = {}
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
mesh2 = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
full = torch.arange(12, dtype=torch.float32).reshape(4, 3)
w = torch.nn.Parameter(distribute_tensor(full, mesh, [Shard(0)]))
r2 = distribute_tensor(full, mesh2, [Replicate(), Shard(1)])
plain = torch.ones(3)
out["fp_is_local"] = fingerprint(w) == fingerprint(w.to_local()) == fingerprint(full)
out["many"] = fingerprint_many([w, plain, r2]) == [fingerprint(full), fingerprint(plain), fingerprint(r2.to_local())]
out["batch"] = fingerprint_object({"x": w}) == fingerprint_object({"x": full})
out["layout"] = layout(w)
out["layout2"] = layout(r2)
out["plain_layout"] = layout(plain)
out["placements"] = [placement_text(p) for p in (Shard(1), Replicate(), Partial())]
out["local_type"] = type(local_tensor(w)).__name__
out["local_shards"] = {k: type(v).__name__ for k, v in local_shards({"w": w, "p": plain}).items()}
tracker = LayoutTracker()
out["track1"] = tracker.fields(params={"w": w, "p": plain})
out["track2"] = tracker.fields(params={"w": w, "p": plain})
out["track3"] = tracker.fields(params={"w": w.redistribute(mesh, [Replicate()]), "p": plain})
out["track4"] = tracker.fields(params={"w": full, "p": plain})
# values: the local shard, loaded by the safe loader; a DTensor pickled whole is refused by name
torch.save({k: v.detach().to("cpu", copy=True) for k, v in local_shards({"w": w}).items()}, tmp / "ok.pt")
loaded = load_values(tmp / "ok.pt")
out["loaded"] = [type(loaded["w"]).__name__, loaded["w"].tolist() == full.tolist()]
torch.save({"w": w.detach()}, tmp / "whole.pt")
try:
    load_values(tmp / "whole.pt")
except RunDirError as exc:
    out["whole"] = str(exc)
keep = OpValues(budget=1 << 20)
keep.keep([w], [fingerprint(w)])
out["opvalues"] = [type(v).__name__ for v in keep.kept.values()]
keep.save(tmp / "op_values.pt")
out["opvalues_loaded"] = [type(v).__name__ for v in torch.load(tmp / "op_values.pt", weights_only=True).values()]
# the sharded parameters whose local shard is constant (the recorder's tracker only)
zero = distribute_tensor(torch.zeros(4, 3), mesh, [Shard(0)])
rep = distribute_tensor(torch.zeros(4, 3), mesh, [Replicate()])
out["constant"] = LayoutTracker(constant=True).fields(params={"w": w, "z": zero, "r": rep, "p": plain})["constant"]
out["constant_none"] = LayoutTracker(constant=True).fields(params={"r": rep, "p": plain}).get("constant")
out["constant_off"] = LayoutTracker().fields(params={"z": zero}).get("constant")
dist.destroy_process_group()
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("dtensor")
    p = run_python(_REAL, str(tmp), timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_dtensor_is_fingerprinted_by_its_local_shard(real: dict[str, Any]) -> None:
    assert real["fp_is_local"] and real["many"] and real["batch"]
    assert real["local_type"] == "Tensor" and real["local_shards"] == {"w": "Tensor", "p": "Tensor"}


def test_the_layout_says_placements_mesh_and_coordinate(real: dict[str, Any]) -> None:
    lay = real["layout"]
    assert {k: v for k, v in lay.items() if k != "mesh_id"} == {
        "placements": ["Shard(0)"], "mesh_shape": [1], "mesh_dim_names": ["dp"], "coordinate": [0], "shape": [4, 3]}
    assert len(lay["mesh_id"]) == 16
    assert real["layout2"]["placements"] == ["Replicate()", "Shard(1)"] and real["layout2"]["coordinate"] == [0, 0]
    assert real["layout2"]["mesh_id"] != lay["mesh_id"]
    assert real["plain_layout"] is None
    assert real["placements"] == ["Shard(1)", "Replicate()", "Partial(sum)"]
    assert describe_layout(lay) == "Shard(0) on mesh (dp=1) at (0,)"
    assert describe_layout(real["layout2"]) == "(Replicate(), Shard(1)) on mesh (replicate=1, shard=1) at (0, 0)"


def test_layouts_are_written_when_they_change(real: dict[str, Any]) -> None:
    assert list(real["track1"]["layouts"]["params"]) == ["w"]  # the plain tensor is never mentioned
    assert real["track2"] == {}  # unchanged: nothing
    assert real["track3"]["layouts"]["params"]["w"]["placements"] == ["Replicate()"]
    assert real["track4"] == {"layouts": {"params": {"w": None}}}  # a plain tensor now


def test_values_are_plain_local_shards_and_a_whole_dtensor_is_refused_by_name(real: dict[str, Any]) -> None:
    assert real["loaded"] == ["Tensor", True]
    assert "holds DTensors" in real["whole"] and "Record the run again" in real["whole"]
    assert real["opvalues"] == ["Tensor"] and real["opvalues_loaded"] == ["Tensor"]


def test_the_recorders_tracker_names_the_sharded_parameters_whose_shard_is_constant(real: dict[str, Any]) -> None:
    assert real["constant"] == ["z"]  # w: not constant; r: replicated; p: plain
    assert real["constant_none"] is None and real["constant_off"] is None


# --- the comparison of ranks, on hand-made traces ------------------------------------------------------------
def _lay(placements: list[str], coord: list[int], mesh: list[int], names: list[str] | None = None,
         mesh_id: str = "m0") -> dict[str, Any]:
    return {"placements": placements, "mesh_shape": mesh, "mesh_dim_names": names, "coordinate": coord,
            "mesh_id": mesh_id, "shape": [4, 4]}


def _run(params: dict[str, str], layouts: dict[str, Any] | None, *, step: dict[str, Any] | None = None,
         unreplicated: list[str] | None = None, step_layouts: dict[str, Any] | None = None) -> Run:
    init: dict[str, Any] = {"kind": "init", "params": params}
    if layouts:
        init["layouts"] = {"params": layouts}
    events = [init]
    if step is not None:
        event = {"kind": "step", "n": 1, **step}
        if step_layouts:
            event["layouts"] = step_layouts
        events.append(event)
    assert all(not event_problems(e) for e in events)
    return Run(Path("r"), {"unreplicated": unreplicated or []}, events)


COORDS = [[0, 0], [0, 1], [1, 0], [1, 1]]  # a (dp=2, tp=2) mesh: rank r at COORDS[r]
NAMES = ["dp", "tp"]


def _mesh_runs(values: dict[str, list[str]], placements: dict[str, list[str]]) -> list[Run]:
    return [_run({n: v[r] for n, v in values.items()},
                 {n: _lay(placements[n], COORDS[r], [2, 2], NAMES) for n in values if n in placements})
            for r in range(4)]


def test_a_replicated_dimension_must_agree_and_shards_may_differ() -> None:
    # "w" is (Replicate(), Shard(0)): ranks 0 and 2 hold tp-shard 0, ranks 1 and 3 tp-shard 1
    ok = _mesh_runs({"w": ["a", "b", "a", "b"], "s": ["1", "2", "3", "4"], "p": ["x", "y", "z", "t"],
                     "b": ["k", "k", "k", "k"]},
                    {"w": ["Replicate()", "Shard(0)"], "s": ["Shard(0)", "Shard(1)"],
                     "p": ["Replicate()", "Partial(sum)"]})
    assert rank_desync(ok) is None  # shards and partial sums differ by design
    bad = _mesh_runs({"w": ["a", "b", "a", "c"], "b": ["k", "k", "k", "k"]}, {"w": ["Replicate()", "Shard(0)"]})
    d = rank_desync(bad)
    assert d is not None and (d.step, d.kind, d.names, d.ranks, d.reference) == (0, "init", ["w"], [3], [1])
    assert d.coordinates == {1: [0, 1], 3: [1, 1]} and d.placements == ["Replicate()", "Shard(0)"]
    assert d.describe() == ("run 1: rank 3 differs from rank 1 in the initial parameters: initial parameters w "
                            "[(Replicate(), Shard(0)) on mesh (dp=2, tp=2); rank 3 at (1, 1), rank 1 at (0, 1)]")
    assert d.to_json()["coordinates"] == {1: [0, 1], 3: [1, 1]}
    plain = _mesh_runs({"b": ["k", "k", "j", "k"]}, {})
    d = rank_desync(plain)
    assert d is not None and d.ranks == [2] and d.reference == [0, 1, 3] and d.placements is None
    assert d.describe() == "run 1: rank 2 differs from rank 0 and rank 1 and rank 3 in the initial parameters: " \
                           "initial parameters b"


def test_replicas_on_other_meshes_are_not_compared() -> None:
    # FSDP on the dp sub-meshes of a 2-D mesh: ranks 0 and 1 are both at (0,) but of different meshes
    runs = [_run({"w": v}, {"w": _lay(["Shard(0)"], [c], [2], ["dp"], mesh_id=m)})
            for v, c, m in (("a", 0, "m02"), ("b", 0, "m13"), ("c", 1, "m02"), ("d", 1, "m13"))]
    assert rank_desync(runs) is None


def test_optimizer_state_follows_its_parameter_and_legacy_runs_use_unreplicated() -> None:
    def lay(r: int) -> dict[str, Any]:
        return {"w": _lay(["Replicate()"], [r], [2], ["tp"]), "s": _lay(["Shard(0)"], [r], [2], ["tp"])}

    runs = [_run({"w": "a", "s": str(r)}, lay(r), step={"params": {"w": "a", "s": str(r)}, "grads": {},
                                                       "state": {"w.step": "5" * 32, "s.step": "5" * 32,
                                                                 "s.exp_avg": f"{r}" * 32, "w.exp_avg": f"{r}" * 32}})
            for r in range(2)]
    d = rank_desync(runs)  # s.exp_avg follows Shard(0) "s": not compared; w.exp_avg follows Replicate() "w"
    assert d is not None and (d.step, d.kind, d.names, d.ranks) == (1, "state", ["w.exp_avg"], [1])
    assert d.placements == ["Replicate()"]
    legacy = [_run({"w": "a", "s": str(r)}, None, unreplicated=["s"]) for r in range(2)]
    assert rank_desync(legacy) is None
    legacy = [_run({"w": str(r), "s": str(r)}, None, unreplicated=["s"]) for r in range(2)]
    d = rank_desync(legacy)
    assert d is not None and d.names == ["w"] and d.placements is None


def test_layouts_carry_forward_and_tensors_are_counted() -> None:
    lay = _lay(["Shard(0)"], [1], [2])
    run = _run({"w": "a" * 32, "b": "b" * 32}, {"w": lay},
               step={"params": {"w": "c" * 32, "b": "unreadable: RuntimeError: x"}, "grads": {"w": "d" * 32, "b": None},
                     "state": {"w.exp_avg": "e" * 32, "w.step": "1.0"}},
               step_layouts={"grads": {"w": lay}, "state": {"w.exp_avg": lay}})
    init, steps = layouts_at(run)
    assert init == {"params": {"w": lay}} and steps == [{"params": {"w": lay}, "grads": {"w": lay},
                                                         "state": {"w.exp_avg": lay}}]
    assert tensor_counts(run) == {"compared": 4, "params": 2, "grads": 1, "state": 1, "dtensors": 3, "unreadable": 1}
    assert shard_text(lay) == "shard 1 of 2" and shard_text(_lay(["Replicate()"], [1], [2])) == "a replica"
    assert shard_text(_lay(["Shard(0)", "Shard(1)"], [1, 1], [2, 3])) == "shard 4 of 6"
    assert replica_key(_lay(["Partial(sum)"], [0], [2])) is None and replica_key(None) == ("plain",)


def test_malformed_layouts_are_refused() -> None:
    assert event_problems({"kind": "init", "layouts": {"params": {"w": {"placements": ["Shard(0)"], "mesh_shape": [2],
                                                                         "coordinate": ["x"], "mesh_id": "m",
                                                                         "shape": [4]}}}})
    assert event_problems({"kind": "init", "layouts": {"params": {"w": {"placements": ["Shard(0)"],
                                                                         "mesh_shape": [2, 2], "mesh_id": "m",
                                                                         "shape": [4]}}}})
    assert event_problems({"kind": "init", "layouts": {"weights": {}}})
    assert event_problems({"kind": "init", "layouts": {"params": {"w": 3}}})
    assert not event_problems({"kind": "init", "layouts": {"params": {"w": None}}})


def _result(verdict: str, first_step: int | None) -> CheckResult:
    return CheckResult(verdict=verdict, runs=["a", "b"], step_mode="optimizer", steps=[4, 4], first_step=first_step)


def test_the_lead_is_the_rank_that_diverged_first() -> None:
    check = RanksCheck(3, [_result("diverged", 3), _result("diverged", 2), _result("diverged", 2)], [None] * 2)
    assert check.lead[0] == 1
    assert RanksCheck(2, [_result("identical", None), _result("identical", None)], [None]).lead[0] == 0


def test_runs_with_other_layouts_are_not_compared() -> None:
    a = [_run({"w": "a"}, {"w": _lay(["Shard(0)"], [r], [2])}) for r in range(2)]
    b = [_run({"w": "a"}, {"w": _lay(["Shard(1)"], [r], [2])}) for r in range(2)]
    with pytest.raises(RunsNotComparableError, match=r"rank 0: w is Shard\(0\) on mesh \(2,\) at \(0,\) \(global "
                       r"shape \(4, 4\)\) in run 1 and Shard\(1\) on mesh \(2,\) at \(0,\) .* in run 2"):
        compare_rank_runs([a, b])
