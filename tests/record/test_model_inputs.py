"""Loops without a DataLoader: the inputs of the model's forward are the data of a step ("batches_source":
"model-inputs"), so that unseeded hand-written batches get cause `data`, not `compute`."""

from __future__ import annotations

import gc
import json
import pickle
import warnings
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import torchrepro
from tests.inprocess import torchrepro as in_process
from torchrepro.analysis.compare import compare_runs
from torchrepro.record.store import MODEL_INPUTS, load_run

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "hand_batches.py"


def check(tmp_path: Path, *script_args: str) -> tuple[int, dict, str]:
    """`check --json` of the script, in this process (tests/inprocess.py). Runs of several micro-batches a step
    (--accum), or with --kwargs or --eval-unseeded, use AdamW's steps; the others update the parameters by hand
    (--manual: no torch.optim, whose first use imports torch._dynamo, about 1 CPU s a run)."""
    out = tmp_path / "out"
    manual = () if {"--accum", "--kwargs", "--eval-unseeded"} & set(script_args) else ("--manual",)
    p = in_process("check", "--json", "--out", str(out), "--", "python", str(SCRIPT), "--steps", "3", *manual,
                   *script_args, timeout=600)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


@pytest.mark.parametrize("call", [(), ("--kwargs", "--accum", "2")])
def test_unseeded_hand_written_batches_are_data(tmp_path, call):
    rc, doc, err = check(tmp_path, *call)
    assert rc == 1, err
    assert (doc["verdict"], doc["first_divergent_step"], doc["cause"]) == ("diverged", 1, "data")
    first = doc["diverged_first"][0]
    assert first["kind"] == "batches" and first["label"] == "data batch"
    assert first["names"][0] == "TinyLM.forward inputs[0]"
    assert doc["data_source"] == {"source": MODEL_INPUTS, "modules": ["TinyLM"],
                                  "text": "the inputs of TinyLM.forward (no DataLoader seen)"}
    assert "the inputs of TinyLM.forward (no DataLoader seen) differ" in doc["explanation"]
    assert "--deterministic" not in doc["action"] and "seeded generators" in doc["action"]
    step = load_run(tmp_path / "out" / "run1").steps()[0]
    assert step["batches_source"] == MODEL_INPUTS and step["input_modules"] == ["TinyLM"] * (2 if call else 1)


@pytest.mark.parametrize("extra", [(), ("--kwargs", "--accum", "2", "--eval-unseeded")])
def test_seeded_hand_written_batches_are_identical(tmp_path, extra):
    """Validation forwards under no_grad and eval-mode forwards between steps draw unseeded data: not training
    data, so no false divergence."""
    rc, doc, err = check(tmp_path, "--data-seed", "1", *extra)
    assert rc == 0, (err, doc.get("diverged_first"))
    assert doc["verdict"] == "identical"
    steps = load_run(tmp_path / "out" / "run1").steps()
    assert all(s["batches_source"] == MODEL_INPUTS and len(s["batches"]) == (2 if extra else 1) for s in steps)


def test_nondeterministic_compute_stays_compute_with_inputs_fingerprinted(tmp_path):
    rc, doc, err = check(tmp_path, "--data-seed", "1", "--dropout-unseeded")
    assert rc == 1, err
    assert (doc["verdict"], doc["first_divergent_step"], doc["cause"]) == ("diverged", 1, "compute")
    assert "batches" not in [d["kind"] for d in doc["diverged_first"]] and doc["data_source"] is None
    assert load_run(tmp_path / "out" / "run1").steps()[0]["batches_source"] == MODEL_INPUTS


# --- in-process (watch) ----------------------------------------------------------------------------------------
class Net(nn.Module):
    def __init__(self, drop_seed: int | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)
        self.gen = torch.Generator().manual_seed(drop_seed) if drop_seed is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x))
        if self.gen is not None:
            h = h * (torch.rand(h.shape, generator=self.gen) > 0.5)
        return self.out(h)


def _loop(run_dir: Path, *, data_seed: int, wrap=lambda m: m, steps: int = 3) -> nn.Module:
    torch.manual_seed(0)
    model = Net()
    called = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(data_seed)
    with torchrepro.watch(model, opt, run_dir=run_dir):
        for _ in range(steps):
            called(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return called


def test_dataloader_batches_unchanged_and_model_inputs_not_fingerprinted(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = torch.utils.data.TensorDataset(torch.randn(12, 4))
    with torchrepro.watch(model, opt, run_dir=tmp_path / "a") as rec:
        for (x,) in torch.utils.data.DataLoader(ds, batch_size=4):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            assert not model._forward_pre_hooks and not model._forward_hooks  # the forward is not hooked
        assert rec.inputs.since_backward == [] and rec.inputs.pending == []
    steps = load_run(tmp_path / "a").steps()
    assert len(steps) == 3 and all(len(s["batches"]) == 1 and "batches_source" not in s for s in steps)
    assert not torch.nn.modules.module._global_forward_pre_hooks  # the global hook that waited is gone


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_hooked_model_can_be_scripted_and_is_unhooked_after(tmp_path):
    """torch.jit.script compiles a module's hooks, and Python hooks cannot be: ours are off while it scripts."""
    script = torch.jit.script
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchrepro.watch(model, opt, run_dir=tmp_path / "a"):
        for step in range(3):
            model(torch.ones(2, 4) * step).sum().backward()
            opt.step()
            opt.zero_grad()
            assert model._forward_pre_hooks
            torch.jit.script(model)
    assert torch.jit.script is script and not model._forward_pre_hooks and not model._forward_hooks
    assert [len(s["batches"]) for s in load_run(tmp_path / "a").steps()] == [1, 1, 1]


def test_compiled_module_is_recorded_without_recompiling_or_warning(tmp_path):
    compiles: list[int] = []

    def backend(gm, example_inputs):
        compiles.append(1)
        return gm.forward

    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's warning about global module hooks at compiled calls included
        _loop(tmp_path / "a", data_seed=1, wrap=lambda m: torch.compile(m, backend=backend))
    assert len(compiles) == 1
    steps = load_run(tmp_path / "a").steps()
    assert [s["input_modules"] for s in steps] == [["Net"]] * 3  # named after the compiled module
    _loop(tmp_path / "b", data_seed=1)  # eager: the same inputs
    assert [s["batches"] for s in steps] == [s["batches"] for s in load_run(tmp_path / "b").steps()]


def test_ddp_wrapped_module_records_its_callers_inputs(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        _loop(tmp_path / "a", data_seed=1, wrap=lambda m: nn.parallel.DistributedDataParallel(m))
        _loop(tmp_path / "b", data_seed=2, wrap=lambda m: nn.parallel.DistributedDataParallel(m))
    finally:
        dist.destroy_process_group()
    a, b = load_run(tmp_path / "a"), load_run(tmp_path / "b")
    assert [s["input_modules"] for s in a.steps()] == [["Net"]] * 3
    result = compare_runs([a, b])
    assert (result.first_step, result.cause, result.first[0].names) == (1, "data", ["Net.forward inputs[0]"])


def test_outputs_of_another_model_are_not_data(tmp_path):
    """A GAN-like step: D's inputs are G's output, detached (and through the autograd graph): not data. G's
    unseeded dropout makes the runs differ in compute; D's inputs then differ too, but are no data."""
    def run(run_dir: Path, drop_seed: int) -> None:
        torch.manual_seed(0)
        gen, disc = Net(drop_seed), Net()
        opt = torch.optim.SGD([*gen.parameters(), *disc.parameters()], lr=0.1)
        z = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
        with torchrepro.watch({"G": gen, "D": disc}, opt, run_dir=run_dir):
            for _ in range(2):
                fake = gen(z).expand(8, 4)
                (disc(fake.detach()).mean() + disc(fake).mean()).backward()
                opt.step()
                opt.zero_grad()
                pickle.dumps(gen)  # a hooked model stays picklable (torch.save of the whole module)

    run(tmp_path / "a", 1)
    run(tmp_path / "b", 2)
    a, b = load_run(tmp_path / "a"), load_run(tmp_path / "b")
    assert [s["input_modules"] for s in a.steps()] == [["Net"]] * 2  # G(z) only
    result = compare_runs([a, b])
    assert (result.first_step, result.cause) == (1, "compute") and result.data_source is None


def test_a_finished_recorder_is_freed_with_its_last_reference(tmp_path):
    """The model-input watch and the resume marks refer to their recorder weakly: no cycle keeps a finished
    recorder, and the optimizers it holds, alive until a gc pass (optimizers_exist() would still see them, and a
    later script without torch.optim would not get one step per backward())."""
    from torchrepro.record.recorder import Recorder

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gc.disable()
    try:
        rec = Recorder(tmp_path / "r", models={"": model}, resume_marks=True, keep_values=True).install()
        for _ in range(2):
            model(torch.randn(8, 4)).sum().backward()  # no DataLoader: the model's forward is hooked
            opt.step()
            opt.zero_grad()
        rec.finish()
        assert rec.inputs._roots and rec.marks is not None
        freed = weakref.ref(rec)
        del rec
        assert freed() is None
    finally:
        gc.enable()
