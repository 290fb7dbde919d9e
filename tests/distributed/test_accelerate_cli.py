"""`torchrepro check -- accelerate launch ...` end to end (CPU; two processes through accelerate's torchrun, gloo),
and the launchers torchrepro does not follow, refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inprocess import torchrepro as in_process
from torchrepro.cli import main
from torchrepro.record.launcher import CommandError, parse_python_command, ranks_command

pytest.importorskip("accelerate")

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "accelerate_train.py")
LIMIT_S = 300


def torchrepro(*args: str) -> subprocess.CompletedProcess:
    """``torchrepro ARGS`` (here `check`: the ranks' output goes to the run directories), in this process
    (tests/inprocess.py)."""
    return in_process(*args, timeout=LIMIT_S)


def state(path: Path) -> dict:
    """What the script printed about the state accelerate gave it (its `accelerate <json>` line)."""
    line = next(w for w in path.read_text().splitlines() if w.startswith("accelerate "))
    return json.loads(line[len("accelerate "):])


def test_check_of_accelerate_launch_records_the_script_with_accelerates_options(tmp_path):
    out = tmp_path / "out"
    command = ["accelerate", "launch", "--cpu", "--num_processes", "1", "--mixed_precision", "bf16", SCRIPT, "--steps",
               "3"]
    p = torchrepro("check", "--json", "--out", str(out), "--", *command)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "identical" and doc["steps"] == [3, 3], doc
    # accelerate's choice for this machine, unless the environment already sets it
    threads = dict(parse_python_command(command).env).get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
    for run in ("run1", "run2"):  # the script ran as accelerate runs it: its environment, its options
        assert state(out / run / "stdout.txt") == {"num_processes": 1, "process_index": 0, "mixed_precision": "bf16",
                                                   "dtype": "torch.bfloat16", "omp_num_threads": threads}
    manifest = json.loads((out / "run1" / "manifest.json").read_text())
    assert manifest["command"][:2] == ["accelerate", "launch"] and manifest["optimizer_steps"] == 3


def test_check_of_accelerate_launch_of_two_processes_records_every_rank(tmp_path):
    out = tmp_path / "out"
    p = torchrepro("check", "--json", "--out", str(out), "--", "accelerate", "launch", "--multi_gpu",
                   "--num_processes", "2", SCRIPT, "--steps", "3")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "identical" and doc["nproc_per_node"] == 2, doc
    assert [r["steps"] for r in doc["ranks"]] == [[3, 3], [3, 3]] and doc["desync"] == [None, None]
    for rank in (0, 1):
        assert state(out / "run1" / f"rank{rank}" / "stdout.txt") == {
            "num_processes": 2, "process_index": rank, "mixed_precision": "no", "dtype": "torch.float32",
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1")}  # torchrun's default


def test_check_of_an_unseeded_accelerate_script_diverges(tmp_path):
    p = torchrepro("check", "--json", "--out", str(tmp_path / "out"), "--", sys.executable, "-m",
                   "accelerate.commands.launch", "--cpu", SCRIPT, "--steps", "3", "--unseeded")
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "diverged" and doc["steps"] == [3, 3], doc


def test_accelerate_commands_are_understood():
    target = parse_python_command(["accelerate", "launch", "--cpu", "--mixed_precision", "bf16", SCRIPT, "--x"])
    assert (target.kind, target.target, target.argv) == ("path", SCRIPT, [SCRIPT, "--x"])
    env = dict(target.env)
    assert env["ACCELERATE_USE_CPU"] == "True" and env["ACCELERATE_MIXED_PRECISION"] == "bf16" and not target.launcher
    module = parse_python_command([sys.executable, "-m", "accelerate.commands.launch", "--cpu", "-m", "pkg.train"])
    assert (module.kind, module.target, module.interpreter) == ("module", "pkg.train", sys.executable)
    two = ["accelerate-launch", "--multi_gpu", "--num_processes=2", SCRIPT]
    assert ranks_command(two, None) == (two, 2) and parse_python_command(two).launcher == tuple(two)
    with pytest.raises(CommandError, match="disagrees with the accelerate command, which starts 2 processes"):
        ranks_command(two, 3)


def test_accelerate_cpu_runs_one_process_whatever_num_processes_says(capsys):
    command = ["accelerate", "launch", "--cpu", "--num_processes", "2", SCRIPT]
    assert ranks_command(command, None) == (command, None)
    assert capsys.readouterr().err == (
        f"torchrepro: note: `{' '.join(command)}` starts one process whatever --num_processes says (accelerate's "
        "simple launcher: several processes need --multi_gpu, or mpirun through --mpirun_hostfile); torchrepro records "
        "that one process, as accelerate runs it. For several CPU processes: `accelerate launch --multi_gpu "
        "--num_processes N` with Accelerator(cpu=True).\n")


DEEPSPEED = ("torchrepro does not follow `deepspeed` (DeepSpeed's launcher): it starts the training processes itself, "
             "so torchrepro would record the launcher, not the training. Run the script with torchrun, which "
             "torchrepro follows: `-- torchrun --nproc-per-node N train.py --lr 0.1` (DeepSpeed reads the ranks "
             "torchrun sets), or with python for one process: `-- python train.py --lr 0.1`.")


@pytest.mark.parametrize("command, message", [
    (["deepspeed", "train.py", "--lr", "0.1"], DEEPSPEED),
    (["mpirun", "-n", "2", "python", "train.py"], "torchrepro does not follow `mpirun` (MPI's launcher)"),
    (["python", "-m", "torch.distributed.launch", "--nproc-per-node", "2", "train.py"],
     "torchrepro does not follow `python -m torch.distributed.launch` (PyTorch's deprecated launcher, which passes "
     "--local-rank to the script)"),
    (["srun", "-n", "2", "python", "train.py"], "srun torchrepro run --record DIR -- torchrun"),
    (["accelerate", "test"], "torchrepro follows `accelerate launch`, not `accelerate test`"),
    (["accelerate", "launch", "--use_deepspeed", "train.py"],
     "torchrepro does not follow `accelerate launch` with DeepSpeed"),
    (["accelerate", "launch", "--no_python", "train.sh"], "remove --no_python"),
])
def test_launchers_not_followed_are_refused_by_name(tmp_path, capsys, command, message):
    rc = main(["check", "--out", str(tmp_path / "o"), "--", *command])
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    assert "no backward() call" not in err and not (tmp_path / "o").exists()
    if message == DEEPSPEED:
        assert err.strip() == f"torchrepro: error: {DEEPSPEED}"
