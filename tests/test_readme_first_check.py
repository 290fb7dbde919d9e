"""The README's first check on one's own script, run as written: the block under "Your first check, on your own
script", in a folder holding a training script that takes the block's arguments, with the venv's torchrepro."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

from tests.inprocess import torchrepro

ROOT = Path(__file__).resolve().parents[1]

TRAIN = textwrap.dedent("""\
    import argparse
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(20):
        x = torch.randn(16, 8)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    """)


def _first_check_block() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Your first check, on your own script", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the README's first-check section has no bash block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_readmes_first_check_runs_as_written(tmp_path):
    commands = _first_check_block()
    assert commands and all(c.startswith("torchrepro check --max-steps") for c in commands), commands
    (tmp_path / "train.py").write_text(TRAIN)
    for command in commands:
        argv = shlex.split(command)[1:]
        p = torchrepro(*argv, cwd=tmp_path, timeout=600)
        assert p.returncode == 0, p.stderr
        steps = argv[argv.index("--max-steps") + 1]
        assert p.stdout.startswith(f"torchrepro: IDENTICAL - 2 runs of `python train.py --lr 0.1`, {steps} steps "
                                   "each"), p.stdout
        assert "Report: torchrepro-runs/check-" in p.stdout  # the output directory the README points at
