"""Shards and random draws against their placements (``analysis/shardcheck``, ``record/draws``): on hand-made traces
and with the draw watch run in this process. The end-to-end checks under torchrun are in test_dtensor_cli.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from torchrepro.analysis.rankcompare import layouts_at
from torchrepro.analysis.shardcheck import broken_shards as _broken_shards
from torchrepro.analysis.shardcheck import draw_problems, placement_problems
from torchrepro.record.draws import DRAW_STEPS_ENV, DrawWatch, draw_steps
from torchrepro.record.store import Run, event_problems


def _lay(placements: list[str], coord: list[int], mesh: list[int]) -> dict[str, Any]:
    return {"placements": placements, "mesh_shape": mesh, "mesh_dim_names": None, "coordinate": coord,
            "mesh_id": "m0", "shape": [4, 4]}


def _run(events: list[dict[str, Any]]) -> Run:
    assert all(not event_problems(e) for e in events), [event_problems(e) for e in events]
    return Run(Path("r"), {}, events)


def _init(r: int, params: dict[str, str], placements: dict[str, list[str]],
          constant: list[str] | None) -> dict[str, Any]:
    event: dict[str, Any] = {"kind": "init", "params": params,
                             "layouts": {"params": {n: _lay(p, [r], [2]) for n, p in placements.items()}}}
    if constant is not None:
        event["constant"] = constant
    return event


def broken_shards(runs: list[Run]) -> Any:
    return _broken_shards(runs, [layouts_at(r) for r in runs])


FP = ["a" * 32, "b" * 32, "c" * 32]


def test_equal_shards_of_a_tensor_that_is_not_constant_are_a_broken_shard() -> None:
    shard = {"w": ["Shard(0)"], "z": ["Shard(0)"], "r": ["Replicate()"]}
    # w: equal shards, not constant -> broken; z: equal constant shards (a zero bias) -> fine; r: a replica
    runs = [_run([_init(r, {"w": FP[0], "z": FP[1], "r": FP[2]}, shard, ["z"])]) for r in range(2)]
    p = broken_shards(runs)
    assert p is not None and (p.kind, p.step, p.name, p.ranks, p.placements) == (
        "broken-shard", 0, "w", [0, 1], ["Shard(0)"])
    assert p.describe() == ("run 1: broken shard in the initial parameters: w [Shard(0) on mesh (2,)] has bitwise "
                            "identical shards on ranks 0 and 1 although the tensor is not constant")
    fine = [_run([_init(r, {"w": FP[r], "z": FP[1]}, shard, ["z"])]) for r in range(2)]
    assert broken_shards(fine) is None
    legacy = [_run([_init(r, {"w": FP[0]}, shard, None)]) for r in range(2)]  # recorded before "constant"
    assert broken_shards(legacy) is None
    one_shard = [_run([{"kind": "init", "params": {"w": FP[0]}, "constant": [], "layouts": {"params": {
        "w": _lay(["Replicate()", "Shard(0)"], [r, 0], [2, 1])}}}]) for r in range(2)]
    assert broken_shards(one_shard) is None  # a (2, 1) mesh: both ranks hold the one shard


def _draw(op: str, site: str, fp: str, *, i: int = 0, inp: str | None = None, lay: dict[str, Any] | None = None,
          const: bool = False, step: int = 1) -> dict[str, Any]:
    return {"kind": "draw", "during_step": step, "op": op, "site": site, "i": i, "fp": fp, "const": const,
            "in": inp, "layout": lay}


def test_draws_are_judged_by_their_placement_or_their_module_input() -> None:
    def runs(*per_rank: list[dict[str, Any]]) -> list[Run]:
        return [_run(d) for d in per_rank]

    # other inputs (shards of an activation, other data): equal masks are correlated; different ones are fine
    problems, n = draw_problems(runs([_draw("bernoulli_", "drop", FP[0], inp=FP[1])],
                                     [_draw("bernoulli_", "drop", FP[0], inp=FP[2])]))
    assert n == 1 and [(p.kind, p.name, p.site, p.index, p.ranks) for p in problems] == [
        ("correlated", "bernoulli_", "drop", 0, [0, 1])]
    assert problems[0].describe() == ("run 1: correlated random numbers: bernoulli_ #0 in drop during step 1 drew "
                                      "bitwise identical values on ranks 0 and 1, which hold different inputs")
    assert draw_problems(runs([_draw("bernoulli_", "drop", FP[0], inp=FP[1])],
                              [_draw("bernoulli_", "drop", FP[1], inp=FP[2])]))[0] == []
    # a constant draw (p=0 or 1) says nothing
    assert draw_problems(runs([_draw("bernoulli_", "drop", FP[0], inp=FP[1], const=True)],
                              [_draw("bernoulli_", "drop", FP[0], inp=FP[2], const=True)]))[0] == []
    # equal inputs (a replicated region): the draws must agree
    problems, _ = draw_problems(runs([_draw("bernoulli_", "drop2", FP[0], inp=FP[1])],
                                     [_draw("bernoulli_", "drop2", FP[2], inp=FP[1])]))
    assert [(p.kind, p.ranks) for p in problems] == [("replicas-drew", [0, 1])]
    assert "which hold bitwise equal inputs" in problems[0].describe()
    # DTensors: by placement; shards must differ, replicas agree
    shard = [_lay(["Shard(0)"], [r], [2]) for r in range(2)]
    problems, _ = draw_problems(runs([_draw("uniform_", "", FP[0], lay=shard[0])],
                                     [_draw("uniform_", "", FP[0], lay=shard[1])]))
    assert [(p.kind, p.placements) for p in problems] == [("correlated", ["Shard(0)"])]
    assert problems[0].describe() == ("run 1: correlated random numbers: uniform_ #0 outside any module's forward by "
                                      "the end of step 1 [Shard(0) on mesh (2,)] drew bitwise identical values on "
                                      "ranks 0 and 1, which hold other shards")
    rep = [_lay(["Replicate()"], [r], [2]) for r in range(2)]
    problems, _ = draw_problems(runs([_draw("bernoulli_", "", FP[0], lay=rep[0])],
                                     [_draw("bernoulli_", "", FP[1], lay=rep[1])]))
    assert [p.kind for p in problems] == ["replicas-drew"]
    # plain draws outside any forward (initialisation, data) are not judged; the first of each kind, with a count
    assert draw_problems(runs([_draw("randn", "", FP[0])], [_draw("randn", "", FP[0])])) == ([], 0)
    many = [[_draw("bernoulli_", "drop", FP[0], inp=FP[r + 1], i=i) for i in range(3)] for r in range(2)]
    problems, n = draw_problems(runs(*many))
    assert n == 3 and len(problems) == 1 and problems[0].more == 2 and problems[0].describe().endswith("(+2 more)")
    assert placement_problems(runs(*many), [layouts_at(r) for r in runs(*many)])[1] == 3
    assert placement_problems([runs(*many)[0]], [({}, [])]) == ([], 0)  # one rank: nothing to compare


class _Recorder:
    """What a DrawWatch reads of its recorder."""

    def __init__(self) -> None:
        self.steps = 0
        self.backward_calls = 0
        self.forked = False
        self._models: dict[str, nn.Module] | None = None
        self.events: list[dict[str, Any]] = []
        self.trace = self

    def write(self, event: dict[str, Any]) -> None:
        self.events.append(event)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.drop(self.fc(x)) + torch.randn_like(x)
        return out


def test_the_draw_watch_is_off_in_one_process_and_records_draws_by_site_under_torchrun(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert draw_steps() == 0 and DrawWatch.from_env(_Recorder()) is None  # single process: nothing installed
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert draw_steps() == 2
    monkeypatch.setenv(DRAW_STEPS_ENV, "0")
    assert DrawWatch.from_env(_Recorder()) is None
    monkeypatch.setenv(DRAW_STEPS_ENV, "1")
    rec = _Recorder()
    net = _Net()
    rec._models = {"": net}
    watch = DrawWatch.from_env(rec)
    assert watch is not None
    watch.install()
    try:
        x = torch.ones(2, 4)
        net(x)
        torch.rand(3)  # outside any forward
        rec.steps = 1  # step 1 done: the next forward turns the watch off
        net(x)
        assert not watch.on
    finally:
        watch.uninstall()
    assert [(e["op"], e["site"], e["i"], e["during_step"], e["in"] is not None) for e in rec.events] == [
        ("bernoulli_", "drop", 0, 1, True), ("randn_like", "_Net", 0, 1, True), ("rand", "", 0, 1, False)]
    assert all(not event_problems(e) and e["layout"] is None and not e["const"] for e in rec.events)
    assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()  # the mode is gone
