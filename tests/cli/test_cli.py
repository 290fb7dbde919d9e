from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torchrepro
from torchrepro.cli import main


def test_module_help_and_version():
    out = subprocess.run([sys.executable, "-m", "torchrepro", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: torchrepro" in out.stdout
    out = subprocess.run([str(Path(sys.executable).parent / "torchrepro"), "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"torchrepro {torchrepro.__version__}"


def test_env_json(capsys):
    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["torch"].startswith("2.") and info["device_kind"] == "cpu"
    assert "use_deterministic_algorithms" in info["determinism"]


def test_no_command_is_usage_error(capsys):
    assert main([]) == 2


def test_run_deterministic_except_leaves_out_only_those_settings(tmp_path, capfd):
    script = Path(__file__).resolve().parents[1] / "scripts" / "needs_algorithms.py"
    rec = tmp_path / "rec"
    assert main(["run", "--record", str(rec), "--max-steps", "2", "--deterministic-except",
                 "fill-uninitialized-memory", "--", sys.executable, str(script)]) == 0
    manifest = json.loads((rec / "manifest.json").read_text())
    assert manifest["deterministic"] and manifest["determinism_options"] == {"fill_uninitialized_memory": False}
    assert "fill_uninitialized_memory=False algorithms=True" in capfd.readouterr().out
    assert main(["run", "--deterministic-except", "fill,tf32", "--", sys.executable, str(script)]) == 2
    err = capfd.readouterr().err
    assert "argument --deterministic-except: unknown deterministic-mode setting 'fill'; known: algorithms, " \
           "fill-uninitialized-memory, cudnn-deterministic" in err
