"""compare_runs on hand-built run directories: each kind of divergence, not-comparable runs, NaN values, and
value files that must not be loaded."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from torchrepro._core.errors import RunDirError, RunsNotComparableError
from torchrepro.analysis.compare import command_key, compare_runs, tensor_delta, ulp_distance
from torchrepro.record.store import TraceWriter, load_run, write_manifest

NAMES = ("fc.weight", "fc.bias")
CMD = ("python", "train.py", "--lr", "0.1")


def _fp(*parts: object) -> str:
    return hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=16).hexdigest()


def make_run(root: Path, name: str, *, steps: int = 3, names: tuple[str, ...] = NAMES, change: frozenset = frozenset(),
             command: tuple[str, ...] = CMD, values: dict[str, dict[str, torch.Tensor]] | None = None,
             losses: list[float] | None = None):
    """A run directory written the way the recorder writes one: ``change`` holds (kind, step) pairs whose
    fingerprints differ from the baseline (kind: init, batches, loss, grads, params, state)."""
    d = root / name

    def fp(kind: str, step: int, key: object = "") -> str:
        return _fp(kind, step, key, "changed" if (kind, step) in change else "")

    w = TraceWriter(d)
    w.write({"kind": "init", "t": 0.0, "params": {p: fp("init", 0, p) for p in names}})
    for k in range(1, steps + 1):
        value = losses[k - 1] if losses else 1.0 / k + (0.5 if ("loss", k) in change else 0.0)
        w.write({"kind": "step", "n": k, "opt": 0, "t": float(k),
                 "losses": [{"value": float(value).hex(), "fp": fp("loss", k)}], "batches": [fp("batches", k)],
                 "grads": {p: fp("grads", k, p) for p in names}, "params": {p: fp("params", k, p) for p in names},
                 "state": {f"{p}.exp_avg": fp("state", k, p) for p in names}, "lr": [0.1]})
    w.write({"kind": "final", "t": steps + 1.0, "params": {p: fp("params", steps, p) for p in names}})
    w.close()
    for vname, tensors in (values or {}).items():
        torch.save(tensors, d / "values" / f"{vname}.pt")
    write_manifest(d, {"command": list(command), "step_mode": "optimizer", "steps": steps,
                       "trace_records": w.records})
    return load_run(d)


def pair(tmp_path: Path, **b_kwargs):
    return [make_run(tmp_path, "a"), make_run(tmp_path, "b", **b_kwargs)]


def kinds(result) -> list[str]:
    return [d.kind for d in result.first]


# --- verdicts on trace fingerprints ----------------------------------------------------------------------
def test_identical_runs(tmp_path):
    r = compare_runs(pair(tmp_path))
    assert r.verdict == "identical" and r.first_step is None and r.cause is None and not r.first
    assert r.steps == [3, 3] and r.loss_delta == [0.0, 0.0, 0.0]


def test_loss_only_divergence(tmp_path):
    r = compare_runs(pair(tmp_path, change=frozenset({("loss", 2)})))
    assert r.verdict == "diverged" and r.first_step == 2 and r.cause == "compute"
    assert kinds(r) == ["loss"] and r.first[0].names == ["loss[0]"] and r.kind_first_steps == {"loss": 2}
    assert r.loss_delta == [0.0, 0.5, 0.0]


def test_optimizer_state_only_divergence(tmp_path):
    r = compare_runs(pair(tmp_path, change=frozenset({("state", 3)})))
    assert r.verdict == "diverged" and r.first_step == 3 and r.cause == "compute"
    assert kinds(r) == ["state"] and r.first[0].names == ["fc.weight.exp_avg", "fc.bias.exp_avg"]
    assert r.kind_first_steps == {"state": 3}


def test_gradients_then_parameters(tmp_path):
    r = compare_runs(pair(tmp_path, change=frozenset({("grads", 2), ("params", 2), ("params", 3)})))
    assert r.first_step == 2 and kinds(r) == ["grads", "params"] and r.cause == "compute"


def test_step_count_divergence(tmp_path):
    r = compare_runs(pair(tmp_path, steps=4))
    assert r.verdict == "diverged" and r.cause == "steps" and r.first_step == 4 and r.steps == [3, 4]
    assert kinds(r) == ["steps"] and r.first[0].names == ["run 1: 3 steps", "run 2: 4 steps"]
    # two commands (compare): named A and B, as everywhere else in its output
    r = compare_runs(pair(tmp_path / "ab", steps=4), one_command=False)
    assert r.first[0].names == ["A: 3 steps", "B: 4 steps"]


def test_data_and_initial_weight_causes(tmp_path):
    r = compare_runs(pair(tmp_path / "data", change=frozenset({("batches", 1), ("loss", 1)})))
    assert r.cause == "data" and kinds(r) == ["batches", "loss"]
    r = compare_runs(pair(tmp_path / "init", change=frozenset({("init", 0), ("loss", 1)})))
    assert r.cause == "initial-weights" and r.first_step == 0 and kinds(r) == ["init"]
    assert r.kind_first_steps == {"init": 0, "loss": 1}


# --- runs that cannot be compared ------------------------------------------------------------------------
def test_different_commands_are_not_comparable(tmp_path):
    with pytest.raises(RunsNotComparableError) as exc:
        compare_runs(pair(tmp_path, command=("python", "train.py", "--lr", "0.2")))
    msg = str(exc.value)
    assert "ran different commands" in msg and "'0.1' in run 1 vs '0.2' in run 2" in msg
    assert "`python train.py --lr 0.1`" in msg and "same command" in msg


def test_same_command_on_another_machine_is_comparable(tmp_path):
    other = ("/opt/conda/bin/python3.11", "/home/bob/project/train.py", "--lr", "0.1")
    assert command_key(list(other)) == list(CMD)
    assert compare_runs(pair(tmp_path, command=other)).verdict == "identical"


def test_different_parameter_names_are_not_comparable(tmp_path):
    runs = pair(tmp_path, names=("fc.weight", "fc.bias", "head.weight"), change=frozenset({("init", 0)}))
    with pytest.raises(RunsNotComparableError) as exc:
        compare_runs(runs)
    assert exc.value.problems == ["run 2's model has 1 parameter(s) that run 1's lacks: head.weight"]
    assert "The same command built models with different parameters" in str(exc.value)


def test_different_parameter_shapes_are_not_comparable(tmp_path):
    va = {"init": {"fc.weight": torch.zeros(3, 4), "fc.bias": torch.zeros(3)}}
    vb = {"init": {"fc.weight": torch.zeros(3, 5), "fc.bias": torch.zeros(3)}}
    runs = [make_run(tmp_path, "a", values=va), make_run(tmp_path, "b", values=vb, change=frozenset({("init", 0)}))]
    with pytest.raises(RunsNotComparableError) as exc:
        compare_runs(runs)
    assert exc.value.problems == ["1 parameter(s) differ in shape or dtype: "
                                  "fc.weight: [3, 4] float32 in run 1, [3, 5] float32 in run 2"]


# --- NaN and Inf in saved values -------------------------------------------------------------------------
def test_identical_nans_do_not_hide_the_tensor_that_differs(tmp_path):
    nan_w = torch.tensor([[float("nan"), 1.0], [2.0, float("nan")]])
    fa = {"fc.weight": nan_w, "fc.bias": torch.tensor([1.0, 2.0])}
    fb = {"fc.weight": nan_w.clone(), "fc.bias": torch.tensor([1.0, 2.25])}
    runs = [make_run(tmp_path, "a", values={"final": fa}),
            make_run(tmp_path, "b", values={"final": fb}, change=frozenset({("params", 3)}))]
    r = compare_runs(runs)
    assert r.final_max_abs_delta == 0.25 and r.final_max_abs_delta_tensor == "fc.bias"
    assert r.max_ulp_tensor == "fc.bias" and r.max_ulp == 1 << 20
    assert r.nonfinite == []
    assert json.loads(json.dumps(r.to_json(), allow_nan=False))["final_max_abs_delta_weight"] == 0.25


def test_nan_positions_in_one_run_only_are_reported_apart(tmp_path):
    wa = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    wb = torch.tensor([1.0, float("nan"), float("nan"), float("nan"), 5.5])
    fa, fb = {"fc.weight": wa, "fc.bias": torch.ones(2)}, {"fc.weight": wb, "fc.bias": torch.ones(2)}
    runs = [make_run(tmp_path, "a", values={"final": fa}),
            make_run(tmp_path, "b", values={"final": fb}, change=frozenset({("params", 3)}))]
    r = compare_runs(runs)
    assert r.final_max_abs_delta == 0.5 and r.final_max_abs_delta_tensor == "fc.weight"  # finite positions only
    assert [e["text"] for e in r.nonfinite] == ["fc.weight: NaN at 3 positions in run 2 only"]
    assert r.nonfinite[0]["step"] is None and r.nonfinite[0]["nan_only"] == [0, 3]


def test_tensor_delta_is_bitwise_first():
    x = torch.tensor([float("nan"), float("inf"), 1.0])
    same = tensor_delta(x, x.clone())
    assert same is not None and same.equal and same.max_abs == 0
    d = tensor_delta(x, torch.tensor([float("nan"), -float("inf"), 1.0]))
    assert d is not None and not d.equal and d.max_abs == 0 and d.inf == 1 and d.nan_only == (0, 0)
    assert ulp_distance(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])) == 0
    assert tensor_delta(torch.zeros(2), torch.zeros(3)) is None


def test_nan_losses(tmp_path):
    nan = float("nan")
    both = [make_run(tmp_path / "both", n, losses=[1.0, nan, nan]) for n in ("a", "b")]
    r = compare_runs(both)
    assert r.verdict == "identical" and r.loss_delta == [0.0, 0.0, 0.0] and r.nonfinite == []
    one = [make_run(tmp_path / "one", "a", losses=[1.0, 0.5, 0.25]),
           make_run(tmp_path / "one", "b", losses=[1.0, nan, nan], change=frozenset({("loss", 2), ("loss", 3)}))]
    r = compare_runs(one)
    assert r.first_step == 2 and kinds(r) == ["loss"]
    assert r.loss_delta == [0.0, None, None]
    assert [e["text"] for e in r.nonfinite] == ["loss: 0.5 in run 1, nan in run 2"]
    assert r.nonfinite[0]["step"] == 2
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in r.loss_delta if v is not None)


# --- value files that must not be loaded ---------------------------------------------------------------
CHANGED = frozenset({("params", 3)})  # the runs diverge, so compare reads the values


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_code_executing_pickle_is_refused_not_called_truncated(tmp_path):
    marker = tmp_path / "code-ran"
    values = {"init": {"fc.weight": torch.zeros(2), "fc.bias": torch.zeros(2)}}
    runs = [make_run(tmp_path, "a", values=values), make_run(tmp_path, "b", values=values, change=CHANGED)]
    torch.save({"fc.weight": _RunsCode(marker)}, runs[1].path / "values" / "init.pt")
    with pytest.raises(RunDirError) as exc:
        compare_runs(runs)
    msg = str(exc.value)
    assert msg.startswith(str(runs[1].path / "values" / "init.pt"))
    assert "holds pickle data that would import and call" in msg and "open" in msg and "refused" in msg
    assert "weights_only" not in msg and "truncated" not in msg
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_truncated_or_corrupt_values_file(tmp_path, damage):
    values = {"init": {"fc.weight": torch.zeros(2), "fc.bias": torch.zeros(2)}}
    runs = [make_run(tmp_path, "a", values=values), make_run(tmp_path, "b", values=values, change=CHANGED)]
    path = runs[1].path / "values" / "init.pt"
    path.write_bytes(path.read_bytes()[:100] if damage == "cut" else b"garbage")
    with pytest.raises(RunDirError) as exc:
        compare_runs(runs)
    msg = str(exc.value)
    assert "cannot be read" in msg and "may be truncated or corrupt" in msg and "weights_only" not in msg


def test_optimizer_state_only_one_command_has_is_never_within_a_tolerance(tmp_path):
    """compare --rtol: B's SGD keeps momentum (momentum 0.9), A's none (0). Nothing could be compared by value, and
    the verdict was EQUIVALENT with exit 0: a tensor one side lacks is out of any tolerance, saying why."""
    from torchrepro.analysis.crossrun import compare_commands
    from torchrepro.analysis.tolerance import Tolerance

    runs = []
    for name, state in (("a", {}), ("b", {"fc.weight.momentum_buffer": _fp("m")})):
        d = tmp_path / name
        w = TraceWriter(d)
        w.write({"kind": "init", "t": 0.0, "params": {p: _fp("init", p) for p in NAMES}})
        w.write({"kind": "step", "n": 1, "opt": 0, "t": 1.0, "losses": [{"value": (0.5).hex(), "fp": _fp("l")}],
                 "batches": [_fp("x")], "grads": {p: _fp("g", p) for p in NAMES},
                 "params": {p: _fp("p", p) for p in NAMES}, "state": state, "lr": [0.1]})
        w.write({"kind": "final", "t": 2.0, "params": {p: _fp("p", p) for p in NAMES}})
        w.close()
        write_manifest(d, {"command": ["python", "train.py", name], "step_mode": "optimizer", "steps": 1,
                           "trace_records": w.records})
        runs.append(load_run(d))
    result = compare_commands(runs[0], runs[1], Tolerance(rtol=1e-4))
    assert result.verdict == "diverged"
    first = result.first_out
    assert first is not None and (first.step, first.kind, first.tensor) == (1, "state", "fc.weight.momentum_buffer")
    assert first.reason == ("in B only: A has no optimizer state tensor of that name, so it cannot be compared")
    assert first.within is False and result.bitwise_only == []


# --- mutation gaps (issue 37): what a broken comparison would have let through --------------------------------
def _run_with(tmp_path: Path, name: str, steps: list[dict], *, command=CMD, init=None, final=None):
    """A run directory from explicit step records (``grads``/``params``/``state`` maps, ``loss`` value)."""
    d = tmp_path / name
    w = TraceWriter(d)
    w.write({"kind": "init", "t": 0.0, "params": init or {p: _fp("init", p) for p in NAMES}})
    for k, s in enumerate(steps, start=1):
        loss = s.get("loss", 1.0 / k)
        w.write({"kind": "step", "n": k, "opt": 0, "t": float(k),
                 "losses": [{"value": float(loss).hex(), "fp": s.get("loss_fp", _fp("loss", loss))}],
                 "batches": [_fp("batch", k)], "grads": s.get("grads", {p: _fp("g", k, p) for p in NAMES}),
                 "params": s.get("params", {p: _fp("p", k, p) for p in NAMES}),
                 "state": s.get("state", {}), "lr": [0.1]})
    w.write({"kind": "final", "t": len(steps) + 1.0,
             "params": final or {p: _fp("p", len(steps), p) for p in NAMES}})
    w.close()
    write_manifest(d, {"command": list(command), "step_mode": "optimizer", "steps": len(steps),
                       "trace_records": w.records})
    return d


def test_a_gradient_or_state_entry_only_run_2_has_is_a_difference(tmp_path):
    a = _run_with(tmp_path, "a", [{}, {}])
    b = _run_with(tmp_path, "b", [{}, {"state": {"fc.weight.momentum_buffer": _fp("m")},
                                       "grads": {**{p: _fp("g", 2, p) for p in NAMES}, "extra.grad": _fp("e")}}])
    r = compare_runs([load_run(a), load_run(b)])
    assert r.verdict == "diverged" and r.first_step == 2
    assert [(d.kind, d.names) for d in r.first] == [("grads", ["extra.grad"]),
                                                    ("state", ["fc.weight.momentum_buffer"])]


def test_parameters_differing_only_in_the_final_record_are_reported_there(tmp_path):
    final_b = {"fc.weight": _fp("nudged"), "fc.bias": _fp("p", 2, "fc.bias")}
    va = {"step_000002": {"fc.weight": torch.zeros(2), "fc.bias": torch.zeros(1)},
          "final": {"fc.weight": torch.zeros(2), "fc.bias": torch.zeros(1)}}
    vb = {"step_000002": {"fc.weight": torch.zeros(2), "fc.bias": torch.zeros(1)},
          "final": {"fc.weight": torch.tensor([0.0, 0.5]), "fc.bias": torch.zeros(1)}}
    a = _run_with(tmp_path, "a", [{}, {}])
    b = _run_with(tmp_path, "b", [{}, {}], final=final_b)
    for d, v in ((a, va), (b, vb)):
        for name, tensors in v.items():
            torch.save(tensors, d / "values" / f"{name}.pt")
    r = compare_runs([load_run(a), load_run(b)])
    assert r.verdict == "diverged" and r.final_max_abs_delta == 0.5 and r.final_max_abs_delta_tensor == "fc.weight"
    assert r.param_delta == {2: 0.0}  # the last step has its entry: equal there
    assert r.params_identical is False


def test_a_lower_loss_in_run_2_is_a_positive_delta(tmp_path):
    a = _run_with(tmp_path, "a", [{"loss": 1.0}, {"loss": 0.75}])
    b = _run_with(tmp_path, "b", [{"loss": 1.0}, {"loss": 0.5}])
    r = compare_runs([load_run(a), load_run(b)])
    assert r.loss_delta == [0.0, 0.25]


def test_the_same_loss_fingerprint_with_other_exact_values_is_a_difference(tmp_path):
    a = _run_with(tmp_path, "a", [{"loss": 0.5, "loss_fp": _fp("same")}])
    b = _run_with(tmp_path, "b", [{"loss": 0.5000001, "loss_fp": _fp("same")}])
    r = compare_runs([load_run(a), load_run(b)])
    assert r.verdict == "diverged" and [d.kind for d in r.first] == ["loss"]


def test_minus_zero_against_zero_names_the_tensor_and_initial_weights_make_parameters_not_identical(tmp_path):
    init_b = {"fc.weight": _fp("init", "fc.weight"), "fc.bias": _fp("minus zero")}
    a = _run_with(tmp_path, "a", [{}])
    b = _run_with(tmp_path, "b", [{}], init=init_b)
    for d, bias in ((a, 0.0), (b, -0.0)):
        torch.save({"fc.weight": torch.ones(2), "fc.bias": torch.tensor([bias])}, d / "values" / "init.pt")
    r = compare_runs([load_run(a), load_run(b)])
    assert r.cause == "initial-weights" and r.first[0].names == ["fc.bias"]
    assert r.params_identical is False
    delta = tensor_delta(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert delta is not None and not delta.equal and delta.max_abs == 0


def test_two_commands_with_another_shape_are_not_comparable(tmp_path):
    va = {"init": {"fc.weight": torch.zeros(3, 4), "fc.bias": torch.zeros(3)}}
    vb = {"init": {"fc.weight": torch.zeros(4, 4), "fc.bias": torch.zeros(3)}}
    runs = [make_run(tmp_path, "a", values=va),
            make_run(tmp_path, "b", values=vb, change=frozenset({("init", 0)}), command=("python", "other.py"))]
    with pytest.raises(RunsNotComparableError):
        compare_runs(runs, one_command=False)


def test_tolerance_is_asymmetric_as_assert_close_and_losses_use_float32s():
    from torchrepro.analysis.tolerance import Tolerance, scalar_delta, value_delta

    tol = Tolerance(rtol=0.1, atol=0.0)
    a, b = torch.tensor([1.0]), torch.tensor([1.105])
    assert value_delta(a, b, tol).within is True  # |a - b| = 0.105 <= 0.1 * |b| = 0.1105
    assert value_delta(b, a, tol).within is False  # 0.105 > 0.1 * |a| = 0.1
    loss = scalar_delta(1.0, 1.0 + 1e-6, Tolerance())  # float32's rtol 1.3e-6 accepts it; float64's 1e-7 would not
    assert loss.within is True and loss.rtol == 1.3e-6


def test_a_difference_without_values_is_bitwise_only_and_never_within(tmp_path):
    from torchrepro.analysis.crossrun import Entry

    entry = Entry(step=2, kind="grads", tensor="fc.weight", delta=None)
    assert entry.within is None  # not compared: not "within"
    assert Entry(step=2, kind="grads", tensor="fc.weight", delta=None, reason="in B only").within is False


def test_a_shared_working_directory_forces_diverged_even_within_tolerance(tmp_path):
    from torchrepro.analysis.crossrun import compare_commands
    from torchrepro.analysis.tolerance import Tolerance

    a = load_run(_run_with(tmp_path, "a", [{"loss": 1.0}]))
    b = load_run(_run_with(tmp_path, "b", [{"loss": 1.0 + 1e-9}], command=("python", "other.py")))
    shared = {"read_from_earlier_run": [{"run": 2, "path": "snap.pt", "how": "opened", "change": "created"}]}
    loose = compare_commands(a, b, Tolerance(rtol=1e-3))
    assert loose.verdict == "equivalent"
    result = compare_commands(a, b, Tolerance(rtol=1e-3), workdir=shared)
    assert result.verdict == "diverged" and result.cause == "shared-working-directory"


@pytest.mark.parametrize(("lo", "hi", "skipped", "expected"), [(0, 3, (), 1), (0, 4, (2,), 3), (0, 6, (3,), 4)])
def test_bisect_picks_the_later_of_two_equally_distant_middles(lo, hi, skipped, expected):
    from torchrepro.analysis.bisect import Search

    search = Search(n=hi)
    for i in skipped:
        search.record(i, "skip")
    assert search.next() == expected


def test_a_step_only_run_1_kept_values_of_has_no_growth_entry(tmp_path):
    """check --resume-at: the resumed process keeps values at other steps than run 1; such a step was shown as
    0.0 in the growth table (the real difference was 0.0032)."""
    va = {"step_000001": {"fc.weight": torch.zeros(2), "fc.bias": torch.zeros(1)},
          "step_000002": {"fc.weight": torch.zeros(2), "fc.bias": torch.zeros(1)}}
    vb = {"step_000001": {"fc.weight": torch.zeros(2), "fc.bias": torch.zeros(1)}}
    runs = [make_run(tmp_path, "a", values=va), make_run(tmp_path, "b", values=vb, change=frozenset({("params", 2)}))]
    r = compare_runs(runs)
    assert r.verdict == "diverged" and r.param_delta == {1: 0.0}


def test_a_values_file_with_tensors_that_hold_no_data_is_refused_by_name(tmp_path):
    """A meta tensor was an internal error (exit 3) in the comparison; now the file is named, as any unusable file
    is (exit 2)."""
    why = "fc.weight (a meta tensor, which holds no data)"
    va = {"final": {"fc.weight": torch.empty(2, device="meta"), "fc.bias": torch.zeros(1)}}
    runs = [make_run(tmp_path, "a", values=va), make_run(tmp_path, "b", values=va, change=frozenset({("params", 3)}))]
    with pytest.raises(RunDirError) as exc:
        compare_runs(runs)
    assert str(exc.value) == (f"{tmp_path / 'a' / 'values' / 'final.pt'}: holds tensors that cannot be compared by "
                              f"value: {why}; values files hold dense tensors with data (the recorder saves "
                              "parameters that way). Record the run again with torchrepro, or leave this file out of "
                              "the run directory.")


def test_complex_values_are_compared_by_their_real_and_imaginary_parts(tmp_path):
    w = torch.tensor([1 + 2j, 3 + 4j])
    runs = [make_run(tmp_path, "a", values={"final": {"fc.weight": w, "fc.bias": torch.zeros(1)}}),
            make_run(tmp_path, "b", values={"final": {"fc.weight": w * 2, "fc.bias": torch.zeros(1)}},
                     change=frozenset({("params", 3)}))]
    r = compare_runs(runs)
    assert r.final_max_abs_delta == 4.0 and r.final_max_abs_delta_tensor == "fc.weight"


def test_sparse_values_are_compared_as_dense(tmp_path):
    """A sparse gradient (nn.Embedding(sparse=True)) was an internal error (exit 3)."""
    bias = torch.zeros(1)
    runs = [make_run(tmp_path, "a", values={"final": {"fc.weight": torch.eye(2).to_sparse(), "fc.bias": bias}}),
            make_run(tmp_path, "b", values={"final": {"fc.weight": (torch.eye(2) * 3).to_sparse(), "fc.bias": bias}},
                     change=frozenset({("params", 3)}))]
    r = compare_runs(runs)
    assert r.final_max_abs_delta == 2.0 and r.final_max_abs_delta_tensor == "fc.weight"
