"""The recorder and launcher, through `torchrepro run` in separate processes and `watch` in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

import torchrepro
from torchrepro.cli import main
from torchrepro.record.store import load_run

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def torchrepro_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchrepro", *args], capture_output=True, text=True, timeout=300)


def test_run_preserves_argv_exit_code_output_and_fixes_hashseed(tmp_path):
    outs = []
    for i in range(2):
        p = torchrepro_cli("run", "--record", str(tmp_path / f"r{i}"), "--", "python",
                           str(SCRIPTS / "exit_code.py"), "3")
        assert p.returncode == 3, p.stderr
        assert "argv: ['3']" in p.stdout
        outs.append(p.stdout)
    run = load_run(tmp_path / "r0")
    m = run.manifest
    assert m["exit_code"] == 3 and m["status"] == "failed" and m["steps"] == 5
    assert m["format"] == "torchrepro.run" and m["version"] == 1 and m["torch"] == torch.__version__
    assert m["environment"]["env"]["PYTHONHASHSEED"] == "0"
    assert [e["kind"] for e in run.events] == ["init", "backward"] + ["step"] * 5 + ["final"]


def test_run_json_prints_only_the_manifest(tmp_path):
    p = torchrepro_cli("run", "--json", "--record", str(tmp_path / "r"), "--", "python",
                       str(SCRIPTS / "exit_code.py"))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["status"] == "ok" and doc["steps"] == 5 and doc["format"] == "torchrepro.run"
    assert "argv: []" in p.stderr  # the script's own stdout was moved to stderr


def test_hash_seed_is_fixed_in_child(tmp_path):
    code = "print(hash('torchrepro'))"
    script = tmp_path / "h.py"
    script.write_text(code)
    a = torchrepro_cli("run", "--", "python", str(script)).stdout
    b = torchrepro_cli("run", "--", "python", str(script)).stdout
    assert a == b and a.strip()


def test_max_steps_stops_cleanly(tmp_path):
    p = torchrepro_cli("run", "--record", str(tmp_path / "r"), "--max-steps", "2", "--",
                       "python", str(SCRIPTS / "exit_code.py"), "4")
    assert p.returncode == 0, p.stderr
    m = load_run(tmp_path / "r").manifest
    assert m["status"] == "stopped-at-max-steps" and m["steps"] == 2
    assert "hash-seed-fixed" not in p.stdout  # the script did not run past step 2


def test_manual_updates_make_each_backward_a_step(tmp_path):
    p = torchrepro_cli("run", "--record", str(tmp_path / "r"), "--", "python", str(SCRIPTS / "manual_sgd.py"))
    assert p.returncode == 0, p.stderr
    run = load_run(tmp_path / "r")
    assert run.manifest["step_mode"] == "backward" and run.manifest["steps"] == 4
    steps = run.steps()
    assert len(steps) == 4 and set(steps[0]["params"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert steps[0]["params"] != steps[1]["params"]  # the hand update between backward calls is seen


def test_two_models_lbfgs_closure_and_accumulation(tmp_path):
    p = torchrepro_cli("run", "--record", str(tmp_path / "r"), "--", "python", str(SCRIPTS / "features.py"))
    assert p.returncode == 0, p.stderr
    run = load_run(tmp_path / "r")
    steps = run.of_kind("step")
    assert [s["opt"] for s in steps] == [0, 1] * 3
    adam, lbfgs = steps[0], steps[1]
    assert set(adam["params"]) == {"Net.layer1.0.conv1.weight", "Net.layer1.0.conv1.bias",
                                   "Net.layer1.1.conv1.weight", "Net.layer1.1.conv1.bias",
                                   "Net.out.weight", "Net.out.bias"}
    assert len(adam["losses"]) == 2  # two backward() calls accumulated into one step
    assert set(lbfgs["params"]) == {"Linear.weight", "Linear.bias"}
    assert len(lbfgs["losses"]) >= 2  # the closure ran backward() several times inside step()
    assert "Net.layer1.0.conv1.weight.exp_avg" in adam["state"]
    assert all(v for v in adam["grads"].values())


def _train(seed: int, run_dir: Path, init_seed: int | None = None) -> None:
    torch.manual_seed(init_seed if init_seed is not None else seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(seed)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))),
                                         batch_size=16, shuffle=True)
    with torchrepro.watch(model, opt, run_dir=run_dir):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()


def test_watch_from_code_and_diff(tmp_path, capsys):
    _train(0, tmp_path / "a")
    _train(0, tmp_path / "b")
    _train(0, tmp_path / "c", init_seed=1)
    assert load_run(tmp_path / "a").manifest["steps"] == 4
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "d1")]) == 0
    assert "IDENTICAL" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "c"), "--json", "--out", str(tmp_path / "d2")]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "diverged" and doc["first_divergent_step"] == 0 and doc["cause"] == "initial-weights"
    assert torch.autograd.backward.__name__ == "backward" and not hasattr(torch.autograd.backward, "__wrapped__")


def test_values_are_memory_mapped_from_a_file_name(tmp_path, monkeypatch):
    """torch 2.1's torch.load memory-maps only a file given by name (a Path was ValueError: every diff failed)."""
    from torchrepro.record import store

    path = tmp_path / "init.pt"
    torch.save({"w": torch.arange(3.0)}, path)
    real_load = torch.load

    def load_as_torch_2_1(f, *args, mmap=None, **kwargs):
        if mmap and not isinstance(f, str):
            raise ValueError("f must be a string filename in order to use mmap argument")
        return real_load(f, *args, mmap=mmap, **kwargs)

    monkeypatch.setattr(torch, "load", load_as_torch_2_1)
    assert torch.equal(store.load_values(path, mmap=True)["w"], torch.arange(3.0))
