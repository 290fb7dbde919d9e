"""verify_resume called from a single script, as the README and docs/resume.md show it: no `__main__` guard."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchrepro
from torchrepro.resume import verify

SRC = str(Path(torchrepro.__file__).resolve().parents[1])

# The recipe of docs/resume.md ("Prove it: verify_resume"), with Net and dataset defined, as one file, unguarded.
RECIPE = textwrap.dedent("""\
    import torch
    import torchrepro

    torch.manual_seed(0)
    dataset = torch.utils.data.TensorDataset(torch.randn(96, 4), torch.randint(0, 3, (96,)))
    BUILT = []  # build() and step() must see one module: its globals are shared as in the caller's process


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x)


    def build():
        BUILT.append(1)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torchrepro.ResumableLoader(dataset, batch_size=32, shuffle=True, seed=0)
        return {"model": model, "optimizer": opt, "loader": loader}


    def step(state):
        assert BUILT == [1], BUILT
        x, y = state["loader"].next_batch()
        state["optimizer"].zero_grad()
        loss = torch.nn.functional.cross_entropy(state["model"](x), y)
        loss.backward()
        state["optimizer"].step()
        return loss


    report = torchrepro.verify_resume(build, step, steps=6, resume_at=2)
    assert report.identical, report
    print(report)
    print("AFTER THE CALL")  # runs in the caller's process only
""")


def _run(script: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=script.parent, env=env,
                          timeout=600)


def test_the_documented_recipe_works_in_one_script_without_a_main_guard(tmp_path):
    """Before: each fresh process re-ran the script's verify_resume call and failed with
    ModuleNotFoundError: No module named '_torchrepro_resume_target'."""
    script = tmp_path / "train_setup.py"
    script.write_text(RECIPE)
    p = _run(script)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "resume is bitwise exact: 6 steps straight == 2 steps + save + load in a new process + 4 steps (losses, "
        "parameters, optimizer state)",
        "AFTER THE CALL"]


def test_functions_of_an_interactive_session_are_refused_by_name(monkeypatch):
    """A REPL's or notebook's __main__ has no file: say so, instead of importing the working directory."""
    import types

    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)

    def build():  # pragma: no cover - never called
        return {}

    build.__module__, build.__qualname__ = "__main__", "build"
    with pytest.raises(TypeError) as info:
        verify.verify_resume(build, build, steps=2, resume_at=1)
    assert str(info.value) == ("build is defined in an interactive session (a REPL or notebook), which a fresh "
                               "process cannot import: put build and step in a .py file and import them from there "
                               "(or run that file with python).")
