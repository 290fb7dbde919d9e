"""The recorder's settings objects (record/settings.py): the flat keyword arguments the recorder took before them
map onto the same objects, a bad value is refused by name before anything is written, and they survive JSON
(how launch options reach the child) and pickling."""

from __future__ import annotations

import dataclasses
import inspect
import json
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

import torchrepro
from torchrepro.record.recorder import DEFAULT_VALUES_BUDGET, Recorder, sampled_step
from torchrepro.record.resumeat import ResumePlan
from torchrepro.record.settings import (
    FLAT_KEYWORDS,
    RecorderSettings,
    ResumeMarks,
    StopSettings,
    TraceSettings,
    ValueSettings,
)

DIVERGENCE = {"runs": ["a", "b"], "me": 1, "after": 2}
FLAT = dict(keep_values=True, values_budget=1 << 20, value_schedule="sampled", grad_value_steps=3,
            grad_value_start=5, trace_steps=(0, 2), trace_mode="backward", resume_marks=True, boundary_after=4,
            stop_after=4, max_steps=9, divergence=DIVERGENCE)
OBJECTS = dict(values=ValueSettings(keep=True, budget=1 << 20, schedule="sampled", grad_steps=3, grad_start=5),
               trace=TraceSettings(steps=(0, 2), mode="backward"),
               resume=ResumeMarks(enabled=True, boundary_after=4, stop_after=4),
               stop=StopSettings(max_steps=9, divergence=DIVERGENCE))
# what the recorder does with its settings: the attributes it reads as it records
ATTRIBUTES = ("max_steps", "trace_steps", "trace_mode", "timing", "check_ranks_every", "grad_value_steps",
              "grad_value_start", "resume_marks", "boundary_after", "stop_after", "divergence")


def _configuration(rec: Recorder) -> dict:
    try:
        return {**{name: getattr(rec, name) for name in ATTRIBUTES}, "settings": rec.settings,
                "values_budget": rec.values.budget if rec.values is not None else None,
                "snapshot_steps": [n for n in range(1, 80) if rec._snapshot_due(n)],
                "marks": rec.marks is not None, "tracer": rec._tracer is not None}
    finally:
        rec.finish()


def test_the_flat_keywords_and_the_settings_objects_configure_the_same_recorder(tmp_path):
    flat = _configuration(Recorder(tmp_path / "flat", timing=True, check_ranks_every=2, **FLAT))
    objects = _configuration(Recorder(tmp_path / "objects", timing=True, check_ranks_every=2, **OBJECTS))
    assert flat == objects
    assert flat["settings"] == RecorderSettings(**OBJECTS, timing=True, check_ranks_every=2)
    assert flat["trace_steps"] == (0, 2) and flat["grad_value_start"] == 5 and flat["values_budget"] == 1 << 20
    assert flat["snapshot_steps"] == [n for n in range(1, 80) if sampled_step(n)] and flat["marks"] and flat["tracer"]


def test_defaults_are_the_same_either_way_and_mixed_groups_combine(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHREPRO_GRAD_VALUE_STEPS", "2")  # grad_steps=None: the environment's, read by the recorder
    default = _configuration(Recorder(tmp_path / "a"))
    assert default["settings"] == RecorderSettings() and default["grad_value_steps"] == 2
    assert default["values_budget"] is None and not default["marks"] and not default["tracer"]
    assert RecorderSettings().values.budget == DEFAULT_VALUES_BUDGET
    # one group as an object, another as flat keywords: each maps on its own
    mixed = Recorder(tmp_path / "b", values=ValueSettings(keep=True), max_steps=3, trace_steps=[1, 1])
    assert mixed.settings == RecorderSettings(values=ValueSettings(keep=True), stop=StopSettings(max_steps=3),
                                              trace=TraceSettings(steps=(1, 1)))
    mixed.finish()


def test_watch_builds_its_recorder_from_the_settings_objects(tmp_path):
    w = torchrepro.watch(nn.Linear(2, 2), run_dir=tmp_path / "w", max_steps=4, check_ranks_every=3)
    assert w.recorder.settings == RecorderSettings(values=ValueSettings(keep=True), stop=StopSettings(max_steps=4),
                                                   check_ranks_every=3)
    assert w.recorder.max_steps == 4
    w.recorder.finish()


def test_every_flat_keyword_of_the_recorder_maps_onto_a_setting():
    params = inspect.signature(Recorder.__init__).parameters
    flat = {name for name in params if name not in ("self", "run_dir", "models", "values", "trace", "resume", "stop",
                                                    "timing", "check_ranks_every")}
    assert flat == set(FLAT_KEYWORDS) == set(FLAT)
    for keyword, (group, name) in FLAT_KEYWORDS.items():
        assert getattr(getattr(RecorderSettings.build(**{keyword: FLAT[keyword]}), group), name) == \
            (tuple(FLAT[keyword]) if keyword == "trace_steps" else FLAT[keyword])


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"value_schedule": "often"}, ValueError,
     r"ValueSettings\.schedule \(value_schedule\) must be one of \['every', 'sampled'\], got 'often'"),
    ({"values_budget": -1}, ValueError, r"ValueSettings\.budget \(values_budget\) must be an int >= 0 \(bytes\)"),
    ({"keep_values": "yes"}, TypeError, r"ValueSettings\.keep \(keep_values\) must be True or False, got 'yes'"),
    ({"grad_value_steps": 1.5}, TypeError, r"ValueSettings\.grad_steps \(grad_value_steps\) must be an int or None"),
    ({"grad_value_start": 0}, ValueError, r"ValueSettings\.grad_start \(grad_value_start\) must be an int >= 1"),
    ({"trace_steps": (3, 1)}, ValueError, r"TraceSettings\.steps \(trace_steps\) must be \(first, last\) with 0 <="),
    ({"trace_steps": 3}, TypeError, r"TraceSettings\.steps \(trace_steps\) must be a pair of ints"),
    ({"trace_mode": "epoch"}, ValueError, r"TraceSettings\.mode \(trace_mode\) must be one of \['optimizer', 'ba"),
    ({"boundary_after": -1}, ValueError, r"ResumeMarks\.boundary_after must be an int >= 0, got -1"),
    ({"resume_marks": 1}, TypeError, r"ResumeMarks\.enabled \(resume_marks\) must be True or False, got 1"),
    ({"max_steps": True}, TypeError, r"StopSettings\.max_steps must be an int or None, got True"),
    ({"divergence": ["a"]}, TypeError, r"StopSettings\.divergence must be a dict"),
    ({"check_ranks_every": -2}, ValueError, r"RecorderSettings\.check_ranks_every must be an int >= 0, got -2"),
    ({"timing": None}, TypeError, r"RecorderSettings\.timing must be True or False, got None"),
    ({"values": {"keep": True}}, TypeError, r"RecorderSettings\.values must be a ValueSettings, got \{'keep': True\}"),
    ({"values": ValueSettings(), "keep_values": True}, TypeError,
     r"got both values=ValueSettings\(\.\.\.\) and keep_values=; give keep=True inside the ValueSettings"),
    ({"stop": StopSettings(), "max_steps": 3}, TypeError, r"got both stop=StopSettings\(\.\.\.\) and max_steps="),
])
def test_a_bad_setting_is_refused_by_name_before_anything_is_written(tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        Recorder(tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()  # checked before the run directory (or the value writer) is made


def test_the_objects_check_their_fields_as_they_are_made():
    with pytest.raises(ValueError, match=r"ValueSettings\.budget \(values_budget\) must be an int >= 0"):
        ValueSettings(budget=-5)
    with pytest.raises(TypeError, match=r"TraceSettings\.steps \(trace_steps\) must be a pair of ints"):
        TraceSettings(steps=(1, 2, 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ResumeMarks\.stop_after must be an int >= 0"):
        ResumeMarks(stop_after=-1)
    with pytest.raises(TypeError):
        ValueSettings(True)  # type: ignore[misc]  # keyword-only: a bare True says nothing
    with pytest.raises(dataclasses.FrozenInstanceError):
        ValueSettings().keep = True  # type: ignore[misc]
    assert ValueSettings(schedule="sampled").due(18) and not ValueSettings(schedule="sampled").due(17)
    assert TraceSettings(steps=[2, 5]).steps == (2, 5)


ALL = [ValueSettings(keep=True, budget=7, schedule="sampled", grad_steps=2, grad_start=3),
       TraceSettings(steps=(1, 4), mode="backward"), ResumeMarks(enabled=True, boundary_after=0, stop_after=2),
       StopSettings(max_steps=5, divergence=DIVERGENCE),
       RecorderSettings(**OBJECTS, timing=True, check_ranks_every=4), RecorderSettings()]


@pytest.mark.parametrize("settings", ALL, ids=lambda s: type(s).__name__)
def test_json_and_pickle_give_the_same_settings_back(settings):
    text = json.dumps(settings.to_json())
    assert type(settings).from_json(json.loads(text)) == settings
    # LaunchOptions travel as json.dumps(dataclasses.asdict(opts)): that form reads back too
    assert type(settings).from_json(json.loads(json.dumps(dataclasses.asdict(settings)))) == settings
    assert settings.to_json() == json.loads(json.dumps(dataclasses.asdict(settings)))
    assert pickle.loads(pickle.dumps(settings)) == settings


def test_from_json_fills_defaults_and_refuses_unknown_or_bad_keys():
    assert RecorderSettings.from_json({}) == RecorderSettings()
    assert RecorderSettings.from_json({"values": {"keep": True}}) == RecorderSettings(values=ValueSettings(keep=True))
    with pytest.raises(ValueError, match=r"unknown ValueSettings setting\(s\) \['keep_values'\]"):
        ValueSettings.from_json({"keep_values": True})
    with pytest.raises(ValueError, match=r"unknown RecorderSettings setting\(s\) \['max_steps'\]"):
        RecorderSettings.from_json({"max_steps": 3})
    with pytest.raises(ValueError, match=r"TraceSettings\.mode \(trace_mode\) must be one of"):
        RecorderSettings.from_json({"trace": {"mode": "epoch"}})
    with pytest.raises(TypeError, match="needs a dict"):
        StopSettings.from_json([("max_steps", 3)])  # type: ignore[arg-type]


@pytest.mark.parametrize(("phase", "grad_start", "boundary", "stop"), [
    ("straight", 5, 4, None), ("stop", 1, None, 4), ("resume", 1, 0, None)])
def test_resume_plan_gives_its_marks_and_the_first_gradient_snapshot(phase, grad_start, boundary, stop):
    values = ValueSettings(keep=True, schedule="sampled", grad_steps=3)
    got_values, marks = ResumePlan(phase, 4, "ckpt").recorder_settings(values)
    assert got_values == dataclasses.replace(values, grad_start=grad_start)
    assert marks == ResumeMarks(enabled=True, boundary_after=boundary, stop_after=stop)


def test_a_recorder_built_from_settings_records_as_before(tmp_path):
    """The settings reach the recording: sampled snapshots, gradient snapshots from grad_start, the stop."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(tmp_path / "r", models={"": model}, values=ValueSettings(keep=True, grad_steps=2, grad_start=2),
                   stop=StopSettings(max_steps=3)).install()
    with pytest.raises(SystemExit):
        for _ in range(10):
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
    summary = rec.finish()
    assert summary["steps"] == 3 and summary["stopped_at_max_steps"]
    saved = set(summary["values_saved"])
    assert {"init", "step_000001", "step_000003", "final", "grads_000002", "grads_000003"} <= saved
    assert "grads_000001" not in saved and Path(tmp_path / "r" / "values" / "grads_000002.pt").is_file()


def test_launch_options_travel_to_the_child_as_json_and_back():
    """The child rebuilds the launcher's options from JSON (launcher.child_env): every group comes back equal."""
    import json

    from torchrepro.record.launcher import CONFIG_ENV, child_env
    from torchrepro.record.options import LaunchOptions, RankOptions, WorkdirOptions

    opts = LaunchOptions(record="/tmp/r", seed=3, max_steps=4, values=ValueSettings(keep=True, schedule="sampled"),
                         trace=TraceSettings(steps=(1, 2), mode="backward"),
                         ranks=RankOptions(nproc_per_node=2, nnodes=2, node_rank=1, rendezvous=["--rdzv=x"],
                                           static=False, output=True),
                         workdir=WorkdirOptions(cwd="/tmp", watch_since_ns=5))
    sent = json.loads(child_env(opts)[CONFIG_ENV])
    assert LaunchOptions.from_json(sent) == opts
    with pytest.raises(TypeError, match=r"LaunchOptions\.ranks must be a RankOptions, got \{'nproc_per_node': 2\}"):
        LaunchOptions(ranks={"nproc_per_node": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"RankOptions\.nproc_per_node must be an int >= 1, got 0"):
        RankOptions(nproc_per_node=0)
