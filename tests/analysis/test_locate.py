"""End to end: `torchrepro check --locate` (the command in this process, its runs in their own: tests/inprocess.py),
plus the op tracer and the op-stream comparison in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import torchrepro
from tests.inprocess import torchrepro as in_process
from torchrepro.analysis.locate import deterministic_kernel, locate_ops

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _line_of(path: Path, marker: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), start=1) if marker in line)


# Most test scripts update their parameters by hand, not by torch.optim (whose first use imports torch._dynamo: about
# 1 CPU s in each of the four runs of a check --locate), where a test is not about the optimizer.


def locate(tmp_path: Path, script: Path, *flags: str) -> tuple[int, dict, str]:
    """`check --locate --json`, in this process (tests/inprocess.py)."""
    p = in_process("check", "--locate", "--json", "--out", str(tmp_path / "out"), *flags, "--", "python", str(script))
    return p.returncode, (json.loads(p.stdout) if p.stdout.strip() else {}), p.stderr


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="CPU nondeterminism needs 2+ torch threads")
def test_index_put_origin_with_module_phase_and_line(tmp_path):
    script = EXAMPLES / "scatter_gnn.py"
    rc, doc, err = locate(tmp_path, script, "--max-steps", "2")  # the race is at step 1: 2 of its 5 steps
    assert rc == 1, err
    loc = doc["locate"]
    assert loc["verdict"] == "origin" and loc["step"] == 1
    assert doc["action"].startswith("See Locate below")  # not "check --locate names the operation": it ran
    op = loc["op"]
    assert op["op"] == "aten.index_put_" and op["phase"] == "forward" and op["module"] == "layers.0"
    assert Path(op["file"]).resolve() == script.resolve()
    assert op["line"] == _line_of(script, "index_put_((flat_index,)")
    assert "index_put_" in op["code"]
    assert loc["deterministic_kernel"].startswith("yes")
    assert "--deterministic" in loc["fix"]
    assert loc["alternatives"] == ["unique indices, or torchrepro.nn.functional.index_put"]  # from the registry
    assert loc["fix"].endswith("Deterministic without global deterministic mode: unique indices, or "
                               "torchrepro.nn.functional.index_put.")
    table = Path(loc["op_table"]).read_text()
    assert "=>" in table and "aten.index_put_" in table
    assert (tmp_path / "out" / "locate.json").is_file()


def test_unseeded_generator_in_a_module_gives_rng_verdict(tmp_path):
    script = SCRIPTS / "rng_module.py"
    rc, doc, err = locate(tmp_path, script)
    assert rc == 1, err
    assert doc["cause"] == "compute" and doc["first_divergent_step"] == 1
    loc = doc["locate"]
    assert loc["verdict"] == "rng" and loc["title"] == "random-number state differs"
    assert loc["op"]["op"] == "aten.randn" and loc["op"]["module"] == "1"
    assert loc["op"]["line"] == _line_of(script, "NOISE-LINE")
    assert loc["op"]["generator"] == "private"
    assert loc["fix"].endswith("come from a torch.Generator passed as generator= whose seed differs between runs (its "
                               ".seed(), or a seed taken from the clock or the OS): seed it with a fixed value, "
                               "generator.manual_seed(SEED).")


def test_branch_on_unseeded_draw_gives_control_flow_verdict(tmp_path):
    script = SCRIPTS / "branchy.py"
    rc, doc, err = locate(tmp_path, script)
    assert rc == 1, err
    loc = doc["locate"]
    assert loc["verdict"] == "control-flow"
    branch = _line_of(script, "BRANCH-LINE")
    lines = {loc["op"] and loc["op"]["line"], loc["op_other_run"] and loc["op_other_run"]["line"]}
    assert branch in lines  # one run is still in the loop at that line, the other has left it


def test_unseeded_init_is_located_in_the_model_construction(tmp_path):
    script = SCRIPTS / "unseeded_init_by_hand.py"
    rc, doc, err = locate(tmp_path, script)
    assert rc == 1, err
    loc = doc["locate"]
    assert doc["cause"] == "initial-weights" and loc["step"] == 0
    assert loc["verdict"] == "rng" and loc["op"]["op"] == "aten.uniform_"
    assert loc["op"]["line"] == _line_of(script, "model = nn.Sequential")
    assert loc["op"]["generator"] == "global" and ".seed()" not in loc["fix"]
    assert "come from torch's global generator" in loc["fix"] and "`torchrepro check --seed 0 -- ...`" in loc["fix"]


def test_deterministic_script_has_nothing_to_locate(tmp_path):
    p = in_process("check", "--locate", "--out", str(tmp_path / "o"), "--max-steps", "3", "--", "python",
                   str(SCRIPTS / "manual_sgd.py"))  # seeded, deterministic
    assert p.returncode == 0, p.stderr
    assert "IDENTICAL" in p.stdout and "Locate: the runs are identical: nothing to locate" in p.stdout
    assert "--locate: tracing" not in p.stderr


# --- the tracer in-process ----------------------------------------------------------------------------
class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)  # FORWARD-LINE
        return h.relu()


def test_trace_ops_phases_modules_and_backward_source():
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchrepro.trace_ops(model) as trace:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    phases = {op["phase"] for op in trace.ops}
    assert phases == {"forward", "backward", "optimizer"}
    addmm = next(op for op in trace.ops if op["op"] == "aten.addmm")
    assert addmm["module"] == "fc" and addmm["line"] == _line_of(Path(__file__), "FORWARD-LINE")
    mm_back = [op for op in trace.ops if op["phase"] == "backward" and op["op"] == "aten.mm"]
    assert mm_back and all(op["line"] == addmm["line"] and op["module"] == "fc" for op in mm_back)
    assert all(len(op["out"]) >= 1 for op in trace.ops)
    assert [op["i"] for op in trace.ops] == list(range(len(trace.ops)))


def test_every_backward_op_points_to_the_forward_line_and_module_that_made_its_node():
    # nn.Linear runs two ops (aten.t, aten.addmm), each with its own autograd node; both nodes are the fc's line
    torch.manual_seed(0)
    model = Tiny()
    x = torch.randn(2, 4)
    with torchrepro.trace_ops(model) as trace:
        model(x).sum().backward()  # LOSS-LINE
    here = Path(__file__)
    forward_line, loss_line = _line_of(here, "FORWARD-LINE"), _line_of(here, "LOSS-LINE")
    sites = [(op["op"], op["line"], op["module"]) for op in trace.ops if op["phase"] == "backward"
             and op["op"] not in ("aten.new_empty_strided", "aten.copy_")]  # AccumulateGrad: made by no line
    assert ("aten.expand", loss_line, "") in sites  # the sum's node
    assert ("aten.threshold_backward", forward_line + 1, "Tiny") in sites  # h.relu(), in Tiny's own forward
    fc = [site for site in sites if site[0] in ("aten.t", "aten.mm", "aten.sum", "aten.view")]
    assert len(fc) >= 4 and all(site[1:] == (forward_line, "fc") for site in fc), sites
    assert all(line is not None for _, line, _ in sites), sites


def test_an_op_run_from_the_standard_library_points_to_the_users_line():
    import copy

    x = torch.randn(3)
    with torchrepro.trace_ops() as trace:
        copy.deepcopy(x)  # DEEPCOPY-LINE
    lines = {op["line"] for op in trace.ops}
    assert lines == {_line_of(Path(__file__), "DEEPCOPY-LINE")}, [(op["file"], op["line"]) for op in trace.ops]


def test_backward_ops_of_a_graph_built_by_backward_point_to_the_line_that_built_it():
    torch.manual_seed(0)
    lin = nn.Linear(3, 1)
    x = torch.randn(5, 3, requires_grad=True)
    with torchrepro.trace_ops(lin) as trace:
        y = lin(x).sum()  # DOUBLE-FORWARD
        (g,) = torch.autograd.grad(y, x, create_graph=True)  # GRAD-LINE
        g.square().sum().backward()
    here = Path(__file__)
    lines = {op["line"] for op in trace.ops if op["phase"] == "backward"}
    # the first backward's ops run nodes made by the forward; the second runs nodes the first one made
    assert _line_of(here, "DOUBLE-FORWARD") in lines and _line_of(here, "GRAD-LINE") in lines


def test_trace_ops_handles_inplace_views_tuples_scalars_dtypes_and_sparse():
    with torchrepro.trace_ops() as trace:
        a = torch.arange(6, dtype=torch.float32)
        v = a.view(2, 3)
        v.add_(1)  # in place through a view
        values, idx = torch.max(v, dim=1)  # tuple output
        s = v.sum().item()  # non-tensor output
        torch.tensor([True, False]).logical_not()
        (torch.randn(3, dtype=torch.complex64) * 2).abs()
        torch.arange(4, dtype=torch.int16) + 1
        sp = torch.eye(3).to_sparse()
        (sp * 2).coalesce()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.mm(torch.randn(2, 2), torch.randn(2, 2))
    ops = {op["op"]: op for op in trace.ops}
    add_ = ops["aten.add_"]
    assert add_["in"][0] != add_["out"][0]  # in-place: the input was fingerprinted before the write
    assert len(ops["aten.max"]["out"]) == 2
    assert ops["aten._local_scalar_dense"]["out"] == [float(s).hex()]
    assert any(fp.startswith("unfingerprintable") for op in trace.ops for fp in op["in"] + op["out"])
    assert any(op["op"] == "aten.mm" for op in trace.ops)
    assert values.dtype == torch.float32 and idx.dtype == torch.int64


def test_tracer_is_removed_after_use():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    with torchrepro.trace_ops():
        torch.ones(2) + 1
    assert _get_current_dispatch_mode() is None


def test_the_tracer_keeps_no_autograd_graph_alive():
    # a graph the script drops is freed while tracing goes on, with the tensors it saved: keeping nodes alive
    # changed what autograd did (a reentrant checkpoint's input gradient was copied instead of moved)
    import weakref

    x = torch.randn(100, requires_grad=True)
    with torchrepro.trace_ops():
        a = x * 2
        kept = weakref.ref(a)
        y = a.sin()  # its node saves `a`
        del a, y
        torch.ones(1).add(1)  # the tracer holds the last op's outputs until the next op starts, no longer
        assert kept() is None


def test_a_tracer_stopped_inside_backward_leaves_the_mode_stack_once_settled():
    # the recorder stops tracing in a hook that loss.backward() runs; a mode popped there would come back when
    # the backward pass restores its thread-local state, and pass every later op through Python for good
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from torchrepro.record.optrace import OpTracer

    lin = nn.Linear(3, 3)
    x = torch.randn(2, 3)
    tracer = OpTracer(models={"": lin}).start()
    y = lin(x)
    y.register_hook(lambda g: tracer.stop())
    y.sum().backward()
    traced = tracer.count
    tracer.settle()  # as the recorder does at the next optimizer step
    assert _get_current_dispatch_mode() is None and not tracer.active
    (lin(x) * 2).sum().backward()
    assert tracer.count == traced


def _op(op, ins, outs, line=1, rng=False):
    return {"op": op, "in": ins, "out": outs, "file": "f.py", "line": line, "step": 1, "rng": rng, "phase": "forward"}


def test_locate_ops_verdicts():
    same = [_op("aten.add", ["a"], ["b"]), _op("aten.mul", ["b"], ["c"])]
    assert locate_ops(same, same).verdict == "not-reproduced"
    origin = locate_ops(same + [_op("aten.index_put_", ["c"], ["x"])], same + [_op("aten.index_put_", ["c"], ["y"])])
    assert origin.verdict == "origin" and origin.index == 2
    rng = locate_ops([_op("aten.uniform_", ["junk1"], ["x"], rng=True)],
                     [_op("aten.uniform_", ["junk2"], ["y"], rng=True)])
    assert rng.verdict == "rng"
    ext = locate_ops([_op("aten.add", ["p"], ["q"])], [_op("aten.add", ["r"], ["s"])])
    assert ext.verdict == "external-input"
    flow = locate_ops(same + [_op("aten.mul", ["c"], ["d"], line=9)], same + [_op("aten.sum", ["c"], ["d"], line=12)])
    assert flow.verdict == "control-flow" and flow.op_a["line"] == 9 and flow.op_b["line"] == 12
    shorter = locate_ops(same, same + [_op("aten.mul", ["c"], ["d"])])
    assert shorter.verdict == "control-flow" and shorter.op_a is None
    assert deterministic_kernel("aten.grid_sampler_2d_backward", "cuda").startswith("no")
    assert deterministic_kernel("aten.foo", "cpu").startswith("unknown")


def test_an_extra_op_early_in_one_run_does_not_hide_the_origin(tmp_path, monkeypatch):
    """A logging ``.item()`` in one run only: ops are paired by identity, so the unseeded draw is still found."""
    script = SCRIPTS / "speed_extra_item.py"
    monkeypatch.setenv("SPEED_EXTRA_OP_DIR", str(tmp_path / "claims"))
    rc, doc, err = locate(tmp_path, script)
    assert rc == 1, err
    loc = doc["locate"]
    assert loc["ops_traced"][0] != loc["ops_traced"][1]  # exactly one traced run logged
    assert loc["verdict"] == "rng", loc
    assert loc["op"]["op"] == "aten.randn" and loc["op"]["line"] == _line_of(script, "NOISE-LINE")


def _ops(*specs, step=1):
    """Op records from (op, module, line, ins, outs[, rng]) tuples."""
    return [{"op": op, "module": mod, "line": line, "file": "f.py", "in": list(ins), "out": list(outs),
             "step": step, "rng": bool(rest and rest[0]), "phase": "forward"}
            for op, mod, line, ins, outs, *rest in specs]


def test_ops_are_paired_by_identity_not_position():
    from torchrepro.analysis.locate import align

    common = [("aten.addmm", "0", 5, "xw", "h"), ("aten.randn", "1", 9, [], "n1", True),
              ("aten.add", "1", 9, "hn", "z")]
    log = [("aten.linalg_vector_norm", "", 3, "w", "r"), ("aten._local_scalar_dense", "", 3, "r", ["0x1p+0"])]
    a = _ops(*log, *common)
    b = _ops(*common[:1], ("aten.randn", "1", 9, [], "n2", True), ("aten.add", "1", 9, "hm", "z2"))
    assert align(a, b) == [(0, None), (1, None), (2, 0), (3, 1), (4, 2)]
    assert align(b, a) == [(None, 0), (None, 1), (0, 2), (1, 3), (2, 4)]
    res = locate_ops(a, b)
    assert res.verdict == "rng" and res.op_a["op"] == "aten.randn" and res.index == 3
    assert locate_ops(b, a).verdict == "rng"
    assert [row["op"] for row in res.context][:2] == ["aten.linalg_vector_norm", "aten._local_scalar_dense"]
    assert locate_ops(a, _ops(*common)).verdict == "control-flow"  # nothing else differs: the extra ops are it
    # occurrences: the second add of an identity pairs with the second one in the other run
    twice = _ops(("aten.add", "", 1, "a", "b"), ("aten.add", "", 1, "b", "c"))
    assert align(twice, twice) == [(0, 0), (1, 1)]


def test_unpaired_ops_that_explain_the_difference_are_control_flow():
    common = [("aten.mul", "", 7, "x", "y"), ("aten.sum", "", 8, "y", "s")]
    extra_inplace = _ops(("aten.mul", "", 7, "x", "y"), ("aten.add_", "", 4, "y", "y2"), ("aten.sum", "", 8, "y2", "t"))
    res = locate_ops(extra_inplace, _ops(*common))
    assert res.verdict == "control-flow" and res.op_a["op"] == "aten.add_" and res.op_b is None
    extra_draw = _ops(("aten.rand", "", 2, [], "junk", True), ("aten.randn", "", 9, [], "n1", True))
    res = locate_ops(extra_draw, _ops(("aten.randn", "", 9, [], "n2", True)))
    assert res.verdict == "control-flow" and res.op_a["op"] == "aten.rand"


class _Augmenting(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        x = torch.full((3,), float(i))
        for _ in range(300):  # enough ops that a worker would flush tens of KB into an inherited file
            x = x.mul(1.0).add(0.0)
        return x


def test_dataloader_workers_do_not_write_into_the_trace(tmp_path):
    path = tmp_path / "ops.jsonl"
    loader = torch.utils.data.DataLoader(_Augmenting(), batch_size=4, num_workers=2)
    with torchrepro.trace_ops(path=path) as trace:
        batches = [b.sum() for b in loader]
    from torchrepro.record.optrace import read_ops

    ops = list(read_ops(path))
    assert [op["i"] for op in ops] == list(range(len(ops))) == [op["i"] for op in trace.ops]
    assert not any(op["op"] in ("aten.full", "aten.mul", "aten.add") for op in ops)  # worker ops stay out
    assert sum(1 for op in ops if op["op"] == "aten.sum") == len(batches) == 2


def _write_ops(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(lines))
    return path


def test_read_ops_tolerates_only_a_cut_off_last_line(tmp_path):
    from torchrepro.record.optrace import read_ops

    good = [json.dumps(_op("aten.add", ["a"], ["b"]) | {"file": None, "i": i}) + "\n" for i in range(3)]
    cut = _write_ops(tmp_path / "cut.jsonl", good + ['{"i": 3, "op": "aten.m'])  # killed mid-write
    assert [op["i"] for op in read_ops(cut)] == [0, 1, 2]


@pytest.mark.parametrize("bad", ['{"i": 1, "op": "aten.m\n', "garbage\n", "[1, 2]\n"])
def test_read_ops_rejects_a_corrupt_middle_line(tmp_path, bad):
    from torchrepro._core.errors import RunDirError
    from torchrepro.record.optrace import read_ops

    good = [json.dumps(_op("aten.add", ["a"], ["b"]) | {"file": None, "i": i}) + "\n" for i in range(3)]
    path = _write_ops(tmp_path / "ops.jsonl", [good[0], bad, good[1], good[2]])
    with pytest.raises(RunDirError) as exc:
        list(read_ops(path))
    msg = str(exc.value)
    expected = (f"{path}: line 2 is not valid JSON", f"{path}: line 2 is not a valid op record: it is a list")
    assert msg.startswith(expected), msg
    assert msg.endswith("Trace the run again (`torchrepro check --locate -- ...`)."), msg


def test_read_ops_skips_an_empty_line(tmp_path):
    """An empty line shifts no record (each carries its index ``i``): it is skipped, not called corrupt."""
    from torchrepro.record.optrace import read_ops

    good = [json.dumps(_op("aten.add", ["a"], ["b"]) | {"file": None, "i": i}) + "\n" for i in range(3)]
    path = _write_ops(tmp_path / "ops.jsonl", [good[0], "\n", good[1], good[2]])
    assert [op["i"] for op in read_ops(path)] == [0, 1, 2]


_DIES_WHILE_TRACING = """
import os, sys, torch
from torchrepro.record.optrace import OpTracer
x = torch.ones(3)
tracer = OpTracer(path=sys.argv[1], keep=False).start()
for _ in range(int(sys.argv[2])):
    x = x + 1
if sys.argv[3] == "fork":
    pid = os.fork()
    if pid == 0:  # the child runs ops and exits normally (atexit runs): it must write nothing
        y = x * 2
        sys.exit(0)
    os.waitpid(pid, 0)
    x = x - 1
raise RuntimeError("the script dies while the tracer is on")
"""


@pytest.mark.parametrize("adds", [10, 1100])  # fewer than one batch of queued records, and several batches
def test_a_script_that_dies_while_tracing_keeps_every_record(tmp_path, adds):
    from torchrepro.record.optrace import read_ops

    path = tmp_path / "ops.jsonl"
    p = subprocess.run([sys.executable, "-c", _DIES_WHILE_TRACING, str(path), str(adds), "-"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1 and "the script dies" in p.stderr
    ops = list(read_ops(path))
    assert [op["i"] for op in ops] == list(range(adds))
    assert {op["op"] for op in ops} == {"aten.add"}


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_never_writes_the_parents_queued_records(tmp_path):
    from torchrepro.record.optrace import read_ops

    path = tmp_path / "ops.jsonl"
    p = subprocess.run([sys.executable, "-c", _DIES_WHILE_TRACING, str(path), "5", "fork"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    ops = list(read_ops(path))
    assert [op["op"] for op in ops] == ["aten.add"] * 5 + ["aten.sub"]  # the child's aten.mul stays out
    assert [op["i"] for op in ops] == list(range(6))


def test_two_tracers_stopped_out_of_order_each_records_until_its_own_stop():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from torchrepro.record.optrace import OpTracer

    x = torch.ones(3)
    outer = OpTracer().start()
    [x + 1 for _ in range(3)]
    inner = OpTracer().start()
    [x + 2 for _ in range(6)]
    outer.stop()  # its modes are under the inner tracer's: they stay, passing ops through, until inner stops
    [x + 3 for _ in range(3)]
    inner.stop()
    assert [op["op"] for op in inner.ops] == ["aten.add"] * 9 and outer.count == 9
    assert not outer.active and not inner.active and _get_current_dispatch_mode() is None


def test_an_interrupt_while_records_are_encoded_loses_none(tmp_path, monkeypatch):
    import signal

    from torchrepro.record import optrace

    real, calls = optrace._fps_json, []

    def encode(fps):  # called for every record's fingerprint lists while the batch is encoded
        calls.append(fps)
        if len(calls) == 5:
            signal.raise_signal(signal.SIGUSR1)  # the handler raises: a Ctrl-C in the middle of a batch
        return real(fps)

    def interrupt(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(optrace, "_fps_json", encode)
    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        x = torch.ones(4)
        tracer = optrace.OpTracer(path=tmp_path / "ops.jsonl", keep=True).start()
        for _ in range(20):
            x = x + 1
        with pytest.raises(KeyboardInterrupt):  # raised once the batch is written
            tracer.stop()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not tracer.active
    assert len(calls) == 40  # the interrupt came in the middle of the batch, which was encoded to its end
    assert [op["i"] for op in optrace.read_ops(tmp_path / "ops.jsonl")] == list(range(20))
    assert [op["i"] for op in tracer.ops] == list(range(20))


_LATE_ATEXIT = """
import atexit, sys, torch
state = {}

def late():  # registered before torchrepro.record.optrace is imported: runs after the tracer's exit flush
    x = state["x"]
    for _ in range(7):
        x = x * 2
    with open(sys.argv[2], "w") as f:
        f.write(str(state["tracer"].count))

atexit.register(late)
from torchrepro.record.optrace import OpTracer
x = torch.ones(3)
state["tracer"] = OpTracer(path=sys.argv[1], keep=False).start()
for _ in range(5):
    x = x + 1
state["x"] = x
"""


def test_ops_after_the_exit_flush_are_neither_counted_nor_lost(tmp_path):
    from torchrepro.record.optrace import read_ops

    p = subprocess.run([sys.executable, "-c", _LATE_ATEXIT, str(tmp_path / "ops.jsonl"), str(tmp_path / "count")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert [op["op"] for op in read_ops(tmp_path / "ops.jsonl")] == ["aten.add"] * 5
    assert (tmp_path / "count").read_text() == "5"


# --- the fix text of a random draw matches the generator that drew ------------------------------------------
def test_the_tracer_records_which_generator_a_draw_used():
    g = torch.Generator().manual_seed(1)
    with torchrepro.trace_ops() as trace:
        torch.randn(3)
        torch.randn(3, generator=g)
        torch.ones(2).add(1)
    draws = [(op["op"], op.get("generator")) for op in trace.ops if op["rng"]]
    assert draws == [("aten.randn", "global"), ("aten.randn", "private")]
    assert all("generator" not in op for op in trace.ops if not op["rng"])


_DRAW_FIXES = {
    "global": "The random numbers drawn by aten.uniform_ (f.py:1) come from torch's global generator, which is "
              "not seeded with a fixed seed before this draw: call torchrepro.seed_everything(SEED) (or "
              "torch.manual_seed(SEED)) at the top of the script, before anything draws, or rerun with "
              "`torchrepro check --seed 0 -- ...` to confirm.",
    "private": "The random numbers drawn by aten.uniform_ (f.py:1) come from a torch.Generator passed as "
               "generator= whose seed differs between runs (its .seed(), or a seed taken from the clock or the "
               "OS): seed it with a fixed value, generator.manual_seed(SEED).",
    None: "The random numbers drawn by aten.uniform_ (f.py:1) differ between runs: seed the generator it uses "
          "with a fixed value (torchrepro.seed_everything(SEED) for torch's global generator; "
          "generator.manual_seed(SEED) for a torch.Generator passed as generator=).",
}


@pytest.mark.parametrize("generator", ["global", "private", None])
def test_the_fix_for_a_random_draw_names_what_drew_it(generator):
    """An unseeded global draw was told to use `manual_seed(SEED) instead of .seed()`, which nothing called."""
    extra = {} if generator is None else {"generator": generator}
    res = locate_ops([_op("aten.uniform_", ["junk1"], ["x"], rng=True) | extra],
                     [_op("aten.uniform_", ["junk2"], ["y"], rng=True) | extra])
    assert res.verdict == "rng"
    assert res.fix == _DRAW_FIXES[generator]


# --- training in a thread -------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.get_num_threads() < 2, reason="CPU nondeterminism needs 2+ torch threads")
def test_locate_traces_training_that_runs_in_another_thread(tmp_path):
    """The tracer saw the main thread only: "did not reproduce, 0 and 0 ops"."""
    script = SCRIPTS / "threaded_scatter.py"
    rc, doc, err = locate(tmp_path, script, "--max-steps", "2")
    assert rc == 1, err
    loc = doc["locate"]
    assert loc["ops_traced"][0] > 0 and loc["ops_traced"][1] > 0
    assert loc["verdict"] == "origin" and loc["op"]["op"] == "aten.index_put_", loc
    assert loc["op"]["line"] == _line_of(EXAMPLES / "scatter_gnn.py", "index_put_((flat_index,)")
    assert loc["op"]["module"] == "layers.0"


def test_trace_ops_records_the_ops_of_a_thread_started_while_tracing():
    import threading

    from torch.utils._python_dispatch import _get_current_dispatch_mode

    with torchrepro.trace_ops() as trace:
        worker = threading.Thread(target=lambda: torch.ones(3).cumsum(0))
        worker.start()
        worker.join()
    assert [op["op"] for op in trace.ops if op["op"] == "aten.cumsum"] == ["aten.cumsum"]
    assert not trace.active and _get_current_dispatch_mode() is None
    after = threading.Thread(target=lambda: torch.ones(3).cumsum(0))  # not traced once the tracer stopped
    after.start()
    after.join()
    assert sum(op["op"] == "aten.cumsum" for op in trace.ops) == 1


def test_no_traced_op_at_all_says_where_the_tracer_cannot_see():
    """0 and 0 ops traced was reported as an intermittent race."""
    from torchrepro.analysis.locate import LocateResult

    fix = LocateResult("not-reproduced", ops_traced=(0, 0), traced_steps=[1]).fix
    assert fix.startswith("No operation was traced in either re-run: the training ran where the tracer cannot "
                          "see it.") and "intermittent" not in fix
    assert "race" in LocateResult("not-reproduced", ops_traced=(5, 5), traced_steps=[1]).fix


# --- memory no op wrote (issue 37): never the origin; ops of an optimizer's closure are forward/backward ---------
def test_memory_no_op_wrote_is_never_the_origin_and_a_closures_draw_is_forward(tmp_path):
    """Lightning's logging deepcopies a tensor (``set_`` of a fresh storage): ``aten.set_`` was named, "inputs
    identical; outputs differ", before the real draw, and the draw, run in ``optimizer.step(closure)``, was
    labelled ``optimizer``."""
    script = SCRIPTS / "uninit_buffers.py"
    rc, doc, err = locate(tmp_path, script)
    assert rc == 1, err
    loc = doc["locate"]
    assert loc["verdict"] == "rng", loc
    assert loc["op"]["op"] == "aten.bernoulli_" and loc["op"]["line"] == _line_of(script, "MASK-LINE")
    assert loc["op"]["phase"] == "forward"
    # the traces do hold a set_ with identical inputs and different outputs before the draw: what was named
    from torchrepro.record.optrace import read_ops

    runs = [list(read_ops(tmp_path / "out" / "locate" / run / "ops.jsonl")) for run in ("run1", "run2")]
    set_ops = [(a, b) for a, b in zip(*runs) if a["op"] == "aten.set_" and a["i"] < loc["op"]["i"]]
    assert any(a["in"] == b["in"] and a["out"] != b["out"] for a, b in set_ops)


def test_outputs_of_memory_no_op_wrote_are_unknown_until_overwritten():
    """A ``set_`` of a fresh storage (Tensor.__deepcopy__) gives different bytes in each run: not the origin, and
    the ``copy_`` that overwrites them, its source identical, matches."""
    a = _ops(("aten.empty", "", 1, [], ["uninitialized"]), ("aten.set_", "", 1, ["uninitialized"], ["junk1"]),
             ("aten.copy_", "", 1, ["junk1", "src"], ["src2"]), ("aten.mul", "", 2, ["src2"], ["m"]),
             ("aten.rand", "", 3, [], ["r1"], True), ("aten.add", "", 4, ["m", "r1"], ["s1"]))
    b = _ops(("aten.empty", "", 1, [], ["uninitialized"]), ("aten.set_", "", 1, ["uninitialized"], ["junk2"]),
             ("aten.copy_", "", 1, ["junk2", "src"], ["src2"]), ("aten.mul", "", 2, ["src2"], ["m"]),
             ("aten.rand", "", 3, [], ["r2"], True), ("aten.add", "", 4, ["m", "r2"], ["s2"]))
    res = locate_ops(a, b)
    assert res.verdict == "rng" and res.op_a["op"] == "aten.rand"
    for op in ("aten.new_empty", "aten.resize_", "aten.empty_strided", "aten.as_strided"):  # the same for these
        a[1]["op"] = b[1]["op"] = op
        a[1]["in"] = b[1]["in"] = ["shape-of-this"]  # read, and identical: still not the origin
        assert locate_ops(a, b).op_a["op"] == "aten.rand", op
    # a copy_ whose source differs still differs: overwriting unknown memory hides nothing else
    b[2]["in"] = ["junk2", "other"]
    res = locate_ops(a, b)
    assert res.verdict == "external-input" and res.op_a["op"] == "aten.copy_"


def test_reading_memory_no_op_wrote_hides_no_later_origin_and_is_named_only_when_nothing_else_differs():
    read = ("aten.sum", "", 5, ["uninitialized"])  # torch.empty(3).sum(): different garbage in each run
    a = _ops(("aten.empty", "", 4, [], ["uninitialized"]), (*read, ["g1"]), ("aten.mul", "", 6, ["g1"], ["h1"]))
    b = _ops(("aten.empty", "", 4, [], ["uninitialized"]), (*read, ["g2"]), ("aten.mul", "", 6, ["g2"], ["h2"]))
    later = ("aten.index_put_", "", 9, ["z", "i", "v"])
    res = locate_ops(a + _ops((*later, ["x"])), b + _ops((*later, ["y"])))
    assert res.verdict == "origin" and res.op_a["op"] == "aten.index_put_"
    res = locate_ops(a, b)  # nothing else differs: the read of uninitialized memory it is
    assert res.verdict == "external-input" and res.op_a["op"] == "aten.sum" and res.op_a["line"] == 5
    assert res.fix.startswith("aten.sum (f.py:5) reads memory that nothing wrote") and "torch.zeros" in res.fix
    # a storage with different bytes in each run (torch.load of another file), read later: set_ is named
    a = _ops(("aten.set_", "", 2, ["uninitialized"], ["d1"]), ("aten.mul", "", 3, ["d1"], ["e1"]))
    b = _ops(("aten.set_", "", 2, ["uninitialized"], ["d2"]), ("aten.mul", "", 3, ["d2"], ["e2"]))
    res = locate_ops(a, b)
    assert res.verdict == "external-input" and res.op_a["op"] == "aten.set_"
    assert res.fix.startswith("The memory that aten.set_ (f.py:2) gives a tensor, without writing it, differs")
    # written over before anything reads it: nothing to name
    a[1], b[1] = _ops(("aten.copy_", "", 3, ["d1", "s"], ["s"]), ("aten.copy_", "", 3, ["d2", "s"], ["s"]))
    assert locate_ops(a, b).verdict == "not-reproduced"


def test_the_tracer_keeps_memory_a_resize_adds_uninitialized_and_out_arguments_overwritten():
    from torchrepro.record.optrace import OVERWRITTEN, UNINITIALIZED

    with torchrepro.trace_ops() as trace:
        grown = torch.ones(4)
        grown.resize_(1000)  # 996 floats of whatever was there
        grown + 1
        kept = torch.ones(4)
        kept.resize_(2)  # its first two ones, nothing added
        kept + 1
        out = torch.empty(4)
        torch.add(torch.ones(4), 1, out=out)  # writes out without reading it
        read = torch.empty(3)
        torch.add(read, 1, out=read)  # reads what it writes
    adds = _only(trace, "aten.add")
    assert adds[0]["in"] == [UNINITIALIZED]
    assert adds[1]["in"] == [torchrepro.fingerprint(torch.ones(2))]
    assert adds[2]["in"] == [torchrepro.fingerprint(torch.ones(4)), OVERWRITTEN]
    assert adds[3]["in"] == [UNINITIALIZED, UNINITIALIZED]


def _only(trace, name):
    return [op for op in trace.ops if op["op"] == name]


def test_ops_of_the_closure_an_optimizer_step_runs_are_forward_and_backward():
    """Lightning runs training_step in optimizer.step(closure): its ops were all labelled `optimizer`."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def closure():
        opt.zero_grad()
        loss = model(torch.rand(2, 4)).sum()  # CLOSURE-LINE
        loss.backward()
        return loss

    with torchrepro.trace_ops(model) as trace:
        opt.step(closure)
        opt.step(closure=closure)
    for i in (0, 1):
        draws = [op for op in trace.ops if op["op"] == "aten.rand"]
        assert draws[i]["phase"] == "forward" and draws[i]["line"] == _line_of(Path(__file__), "CLOSURE-LINE")
    assert {op["phase"] for op in trace.ops if op["op"] == "aten.addmm"} == {"forward"}
    assert {op["phase"] for op in trace.ops if op["op"] == "aten.mm"} == {"backward"}
    updates = [op for op in trace.ops if op["op"] in ("aten.add_", "aten.mul_")]
    assert updates and {op["phase"] for op in updates} == {"optimizer"}  # the step's own update, after the closure
    assert trace._context.in_optimizer == 0


def test_a_lightning_training_step_is_forward_and_backward_not_optimizer(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            self.log("size", float(len(batch[0])))
            keep = torch.rand(batch[0].shape) > 0.1  # LIGHTNING-DRAW
            return ((self.fc(batch[0] * keep) - batch[1]) ** 2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    trainer = pl.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=tmp_path)
    model = Net()
    with torchrepro.trace_ops(model) as trace:
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
    draw = [op for op in trace.ops if op["op"] == "aten.rand"]
    assert len(draw) == 1 and draw[0]["phase"] == "forward"
    assert draw[0]["line"] == _line_of(Path(__file__), "LIGHTNING-DRAW")
    assert {op["phase"] for op in trace.ops if op["op"] == "aten.addmm"} == {"forward"}
    assert "backward" in {op["phase"] for op in trace.ops if op["module"] == "fc"}
    assert any(op["phase"] == "optimizer" for op in trace.ops)  # SGD's own update




def test_locate_with_fresh_cwd_names_the_users_file_not_the_copies(tmp_path):
    """Each traced re-run runs in its own copy of the working directory: the op sites are named as in the original
    (they were OUT/locate/run1-cwd/t.py and run2-cwd/t.py, so no op paired and the verdict was control-flow)."""
    work = tmp_path / "work"
    work.mkdir()
    script = work / "t.py"
    script.write_text((SCRIPTS / "noisy_model.py").read_text())
    p = in_process("check", "--locate", "--fresh-cwd", "--json", "--out", str(tmp_path / "out"), "--", "python",
                   str(script), cwd=work)
    assert p.returncode == 1, p.stderr
    loc = json.loads(p.stdout)["locate"]
    assert loc["verdict"] == "rng", loc
    assert loc["op"]["op"] == "aten.rand" and loc["op"]["file"] == str(script)
    assert loc["op"]["line"] == _line_of(script, "NOISE-LINE")
