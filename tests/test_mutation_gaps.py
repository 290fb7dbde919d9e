"""Tests for breakages a mutation review made that no other test caught (issue 21, "Tests that do not test").

Each test asserts the real behaviour of one unit: the rank of an environment difference, the tracer's fingerprint
cache, the optimizer step of measure_nondeterminism, majority and sharded tensors in rank comparison, the sign of
ULP distances, compilelocate's eager verdict, tolerance scaling, spreads against every run, NaN metrics, Student's
t for negative t, bool metrics and noqa prefixes in lint.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import torchrepro
from torchrepro.analysis.compare import compare_runs, tensor_delta, ulp_distance
from torchrepro.analysis.compilelocate import locate_compiled
from torchrepro.analysis.envdiff import BENIGN, BREAKS, MAY, diff_environments
from torchrepro.analysis.rankcompare import rank_desync
from torchrepro.cli._series import Launched
from torchrepro.cli.variance_cmd import _value
from torchrepro.lint import LintConfig, lint_source
from torchrepro.measure.variance import GroupStats, t_cdf
from torchrepro.record.store import Run, read_trace_lines


# --- 1. env diff: the rank and order of CUDA, GPU, cuBLAS and launch differences ------------------------------
def _doc(**values: object) -> dict:
    """An environment document with the dotted ``values`` (``__`` for ``.``), launched the same way otherwise."""
    doc: dict = {"launch": {"seed": 0, "deterministic": False, "pythonhashseed": "0", "command": "python t.py"}}
    for dotted, value in values.items():
        key = dotted.replace("__", ".")
        section, _, rest = key.partition(".")
        if section == "accelerators":
            index, _, field = rest.partition(".")
            gpus = doc.setdefault("accelerators", [])
            while len(gpus) <= int(index):
                gpus.append({})
            gpus[int(index)][field] = value
        else:
            doc.setdefault(section, {})[rest] = value
    return doc


RANKED = [
    ("cuda.runtime", "12.1", "12.4", BREAKS, "another CUDA runtime brings other library kernels"),
    ("torch_build.cuda", "12.1", "12.4", BREAKS, "torch built for another CUDA version uses other CUDA libraries"),
    ("accelerators.0.name", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", BREAKS,
     "another GPU model selects other kernels (SM count, tensor cores)"),
    ("env.CUBLAS_WORKSPACE_CONFIG", ":4096:8", None, BREAKS,
     "decides whether cuBLAS uses deterministic workspaces"),
    ("launch.deterministic", False, True, BREAKS,
     "deterministic mode selects other kernels (and raises for some ops)"),
    ("torch_build.debug", False, True, MAY, "a build option of torch"),
    ("cuda.driver", "535.104", "550.54", MAY,
     "another driver can JIT-compile PTX differently and change library heuristics"),
    ("accelerators.0.memory_bytes", 80, 40, MAY, "memory limits can change cuDNN/cuBLAS algorithm choice"),
    ("launch.max_steps", 3, 5, BENIGN, "does not change what each step computes"),
]


@pytest.mark.parametrize("key, a, b, rank, reason", RANKED, ids=[row[0] for row in RANKED])
def test_env_difference_gets_its_rank_and_reason(key, a, b, rank, reason):
    field = key.replace(".", "__")
    diff = diff_environments(_doc(**{field: a}), _doc(**{field: b}))
    assert [(c.key, c.a, c.b, c.rank, c.reason) for c in diff.changes] == [(key, a, b, rank, reason)]
    assert diff.exit_code == (1 if rank == BREAKS else 0)


def test_env_differences_are_ordered_by_rank_then_by_table_row():
    a = _doc(torch_build__cuda="12.1", torch_build__debug=False, cuda__runtime="12.1", cuda__driver="535",
             accelerators__0__name="A100", accelerators__0__capability="8.0", env__CUBLAS_WORKSPACE_CONFIG=":4096:8",
             env__NCCL_DEBUG="INFO")
    b = _doc(torch_build__cuda="12.4", torch_build__debug=True, cuda__runtime="12.4", cuda__driver="550",
             accelerators__0__name="H100", accelerators__0__capability="9.0", env__CUBLAS_WORKSPACE_CONFIG=None,
             env__NCCL_DEBUG="WARN")
    a["launch"] |= {"deterministic": False, "max_steps": 3}
    b["launch"] |= {"deterministic": True, "max_steps": 5}
    diff = diff_environments(a, b)
    assert [(c.key, c.rank) for c in diff.changes] == [
        ("torch_build.cuda", BREAKS), ("cuda.runtime", BREAKS), ("accelerators.0.name", BREAKS),
        ("accelerators.0.capability", BREAKS), ("env.CUBLAS_WORKSPACE_CONFIG", BREAKS),
        ("launch.deterministic", BREAKS),
        ("torch_build.debug", MAY), ("cuda.driver", MAY),
        ("env.NCCL_DEBUG", BENIGN), ("launch.max_steps", BENIGN)]
    assert diff.summary() == ("torch_build.cuda 12.1 → 12.4, cuda.runtime 12.1 → 12.4, accelerators.0.name A100 → "
                              "H100, accelerators.0.capability 8.0 → 9.0, CUBLAS_WORKSPACE_CONFIG :4096:8 → unset, "
                              "deterministic mode on")


# --- 2. the op tracer's fingerprint cache: an in-place write through a view ----------------------------------
def test_tracer_refingerprints_a_tensor_written_in_place_through_a_view():
    with torchrepro.trace_ops() as trace:
        x = torch.arange(6, dtype=torch.float32)
        torch.neg(x)  # x is fingerprinted (and cached) as this op's input
        x[:2].mul_(10)  # a view of another shape writes into x: x's cache key is untouched, its version bumps
        torch.neg(x)  # x again: the cache must not answer with the value from before the write
    negs = [op for op in trace.ops if op["op"] == "aten.neg"]
    assert len(negs) == 2
    assert negs[0]["in"][0] != negs[1]["in"][0]
    assert negs[0]["out"][0] != negs[1]["out"][0]
    # and the recorded fingerprint is that of x's current bits, not just "something else"
    with torchrepro.trace_ops() as fresh:
        torch.neg(torch.tensor([0.0, 10.0, 2.0, 3.0, 4.0, 5.0]))
    assert negs[1]["in"][0] == next(op for op in fresh.ops if op["op"] == "aten.neg")["in"][0]


# --- 3. measure_nondeterminism(optimizer=): the step runs in every run ----------------------------------------
class _DriftingSGD(torch.optim.SGD):
    """SGD that adds its own call count to every parameter: a counter outside the optimizer's state_dict, so each
    run of measure_nondeterminism steps to other parameters (1, 2, 3 added in runs 1, 2, 3)."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.calls = 0

    @torch.no_grad()
    def step(self, closure=None):
        self.calls += 1
        out = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(float(self.calls))
        return out


def test_measure_with_an_optimizer_steps_in_every_run_and_compares_the_stepped_parameters():
    model = nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = _DriftingSGD(model.parameters(), lr=0.0)  # lr 0: the parameters move by the counter only
    report = torchrepro.measure_nondeterminism(model, torch.ones(2, 4), runs=3, optimizer=opt)
    assert opt.calls == 3
    assert all(g.identical for g in report.grads) and report.loss.identical  # the step is the only difference
    (weight,) = report.params
    assert weight.name == "weight" and weight.kind == "param" and not weight.identical and not report.identical
    assert weight.max_abs == 2.0 and weight.differing_fraction == 1.0  # run 3 (+3) against run 1 (+1)
    assert torch.equal(model.weight, torch.zeros(1, 4))  # put back afterwards
    assert "forward+backward+optimizer step" in report.summary()


# --- 4. rank comparison with 4 ranks ------------------------------------------------------------------------
def _rank_run(rank: int, *, grads: dict, state: dict | None = None, unreplicated: list[str] | None = None) -> Run:
    params = {"w": "P", "shard": f"S{rank}"}
    events = [{"kind": "init", "params": params},
              {"kind": "step", "n": 1, "grads": {"w": "G1", "shard": f"g{rank}"}, "params": params,
               "state": {"w.exp_avg": "E1", "shard.exp_avg": f"e{rank}"}},
              {"kind": "step", "n": 2, "grads": grads, "params": params, "state": state or {"w.exp_avg": "E2"}}]
    manifest = {"step_mode": "optimizer", "unreplicated": ["shard"] if unreplicated is None else unreplicated}
    return Run(Path(f"rank{rank}"), manifest, events)


def test_rank_desync_blames_the_minority_even_when_it_is_rank_0():
    ranks = [_rank_run(r, grads={"w": "odd" if r == 0 else "G2"}) for r in range(4)]
    found = rank_desync(ranks)
    assert found is not None
    assert (found.step, found.kind, found.names, found.ranks, found.reference) == (2, "grads", ["w"], [0], [1, 2, 3])
    assert found.describe() == "run 1: rank 0 differs from rank 1 and rank 2 and rank 3 at step 2: gradients w"
    # one odd rank elsewhere: still that rank, never rank 0 as the reference by default
    ranks = [_rank_run(r, grads={"w": "odd" if r == 2 else "G2"}) for r in range(4)]
    assert (rank_desync(ranks).ranks, rank_desync(ranks).reference) == ([2], [0, 1, 3])


def test_rank_desync_leaves_sharded_tensors_out():
    ranks = [_rank_run(r, grads={"w": "G2", "shard": f"h{r}"}) for r in range(4)]
    assert rank_desync(ranks) is None  # shard (and shard.exp_avg) differ on every rank by design
    unmarked = [_rank_run(r, grads={"w": "G2"}, unreplicated=[]) for r in range(4)]
    found = rank_desync(unmarked)  # without the manifest's list, the same values are a desync at init
    assert (found.step, found.kind, found.names) == (0, "init", ["shard"])


def test_rank_desync_compares_the_optimizer_state():
    ranks = [_rank_run(r, grads={"w": "G2"}, state={"w.exp_avg": "bad" if r == 3 else "E2"}) for r in range(4)]
    found = rank_desync(ranks)
    assert found is not None
    assert (found.step, found.kind, found.names, found.ranks, found.reference) == (
        2, "state", ["w.exp_avg"], [3], [0, 1, 2])
    assert found.describe() == "run 1: rank 3 differs from rank 0 and rank 1 and rank 2 at step 2: optimizer state " \
                               "w.exp_avg"


# --- 5. ULP distance across the sign ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, one_bits", [(torch.float32, 0x3F800000), (torch.float16, 0x3C00),
                                             (torch.bfloat16, 0x3F80)])
def test_ulp_distance_of_minus_x_and_x_counts_every_float_between_them(dtype, one_bits):
    minus, plus = torch.tensor([-1.0], dtype=dtype), torch.tensor([1.0], dtype=dtype)
    assert ulp_distance(minus, plus) == ulp_distance(plus, minus) == 2 * one_bits
    tiny = torch.tensor([1], dtype=torch.int32 if dtype == torch.float32 else torch.int16).view(dtype)  # bits 0...01
    assert 0 < float(tiny) < torch.finfo(dtype).smallest_normal
    assert ulp_distance(-tiny, tiny) == 2  # the two smallest subnormals: -0 and +0 lie between them
    delta = tensor_delta(minus, plus)
    assert delta is not None and not delta.equal and delta.max_abs == 2.0 and delta.max_ulp == 2 * one_bits
    zeros = tensor_delta(torch.tensor([-0.0], dtype=dtype), torch.tensor([0.0], dtype=dtype))
    assert zeros is not None and not zeros.equal  # -0.0 and +0.0 differ bitwise


# --- 6. compilelocate: the origin node varies in eager PyTorch too --------------------------------------------
def _graph_with_eager(eager: list[dict]) -> dict:
    nodes = [{"name": "x", "kind": "placeholder", "args": []},
             {"name": "a", "kind": "call_function", "op": "aten.mul", "args": ["x"], "line": 3},
             {"name": "b", "kind": "call_function", "op": "aten.index_put", "original_aten":
              "aten.index_put_", "args": ["a"], "module": "emb", "file": "t.py", "line": 4}]
    compiled = [{"x": "X", "a": "A", "b": "B1"}, {"x": "X", "a": "A", "b": "B2"}]
    return {"repeats": 2, "regions": [{"index": 0, "target": "M", "file": "t.py", "line": 9}],
            "graphs": [{"region": 0, "kind": "backward", "order": 1, "nodes": nodes, "inputs": {"x": "X"},
                        "program": [["C1"], ["C2"]], "compiled": compiled, "eager": eager, "errors": []}]}


def test_locate_compiled_with_two_eager_variants_says_eager_varies_too():
    doc = _graph_with_eager([{"x": "X", "a": "A", "b": "E1"}, {"x": "X", "a": "A", "b": "E2"}])
    result = locate_compiled([doc], step=1)
    assert result.verdict == "compiled-kernel" and result.op["node"] == "b"
    assert result.finding.eager_variants == 2 and result.eager_deterministic is False
    assert result.finding.eager_graph_deterministic is False
    assert result.explanation.endswith("gave 2 different results for identical inputs, in the code inductor "
                                       "generated for it: eager PyTorch also varies here (the same op run eagerly "
                                       "gave different bits).")
    assert "@torch.compiler.disable" not in result.fix  # running it eagerly would not help
    assert result.to_json()["measured"]["eager_variants"] == 2
    one = locate_compiled([_graph_with_eager([{"x": "X", "a": "A", "b": "E"}] * 2)], step=1)
    assert one.eager_deterministic is True and "@torch.compiler.disable" in one.fix


# --- 7. assert_deterministic: atol + rtol * |b| -----------------------------------------------------------------
def _alternating(first, second):
    """A function that returns ``first`` on odd calls and ``second`` on even ones (state the RNG does not hold)."""
    calls = []

    def fn():
        calls.append(1)
        return first if len(calls) % 2 else second
    return fn


@pytest.mark.parametrize("make", [lambda v: torch.tensor([1.0, v], dtype=torch.float64), float],
                         ids=["tensor", "float"])
def test_assert_deterministic_tolerance_is_atol_plus_rtol_times_the_value(make):
    # |Δ| 0.15 between 1000 and 1000.15: within 0.1 + 1e-4 * 1000.15 (0.2), beyond atol 0.1 or rtol * |b| (0.1) alone
    fn = _alternating(make(1000.0), make(1000.15))
    torchrepro.assert_deterministic(fn, runs=2, atol=0.1, rtol=1e-4)
    torchrepro.assert_deterministic(fn, runs=2, atol=0.0, rtol=1.6e-4)  # rtol alone scales with the value
    for atol, rtol in ((0.1, 0.0), (0.0, 1e-4), (0.1, 4e-5)):
        with pytest.raises(AssertionError, match=rf"compared with atol={atol:g}, rtol={rtol:g}\)"):
            torchrepro.assert_deterministic(fn, runs=2, atol=atol, rtol=rtol)


def test_assert_deterministic_float_results_bitwise_by_default_and_inf_only_equals_inf():
    with pytest.raises(AssertionError, match=r"output differs between call 1 and call 2: is -0\.0 in one call and "
                                             r"0\.0 in the other"):
        torchrepro.assert_deterministic(_alternating(-0.0, 0.0), runs=2)
    with pytest.raises(AssertionError, match="is 1e[+]308 in one call and inf in the other"):
        torchrepro.assert_deterministic(_alternating(1e308, math.inf), runs=2, atol=1.0, rtol=1.0)
    torchrepro.assert_deterministic(_alternating(math.inf, math.inf), runs=2, atol=1.0, rtol=1.0)


# --- 8. the spread is taken against every run, not the first that differs --------------------------------------
def test_measure_takes_max_abs_and_ulp_over_every_run():
    w = nn.Parameter(torch.zeros(4))
    scales = iter([1.0, 1.5, 4.0])  # the gradient of run 3 lies furthest from run 1's

    def loss():
        return (w * next(scales)).sum()

    report = torchrepro.measure_nondeterminism(loss, runs=3)
    (grad,) = report.grads
    assert not grad.identical and grad.differing_fraction == 1.0
    assert grad.max_abs == 3.0  # |4.0 - 1.0|, not |1.5 - 1.0|
    assert grad.max_ulp == ulp_distance(torch.tensor([1.0]), torch.tensor([4.0])) == 2 << 23
    assert report.max_abs == 3.0 and report.max_ulp == 2 << 23


def test_compare_runs_takes_max_abs_and_ulp_over_every_run(tmp_path):
    from tests.analysis.test_compare import make_run

    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    moved = {"a": 0.0, "b": 0.25, "c": 1.0}  # run 3 lies furthest from run 1
    runs = [make_run(tmp_path, name, change=frozenset() if name == "a" else frozenset({("grads", 2), ("params", 2),
                                                                                        ("params", 3), ("state", 2)}),
                     values={"final": {"fc.weight": w + d, "fc.bias": torch.ones(2)},
                             "step_000002": {"fc.weight": w + d, "fc.bias": torch.ones(2)},
                             "grads_000002": {"fc.weight": w * (1 + d), "fc.bias": torch.ones(2)}})
            for name, d in moved.items()]
    r = compare_runs(runs)
    assert r.verdict == "diverged" and r.first_step == 2
    assert r.final_max_abs_delta == 1.0 and r.final_max_abs_delta_tensor == "fc.weight"
    assert r.max_ulp == ulp_distance(w, w + 1.0) and r.max_ulp > ulp_distance(w, w + 0.25)
    assert r.param_delta[2] == 1.0
    grads = next(e for e in r.value_deltas if e["kind"] == "grads")
    assert (grads["max_abs_delta"], grads["tensor"]) == (4.0, "fc.weight")  # |4 * 2 - 4|, not |4 * 1.25 - 4|


# --- 9. NaN metrics are kept, and never count as equal ---------------------------------------------------------
def test_a_nan_metric_is_recorded_as_nan_and_refused_as_a_spread(tmp_path):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert math.isnan(torchrepro.log_metric("acc", float("nan")))
    with torchrepro.watch(model, opt, run_dir=tmp_path / "run"):
        opt.zero_grad()
        model(torch.ones(3, 2)).sum().backward()
        opt.step()
        torchrepro.log_metric("acc", 0.5)
        torchrepro.log_metric("acc", torch.tensor(float("nan")))
    events = read_trace_lines(tmp_path / "run")[0]
    assert [(e["name"], e["value"], e["step"]) for e in events if e["kind"] == "metric"] == [
        ("acc", (0.5).hex(), 1), ("acc", "nan", 1)]
    run = Launched("seed 0, run 2", tmp_path / "run", None, events)  # type: ignore[arg-type]
    assert math.isnan(_value(2, 2, run, "acc"))  # the last value is NaN: not skipped for the last finite one
    with pytest.raises(ValueError, match=r"^same seed: run\(s\) \[2\] produced a value that is not finite "
                                         r"\(\[nan\]\)$"):
        GroupStats.of("same seed", [0.5, math.nan], [0, 0])
    with pytest.raises(ValueError, match=r"run\(s\) \[1, 2\]"):  # two NaNs are not "identical"
        GroupStats.of("same seed", [math.nan, math.nan], [0, 0])


# --- 10. Student's t for negative t ---------------------------------------------------------------------------
@pytest.mark.parametrize("t, df, p", [(-2.228, 10, 0.025), (-1.812, 10, 0.05), (-12.706, 1, 0.025),
                                      (-1.96, 1e6, 0.025), (-2.0, 3, 0.0696)])
def test_t_cdf_of_negative_t_matches_tables(t, df, p):
    assert t_cdf(t, df) == pytest.approx(p, abs=2e-4)
    assert t_cdf(t, df) + t_cdf(-t, df) == pytest.approx(1.0, abs=1e-12)
    assert t_cdf(0.0, df) == 0.5


# --- 11. log_metric(True) ---------------------------------------------------------------------------------------
def test_log_metric_refuses_a_bool():
    for value in (True, False):
        with pytest.raises(TypeError, match=rf"^log_metric\('ok', ...\): the value must be a real number or a "
                                            rf"one-element tensor, got {value} of type bool\.$"):
            torchrepro.log_metric("ok", value)
    with pytest.raises(TypeError, match=r"^log_metric\('ok', ...\): the value is a bool tensor; pass a number "
                                        r"\(e\.g\. tensor\.float\(\)\.mean\(\)\.item\(\) for a fraction\)\.$"):
        torchrepro.log_metric("ok", torch.tensor(True))
    assert torchrepro.log_metric("ok", 1) == 1.0 and torchrepro.log_metric("ok", torch.tensor(1)) == 1.0


# --- 12. noqa codes are prefixes ----------------------------------------------------------------------------------
def test_noqa_codes_suppress_every_rule_they_are_a_prefix_of():
    lines = {"TR3": True, "tr30": True, "TR": True, "TR1, TR3": True, "TR301": True,
             "TR31": False, "TR1": False, "TR3010": False, "TR302": False}
    source = "from torch.utils.data import DataLoader\n" + "".join(
        f"x{i} = DataLoader(ds, shuffle=True)  # torchrepro: noqa: {codes}\n" for i, codes in enumerate(lines))
    found = lint_source(source, "m.py", LintConfig(select=("TR301",)))
    flagged = {line - 2 for line in (d.line for d in found)}
    assert [d.code for d in found] == ["TR301"] * len(flagged)
    assert {codes: i not in flagged for i, codes in enumerate(lines)} == lines


def test_one_name_for_a_json_ready_dict_and_the_old_names_warn() -> None:
    """Every class says ``to_json()``; ``to_dict()``/``as_dict()`` are deprecated aliases that give the same dict."""
    import warnings

    from torchrepro.control.determinism import current_config
    from torchrepro.control.rng import RNGState
    from torchrepro.lint.rule import Diagnostic

    state = RNGState.capture()
    diagnostic = Diagnostic(code="TR001", message="m", help="h", path="p.py", line=1, column=0)
    for obj, old in ((state, "to_dict"), (current_config(), "as_dict"), (diagnostic, "to_dict")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert getattr(obj, old)() == obj.to_json()
        assert [w.category for w in caught] == [DeprecationWarning], (type(obj), old)
        assert f"{old}() is deprecated" in str(caught[0].message)


def test_patches_are_undone_together_last_first_and_never_over_someone_elses():
    import sys
    import types

    from torchrepro._core.patches import Patches

    mod = types.SimpleNamespace(f=lambda: "f", g=lambda: "g")
    finder = object()
    removed: list[str] = []
    patches = Patches()
    patches.set(mod, "f", lambda: "ours")
    patches.wrap(mod, "g", lambda g: lambda: "wrapped " + g())
    patches.insert(sys.meta_path, 0, finder)
    patches.hook(types.SimpleNamespace(remove=lambda: removed.append("hook")))
    assert (mod.f(), mod.g(), sys.meta_path[0]) == ("ours", "wrapped g", finder)
    mod.g = lambda: "someone else's"  # replaced again after us: kept
    patches.undo()
    assert (mod.f(), mod.g(), finder in sys.meta_path, removed) == ("f", "someone else's", False, ["hook"])
    patches.undo()  # twice is harmless
    assert not patches.active
