"""measure_nondeterminism and assert_deterministic: real nondeterminism is found, restored state gives identity."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import torchrepro
from torchrepro.measure.nondeterminism import _grad_reports, _output_report

needs_threads = pytest.mark.skipif(torch.get_num_threads() < 2, reason="CPU nondeterminism needs 2+ torch threads")


def scatter_sum(values: torch.Tensor, dst: torch.Tensor, nodes: int) -> torch.Tensor:
    """Sum rows of ``values`` into ``nodes`` rows through one large 1-D index_put_(accumulate=True)."""
    feats = values.shape[1]
    flat = (dst.unsqueeze(1) * feats + torch.arange(feats)).reshape(-1)
    out = torch.zeros(nodes * feats, dtype=values.dtype)
    return out.index_put_((flat,), values.reshape(-1), accumulate=True).view(nodes, feats)


class ScatterNet(nn.Module):
    """Messages (msg) summed into nodes with a scatter-add, then classified (out)."""

    def __init__(self, nodes: int = 2000, feats: int = 16) -> None:
        super().__init__()
        self.nodes = nodes
        self.msg = nn.Linear(feats, feats)
        self.out = nn.Linear(feats, 4)

    def forward(self, x: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        return self.out(scatter_sum(torch.relu(self.msg(x)), dst, self.nodes))


def scatter_problem(edges: int = 150_000):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = ScatterNet()
    x, dst = torch.randn(edges, 16, generator=g), torch.randint(0, 2000, (edges,), generator=g)
    return model, (x, dst), torch.randint(0, 4, (2000,), generator=g)


class RunningNorm(nn.Module):
    """Divides by a running RMS kept in a buffer and updated by every forward pass (observation normalisation)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("rms", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.rms.mul_(0.9).add_(0.1 * x.pow(2).mean(0).sqrt())
        return x / self.rms


def stateful_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(RunningNorm(8), nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(32, 5))


# --- measure_nondeterminism -------------------------------------------------------------------------------
@needs_threads
def test_scatter_add_is_reported_nondeterministic():
    model, inputs, target = scatter_problem()
    report = torchrepro.measure_nondeterminism(model, inputs, target=target, runs=3)
    assert not report.identical and not report.deterministic_algorithms
    out = next(t for t in report.grads if t.name == "out.weight")  # its gradient reads the scatter's result
    assert not out.identical and out.max_ulp > 0 and 0 < out.differing_fraction <= 1 and out.max_abs > 0
    # cosine < 1: 1 - cos > 0. Computed as a float64 cosine it may round to 1.0 (seed article 000's method misses
    # such differences); the distance keeps them.
    assert out.max_cosine_distance > 0 and out.min_cosine == 1.0 - out.max_cosine_distance
    assert all(out.cosine[i][j] == 1.0 - out.cosine_distance[i][j] for i in range(3) for j in range(3))
    assert len(out.cosine) == 3 and all(out.cosine[i][i] == 1.0 and out.cosine_distance[i][i] == 0 for i in range(3))
    assert report.max_ulp > 0 and report.max_cosine_distance > 0
    assert report.output is not None and not report.output.identical and report.output.max_abs > 0
    # the table lists exactly the tensors that differed (which ones besides out.weight depends on the race)
    summary = report.summary()
    assert "NOT IDENTICAL" in summary
    assert all((t.name in summary) == (not t.identical) for t in report.grads), summary


def test_scatter_add_is_identical_under_deterministic_mode():
    model, inputs, target = scatter_problem()
    with torchrepro.deterministic():
        report = torchrepro.measure_nondeterminism(model, inputs, target=target, runs=3)
    assert report.identical and report.deterministic_algorithms
    assert [t.name for t in report.grads] == ["msg.weight", "msg.bias", "out.weight", "out.bias"]
    for t in report.grads:
        assert t.identical and t.max_ulp == 0 and t.max_abs == 0 and t.differing_fraction == 0
        assert t.min_cosine == 1.0 and t.max_cosine_distance == 0.0
    assert report.min_cosine == 1.0 and report.max_cosine_distance == 0.0 and report.max_ulp == 0
    assert report.output.identical and report.output.argmax_agreement == 1.0 and report.output.topk_jaccard == 1.0
    assert report.loss.identical and len(set(report.losses)) == 1


@pytest.mark.parametrize("stepped", [False, True], ids=["fresh-optimizer", "optimizer-with-state"])
def test_batchnorm_dropout_buffers_and_optimizer_state_are_restored(stepped):
    model = stateful_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)  # fresh: the first step creates its state
    x, y = torch.randn(16, 8), torch.randint(0, 5, (16,))
    if stepped:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    nn.functional.cross_entropy(model(x), y).backward()  # gradients the caller had before: kept
    grads = [p.grad.clone() for p in model.parameters()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    opt_state = {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}
    rng = torch.get_rng_state()
    report = torchrepro.measure_nondeterminism(model, x, target=y, runs=3, optimizer=opt)
    assert report.identical, report.summary()
    assert [t.kind for t in report.params] == ["param"] * 6 and all(t.identical for t in report.params)
    assert report.output.shape == (16, 5)
    # nothing changed: values, buffers (BatchNorm statistics, the running RMS), gradients, optimizer, RNG
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    after = opt.state_dict()["state"]
    assert after.keys() == opt_state.keys()
    assert all(torch.equal(opt_state[i][k], after[i][k]) for i in after for k in after[i])
    assert torch.equal(rng, torch.get_rng_state())


def test_callable_form_gives_the_same_measurement():
    model = stateful_model()
    x, y = torch.randn(16, 8), torch.randint(0, 5, (16,))
    by_module = torchrepro.measure_nondeterminism(model, x, target=y, runs=2)

    def step():
        out = model(x)
        return nn.functional.cross_entropy(out, y), out

    by_fn = torchrepro.measure_nondeterminism(step, runs=2)
    assert by_fn.identical
    assert [t.name for t in by_fn.grads] == [t.name for t in by_module.grads]
    assert [v.hex() for v in by_fn.losses] == [v.hex() for v in by_module.losses]
    assert by_fn.output is not None and by_fn.output.shape == (16, 5)


def test_output_agreement_and_topk_jaccard():
    a = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    b = torch.tensor([[3.0, 2.0, 0.0, 1.0], [0.0, 1.0, 3.0, 2.0]])
    report = _output_report([a, b, a.clone()], topk=3)
    assert not report.identical and report.differing_fraction == 0.5 and report.max_abs == 1.0
    assert report.topk == 3
    assert report.argmax_agreement == 0.5  # row 2: class 3 vs class 2
    assert report.topk_jaccard == pytest.approx(0.75)  # row 1: {0,1,2} vs {0,1,3} -> 2/4; row 2: same set -> 1
    assert report.agreement[0][2] == 1.0 and report.jaccard[0][2] == 1.0


def test_report_is_json_ready():
    model = stateful_model()
    report = torchrepro.measure_nondeterminism(model, torch.randn(8, 8), runs=2)  # no target: loss = output.sum()
    doc = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert doc["schema"] == "torchrepro.measure/1" and doc["identical"] is True and doc["runs"] == 2
    assert doc["overall"]["cosine"] == [[1.0, 1.0], [1.0, 1.0]]
    assert doc["grads"][0]["name"] == "1.weight" and doc["grads"][0]["max_ulp"] == 0
    assert [float.fromhex(v) for v in doc["loss"]["values"]] == report.losses


def test_bad_inputs_are_refused_with_the_reason():
    model = stateful_model()
    x = torch.randn(4, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="runs must be an integer >= 2"):
        torchrepro.measure_nondeterminism(model, x, runs=1)
    with pytest.raises(TypeError, match="inputs is missing"):
        torchrepro.measure_nondeterminism(model)
    with pytest.raises(TypeError, match="expected an nn.Module or a callable"):
        torchrepro.measure_nondeterminism(42, x)
    with pytest.raises(TypeError, match="the loss is a float"):
        torchrepro.measure_nondeterminism(lambda: 1.0)
    with pytest.raises(ValueError, match="does not depend on any tensor that requires grad"):
        torchrepro.measure_nondeterminism(lambda: torch.ones(1).sum())
    with pytest.raises(ValueError, match=r"the loss has shape \(4, 5\)"):
        torchrepro.measure_nondeterminism(model, x, loss_fn=lambda out: out)
    # the last call ran the forward pass (RunningNorm and BatchNorm update their buffers) before it failed
    assert set(before) == set(model.state_dict())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # failed calls restored it


# --- assert_deterministic ---------------------------------------------------------------------------------
def test_assert_deterministic_passes_on_seeded_randomness_and_advances_the_rng_once():
    state = torch.get_rng_state()
    torchrepro.assert_deterministic(lambda n: torch.rand(n) + torch.randn(n), 5, runs=4)
    after = torch.rand(2)
    torch.set_rng_state(state)
    torch.rand(5), torch.randn(5)
    assert torch.equal(after, torch.rand(2))


def scatter_once() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    values = torch.randn(150_000, 16, generator=g)
    return scatter_sum(values, torch.randint(0, 2000, (150_000,), generator=g), 2000)


@needs_threads
def test_assert_deterministic_names_the_scatter_difference_and_the_fix():
    with pytest.raises(AssertionError) as info:
        torchrepro.assert_deterministic(scatter_once, runs=5)
    msg = str(info.value)
    assert msg.startswith("`scatter_once` is not deterministic (5 calls, each from the same RNG state; compared "
                          "bitwise (atol=0, rtol=0)): output differs between call 1 and call ")
    assert " of 32000 elements differ (" in msg and "greatest |Δ| " in msg and "at index (" in msg
    assert "ULP of float32; largest ULP distance anywhere" in msg
    assert "\nCause: a nondeterministic kernel: under torchrepro.deterministic() all 5 calls agree. Fix: run it " \
           "under `with torchrepro.deterministic():`" in msg
    with torchrepro.deterministic():
        torchrepro.assert_deterministic(scatter_once, runs=5)


@needs_threads
def test_assert_deterministic_names_an_op_that_has_no_deterministic_kernel():
    def scatter_then_put() -> torch.Tensor:
        out = scatter_once().reshape(-1)
        return out.put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))  # raises under deterministic mode on CPU

    with pytest.raises(AssertionError) as info:
        torchrepro.assert_deterministic(scatter_then_put, runs=3)
    assert "\nCause: a kernel without a deterministic implementation: under torchrepro.deterministic() the call " \
           "raises RuntimeError: put_ does not have a deterministic implementation, but you set " \
           "'torch.use_deterministic_algorithms(True)'. Replace that operation" in str(info.value)
    assert not torch.are_deterministic_algorithms_enabled()


def test_assert_deterministic_blames_state_under_deterministic_mode():
    calls = []

    def counter() -> dict:
        calls.append(1)
        return {"x": torch.ones(3) * len(calls), "tag": "same"}

    with torchrepro.deterministic(), pytest.raises(AssertionError) as info:
        torchrepro.assert_deterministic(counter, runs=2)
    msg = str(info.value)
    assert "output['x'] differs between call 1 and call 2: 3 of 3 elements differ (100.00%); greatest |Δ| 1 at " \
           "index (0,): 1.0 vs 2.0" in msg
    assert "Cause: deterministic algorithms are on, so the difference comes from state that the function changes " \
           "or reads" in msg
    with pytest.raises(AssertionError, match="the calls differ under torchrepro.deterministic.. too, so the "
                                             "difference comes from state"):
        torchrepro.assert_deterministic(counter, runs=2)


def test_tolerance_presets_accept_last_bit_noise_and_bitwise_does_not():
    calls = []

    def noisy(dtype: torch.dtype) -> torch.Tensor:  # one ULP up on every other call
        calls.append(1)
        x = torch.linspace(1, 2, 8, dtype=dtype)
        return torch.nextafter(x, torch.full_like(x, 3)) if len(calls) % 2 == 0 else x

    with pytest.raises(AssertionError) as info:
        torchrepro.assert_deterministic(noisy, torch.bfloat16)
    assert "(1 ULP of bfloat16" in str(info.value) and "TOLERANCES['bf16-autocast']" in str(info.value)
    torchrepro.assert_deterministic(noisy, torch.bfloat16, **torchrepro.TOLERANCES["bf16-autocast"])
    torchrepro.assert_deterministic(noisy, torch.float16, **torchrepro.TOLERANCES["fp16-autocast"])
    torchrepro.assert_deterministic(noisy, torch.float32, **torchrepro.TOLERANCES["fp32"])
    with pytest.raises(AssertionError, match="compared with atol=1e-05, rtol=1.3e-06"):
        torchrepro.assert_deterministic(lambda: torch.ones(2) * (1 + 1e-3 * len(calls.append(1) or calls)),
                                        **torchrepro.TOLERANCES["fp32"])


def test_assert_deterministic_structure_and_argument_errors():
    sizes = iter(range(1, 10))
    with pytest.raises(AssertionError, match="the structure of its result differs between call 1 and call 2"):
        torchrepro.assert_deterministic(lambda: [torch.zeros(1)] * next(sizes))
    floats = iter([0.5, 0.5 + 2**-40])
    with pytest.raises(AssertionError, match=r"output differs between call 1 and call 2: is 0.5 in one call and"):
        torchrepro.assert_deterministic(lambda: next(floats), runs=2)
    with pytest.raises(ValueError, match="runs must be an integer >= 2"):
        torchrepro.assert_deterministic(torch.rand, 3, runs=1)
    with pytest.raises(ValueError, match="atol must be a number >= 0"):
        torchrepro.assert_deterministic(torch.rand, 3, atol=-1.0)
    assert math.isclose(torchrepro.TOLERANCES["bf16-autocast"]["rtol"], 2 * 2**-7, rel_tol=0.03)


def test_cosine_distances_keep_last_bit_differences_and_ignore_scale():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1000, generator=g), torch.randn(10, generator=g)
    a1 = a.clone()
    a1[7] = torch.nextafter(a1[7], torch.tensor(10.0))  # one ULP
    runs = [[a, b], [a1, b], [a * 2, b * 2], [a, b]]
    reports, overall = _grad_reports(["a", "b"], runs)

    def direct(x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x.double(), y.double()
        return float(0.5 * (x / x.norm() - y / y.norm()).square().sum())

    d = reports[0].cosine_distance
    assert d[0][1] == pytest.approx(direct(a, a1), rel=1e-6) and 0 < d[0][1] < 1e-15
    assert d[0][2] < 1e-28 and d[0][3] == 0.0  # a scaled copy points the same way; run 4 is run 1 exactly
    assert reports[0].cosine[0][1] == 1.0  # the float64 cosine cannot show it: the distance does
    assert not reports[1].identical and reports[1].max_cosine_distance < 1e-28  # b and 2b: same direction
    assert overall[0][1] == pytest.approx(direct(torch.cat([a, b]), torch.cat([a1, b])), rel=1e-6)
    assert overall[0][3] == 0.0 and overall[0][2] < 1e-28


def test_outputs_that_change_shape_are_reported_not_crashed_on():
    lin = nn.Linear(3, 3)
    calls = []

    def step():
        calls.append(1)
        out = lin(torch.ones(len(calls), 3))  # a batch that grows: state the measurement cannot restore
        return out.sum(), out

    report = torchrepro.measure_nondeterminism(step, runs=3)
    assert not report.identical and not report.output.identical and report.output.max_abs == math.inf
    assert report.output.argmax_agreement is None and "NOT IDENTICAL" in report.summary()
