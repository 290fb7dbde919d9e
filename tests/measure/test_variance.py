"""`torchrepro variance`, its statistics, and log_metric: verdicts on scripts whose answer is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import torchrepro
from torchrepro.cli import main
from torchrepro.control.seeding import derive_seed
from torchrepro.measure.variance import (
    GroupStats,
    TimeStats,
    analyze_variance,
    min_detectable_difference,
    overhead_ci,
    t_quantile,
)
from torchrepro.record.store import read_trace_lines

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
# parameters updated by hand (no torch.optim, whose first use imports torch._dynamo: about 1 CPU s a run): what
# variance reads is the metric and the parameters
TINY = ["python", str(SCRIPTS / "bench_tiny.py"), "--manual", "--steps", "10"]
needs_threads = pytest.mark.skipif(torch.get_num_threads() < 2, reason="CPU nondeterminism needs 2+ torch threads")


def variance(capsys, out: Path, *args: str, command: list[str] = TINY, as_json: bool = True) -> tuple[int, dict, str]:
    rc = main(["variance", *(["--json"] if as_json else []), "--out", str(out), *args, "--", *command])
    captured = capsys.readouterr()
    return rc, json.loads(captured.out) if as_json else {}, captured.out if not as_json else captured.err


# --- the command on scripts with known answers ---------------------------------------------------------
def test_seeded_script_has_zero_implementation_spread(tmp_path, capsys):
    out = tmp_path / "out"
    rc, doc, _ = variance(capsys, out, "--runs", "2", "--seeds", "2", "--metric", "acc")
    assert rc == 0
    assert doc["schema"] == "torchrepro.variance/1" and doc["value"] == "metric 'acc'"
    assert doc["verdict"] == "deterministic" and doc["final_params_identical"] is True
    same, seeds = doc["same_seed"], doc["seeds"]
    assert same["seeds"] == [0, 0] and seeds["seeds"] == [derive_seed(0, "variance", i) for i in (1, 2)]
    assert same["std"] == 0 and same["identical"] and doc["ratio"] == 0
    assert seeds["std"] > 0 and not seeds["identical"]
    assert doc["detectable_same_seed"] == {"n": 2, "difference": 0.0}
    assert [d["n"] for d in doc["detectable"]] == [2, 3, 5, 10, 20]
    assert all(a["difference"] > b["difference"] > 0 for a, b in zip(doc["detectable"], doc["detectable"][1:]))
    assert doc["detectable"][0]["difference"] == pytest.approx(min_detectable_difference(seeds["std"], 2))
    assert "Welch" in doc["test"] and doc["alpha"] == 0.05 and doc["power"] == 0.8
    # the groups alternate, and each value is the last 'acc' the run logged
    assert list(doc["runs"].values()) == ["run1", "run2", "run3", "run4"]
    labels = list(doc["runs"])
    assert labels == ["seed 0, run 1", f"seed {seeds['seeds'][0]}", "seed 0, run 2", f"seed {seeds['seeds'][1]}"]
    logged = {label: [e for e in read_trace_lines(out / name)[0] if e["kind"] == "metric"]
              for label, name in doc["runs"].items()}
    assert all(len(events) == 2 and events[-1]["step"] == 10 for events in logged.values())
    assert same["values"] == [float.fromhex(logged[lbl][-1]["value"]) for lbl in labels[::2]]
    assert seeds["values"] == [float.fromhex(logged[lbl][-1]["value"]) for lbl in labels[1::2]]
    assert doc["initial_params_same_across_seeds"] is False
    assert Path(doc["plot"]).is_file() and json.loads((out / "variance.json").read_text()) == doc


def test_a_script_that_seeds_itself_is_seed_insensitive(tmp_path, capsys):
    rc, _, text = variance(capsys, tmp_path / "out", "--runs", "2", "--seeds", "2", command=[*TINY, "--fixed-seed"],
                           as_json=False)
    assert rc == 0
    assert "Verdict: seed-insensitive - the value does not change with the seed torchrepro gives the script." in text
    assert "TORCHREPRO_SEED" in text and "final loss" in text
    assert "final parameters of the same-seed runs: bitwise identical" in text
    assert "Note: the initial weights are bitwise identical for every seed" in text


@needs_threads
def test_scatter_add_training_has_same_seed_spread(tmp_path, capsys):
    rc, doc, _ = variance(capsys, tmp_path / "out", "--runs", "2", "--seeds", "2", "--metric", "val_mse",
                          command=["python", str(SCRIPTS / "variance_scatter.py"), "2"])
    assert rc == 0
    assert doc["value"] == "metric 'val_mse'" and doc["final_params_identical"] is False
    assert doc["same_seed"]["std"] > 0 and not doc["same_seed"]["identical"]
    assert doc["verdict"] in ("same-band", "seed-dominated") and doc["detectable_same_seed"]["difference"] > 0
    assert doc["initial_params_same_across_seeds"] is False and doc["seeds"]["std"] > doc["same_seed"]["std"]


def test_bad_input_exits_2_with_the_reason(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["variance", "--out", str(out), "--runs", "2", "--seeds", "2", "--metric", "val_acc", "--", *TINY])
    err = capsys.readouterr().err
    assert rc == 2
    assert "run 1 of 4 (seed 0, run 1) never logged metric 'val_acc' (it logged 'acc'). Call " \
           "torchrepro.log_metric('val_acc', value) in the script, or leave out --metric" in err
    assert not (out / "run2").exists()  # stopped at once
    rc = main(["variance", "--out", str(out), "--", "python", str(SCRIPTS / "no_steps.py")])
    assert rc == 2 and "recorded no optimizer step and no backward() call" in capsys.readouterr().err
    assert main(["variance", "--runs", "1", "--", *TINY]) == 2
    assert "argument --runs: expected at least 2 (a spread needs two values), got '1'" in capsys.readouterr().err
    assert main(["variance"]) == 2


# --- statistics ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p, df, expected", [(0.975, 1, 12.7062047), (0.975, 4, 2.7764451), (0.8, 4, 0.9409646),
                                             (0.975, 10, 2.2281389), (0.95, 30, 1.6972609), (0.025, 4, -2.7764451)])
def test_t_quantiles_match_tables(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-6)


def test_detectable_difference_formula():
    # n = 5 per group: df = 8, t(0.975, 8) = 2.3060041, t(0.8, 8) = 0.8888895
    assert min_detectable_difference(2.0, 5) == pytest.approx((2.3060041 + 0.8888895) * 2.0 * (2 / 5) ** 0.5)
    assert min_detectable_difference(0.0, 3) == 0.0
    with pytest.raises(ValueError, match="at least 2 runs"):
        min_detectable_difference(1.0, 1)


@pytest.mark.parametrize("same, seeds, verdict", [
    ([1.0, 1.0, 1.0], [0.9, 1.0, 1.1], "deterministic"),
    ([1.0, 1.08, 0.93], [0.9, 1.0, 1.1], "same-band"),
    ([1.0, 1.001, 0.999], [0.9, 1.0, 1.1], "seed-dominated"),
    ([1.0, 1.0], [1.0, 1.0], "seed-insensitive"),
])
def test_verdicts(same, seeds, verdict):
    report = analyze_variance(GroupStats.of("same", same, [0] * len(same)), GroupStats.of("seeds", seeds, [1, 2, 3]))
    assert report.verdict == verdict
    assert report.to_json()["title"] and report.to_json()["action"]
    if verdict == "seed-insensitive":
        assert report.ratio is None and report.seed_only_std == 0


def test_group_stats_refuse_non_finite_values():
    with pytest.raises(ValueError, match=r"run\(s\) \[2\] produced a value that is not finite"):
        GroupStats.of("same seed", [1.0, float("nan")], [0, 0])


def test_step_time_summaries():
    stats = TimeStats.of([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (stats.median, stats.q1, stats.q3, stats.iqr, stats.steps) == (3.0, 2.0, 4.0, 2.0, 5)
    base, slower = [10.0, 10.5, 9.5, 10.2, 9.8] * 4, [12.0, 12.6, 11.4, 12.24, 11.76] * 4
    point, lo, hi = overhead_ci(base, slower)
    assert point == pytest.approx(0.2) and lo <= point <= hi and hi - lo < 0.2
    assert overhead_ci(base, slower) == (point, lo, hi)  # a fixed bootstrap seed: the same interval every time


# --- log_metric ---------------------------------------------------------------------------------------------
def test_log_metric_without_a_recorder_returns_the_value():
    assert torchrepro.log_metric("acc", torch.tensor([0.25])) == 0.25
    assert torchrepro.log_metric("n", 3) == 3.0
    with pytest.raises(TypeError, match=r"log_metric\('acc', ...\): the value is a tensor of shape \(2,\)"):
        torchrepro.log_metric("acc", torch.ones(2))
    with pytest.raises(TypeError, match="must be a real number or a one-element tensor, got 'high'"):
        torchrepro.log_metric("acc", "high")
    with pytest.raises(ValueError, match="the name must be a non-empty string"):
        torchrepro.log_metric("", 1.0)


def test_log_metric_goes_into_the_trace_of_watch(tmp_path):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchrepro.watch(model, opt, run_dir=tmp_path / "run"):
        for _ in range(2):
            opt.zero_grad()
            model(torch.ones(3, 2)).sum().backward()
            opt.step()
            torchrepro.log_metric("loss2", 0.1)
    metrics = [e for e in read_trace_lines(tmp_path / "run")[0] if e["kind"] == "metric"]
    got = [(m["name"], m["step"], float.fromhex(m["value"])) for m in metrics]
    assert got == [("loss2", 1, 0.1), ("loss2", 2, 0.1)]
    before = (tmp_path / "run" / "trace.jsonl").read_bytes()
    assert torchrepro.log_metric("after", 1.0) == 1.0  # the recorder is gone: nothing written, nothing raised
    assert (tmp_path / "run" / "trace.jsonl").read_bytes() == before
