"""assert_deterministic compares what a function returns by state: modules, optimizers and plain objects too."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import pytest
import torch
from torch import nn

import torchrepro
from torchrepro._core.errors import ReproError


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))


@dataclasses.dataclass
class Trained:
    model: nn.Module
    scale: torch.Tensor
    name: str = "run"


class Holder:
    def __init__(self) -> None:
        self.weight = torch.randn(3)
        self.inner = {"bias": torch.randn(2), "steps": 3}
        self.me = self  # a cycle: compared as a reference to where it points


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self) -> None:
        self.a, self.b = torch.randn(2), 1.5


Pair = namedtuple("Pair", "x y")


def _stepped_optimizer() -> torch.optim.Optimizer:
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(5, 3)).square().sum().backward()
    opt.step()
    return opt


class _NoisyBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("noise", torch.randn(2, generator=torch.Generator().manual_seed(0)), persistent=False)


@pytest.mark.parametrize("build", [
    _net,
    _NoisyBuffer,
    _stepped_optimizer,
    lambda: Trained(_net(), torch.randn(2)),
    Holder,
    Slotted,
    lambda: Pair(torch.randn(2), nn.Linear(2, 2)),
    lambda: {"encoder": nn.Linear(3, 3), "decoder": nn.Linear(3, 1)},
], ids=["module", "non-persistent buffer", "optimizer", "dataclass", "object", "slots", "namedtuple",
        "dict of modules"])
def test_identical_modules_and_objects_pass(build):
    torchrepro.assert_deterministic(build)


def _unseeded_linear() -> nn.Module:
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    g = torch.Generator()
    g.seed()  # not from the RNG state assert_deterministic restores
    with torch.no_grad():
        net[2].weight.copy_(torch.randn(net[2].weight.shape, generator=g))
    return net


def test_a_module_with_an_unseeded_init_fails_naming_the_parameter():
    with pytest.raises(AssertionError) as info:
        torchrepro.assert_deterministic(_unseeded_linear, runs=2)
    assert str(info.value).startswith(
        "`_unseeded_linear` is not deterministic (2 calls, each from the same RNG state; compared bitwise (atol=0, "
        "rtol=0)): output.2.weight differs between call 1 and call 2: 6 of 6 elements differ (100.00%)")


def _differing(what: str):
    calls = []

    def build():
        calls.append(1)
        if what == "buffer":
            net = _net()
            net[1].running_mean.fill_(len(calls))
            return net
        if what == "object":
            holder = Holder()
            holder.inner["steps"] = len(calls)
            return holder
        if what == "slots":
            s = Slotted()
            s.b = float(len(calls))
            return s
        opt = _stepped_optimizer()
        opt.param_groups[0]["lr"] = 0.1 * len(calls)
        return opt
    return build


@pytest.mark.parametrize(("what", "named"), [
    ("buffer", "output.1.running_mean differs between call 1 and call 2: 3 of 3 elements differ"),
    ("object", "output.inner['steps'] differs between call 1 and call 2: is 1 in one call and 2 in the other"),
    ("slots", "output.b differs between call 1 and call 2: is 1.0 in one call and 2.0 in the other"),
    ("optimizer", "output['param_groups'][0]['lr'] differs between call 1 and call 2: is 0.1 in one call and 0.2"),
])
def test_a_differing_field_is_named(what, named):
    with pytest.raises(AssertionError) as info:
        torchrepro.assert_deterministic(_differing(what), runs=2)
    assert named in str(info.value)


def _opaque_message(what: str, path: str, kind: str) -> str:
    return (f"{what} cannot be checked: {path} is of type {kind}, which cannot be compared between calls (it holds no "
            "tensors, numbers or fields to compare, and == on it compares identity). Return what must come out "
            "the same instead: tensors, numbers or strings, a module or optimizer (compared by its state_dict()), "
            "or lists, dicts, dataclasses or objects of them.")


def _make_object() -> object:
    return object()


@pytest.mark.parametrize(("build", "path", "kind"), [
    (_make_object, "output", "object (builtins.object)"),
    (lambda: {"model": nn.Linear(2, 2), "hook": print}, "output['hook']",
     "builtin_function_or_method (builtins.builtin_function_or_method)"),
    (lambda: [torch.Generator()], "output[0]", "Generator (torch._C.Generator)"),
])
def test_an_object_that_cannot_be_compared_is_an_error_not_a_verdict(build, path, kind):
    name = build.__qualname__
    with pytest.raises(TypeError) as info:
        torchrepro.assert_deterministic(build)
    assert isinstance(info.value, ReproError)
    assert str(info.value) == _opaque_message(f"`{name}`", path, kind)
