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
