"""DeterminismPolicy (per-op rules, tiers, decisions) and mark_deterministic (forward and backward), on CPU with
2 threads. Ops used: ``put_`` with duplicate indices (raises under deterministic mode on CPU), ``take``'s backward
(``aten.put`` with accumulate, a kernel deterministic mode switches), ``x[idx]``'s backward (``aten.index_put``
with accumulate, varies run to run with 2 threads)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import torchrepro
from torchrepro import (
    DeterminismPolicy,
    NondeterministicOpError,
    ReproError,
    ReproWarning,
    mark_deterministic,
)
from torchrepro.control import policy as policy_mod
from torchrepro.control import registry
from torchrepro.control.registry import OpEntry

ALERT = "does not have a deterministic implementation"
HERE = str(Path(__file__).resolve())
RUNS = 64


def line_of(marker: str) -> str:
    """``file:line`` of the line of this file that ends with the comment ``marker``."""
    lines = Path(HERE).read_text().splitlines()
    found = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, marker
    return f"{HERE}:{found[0]}"


def flags() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


@pytest.fixture(autouse=True)
def _clean_state():
    threads, before = torch.get_num_threads(), flags()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(False)
    yield
    assert policy_mod._LEVELS.stacks == {} and policy_mod._SCOPES.stack == [] and policy_mod._TRACKER.users == 0
    assert policy_mod._POLICY_GLOBALS.count == 0
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


IDX, SRC = torch.tensor([1, 1, 2]), torch.tensor([5.0, 5.0, 7.0])
EXPECTED = torch.tensor([0.0, 5.0, 7.0, 0.0])


def put(x: torch.Tensor | None = None) -> torch.Tensor:
    """put_ with a duplicate index (both writes carry the same value, so the result is known)."""
    return (torch.zeros(4) if x is None else x).put_(IDX, SRC)


@torch.no_grad()
def _many():
    idx = torch.randint(0, 1000, (2_000_000,), generator=torch.Generator().manual_seed(0))
    return idx, torch.randn(2_000_000, generator=torch.Generator().manual_seed(1))


MANY = _many()


def varies(call) -> bool:
    """Two different results within RUNS runs with 2 threads, else with 4 (on a loaded machine the two threads
    sometimes run one after the other, which hides the race)."""
    try:
        for threads in (2, 4):
            torch.set_num_threads(threads)
            if distinct(call, RUNS, stop_at=2) == 2:
                return True
        return False
    finally:
        torch.set_num_threads(2)


def distinct(call, runs: int, stop_at: int | None = None) -> int:
    seen: set[bytes] = set()
    for _ in range(runs):
        seen.add(call().detach().numpy().tobytes())
        if stop_at and len(seen) >= stop_at:
            break
    return len(seen)


# ---- DeterminismPolicy -----------------------------------------------------------------------------------------
def test_put_raises_under_deterministic_mode():
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match=f"put_ {ALERT}"):
        put()


def test_policy_allowing_put_runs_it_once_recorded_and_keeps_deterministic_mode_for_the_rest():
    with DeterminismPolicy({"aten.put_": "allow"}) as policy:
        assert flags() == (True, False)
        for _ in range(3):
            assert torch.equal(torch.zeros(4).put_(IDX, SRC), EXPECTED)  # allowed-put
        assert flags() == (True, False)  # on again after the allowed op
        with pytest.raises(NondeterministicOpError, match="aten.max_unpool2d"):  # everything else: still strict
            y, i = nn.functional.max_pool2d(torch.arange(16.0).reshape(1, 1, 4, 4), 2, return_indices=True)
            nn.functional.max_unpool2d(y, i, 2)
    assert flags() == (False, False)
    allowed = [d for d in policy.decisions if d.action == "allow"]
    assert [(d.op, d.rule, d.action, d.module, d.line, d.device, d.node, d.count) for d in allowed] == [
        ("aten.put_", "aten.put_", "allow", "", line_of("allowed-put"), "cpu", "", 3)]
    assert allowed[0].why.startswith("accumulate=False with duplicate indices")
    assert [(d.op, d.action, d.rule) for d in policy.decisions[1:]] == [("aten.max_unpool2d", "error", "default")]


def test_error_names_op_rule_and_line_exactly():
    policy = DeterminismPolicy(default="error")
    with pytest.raises(NondeterministicOpError) as info, policy:
        x = torch.zeros(4)
        x.put_(IDX, SRC)  # the-error-line
    err = info.value
    assert isinstance(err, ReproError)
    assert (err.op, err.rule, err.line, err.module) == ("aten.put_", "default", line_of("the-error-line"), "")
    assert str(err).startswith(f"aten.put_ on cpu is nondeterministic (accumulate=False with duplicate indices "
                               f"(which write wins); varies run to run with 2+ threads) at {line_of('the-error-line')}"
                               ", and rule 'default' says 'error'.")
    assert [(d.op, d.action, d.line) for d in policy.decisions] == [("aten.put_", "error", err.line)]
    assert flags() == (False, False)


def test_rules_exact_name_beats_glob_and_globs_go_in_order():
    p = DeterminismPolicy({"aten.p*": "error", "aten.pu*": "warn", "aten.put_": "allow"})
    assert p.action_for("aten.put_.default") == ("allow", "aten.put_")
    assert p.action_for("aten::put") == ("error", "aten.p*")
    assert p.action_for(torch.ops.aten.grid_sampler_2d_backward.default) == ("error", "default")
    g = DeterminismPolicy({"aten.grid_sampler_2d_backward*": "allow"}, tier="middle")
    assert g.action_for("aten.grid_sampler_2d_backward") == ("allow", "aten.grid_sampler_2d_backward*")
    assert g.action_for("aten.put_") == ("warn", "tier middle")


@pytest.mark.parametrize("tier,action", [("core", "error"), ("middle", "warn"), ("edge", "allow")])
def test_tiers(tier, action):
    p = DeterminismPolicy(tier=tier)
    assert (p.default, p.action_for("aten.put_")) == (action, (action, f"tier {tier}"))
    if action == "error":
        with pytest.raises(NondeterministicOpError, match="rule 'tier core' says 'error'"), p:
            put()
    elif action == "warn":
        with pytest.warns(ReproWarning, match="aten.put_ on cpu .* rule 'tier middle' says 'warn'"), p:
            assert torch.equal(put(), EXPECTED)
    else:
        with p:
            assert torch.equal(put(), EXPECTED)
    assert [(d.op, d.action, d.rule) for d in p.decisions] == [("aten.put_", action, f"tier {tier}")]


@pytest.mark.parametrize("kwargs,message", [
    ({"tier": "outer"}, r"tier='outer'\): expected one of \['core', 'edge', 'middle'\]"),
    ({"tier": "core", "default": "allow"}, "give either a default action or a tier"),
    ({"default": "ignore"}, r"got action 'ignore', expected one of \('error', 'warn', 'allow'\)"),
    ({"rules": {"aten.put_": "skip"}}, r"rule 'aten.put_': got action 'skip'"),
    ({"rules": {"": "allow"}}, "expected an ATen op name or glob"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeterminismPolicy(**kwargs)


def test_decorator_and_restore_after_an_exception():
    torch.backends.cudnn.benchmark = True
    policy = DeterminismPolicy({"aten.put_": "allow"})

    @policy
    def step():
        assert flags() == (True, False) and not torch.backends.cudnn.benchmark
        return put()

    assert torch.equal(step(), EXPECTED) and torch.equal(step(), EXPECTED)
    assert flags() == (False, False) and torch.backends.cudnn.benchmark
    assert policy.decisions[0].count == 2
    with pytest.raises(ZeroDivisionError), policy:
        raise ZeroDivisionError("inside the policy")
    assert flags() == (False, False) and torch.backends.cudnn.benchmark


def test_one_policy_object_in_several_threads_at_once():
    policy = DeterminismPolicy({"aten.put_": "allow"})
    errors, barrier = [], threading.Barrier(3)

    @policy
    def work():
        barrier.wait(10)  # all three threads inside the policy at once
        for _ in range(20):
            assert torch.equal(put(), EXPECTED)
        barrier.wait(10)

    def run():
        try:
            work()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and flags() == (False, False)
    assert sum(d.count for d in policy.decisions) == 60 and {d.action for d in policy.decisions} == {"allow"}


class Block(nn.Module):
    def forward(self, x):
        return put(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Identity(), Block())

    def forward(self, x):
        return self.body(x)


def test_error_and_decision_name_the_module_path():
    with pytest.raises(NondeterministicOpError, match=r"in module Net\.body\.1") as info, DeterminismPolicy():
        Net()(torch.zeros(4))
    assert info.value.module == "Net.body.1"
    with DeterminismPolicy(tier="edge") as p:
        Net()(torch.zeros(4))
        put()
    assert [d.module for d in p.decisions] == ["Net.body.1", ""]


def test_backward_ops_are_decided_too():
    """take's backward is aten.put with accumulate=True: deterministic mode switches its kernel, so only 'allow'
    makes a decision (and runs the nondeterministic kernel); the decision names the autograd node."""
    idx, vals = MANY
    for rules, n in [({}, 0), ({"aten.put": "allow"}, 1)]:
        x = torch.zeros(1000, requires_grad=True)
        with DeterminismPolicy(rules) as p:
            y = torch.take(x, idx)  # forward-line
            y.backward(vals)
        assert [(d.op, d.action, d.node, d.line) for d in p.decisions] == \
            [("aten.put", "allow", "TakeBackward0", line_of("forward-line"))] * n


class Take(nn.Module):
    def forward(self, x):
        return torch.take(x, torch.tensor([0, 0, 1]))  # take-in-module


def test_backward_decision_names_the_forward_module_and_line():
    net = nn.Sequential(nn.Identity(), Take())
    with DeterminismPolicy({"aten.put": "allow"}) as p:
        net(torch.zeros(4, requires_grad=True)).sum().backward()
    assert [(d.op, d.module, d.line, d.node) for d in p.decisions] == [
        ("aten.put", "Sequential.1", line_of("take-in-module"), "TakeBackward0")]


def test_allow_runs_the_nondeterministic_kernel_of_a_kernel_switching_op():
    idx, vals = MANY

    def call():
        return torch.zeros(1000).index_put_((idx,), vals, accumulate=True)

    with DeterminismPolicy():
        assert distinct(call, 5) == 1  # deterministic mode picks the sorted kernel
    with DeterminismPolicy({"aten.index_put_": "allow"}) as p:
        assert varies(call)
    assert p.decisions[0].why.startswith("accumulate=True with duplicate indices")


def test_registry_rows_pytorch_does_not_act_on(monkeypatch):
    """A row saying deterministic mode does "nothing" is decided before the op runs, even with the flag on."""
    fake = OpEntry("aten.index_add_", "cpu", "always (test row)", "nothing", "torchrepro.nn.functional.index_add",
                   "test", None)
    real = registry.match
    monkeypatch.setattr(registry, "match",
                        lambda op, a, k, d: fake if registry.normalize_op(op) == fake.op else real(op, a, k, d))
    x = torch.zeros(3)
    with pytest.raises(NondeterministicOpError, match=r"always \(test row\).*use torchrepro.nn.functional.index_add"):
        with DeterminismPolicy():
            x.index_add_(0, torch.tensor([0]), torch.ones(1))
    assert torch.equal(x, torch.zeros(3))  # refused before it ran
    with DeterminismPolicy(tier="edge") as p:
        x.index_add_(0, torch.tensor([0]), torch.ones(1))
    assert torch.equal(x, torch.tensor([1.0, 0, 0])) and p.decisions[0].why == "always (test row)"


def test_pytorch_alerts_for_ops_the_registry_does_not_list(monkeypatch):
    monkeypatch.setattr(registry, "match", lambda op, a, k, d: None)
    with pytest.raises(NondeterministicOpError, match="PyTorch's deterministic-mode alert") as info:
        with DeterminismPolicy():
            put()
    assert isinstance(info.value.__cause__, RuntimeError) and ALERT in str(info.value.__cause__)
    with DeterminismPolicy({"aten.put_": "allow"}) as p:
        assert torch.equal(put(), EXPECTED)
    assert p.decisions[0].why == "PyTorch's deterministic-mode alert"


def test_nested_policies_innermost_decides():
    with DeterminismPolicy(default="error") as outer, DeterminismPolicy({"aten.put_": "allow"}) as inner:
        assert torch.equal(put(), EXPECTED)
    assert (outer.decisions, [d.action for d in inner.decisions]) == ([], ["allow"])
    with pytest.raises(NondeterministicOpError), DeterminismPolicy(tier="edge"), DeterminismPolicy(tier="core"):
        put()


# ---- mark_deterministic ----------------------------------------------------------------------------------------
class PutInBackward(torch.autograd.Function):
    """Identity forward; backward writes with a duplicate index (put_ raises under deterministic mode)."""

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, g):
        return g.clone().put_(torch.tensor([0, 0]), g.reshape(-1)[:2].clone())


class Part(nn.Module):
    def __init__(self, where: str):
        super().__init__()
        self.lin, self.where = nn.Linear(4, 4), where

    def forward(self, x):
        x = self.lin(x)
        return put(x.detach().clone()) + x if self.where == "forward" else PutInBackward.apply(x)


class Two(nn.Module):
    def __init__(self, where: str):
        super().__init__()
        self.a, self.b = Part(where), Part(where)

    def forward(self, x):
        return self.b(self.a(x))


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_strict_submodule_raises_and_the_same_op_outside_does_not(where):
    torch.manual_seed(0)
    model = Two(where)
    x = torch.randn(3, 4, requires_grad=True)
    model(x).sum().backward()  # unmarked: both parts run put_ freely
    mark_deterministic(model.b, level="strict")
    with pytest.raises(RuntimeError, match=ALERT):
        model(x).sum().backward()
    assert flags() == (False, False)  # restored after the exception, forward or backward
    model.a(x).sum().backward()  # the same op outside the marked submodule does not raise
    assert flags() == (False, False)


def test_flags_restored_after_forward_and_backward_and_the_level_is_on_inside_both():
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("forward", flags()))
            return x * 1

        @staticmethod
        def backward(ctx, g):
            seen.append(("backward", flags()))
            return g

    @mark_deterministic(level="warn")
    def f(x):
        return Probe.apply(x)

    torch.use_deterministic_algorithms(True)  # the setting outside is restored, whatever it is
    x = torch.ones(2, requires_grad=True)
    y = f(x)
    assert flags() == (True, False)
    y.sum().backward()
    assert seen == [("forward", (True, True)), ("backward", (True, True))]
    assert flags() == (True, False) and torch.equal(x.grad, torch.ones(2))


def test_nested_marks_take_the_innermost_level():
    inner_off = mark_deterministic(Part("forward"), level="off")
    outer = mark_deterministic(nn.Sequential(nn.Identity(), inner_off), level="strict")
    outer(torch.ones(2, 4)).sum().backward()  # put_ runs inside "off"
    inner_strict = mark_deterministic(Part("forward"), level="strict")
    outer_off = mark_deterministic(nn.Sequential(inner_strict), level="off")
    with pytest.raises(RuntimeError, match=ALERT):
        outer_off(torch.ones(2, 4))
    assert flags() == (False, False)


def test_class_mark_applies_to_every_instance_and_module_grads_are_unchanged():
    @mark_deterministic(level="strict")
    class Marked(Part):
        pass

    with pytest.raises(RuntimeError, match=ALERT):
        Marked("forward")(torch.ones(1, 4))
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    torch.manual_seed(0)
    marked = nn.Sequential(nn.Linear(4, 4), mark_deterministic(nn.Tanh(), level="strict"),
                           mark_deterministic(nn.Linear(4, 2), level="strict"))
    x1 = torch.randn(5, 4, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    plain(x1).pow(2).sum().backward()
    marked(x2).pow(2).sum().backward()
    assert torch.equal(x1.grad, x2.grad)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), marked.parameters()))
    grads = torch.autograd.grad(marked(x2).sum(), list(marked.parameters()))  # functional grads work too
    assert [g.shape for g in grads] == [p.shape for p in marked.parameters()]
    nested = mark_deterministic(copy_module(marked), level="warn")  # marks inside a mark: same gradients
    for p in nested.parameters():
        p.grad = None
    x3 = x1.detach().clone().requires_grad_(True)
    nested(x3).pow(2).sum().backward()
    assert torch.equal(x1.grad, x3.grad)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), nested.parameters()))


def test_instance_mark_survives_deepcopy_and_can_be_replaced():
    import copy

    part = mark_deterministic(Part("forward"), level="strict")
    twin = copy.deepcopy(part)
    assert isinstance(twin, Part) and type(twin).__name__ == "Part" and twin.lin is not part.lin
    with pytest.raises(RuntimeError, match=ALERT):
        twin(torch.ones(1, 4))
    mark_deterministic(twin, level="off")
    twin(torch.ones(1, 4)).sum().backward()  # off now: put_ runs
    assert twin.lin.weight.grad is not None and part.lin.weight.grad is None
    assert type(twin).__mro__[1] is Part  # re-marked from the original class, not stacked


def test_module_outputs_in_structures_no_grad_and_tensor_kwargs():
    class Multi(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x, *, scale):
            y = self.lin(x) * scale
            return {"y": y, "pair": (y.sum(), 3), "index": torch.arange(2)}

    torch.manual_seed(0)
    plain = Multi()
    marked = mark_deterministic(copy_module(plain), level="strict")
    x = torch.ones(1, 2, requires_grad=True)
    s1, s2 = torch.tensor(2.0, requires_grad=True), torch.tensor(2.0, requires_grad=True)
    a, b = plain(x, scale=s1), marked(x, scale=s2)
    assert b["pair"][1] == 3 and torch.equal(b["index"], torch.arange(2)) and not b["index"].requires_grad
    (a["y"].sum() + a["pair"][0]).backward()
    g1 = x.grad.clone()
    x.grad = None
    (b["y"].sum() + b["pair"][0]).backward()
    assert torch.equal(g1, x.grad) and torch.equal(s1.grad, s2.grad)
    assert torch.equal(plain.lin.weight.grad, marked.lin.weight.grad)
    with torch.no_grad():
        assert torch.equal(marked(x, scale=s2)["y"], plain(x, scale=s1)["y"])
    assert flags() == (False, False)


def copy_module(m: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(m)


def test_strict_backward_switches_kernels_for_a_builtin_backward_op():
    """x[idx]'s backward (aten.index_put, accumulate=True) varies with 2 threads; marked strict it is stable."""
    idx, vals = MANY

    def gather(x):
        return x[idx]

    def grad_of(fn):
        def call():
            x = torch.zeros(1000, requires_grad=True)
            fn(x).backward(vals)
            return x.grad
        return call

    assert varies(grad_of(gather))
    assert distinct(grad_of(mark_deterministic(gather, level="strict")), 5) == 1
    assert flags() == (False, False)


def test_a_marked_region_cannot_be_backpropagated_twice():
    f = mark_deterministic(lambda x: x.exp(), level="strict")
    y = f(torch.ones(2, requires_grad=True)).sum()
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="mark_deterministic region a second time"):
        y.backward()


def test_double_backward_through_a_marked_region_is_refused():
    f = mark_deterministic(lambda x: x.pow(3), level="strict")
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Double backward \(create_graph=True\) through a mark_deterministic"):
        torch.autograd.grad(f(x).sum(), x, create_graph=True)
    assert flags() == (False, False)


def test_policy_outside_mark_inside_innermost_wins():
    model = Two("forward")
    mark_deterministic(model.b, level="strict")
    with DeterminismPolicy({"aten.put_": "allow"}) as p:
        model.a(torch.ones(1, 4))  # allowed by the policy
        with pytest.raises(RuntimeError, match=ALERT):
            model(torch.ones(1, 4))  # strict inside model.b
    assert [d.module for d in p.decisions] == ["Part", "Two.a"]


def test_threads_strictest_innermost_level_is_in_force_and_baseline_returns():
    """Deterministic mode is process-wide: while one thread is inside a strict region, another thread's "off"
    region sees strict; when both leave, the setting from before comes back."""
    inside, release, seen = threading.Event(), threading.Event(), []

    @mark_deterministic(level="strict")
    def hold(x):
        inside.set()
        release.wait(10)
        return x

    @mark_deterministic(level="off")
    def look(x):
        seen.append(flags())
        return x

    t = threading.Thread(target=hold, args=(torch.ones(1),))
    t.start()
    assert inside.wait(10)
    look(torch.ones(1))
    release.set()
    t.join()
    look(torch.ones(1))
    assert seen == [(True, False), (False, False)]  # strict elsewhere wins; alone, "off" is in force
    assert flags() == (False, False)


def test_threads_running_marked_backward_concurrently():
    torch.manual_seed(0)
    errors = []

    def work():
        try:
            model = mark_deterministic(nn.Sequential(nn.Linear(8, 8), nn.Tanh()), level="strict")
            for _ in range(20):
                model(torch.randn(4, 8, requires_grad=True)).sum().backward()
                with pytest.raises(RuntimeError, match=ALERT):
                    mark_deterministic(Part("backward"), level="strict")(torch.ones(2, 4)).sum().backward()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and flags() == (False, False)


@pytest.mark.parametrize("target,level,error,message", [
    (nn.Linear(1, 1), "loose", ValueError, r"expected one of \('strict', 'warn', 'off'\)"),
    (42, "strict", TypeError, "got int 42, expected an nn.Module class, an nn.Module instance or a function"),
])
def test_mark_bad_arguments(target, level, error, message):
    with pytest.raises(error, match=message):
        mark_deterministic(target, level=level)


def test_public_names():
    assert torchrepro.DeterminismPolicy is DeterminismPolicy and torchrepro.mark_deterministic is mark_deterministic
    assert issubclass(torchrepro.NondeterministicOpError, torchrepro.ReproError)
