"""`torchrepro bench`: every variant timed in alternating runs, warm-up left out, clear errors. Never asserts times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.inprocess import torchrepro
from torchrepro.cli import main
from torchrepro.cli.bench_cmd import _Config, _results, render_bench
from torchrepro.record.store import read_trace_lines

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
TINY = ["python", str(SCRIPTS / "bench_tiny.py")]
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the default variants differ with CUDA")


def bench(capsys, out: Path, *args: str, command: list[str] = TINY) -> tuple[int, dict]:
    rc = main(["bench", "--json", "--out", str(out), *args, "--", *command])
    return rc, json.loads(capsys.readouterr().out)


@CPU_ONLY
def test_variants_alternate_and_warmup_steps_are_left_out(tmp_path, capsys):
    out = tmp_path / "out"
    rc, doc = bench(capsys, out, "--steps", "3", "--warmup", "2", "--rounds", "2")
    assert rc == 0, doc
    assert doc["schema"] == "torchrepro.bench/1" and doc["device"] == "cpu" and doc["builtin"] is None
    assert doc["order"] == ["default", "deterministic", "deterministic", "default"]  # A B B A
    default, det = doc["results"]
    assert (default["variant"], det["variant"]) == ("default", "deterministic")
    assert default["runs"] == ["run1", "run4"] and det["runs"] == ["run2", "run3"]
    assert default["overhead"] is None and default["overhead_ci"] is None and det["baseline"] == "default"
    lo, hi = det["overhead_ci"]
    assert lo <= det["overhead"] <= hi
    for result in (default, det):
        assert result["steps"] == 6 and len(result["step_ms"]) == 6 and min(result["step_ms"]) > 0
        assert result["q1_ms"] <= result["median_ms"] <= result["q3_ms"]
        assert result["peak_memory"]["kind"] == "max-rss" and result["peak_memory"]["bytes"] > 0
        times = []
        for name in result["runs"]:  # the timed steps are steps 3..5 of each run, timed from the step before
            manifest = json.loads((out / name / "manifest.json").read_text())
            assert manifest["status"] == "stopped-at-max-steps" and manifest["steps"] == 5
            assert manifest["deterministic"] == (result["variant"] == "deterministic")
            steps = [e for e in read_trace_lines(out / name)[0] if e["kind"] == "step"]
            assert all(fp is None for e in steps for fp in e["params"].values())  # timing only: no fingerprints
            t = [e["t"] for e in steps]
            assert len(t) == 5
            times += [(t[k] - t[k - 1]) * 1e3 for k in (2, 3, 4)]
        assert result["step_ms"] == pytest.approx(times)
    text = (out / "bench.txt").read_text()
    assert text == render_bench(doc) + "\n"
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if "ms/step (median)" in line)
    assert "overhead vs default (95% CI)" in lines[header] and "peak memory" in lines[header]
    rows = [line.split()[0] for line in lines[header + 2:header + 4]]
    assert rows == ["default", "deterministic"] and "baseline" in lines[header + 2]
    assert Path(doc["plot"]).is_file() and json.loads((out / "bench.json").read_text()) == doc


def test_builtin_resnet18_times_fp32_and_bf16(tmp_path, capsys):
    out = tmp_path / "out"
    rc, doc = bench(capsys, out, "--builtin", "resnet18", "--variants", "default", "--steps", "1", "--warmup", "1",
                    "--rounds", "1", command=["--batch-size", "2", "--image-size", "32"])
    assert rc == 0, doc
    assert [r["config"] for r in doc["results"]] == ["fp32 default", "bf16 default"]
    assert [r["baseline"] for r in doc["results"]] == ["fp32 default", "bf16 default"]  # each precision its own
    assert doc["builtin"] == "resnet18" and doc["command"][1:3] == ["-m", "torchrepro.measure.models"]
    for r in doc["results"]:
        manifest = json.loads((out / r["runs"][0] / "manifest.json").read_text())
        command = manifest["command"]
        assert command[command.index("--precision") + 1] == r["precision"] and command[-4:] == [
            "--batch-size", "2", "--image-size", "32"]


def test_a_script_that_never_steps_or_stops_early_is_an_input_error(tmp_path, capsys):
    out = tmp_path / "out"
    rc, doc = bench(capsys, out, "--steps", "2", "--warmup", "1", command=["python", str(SCRIPTS / "no_steps.py")])
    assert rc == 2 and doc["verdict"] == "error"
    assert "run 1 of 4 (default) finished but recorded no optimizer step and no backward() call. torchrepro " \
           "bench needs training steps" in doc["error"]
    assert not (out / "run2").exists()  # stopped at the first bad run
    rc, doc = bench(capsys, out, "--steps", "3", "--warmup", "1", command=[*TINY, "--steps", "2"])  # same --out
    assert rc == 2
    assert "run 1 of 4 (default) made only 2 steps; bench needs 1 warm-up + 3 timed steps per run" in doc["error"]
    assert not (out / "run2").exists()


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "argument --steps: expected a positive integer, got '0'"),
    (["--warmup", "0"], "the first step of a run has no start boundary to time it from"),
    (["--variants", "default,fast"], "argument --variants: unknown variant fast; known: default, deterministic, "
                                     "cudnn-benchmark, no-tf32"),
    (["--precisions", "fp8", "--builtin", "resnet18"], "unknown precision fp8; known: fp32, bf16"),
    (["--precisions", "fp32"], "--precisions needs --builtin"),
    (["--device", "cpu"], "--device needs --builtin (your own script sets its device itself)"),
])
def test_bad_options_exit_2_before_running_anything(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    rc = main(["bench", "--out", str(out), *args, "--", *TINY])
    assert rc == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_errors_as_one_json_document_and_a_users_folder_is_never_replaced(tmp_path):
    p = torchrepro("bench", "--json", "--steps", "0", "--", *TINY, timeout=120, cwd=tmp_path)
    assert p.returncode == 2
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "error" and doc["exit_code"] == 2 and "--steps" in doc["error"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["bench", "--out", str(mine), "--", *TINY]) == 2
    assert [x.name for x in mine.iterdir()] == ["notes.txt"]
    assert main(["bench"]) == 2  # no command and no --builtin


def test_overheads_are_taken_within_each_precision():
    configs = [_Config(f"{p} {v}", p, v, [], durations=[base * f for f in (1.0, 1.1, 0.9, 1.05)])
               for p, scale in (("fp32", 1.0), ("bf16", 0.5)) for v, base in (("default", 10 * scale),
                                                                               ("deterministic", 12 * scale))]
    results = _results(configs)
    assert [r["baseline"] for r in results] == ["fp32 default"] * 2 + ["bf16 default"] * 2
    assert results[1]["overhead"] == pytest.approx(0.2) and results[3]["overhead"] == pytest.approx(0.2)
    assert results[0]["median_ms"] == pytest.approx(10.25) and results[2]["median_ms"] == pytest.approx(5.125)


def test_a_script_without_an_optimizer_is_timed_per_backward_call(tmp_path, capsys):
    out = tmp_path / "out"
    rc, doc = bench(capsys, out, "--variants", "default", "--rounds", "1", "--steps", "2", "--warmup", "1",
                    command=["python", str(SCRIPTS / "manual_sgd.py")])
    assert rc == 0, doc
    (result,) = doc["results"]
    events = read_trace_lines(out / "run1")[0]
    t = [e["t"] for e in events if e["kind"] == "backward"]
    assert not any(e["kind"] == "step" for e in events) and len(t) == 3
    assert result["step_ms"] == pytest.approx([(t[1] - t[0]) * 1e3, (t[2] - t[1]) * 1e3])


@CPU_ONLY
def test_cuda_only_variants_run_on_cpu_with_a_note(tmp_path, capsys):
    """no-tf32 sets PyTorch's new TF32 API in the child; reading the environment afterwards must not crash."""
    # manual_sgd.py: parameters updated by hand (no torch.optim, whose first optimizer imports torch._dynamo: about
    # 1 CPU second a run); bench times its backward() calls
    rc, doc = bench(capsys, tmp_path / "out", "--variants", "default,no-tf32,cudnn-benchmark", "--rounds", "1",
                    "--steps", "1", "--warmup", "1", command=["python", str(SCRIPTS / "manual_sgd.py")])
    assert rc == 0, doc
    assert "no-tf32 has no effect without CUDA" in doc["notes"]


@CPU_ONLY
@pytest.mark.parametrize("args", [["--device", "cuda"], ["--", "--device", "cuda:0"], ["--", "--device=cuda"]])
def test_builtin_on_a_device_this_machine_lacks_is_refused_before_running(tmp_path, capsys, args):
    out = tmp_path / "out"
    rc = main(["bench", "--out", str(out), "--builtin", "resnet18", *args])
    err = capsys.readouterr().err
    assert rc == 2 and "CUDA is not available here" in err and "best available device (cpu)" in err
    assert "Traceback" not in err and not out.exists()


def test_a_failing_bundled_script_is_not_blamed_on_the_user(tmp_path, capsys):
    rc, doc = bench(capsys, tmp_path / "out", "--builtin", "resnet18", "--variants", "default", "--rounds", "1",
                    "--steps", "1", "--warmup", "1", command=["--no-such-option"])
    assert rc == 2 and "failed with exit code 2" in doc["error"]
    assert "Fix the script" not in doc["error"]
    assert "torchrepro's bundled script (`python -m torchrepro.measure.models --model resnet18`), not yours" \
        in doc["error"]


def test_the_bundled_model_refuses_a_missing_device_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    p = subprocess.run([sys.executable, "-m", "torchrepro.measure.models", "--device", "cuda"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.startswith("python -m torchrepro.measure.models: error: --device cuda: CUDA is not available")


def test_bench_nn_alternatives_refuses_a_missing_device():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_nn_alternatives.py"
    p = subprocess.run([sys.executable, str(script), "--device", "cuda"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "--device cuda: CUDA is not available" in p.stderr


@CPU_ONLY
def test_explain_times_each_setting_apart_and_recommends_only_what_a_check_confirmed(tmp_path, capsys):
    """The script repeats itself only under deterministic algorithms: leaving them out must fail its check, and
    the recommendation is deterministic mode without the memory fill, whose own check the test reads back."""
    out = tmp_path / "out"
    rc, doc = bench(capsys, out, "--explain", "--steps", "2", "--warmup", "1", "--rounds", "1",
                    command=["python", str(SCRIPTS / "needs_algorithms.py")])
    assert rc == 0, doc
    assert [r["variant"] for r in doc["results"]] == ["default", "deterministic", "deterministic-without-fill-"
                                                      "uninitialized-memory", "deterministic-without-algorithms"]
    (part,) = doc["explain"]
    rows = {s["setting"]: s for s in part["settings"]}
    for name in ("cudnn-deterministic", "cudnn-benchmark", "cublas-workspace"):
        assert rows[name]["reason"] == "not applicable on cpu" and rows[name]["overhead"] is None
    assert rows["inductor"]["reason"] == "not applicable: the script does not call torch.compile"
    for name in ("algorithms", "fill-uninitialized-memory"):  # timed: a cost and an interval (2 steps: no bounds)
        lo, hi = rows[name]["overhead_ci"]
        assert rows[name]["applicable"] and isinstance(rows[name]["overhead"], float) and lo <= hi
    assert (rows["fill-uninitialized-memory"]["with"], rows["fill-uninitialized-memory"]["without"]) == (
        "deterministic", "deterministic-without-fill-uninitialized-memory")
    checks = {tuple(c["left_out"]): c for c in part["checks"]}
    own = checks[("algorithms", "fill-uninitialized-memory")]  # all applicable left out: the script's own settings
    assert own["verdict"] == "diverged" and own["detail"].startswith("diverged at step ")
    kept = checks[("fill-uninitialized-memory",)]
    assert kept["verdict"] == "identical" and len(kept["runs"]) == 2 and len(checks) == 2
    for name in kept["runs"]:  # the check really ran deterministic mode without the fill, recorded step by step
        manifest = json.loads((out / name / "manifest.json").read_text())
        assert manifest["deterministic"] and manifest["determinism_options"] == {"fill_uninitialized_memory": False}
        assert (out / name / "stdout.txt").read_text().startswith("fill_uninitialized_memory=False algorithms=True")
        assert any(e["kind"] == "step" and e["params"] for e in read_trace_lines(out / name)[0])
    for name in own["runs"]:
        assert not json.loads((out / name / "manifest.json").read_text())["deterministic"]
    rec = part["recommended"]
    assert rec["call"] == "torchrepro.deterministic(fill_uninitialized_memory=False)"
    assert rec["flags"] == ["--deterministic", "--deterministic-except", "fill-uninitialized-memory"]
    assert rec["config"] == "deterministic-without-fill-uninitialized-memory"
    text = (out / "bench.txt").read_text()
    assert "cudnn-deterministic         cudnn.deterministic = True" in text and "not applicable on cpu" in text
    assert "deterministic-without-algorithms: " not in text  # named as what it is:
    assert "the script's own settings: DIVERGED - diverged at step" in text
    assert "  in Python: torchrepro.deterministic(fill_uninitialized_memory=False)\n" in text
    assert "  CLI:       torchrepro run --deterministic --deterministic-except fill-uninitialized-memory -- ...\n" \
        in text


def test_explain_chooses_its_own_variants(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["bench", "--out", str(out), "--explain", "--variants", "default", "--", *TINY])
    assert rc == 2 and "--explain times its own variants" in capsys.readouterr().err and not out.exists()


def test_an_overhead_whose_interval_includes_zero_is_said_to_be_not_significant():
    """A headline of +765.9% (-11.6% to +2160.0%) read as a cost: the interval includes 0, so it is noise."""
    times = {"default": [10.0, 90.0, 11.0, 80.0, 12.0, 70.0], "deterministic": [11.0, 85.0, 10.0, 95.0, 13.0, 60.0]}
    noisy = [_Config(f"fp32 {v}", "fp32", v, [], durations=d) for v, d in times.items()]
    steady = [_Config(f"fp32 {v}", "fp32", v, [], durations=[b * f for f in (1.0, 1.01, 0.99, 1.0, 1.02, 0.98)])
              for v, b in (("default", 10.0), ("deterministic", 12.0))]
    for configs, significant in ((noisy, False), (steady, True)):
        results = _results(configs)
        lo, hi = results[1]["overhead_ci"]
        assert (lo <= 0 <= hi) is (not significant)
        doc = {"results": results, "builtin": None, "command": ["python", "t.py"], "device": "cpu", "threads": 2,
               "torch": "2.13", "rounds": 3, "warmup": 0, "steps": 2, "order": ["default"], "notes": []}
        text = render_bench(doc)
        row = next(line for line in text.splitlines() if line.lstrip().startswith("fp32 deterministic"))
        assert (") n.s." in row) is (not significant), row
        note = ("n.s.: not significant: the 95% interval includes 0, so this overhead is not told apart from noise "
                "(more --rounds and --steps narrow it)")
        assert (note in text.splitlines()) is (not significant), text
