"""Eager vs torch.compile with dropout: the difference is in the random numbers, not in a kernel's arithmetic
(issue 40: `prims.inductor_seeds` was blamed on "generated code (fusion, reduction order)" with "Accept it with
--rtol/--atol (the size is above)" although the masks differ and no size was shown)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchrepro
from torchrepro.analysis.compiledvs import compiled_vs_eager, is_random_op
from torchrepro.record.compiled import inductor_rng_settings

SRC = str(Path(torchrepro.__file__).resolve().parents[1])
RNG = {"torch": "2.13.0+cpu", "fallback_random": False, "align_random_eager": False}

RNG_FIX = (
    "The random numbers differ, not the arithmetic: the compiled code draws its dropout masks and torch.rand* values "
    "from inductor's own random stream (seeded per call by prims.inductor_seeds from torch's generator), while eager "
    "PyTorch draws them from torch's generator op by op (bernoulli/native_dropout, rand), so the same seed gives "
    "other masks. A tolerance cannot absorb that: other elements are dropped and kept, so values differ by their "
    "full size; --rtol/--atol absorb only rounding-sized differences of the same computation. To make the compiled "
    "code draw eager's random numbers, set `torch._inductor.config.fallback_random = True` in B's script before it "
    "compiles (its random ops then run as eager kernels: slower), and compare again: what is left, if anything, is "
    "rounding in the generated kernels, which --rtol/--atol can accept.")
OFFERS = (" The torch B ran (2.13.0+cpu) offers fallback_random (any device) and align_random_eager (CUDA only: "
          "eager's random numbers inside fused kernels, faster than fallback_random); B ran with fallback_random = "
          "False, align_random_eager = False.")


def _graphs(op: str, *, deltas: dict | None = None, rng: dict | None = None) -> dict:
    """One captured forward graph whose first call node ``n`` gives other bits compiled than eager."""
    node = {"name": "n", "kind": "call_function", "op": op, "args": ["x"], "module": None, "file": None,
            "line": None, "code": ""}
    graph = {"region": 0, "kind": "forward", "order": 0, "nodes": [node], "outputs": ["n"], "program": [["p"]],
             "compiled": [{"x": "fx", "n": "c1"}, {"x": "fx", "n": "c2"}], "eager": [{"x": "fx", "n": "e"}],
             "deltas": deltas or {}}
    doc = {"graphs": [graph], "regions": [{"index": 0, "target": "Net"}]}
    return doc | ({"inductor_rng": rng} if rng is not None else {})


def test_a_differing_random_op_is_an_rng_difference_with_the_settings_that_align_it():
    doc = compiled_vs_eager(_graphs("prims.inductor_seeds", rng=RNG), step=1, side="B")
    assert doc["verdict"] == "compiled-rng"
    assert doc["title"] == ("the compiled code draws other random numbers than eager PyTorch: inductor generates its "
                            "own (dropout masks, torch.rand*) where eager draws them from torch's generator")
    assert doc["fix"] == RNG_FIX + OFFERS
    assert "size is above" not in doc["fix"] and "fusion, reduction order" not in doc["fix"]


def test_an_older_capture_without_the_rng_settings_still_names_fallback_random():
    assert compiled_vs_eager(_graphs("prims.inductor_seeds"), step=1, side="B")["fix"] == RNG_FIX


@pytest.mark.parametrize("op", ["prims.inductor_random", "aten.bernoulli.p", "aten.native_dropout", "aten.rand"])
def test_every_random_op_is_one(op):
    assert is_random_op(op) and compiled_vs_eager(_graphs(op), step=1)["verdict"] == "compiled-rng"
    assert not is_random_op("aten.sum") and not is_random_op(None)


def test_a_kernel_fix_points_at_a_size_only_where_one_is_shown():
    measured = compiled_vs_eager(_graphs("aten.sum", deltas={"n": {"max_abs": 1e-7, "max_rel": 1e-6}}), step=1)
    assert measured["verdict"] == "compiled-kernel"
    assert ("Accept it with `--rtol/--atol` (its size is above: compiled vs eager on identical inputs)"
            in measured["fix"])
    unmeasured = compiled_vs_eager(_graphs("aten.sum"), step=1)
    assert "Accept it with `--rtol/--atol` (its size was not measured for this op: the tolerance lines above say how " \
           "far the runs part)" in unmeasured["fix"]
    assert "the size is above" not in measured["fix"] + unmeasured["fix"]


def test_the_capture_records_this_torchs_rng_settings():
    import torch._inductor.config as config

    found = inductor_rng_settings()
    assert found["torch"] == torch.__version__
    assert found["fallback_random"] is bool(config.fallback_random)
    assert ("align_random_eager" in found) is hasattr(config, "align_random_eager")


SCRIPT = """\
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = torch.compile(model) if "--compile" in sys.argv else model
x, y = torch.randn(32, 8), torch.randn(32, 1)
for _ in range(2):
    opt.zero_grad()
    ((run(x) - y) ** 2).mean().backward()
    opt.step()
"""


def test_eager_vs_compiled_dropout_end_to_end(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    py = sys.executable
    p = subprocess.run([py, "-m", "torchrepro", "compare", "--seed", "0", "--locate", "--out", "out",
                        f"{py} train.py", f"{py} train.py --compile"], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": SRC}, timeout=900)
    assert p.returncode == 1, p.stderr
    loc = json.loads((tmp_path / "out" / "compare.json").read_text())["locate"]
    assert loc["verdict"] == "compiled-rng" and is_random_op(loc["op"]["op"]), loc
    assert loc["fix"].startswith(RNG_FIX[:80]) and "fallback_random = True" in loc["fix"]
    assert "  B's compiled code draws its random numbers through this op (inductor's own stream); A, eager, draws " \
           "them through torch's random ops: other masks, whatever the arithmetic" in p.stdout
    assert "size is above" not in p.stdout
