"""End to end: `torchrepro check` and `diff` on the bundled examples and on failing scripts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.inprocess import torchrepro
from torchrepro.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
needs_threads = pytest.mark.skipif(torch.get_num_threads() < 2, reason="CPU nondeterminism needs 2+ torch threads")


def check(tmp_path: Path, *args: str, script: str, script_args: tuple[str, ...] = ()) -> tuple[int, dict, str]:
    """`check --json`, in this process (tests/inprocess.py): no test of this module is about the command's own
    process (the entry point `python -m torchrepro` is tested in tests/cli/test_cli.py and others)."""
    out = tmp_path / "out"
    p = torchrepro("check", "--json", "--out", str(out), *args, "--", "python", script, *script_args, timeout=600)
    doc = json.loads(p.stdout) if p.stdout.strip() else {}
    return p.returncode, doc, p.stderr


# What each diverging example records first, and where each kind first differs (given the first step whose losses
# differ). The scatter example's forward scatter-add changes the loss at step 1 in only some pairs of runs (the
# difference can round away in the mean), while its gradients, parameters and Adam state always differ at step 1.
FIRST = {
    "unseeded_init.py": lambda loss: ["init"],
    "unseeded_augmentation.py": lambda loss: ["batches", "loss", "grads", "params"],
    "scatter_gnn.py": lambda loss: (["loss"] if loss == 1 else []) + ["grads", "params", "state"],
}
BY_KIND = {
    "unseeded_init.py": lambda loss: {"init": 0, "loss": 1, "grads": 1, "params": 1},
    "unseeded_augmentation.py": lambda loss: {"batches": 1, "loss": 1, "grads": 1, "params": 1},
    # the race may (usually) or may not reach the loss within the run: its first step, or no entry at all
    "scatter_gnn.py": lambda loss: {"grads": 1, "params": 1, "state": 1} | ({"loss": loss} if loss else {}),
}


@pytest.mark.parametrize(
    "name, flags, script_args, verdict, step, cause",
    [
        # 3 of the CNN's 16 steps, 2 of the GNN's 5: what the verdicts need (the GNN's race is at step 1)
        ("cnn_train.py", ("--max-steps", "3"), ("--epochs", "1"), "identical", None, None),
        pytest.param("scatter_gnn.py", (), ("--steps", "2"), "diverged", 1, "compute", marks=needs_threads),
        ("scatter_gnn.py", ("--deterministic",), ("--steps", "2"), "identical", None, None),
        ("unseeded_init.py", (), (), "diverged", 0, "initial-weights"),
        ("unseeded_init.py", ("--seed", "0"), (), "identical", None, None),
        ("unseeded_augmentation.py", (), (), "diverged", 1, "data"),
    ],
)
def test_examples(tmp_path, name, flags, script_args, verdict, step, cause):
    rc, doc, err = check(tmp_path, *flags, script=str(EXAMPLES / name), script_args=script_args)
    assert rc == (0 if verdict == "identical" else 1), err
    assert doc["schema"] == "torchrepro.check/1"
    assert doc["verdict"] == verdict and doc["first_divergent_step"] == step and doc["cause"] == cause
    # a diverged run 2 is stopped 5 steps after its first divergence (unless it ends before)
    full = doc["steps"][0]
    assert full > 0 and doc["steps"] == [full, full if verdict == "identical" else min(full, step + 5)]
    assert doc["stopped"][0] is None and (doc["stopped"][1] is None) == (verdict == "identical" or full < step + 5)
    assert Path(doc["plot"]).is_file()
    # The first step whose recorded loss values differ must be where the comparison says the loss diverged.
    loss_step = next((k for k, vals in enumerate(zip(*doc["losses"]), start=1) if len(set(vals)) > 1), None)
    assert doc["first_step_by_kind"].get("loss") == loss_step
    if verdict == "diverged":
        assert doc["action"]
        assert [d["kind"] for d in doc["diverged_first"]] == FIRST[name](loss_step)
        assert doc["first_step_by_kind"] == BY_KIND[name](loss_step)
        if cause == "compute" and doc["stopped"][1] is None:
            assert doc["final_max_abs_delta_weight"] > 0 and doc["max_ulp_distance"] > 0
        if cause == "compute":
            assert max(doc["param_max_abs_delta"].values()) > 0
    else:
        assert doc["diverged_first"] == [] and doc["first_step_by_kind"] == {}
        assert doc["final_max_abs_delta_weight"] is None or doc["final_max_abs_delta_weight"] == 0


# examples/unseeded_init.py with its parameters updated by hand (no torch.optim: about 1 CPU s less per run), for the
# tests of check's text and of diff, which are not about the example or its optimizer
UNSEEDED = SCRIPTS / "unseeded_init_by_hand.py"


def test_text_summary_and_three_runs(tmp_path):
    out = tmp_path / "o"
    p = torchrepro("check", "--runs", "3", "--out", str(out), "--", "python", str(UNSEEDED), timeout=600)
    assert p.returncode == 1
    assert "DIVERGED at step 0" in p.stdout and "Cause: initial-weights" in p.stdout
    assert "torchrepro.seed_everything" in p.stdout
    assert sorted(x.name for x in out.iterdir()) == ["check.json", "check.png", "report.html", "run1", "run2", "run3"]
    assert "run 3" in (out / "report.html").read_text() and "initial parameters" in (out / "report.html").read_text()
    assert "run 3/3 stopped-after-divergence: 5 steps" in p.stderr  # 5 steps after step 0, of 8
    assert "Stopped: run 3 stopped 5 steps after its first divergence (step 0), after step 5" in p.stdout


def test_an_identical_verdict_says_what_its_number_of_runs_rules_out(tmp_path):
    """A race that makes 1 run in 4 differ passes 2 runs 75% of the time: IDENTICAL says so, for the runs given."""
    p = torchrepro("check", "--runs", "3", "--seed", "0", "--max-steps", "2", "--out", str(tmp_path / "o"), "--",
                   "python", str(UNSEEDED), timeout=600)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("torchrepro: IDENTICAL - 3 runs of")
    assert lines[1] == ("Sure:  3 runs rule out a difference in every run, not a rare one: a race that makes 1 run "
                        "in 4 differ passes 3 runs 56% of the time (1 in 10: 81%). Use --runs 10 (a 1-in-4 race "
                        "passes 8% of the time) before relying on it.")
    d = torchrepro("diff", str(tmp_path / "o" / "run1"), str(tmp_path / "o" / "run2"), "--out", str(tmp_path / "d"))
    assert d.returncode == 0 and "Sure:" not in d.stdout  # two recordings: their number is not the user's choice


def test_manual_update_script_is_checked_per_backward(tmp_path):
    rc, doc, err = check(tmp_path, script=str(SCRIPTS / "manual_sgd.py"))
    assert rc == 0, err
    assert doc["verdict"] == "identical" and doc["step_mode"] == "backward" and doc["steps"] == [4, 4]
    assert any("backward() call is treated as one step" in n for n in doc["notes"])


@pytest.mark.parametrize(
    "script, message",
    [
        ("fails.py", "run 1 of 2 failed with exit code 1"),
        ("killed.py", "run 1 of 2 was killed by SIGKILL"),
        ("no_steps.py", "recorded no optimizer step and no backward() call"),
    ],
)
def test_failing_scripts_exit_2_never_identical(tmp_path, script, message):
    # --no-prestart: no run 2 importing torch beside run 1 only to be ended when run 1 fails (tested in
    # tests/cli/test_check_prestart.py); what run 1's failure is reported as does not depend on it
    rc, doc, err = check(tmp_path, "--no-prestart", script=str(SCRIPTS / script))
    assert rc == 2 and message in err
    # --json still writes one document, saying what failed and where the run's stderr is
    assert doc["verdict"] == "error" and doc["exit_code"] == 2 and message in doc["error"]
    assert doc["stderr"] == str(tmp_path / "out" / "run1" / "stderr.txt")
    if script == "fails.py":
        assert "user script exploded: bad config value" in err  # the stderr tail is shown
        assert "Fix the script" in err


def test_bad_commands(tmp_path):
    p = torchrepro("check", "--", "bash", "x.sh", cwd=tmp_path)
    assert p.returncode == 2 and "torchrepro records Python training scripts" in p.stderr
    p = torchrepro("check", "--", "python", "nope.py", cwd=tmp_path)
    assert p.returncode == 2 and "script 'nope.py' does not exist" in p.stderr
    p = torchrepro("check", cwd=tmp_path)
    assert p.returncode == 2 and "no command given" in p.stderr
    p = torchrepro("check", "--seed", "-4", "--", "python", "x.py", cwd=tmp_path)
    assert p.returncode == 2 and "[0, 4294967295]" in p.stderr


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two recordings of the unseeded script, made once for the tests of diff (which only read them)."""
    out = tmp_path_factory.mktemp("rec")
    for i in (1, 2):
        p = torchrepro("run", "--record", str(out / f"r{i}"), "--keep-values", "--", "python", str(UNSEEDED))
        assert p.returncode == 0, p.stderr
    return out


@pytest.fixture
def diff_here(capsys):
    """`torchrepro diff ARGS` in this process (the runs are recorded: nothing trains): like `python -m torchrepro
    diff ARGS`, without starting and importing torch in a new process for each call."""

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        rc = main(["diff", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["torchrepro", "diff", *args], rc, out, err)

    return run


def test_diff_two_recorded_runs(recorded, tmp_path, diff_here):
    p = diff_here(str(recorded / "r1"), str(recorded / "r2"), "--json", "--out", str(tmp_path / "d"))
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert doc["cause"] == "initial-weights" and doc["first_divergent_step"] == 0
    assert doc["final_max_abs_delta_weight"] > 0
    p = diff_here(str(recorded / "r1"), str(recorded / "r1"), "--out", str(tmp_path / "e"))
    assert p.returncode == 0 and "IDENTICAL" in p.stdout


def test_diff_of_different_commands_is_not_comparable(recorded, tmp_path, diff_here):
    other = _copy(recorded / "r2", tmp_path / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["command"] = [*manifest["command"], "--wide"]
    (other / "manifest.json").write_text(json.dumps(manifest))
    p = diff_here(str(recorded / "r1"), str(other), "--out", str(tmp_path / "d"))
    assert p.returncode == 2 and p.stdout == ""
    assert "the runs are not comparable" in p.stderr and "'--wide' only in run 2" in p.stderr
    assert "initial-weights" not in p.stderr


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_diff_bad_run_dirs(recorded, tmp_path, diff_here):
    good = recorded / "r1"
    p = diff_here(str(tmp_path / "missing"), str(good))
    assert p.returncode == 2 and "is not a directory" in p.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    p = diff_here(str(empty), str(good))
    assert p.returncode == 2 and "has no manifest.json" in p.stderr
    corrupt = _copy(good, tmp_path / "corrupt")
    (corrupt / "manifest.json").write_text('{"format": "torchrepro.run", "vers')
    p = diff_here(str(corrupt), str(good))
    assert p.returncode == 2 and "manifest.json: is not valid JSON" in p.stderr
    truncated = _copy(good, tmp_path / "truncated")
    trace = truncated / "trace.jsonl"
    trace.write_bytes(trace.read_bytes()[:-30])
    p = diff_here(str(truncated), str(good))
    assert p.returncode == 2 and "the trace is truncated" in p.stderr
    foreign = _copy(good, tmp_path / "foreign")
    (foreign / "manifest.json").write_text('{"format": "something-else"}')
    p = diff_here(str(foreign), str(good))
    assert p.returncode == 2 and "has format 'something-else', expected 'torchrepro.run'" in p.stderr
    badvalues = _copy(good, tmp_path / "badvalues")
    (badvalues / "values" / "final.pt").write_bytes(b"garbage")
    p = diff_here(str(badvalues), str(recorded / "r2"))
    assert p.returncode == 2 and "final.pt: cannot be read" in p.stderr


VALIDATION_SCRIPT = """import os, torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
train = DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
# validation in an order no seed fixes: it never touches the weights
unseeded = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
val = DataLoader(data, batch_size=8, shuffle=True, generator=unseeded)
model = torch.nn.Linear(4, 1)
for x, y in train:
    torch.nn.functional.mse_loss(model(x), y).backward()
    with torch.no_grad():  # updated by hand: torch.optim's first use costs each run about 1 s of CPU
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
    with torch.no_grad():
        for vx, vy in val:
            model(vx)
"""


def test_batches_fetched_with_autograd_off_are_not_training_data(tmp_path):
    """A validation loop (autograd off) in an unseeded order: the training is identical, and so is the verdict
    (its batches were recorded as the step's data: DIVERGED, cause data)."""
    script = tmp_path / "train.py"
    script.write_text(VALIDATION_SCRIPT)
    rc, doc, err = check(tmp_path, script=str(script))
    assert rc == 0 and doc["verdict"] == "identical", err
    assert doc["steps"] == [4, 4]
