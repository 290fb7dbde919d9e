"""_core/dispatchmode: torchrepro's dispatch modes do not import torch._dynamo in a script that never compiles.

Each case runs in a new interpreter: the test process itself imported torch._dynamo long ago.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.inprocess import torchrepro

# A by-hand training script (no torch.optim, whose first optimizer imports torch._dynamo) that writes, before each
# backward(), whether torch._dynamo is imported in its process.
BY_HAND = """
import os, sys, torch
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
x = torch.randn(16, 4)
for step in range(3):
    h = m[0](x)
    if step == 1:
        h = h + (1 + int.from_bytes(os.urandom(1), "little")) * 1e-6  # differs between runs: --locate traces step 2
    loss = m[2](m[1](h)).pow(2).mean()
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()} {'torch._dynamo' in sys.modules}\\n")
    loss.backward()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
"""


def _seen(flags: Path) -> dict[str, set[str]]:
    """{process id: {"True"/"False", ...}} from the script's lines."""
    seen: dict[str, set[str]] = {}
    for line in flags.read_text().splitlines():
        pid, loaded = line.split()
        seen.setdefault(pid, set()).add(loaded)
    return seen


def test_scan_and_the_traced_reruns_of_locate_leave_torch_dynamo_unimported(tmp_path):
    script, flags = tmp_path / "train.py", tmp_path / "flags.txt"
    script.write_text(BY_HAND)

    p = torchrepro("scan", "--", sys.executable, str(script), str(flags), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert list(_seen(flags).values()) == [{"False"}]  # the scan's one process, up to its first backward()

    flags.unlink()
    p = torchrepro("check", "--locate", "--json", "--out", str(tmp_path / "out"), "--", sys.executable, str(script),
                   str(flags), cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert (doc["verdict"], doc["first_divergent_step"]) == ("diverged", 2)
    located = doc["locate"]
    assert (located["verdict"], located["op"]["op"], located["op"]["line"]) == ("origin", "aten.add", 10)
    seen = _seen(flags)
    assert len(seen) == 4  # two recorded runs, two traced re-runs
    assert all(loaded == {"False"} for loaded in seen.values()), seen


PROBE = """
import sys, torch
from torch.utils._python_dispatch import TorchDispatchMode
from torchrepro._core.dispatchmode import QuietDispatchMode

def counting(base):
    class Count(base):
        seen = []
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.seen.append(str(func))
            return func(*args, **(kwargs or {}))
    return Count

Quiet = counting(QuietDispatchMode)
handler = Quiet.__torch_dispatch__.__wrapped__
with Quiet():
    torch.ones(3).sin()
print("eager", "torch._dynamo" in sys.modules, len(Quiet.seen), hasattr(handler, "__dynamo_disable"))

import torch._dynamo  # from here on the handler runs under torch's own wrapper, as a TorchDispatchMode's would
with Quiet():
    torch.ones(3).sin()
print("wrapped", hasattr(handler, "__dynamo_disable") or not hasattr(torch, "_disable_dynamo"),
      "dispatchmode" not in Quiet.__torch_dispatch__.__code__.co_filename)

f = torch.compile(lambda x: (x.sin() + 1).sum(), backend="eager")
for base in (QuietDispatchMode, TorchDispatchMode):
    mode = counting(base)
    with mode():
        result = f(torch.arange(4.0))
    print(base.__name__, float(result), mode.seen)
"""


def test_the_mode_sees_every_op_without_dynamo_and_after_it_as_torchs_own_modes_do():
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    eager, wrapped, quiet, plain = p.stdout.splitlines()
    assert eager == "eager False 2 False"  # ones, sin: seen, and torch._dynamo still not imported
    assert wrapped == "wrapped True True"  # torch's own wrapper of the handler, ours gone
    # under torch.compile it sees what a plain TorchDispatchMode sees
    assert quiet.split(" ", 1)[1] == plain.split(" ", 1)[1]
    assert "aten.sin.default" in quiet
