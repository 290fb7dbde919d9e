"""Environments of recorded runs: `diff` lists seed and environment differences, `diff --locate` names the op
that computes differently in the other environment, `env diff` reads run directories, `run --trace-steps`.

The runs are recorded once for the module; `diff` and `env diff`, which only read them, run in this process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchrepro.cli import main

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "env_threads.py"


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchrepro", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, **(env or {})})


@pytest.fixture
def here(capsys, monkeypatch):
    """``cli`` in this process, for the commands that only read the recorded runs (`diff`, `env diff`): no new
    process, and no import of torch, for each."""

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["torchrepro", *args], code, out, err)

    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """run_a: OMP_NUM_THREADS=1 --seed 1; run_b: OMP_NUM_THREADS=2 --seed 2; run_c: OMP_NUM_THREADS=1 --seed 2.

    All keep the op trace of step 1. The script seeds itself, so only the thread count changes its bits.
    """
    root = tmp_path_factory.mktemp("envruns")
    for name, threads, seed in (("run_a", "1", "1"), ("run_b", "2", "2"), ("run_c", "1", "2")):
        p = cli("run", "--record", name, "--seed", seed, "--trace-steps", "1", "--", "python", str(SCRIPT),
                cwd=root, env={"OMP_NUM_THREADS": threads})
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(f"threads {threads} loss ")
    return root


def test_manifest_embeds_the_full_environment_and_the_trace(runs):
    manifest = json.loads((runs / "run_b" / "manifest.json").read_text())
    env = manifest["environment"]
    assert env["schema"] == "torchrepro.env/1" and env["threads"]["intra_op"] == 2
    assert env["env"]["OMP_NUM_THREADS"] == "2" and env["env"]["PYTHONHASHSEED"] == "2"
    assert manifest["trace_steps"] == [1, 1] and (runs / "run_b" / "ops.jsonl").is_file()


def test_diff_shows_seed_and_thread_differences(runs, here):
    p = here("diff", "run_a", "run_b", "--out", "d1", cwd=runs)
    assert p.returncode == 1, p.stderr
    text = p.stdout
    assert "torchrepro: DIVERGED at step 1" in text
    assert "Environment differences (run 1 → run 2): can break bitwise equality 3\n" in text
    for key, values in (("env.OMP_NUM_THREADS", "1 → 2"), ("launch.seed", "1 → 2"), ("threads.intra_op", "1 → 2")):
        assert any(line.split()[:4] == [key, *values.split()] for line in text.splitlines()), key
    assert ("Note:  The runs also differ in settings that can break bitwise equality (intra-op threads 1 → 2, "
            "OMP_NUM_THREADS 1 → 2, seed 1 → 2): the divergence may come from them rather than from nondeterminism. "
            "Record both with `torchrepro run --record DIR --trace-steps K`") in text
    doc = json.loads(here("diff", "run_a", "run_b", "--out", "d1", "--json", cwd=runs).stdout)
    changes = doc["environment_diff"]["changes"]
    assert [(c["key"], c["a"], c["b"], c["rank"]) for c in changes] == [
        ("threads.intra_op", 1, 2, "breaks-bitwise"), ("env.OMP_NUM_THREADS", "1", "2", "breaks-bitwise"),
        ("launch.seed", 1, 2, "breaks-bitwise")]


def test_identical_runs_with_other_seeds_say_so(runs, here):
    """The first user's complaint: two runs with --seed 1 and --seed 2 were 'identical' without a word."""
    p = here("diff", "run_a", "run_c", "--out", "d2", cwd=runs)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("torchrepro: IDENTICAL")
    assert "Environment differences (run 1 → run 2): can break bitwise equality 1\n" in p.stdout
    assert ("Note:  The runs are bitwise identical although they differ in settings that can break bitwise "
            "equality (seed 1 → 2): this script's results do not depend on them (e.g. it seeds itself).") in p.stdout


def test_diff_locate_names_the_op_and_the_setting(runs, here):
    p = here("diff", "--locate", "run_a", "run_b", "--out", "d3", cwd=runs)
    assert p.returncode == 1, p.stderr
    assert ("Locate: an operation computes differently in B's environment (traced step(s) 1 in the two recorded "
            "runs: ") in p.stdout
    assert (f"  Why: the kernel of `aten.sum` in `1` ({SCRIPT}:13) gives other bits in run B from identical inputs; "
            "B differs by: intra-op threads 1 → 2, OMP_NUM_THREADS 1 → 2, seed 1 → 2\n") in p.stdout
    assert "  Fix: Give B the settings of A (intra-op threads 1, OMP_NUM_THREADS 1, seed 1) to get A's bits" in p.stdout
    assert "come from them rather than from nondeterminism.\n" in p.stdout  # no hint to run what is running
    # one story: across environments deterministic mode does not help, so Next must not suggest it
    assert "check --deterministic" not in p.stdout
    assert "\nNext:  See Locate below: it names the operation that computes differently in B's environment" in p.stdout
    loc = json.loads((runs / "d3" / "locate.json").read_text())
    assert loc["verdict"] == "origin" and loc["op"]["op"] == "aten.sum" and loc["op"]["phase"] == "forward"
    assert loc["op"]["in"] == loc["op_other_run"]["in"] and loc["op"]["out"] != loc["op_other_run"]["out"]
    assert loc["op"]["code"] == "return h / h.abs().sum()" and loc["deterministic_kernel"] is None


def test_diff_of_two_environments_does_not_suggest_deterministic_mode(runs, here):
    p = here("diff", "run_a", "run_b", "--out", "d7", cwd=runs)
    assert p.returncode == 1, p.stderr
    next_line = next(line for line in p.stdout.splitlines() if line.startswith("Next:"))
    assert next_line == ("Next:  The runs differ in settings that can break bitwise equality (intra-op threads 1 → 2, "
                         "OMP_NUM_THREADS 1 → 2, seed 1 → 2): give both the same settings and record again. "
                         "`check --deterministic` would not help: it makes one environment repeat itself, not agree "
                         "with another.")


def test_diff_locate_of_identical_runs_has_nothing_to_locate(runs, here):
    p = here("diff", "--locate", "run_a", "run_c", "--out", "d8", cwd=runs)
    assert p.returncode == 0, p.stderr
    assert "\nLocate: the runs are identical: nothing to locate" in p.stdout
    assert "re-run" not in p.stdout and "--locate-steps" not in p.stdout  # diff re-runs nothing, has no such option
    assert json.loads((runs / "d8" / "locate.json").read_text())["verdict"] == "nothing-to-locate"


def test_diff_locate_with_an_injected_torch_version(runs, here):
    b2 = runs / "run_b_old_torch"
    shutil.copytree(runs / "run_b", b2)
    manifest = json.loads((b2 / "manifest.json").read_text())
    now = manifest["environment"]["torch"]
    manifest["environment"]["torch"] = "2.12.0"
    (b2 / "manifest.json").write_text(json.dumps(manifest))
    doc = json.loads(here("diff", "--locate", "run_a", b2.name, "--out", "d4", "--json", cwd=runs).stdout)
    assert doc["locate"]["explanation"].endswith(
        f"B differs by: torch {now} → 2.12.0, intra-op threads 1 → 2, OMP_NUM_THREADS 1 → 2, seed 1 → 2")
    assert doc["environment_diff"]["changes"][0] == {
        "key": "torch", "a": now, "b": "2.12.0", "only_in": None, "rank": "breaks-bitwise",
        "reason": "another torch version ships other kernels and reduction orders"}
    p = here("env", "diff", "run_a", b2.name, cwd=runs)
    assert p.returncode == 1 and f"\n    torch                {now} → 2.12.0" in p.stdout


def test_env_diff_of_run_directories(runs, here):
    assert here("env", "diff", "run_a", "run_a/manifest.json", cwd=runs).returncode == 0
    p = here("env", "diff", "run_a", "run_b", "--json", cwd=runs)
    assert p.returncode == 1
    assert [c["key"] for c in json.loads(p.stdout)["changes"]] == ["threads.intra_op", "env.OMP_NUM_THREADS",
                                                                   "launch.seed"]


def test_diff_locate_needs_traces_of_the_same_step(runs, tmp_path, here):
    plain = runs / "run_a_no_trace"
    shutil.copytree(runs / "run_a", plain)
    (plain / "ops.jsonl").unlink()
    p = here("diff", "--locate", plain.name, "run_b", "--out", "d5", cwd=runs)
    assert p.returncode == 2
    assert p.stderr.startswith(f"torchrepro: error: {plain.name}: has no op trace (ops.jsonl), so --locate has "
                               "nothing to compare. Record both runs with `torchrepro run --record DIR --trace-steps N")
    other = runs / "run_b_step2"
    shutil.copytree(runs / "run_b", other)
    ops = (other / "ops.jsonl").read_text().replace('"step":1,', '"step":2,').replace('"step": 1,', '"step": 2,')
    (other / "ops.jsonl").write_text(ops)
    p = here("diff", "--locate", "run_a", other.name, "--out", "d6", cwd=runs)
    assert p.returncode == 2
    assert (f"the op traces hold different steps: run_a traced [1], {other.name} traced [2]. Record both with the "
            "same `--trace-steps N`.") in p.stderr


def test_trace_steps_needs_record(tmp_path):
    p = cli("run", "--trace-steps", "1", "--", "python", str(SCRIPT), cwd=tmp_path)
    assert p.returncode == 2
    assert "--trace-steps keeps the op trace in the run directory, so it needs --record" in p.stderr
    p = cli("run", "--record", "r", "--trace-steps", "-1", "--", "python", str(SCRIPT), cwd=tmp_path)
    assert p.returncode == 2 and "expected a step number (0 or more), got '-1'" in p.stderr
