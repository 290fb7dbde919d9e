"""The recorder on awkward inputs: object batches, sparse and float8 tensors, failing value writes, max_steps.

Each test here failed before its fix (see the commit messages of issue 8).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import subprocess
import sys
import threading
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

import torchrepro
from torchrepro._core.errors import ReproWarning
from torchrepro._core.fingerprint import UNREADABLE
from torchrepro.analysis.compare import compare_runs
from torchrepro.record import recorder as record
from torchrepro.record.store import load_run

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


# --- batches that are not tensors, dicts or lists ----------------------------------------------------------
class PlainBatch:
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.meta = {"source": "synthetic", "ids": list(range(len(x)))}


@dataclasses.dataclass
class DataclassBatch:
    x: torch.Tensor
    y: torch.Tensor
    note: str = "dc"


class SlotsBatch:
    __slots__ = ("x", "y")

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y


NamedBatch = namedtuple("NamedBatch", ["x", "y"])
BATCH_TYPES = {"plain": PlainBatch, "dataclass": DataclassBatch, "slots": SlotsBatch, "namedtuple": NamedBatch}


def _collate(kind: str):
    def collate(items):
        return BATCH_TYPES[kind](torch.stack([a for a, _ in items]), torch.stack([b for _, b in items]))
    return collate


def _train_on(run_dir: Path, kind: str, data: torch.Tensor, *, max_steps: int | None = None, **watch_kw) -> None:
    torch.manual_seed(0)
    model = nn.Linear(data.shape[1], 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = torch.utils.data.TensorDataset(data, torch.ones(len(data), 1))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=_collate(kind))
    with torchrepro.watch(model, opt, run_dir=run_dir, max_steps=max_steps, **watch_kw):
        for batch in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(batch.x), batch.y).backward()
            opt.step()


@pytest.mark.parametrize("kind", sorted(BATCH_TYPES))
def test_object_batches_of_identical_runs_are_identical(tmp_path, kind):
    """repr() of a plain object holds its memory address: identical runs were reported as data divergence."""
    data = torch.randn(12, 3, generator=torch.Generator().manual_seed(1))
    _train_on(tmp_path / "a", kind, data)
    _train_on(tmp_path / "b", kind, data)
    runs = [load_run(tmp_path / "a"), load_run(tmp_path / "b")]
    steps = runs[0].steps()
    assert len(steps) == 3 and all(not b.startswith(UNREADABLE) for s in steps for b in s["batches"])
    result = compare_runs(runs)
    assert result.verdict == "identical", (result.first, result.notes)


@pytest.mark.parametrize("kind", ["dataclass", "plain"])
def test_difference_inside_a_large_tensor_of_an_object_batch_is_data(tmp_path, kind):
    """repr() elides the middle of large tensors: a real data difference was reported as cause `compute`."""
    data = torch.randn(8, 2000, generator=torch.Generator().manual_seed(2))
    other = data.clone()
    other[1, 1000] += 1.0
    _train_on(tmp_path / "a", kind, data)
    _train_on(tmp_path / "b", kind, other)
    result = compare_runs([load_run(tmp_path / "a"), load_run(tmp_path / "b")])
    assert result.verdict == "diverged" and result.first_step == 1 and result.cause == "data"
    assert result.first[0].kind == "batches"


class LockedBatch:
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.lock = threading.Lock()  # no state to read: no __dict__, no __slots__, not picklable


def test_unreadable_batch_is_recorded_as_such_and_compare_says_so(tmp_path):
    BATCH_TYPES["locked"] = LockedBatch
    try:
        data = torch.randn(8, 3)
        with pytest.warns(ReproWarning, match="could not read a batch"):
            _train_on(tmp_path / "a", "locked", data)
        _train_on(tmp_path / "b", "locked", data)
    finally:
        del BATCH_TYPES["locked"]
    runs = [load_run(tmp_path / "a"), load_run(tmp_path / "b")]
    batch = runs[0].steps()[0]["batches"][0]
    assert batch.startswith(UNREADABLE) and "batch.lock" in batch and "_thread.lock" in batch
    assert "0x" not in batch.replace("0x…", "")  # no memory address: the same text in every run
    result = compare_runs(runs)
    assert any("2 data batch(es) could not be read, the first at step 1" in n and "batch.lock" in n
               for n in result.notes), result.notes


# --- sparse, float8 and unreadable tensors -------------------------------------------------------------------
def test_sparse_embedding_gradients_are_recorded(tmp_path):
    """nn.Embedding(sparse=True) made recorded runs crash inside backward()."""
    def train(run_dir: Path) -> None:
        torch.manual_seed(0)
        emb = nn.Embedding(20, 4, sparse=True)
        with torchrepro.watch(emb, run_dir=run_dir):
            for step in range(3):
                emb(torch.tensor([1, 5, 1, step])).pow(2).sum().backward()
                with torch.no_grad():
                    emb.weight.add_(emb.weight.grad, alpha=-0.1)
                emb.weight.grad = None
            opt = torch.optim.SGD(emb.parameters(), lr=0.1)  # and through an optimizer that takes them
            for _ in range(2):
                opt.zero_grad()
                emb(torch.tensor([2, 2, 7])).sum().backward()
                opt.step()

    train(tmp_path / "a")
    train(tmp_path / "b")
    run = load_run(tmp_path / "a")
    grads = [g for e in run.events for g in (e.get("grads") or {}).values()]
    assert len(grads) == 6 and all(len(g) == 32 for g in grads)  # 4 backward() events, 2 optimizer steps
    assert compare_runs([run, load_run(tmp_path / "b")]).verdict == "identical"


def test_float8_parameters_are_recorded(tmp_path):
    w = nn.Parameter(torch.randn(8).to(torch.float8_e4m3fn))
    holder = nn.Module()
    holder.w = w
    with torchrepro.watch(holder, run_dir=tmp_path / "r"):
        for _ in range(2):
            (w.float() * 2).sum().backward()
            w.grad = None
    run = load_run(tmp_path / "r")
    assert [len(s["params"]["w"]) for s in run.steps()] == [32, 32]


def test_a_tensor_that_cannot_be_read_is_recorded_not_raised(tmp_path, monkeypatch):
    real = record.fingerprint_many

    def picky(tensors):
        if any(t.dim() == 2 for t in tensors):
            raise RuntimeError("storage at 0x7f00dead is not readable")
        return real(tensors)

    monkeypatch.setattr(record, "fingerprint_many", picky)
    monkeypatch.setattr(record, "fingerprint", lambda t: picky([t])[0])
    with pytest.warns(ReproWarning, match="could not fingerprint 'weight'"):
        _train_on(tmp_path / "a", "namedtuple", torch.randn(8, 3))
    _train_on(tmp_path / "b", "namedtuple", torch.randn(8, 3))
    runs = [load_run(tmp_path / "a"), load_run(tmp_path / "b")]
    step = runs[0].steps()[0]
    assert step["params"]["weight"] == UNREADABLE + "RuntimeError: storage at 0x… is not readable"
    assert len(step["params"]["bias"]) == 32
    notes = compare_runs(runs).notes
    assert any("could not be fingerprinted" in n and "weight" in n for n in notes), notes


# --- the background value writer -----------------------------------------------------------------------------
def _in_thread(fn, timeout: float = 60.0) -> None:
    """Run ``fn`` with a guard: a hang fails the test instead of blocking the suite forever."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "training hung: the value writer blocked submit() or close()"
    if errors:
        raise errors[0]


def _train_long(run_dir: Path, steps: int = 30) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchrepro.watch(model, opt, run_dir=run_dir):
        for _ in range(steps):
            opt.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            opt.step()


def test_full_disk_in_the_value_writer_never_hangs_and_lists_only_written_files(tmp_path, monkeypatch):
    from torchrepro.record import valuewriter

    real = valuewriter.atomic_write
    calls = []

    def full_disk(path, write, **kwargs):
        calls.append(Path(path).name)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, write, **kwargs)

    monkeypatch.setattr(valuewriter, "atomic_write", full_disk)
    with pytest.warns(ReproWarning, match="could not save parameter values .*No space left on device"):
        _in_thread(lambda: _train_long(tmp_path / "a"))
    m = load_run(tmp_path / "a").manifest
    assert m["steps"] == 30 and m["status"] == "ok"
    assert m["values_saved"] == ["init", "step_000001", "step_000002"]  # no snapshot of the provisional backward
    assert sorted(p.stem for p in (tmp_path / "a" / "values").glob("*.pt")) == sorted(m["values_saved"])
    assert m["values_failed"][0] == "step_000003" and m["values_failed"][-1] == "final"
    assert "No space left on device" in m["values_error"] and "step_000003.pt" in m["values_error"]
    monkeypatch.undo()
    _train_long(tmp_path / "b")
    notes = compare_runs([load_run(tmp_path / "a"), load_run(tmp_path / "b")]).notes
    assert [n for n in notes if "parameter values are unavailable" in n] == [
        f"Run 1: parameter values are unavailable from 'step_000003' on ({m['values_error']}), so max |Δ weight| "
        "misses those steps."]


def test_a_values_directory_that_cannot_be_written_never_hangs(tmp_path):
    def train() -> None:
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with torchrepro.watch(model, opt, run_dir=tmp_path / "r") as rec:
            (rec.trace.dir / "values").rmdir()
            (rec.trace.dir / "values").write_text("not a directory")  # a real OS error, even for root
            for _ in range(20):
                opt.zero_grad()
                model(torch.ones(2, 3)).sum().backward()
                opt.step()

    with pytest.warns(ReproWarning, match="could not save parameter values"):
        _in_thread(train)
    m = load_run(tmp_path / "r").manifest
    assert m["steps"] == 20 and m["values_saved"] == [] and m["values_error"]


# --- max_steps -----------------------------------------------------------------------------------------------
def test_max_steps_applies_to_scripts_that_update_parameters_by_hand(tmp_path):
    p = subprocess.run([sys.executable, "-m", "torchrepro", "run", "--record", str(tmp_path / "r"), "--max-steps",
                        "3", "--", "python", str(SCRIPTS / "record_hand_updates.py")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    run = load_run(tmp_path / "r")
    assert run.manifest["step_mode"] == "backward" and run.manifest["steps"] == 3
    assert run.manifest["status"] == "stopped-at-max-steps"
    assert [e["kind"] for e in run.events] == ["init", "backward", "backward", "backward", "final"]
    assert "loop finished" not in p.stdout


def _accumulating(run_dir: Path, max_steps: int, log: list[str]) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchrepro.watch(model, opt, run_dir=run_dir, max_steps=max_steps):
        try:
            for _ in range(10):
                for _ in range(4):  # gradient accumulation: 4 backward() calls per optimizer step
                    model(torch.ones(2, 3)).sum().backward()
                opt.step()
                opt.zero_grad()
                log.append("step")
        finally:
            log.append("finally")
    log.append("after")


def test_watch_max_steps_returns_from_the_with_block(tmp_path):
    """watch(max_steps=N) used to end the interpreter: now the code after the with block runs."""
    log: list[str] = []
    _accumulating(tmp_path / "r", 2, log)
    assert log == ["step", "finally", "after"]  # the stop unwound step 2 and the user's finally clause ran
    m = load_run(tmp_path / "r").manifest
    assert m["status"] == "stopped-at-max-steps" and m["exit_code"] == 0
    assert m["step_mode"] == "optimizer" and m["steps"] == 2 and m["backward_calls"] == 8  # accumulation kept
    assert torch.autograd.backward.__module__ == "torch.autograd"  # the hooks are gone
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):  # training after the block is not stopped
        model(torch.ones(1, 3)).sum().backward()
        opt.step()


def test_watch_max_steps_in_backward_mode(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    done = 0
    with torchrepro.watch(model, run_dir=tmp_path / "r", max_steps=3):
        for _ in range(50):
            model(torch.ones(2, 3)).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
            done += 1
    assert done == 3  # the third hand update happened; the fourth backward() stopped the loop
    run = load_run(tmp_path / "r")
    assert run.manifest["steps"] == 3 and run.manifest["status"] == "stopped-at-max-steps"
    assert run.of_kind("final")[0]["params"] != run.steps()[-1]["params"]  # final holds the third update


def test_watch_still_propagates_other_errors(tmp_path):
    model = nn.Linear(3, 1)
    with pytest.raises(ValueError, match="boom"), torchrepro.watch(model, run_dir=tmp_path / "r", max_steps=5):
        model(torch.ones(1, 3)).sum().backward()
        raise ValueError("boom")
    assert load_run(tmp_path / "r").manifest["status"] == "failed"


# --- a forked child ------------------------------------------------------------------------------------------
FORK_SCRIPT = SCRIPTS / "fork_child_trains.py"
needs_fork = pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")


@needs_fork
def test_a_forked_child_that_trains_records_nothing_into_the_parents_run(tmp_path):
    """The child's init/step events went into the parent's trace: check said DIVERGED at step 0."""
    p = subprocess.run([sys.executable, "-m", "torchrepro", "check", "--json", "--out", str(tmp_path / "o"),
                        "--", "python", str(FORK_SCRIPT)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "identical" and doc["steps"] == [3, 3]
    for name in ("run1", "run2"):
        run = load_run(tmp_path / "o" / name)
        assert [e["kind"] for e in run.events] == ["init", "backward", "step", "step", "step", "final"]


@needs_fork
def test_a_forked_child_that_trains_writes_no_op_records(tmp_path):
    """The op tracer of `--trace-steps` (what --locate uses) keeps only the parent's ops."""
    p = subprocess.run([sys.executable, "-m", "torchrepro", "run", "--record", str(tmp_path / "r"),
                        "--trace-steps", "1", "--", "python", str(FORK_SCRIPT)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    from torchrepro.record.optrace import read_ops

    ops = list(read_ops(tmp_path / "r" / "ops.jsonl"))
    assert ops and [op["i"] for op in ops] == list(range(len(ops)))
    assert {op["step"] for op in ops} == {1}
    assert not any(op["op"] == "aten.cumsum" for op in ops)  # only the child runs cumsum
    run = load_run(tmp_path / "r")
    assert [e["kind"] for e in run.events] == ["init", "backward", "step", "step", "step", "final"]
    assert run.manifest["traced_ops"] == len(ops)
