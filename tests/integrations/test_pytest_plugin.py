"""The pytest plugin, run under pytester: header, per-test seeds independent of order, the reproducible marker."""

from __future__ import annotations

import json

import pytest
import torch._inductor.config  # noqa: F401

from torchrepro.control.seeding import derive_seed

# pytester's in-process runs drop the modules first imported inside them; torch.use_deterministic_algorithms
# imports torch._inductor on first use, and importing it a second time fails (TORCH_LIBRARY registered twice), so
# it is imported here, outside every run (it used to pass only when an earlier test file had imported it).
pytest_plugins = ["pytester"]

ORDER_TESTS = '''
import json, os, random
import numpy as np
import pytest
import torch

@pytest.fixture(scope="session")
def shared():
    return torch.rand(4)  # drawn by whichever test asks first

@pytest.fixture
def seeded_on_purpose():
    torch.manual_seed(123)

def record(nodeid, seed):
    with open(os.environ["OUT"], "a") as f:
        f.write(json.dumps({"test": nodeid, "seed": seed, "torch": torch.rand(3).tolist(),
                            "random": random.random(), "numpy": float(np.random.rand())}) + "\\n")

def test_a(request, torchrepro_seed):
    record(request.node.nodeid, torchrepro_seed)

def test_b(request, torchrepro_seed, shared):
    record(request.node.nodeid, torchrepro_seed)

@pytest.mark.parametrize("x", [1, 2])
def test_c(request, torchrepro_seed, shared, x):
    record(request.node.nodeid, torchrepro_seed)

def test_fixture_seed_wins(seeded_on_purpose):
    got = torch.rand(2)
    torch.manual_seed(123)
    assert torch.equal(got, torch.rand(2))
'''

REVERSE = '''
import os
def pytest_collection_modifyitems(items):
    if os.environ.get("REVERSE"):
        items.reverse()
'''


def _records(path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.unlink()
    return {r["test"]: r for r in rows}


def test_seeding_is_off_unless_the_project_asks_and_the_header_says_when_it_is_on(pytester, monkeypatch):
    """Installing torchrepro must not reseed another project's tests (a silent global default)."""
    pytester.makepyfile(
        "import torch\n"
        "from torchrepro.control.seeding import derive_seed\n"
        "def test_x(request):\n"
        "    assert torch.initial_seed() != derive_seed(0, 'pytest', request.node.nodeid)\n")
    monkeypatch.delenv("TORCHREPRO_SEED", raising=False)
    off = pytester.runpytest("-p", "no:randomly")
    off.assert_outcomes(passed=1)
    assert "torchrepro:" not in off.stdout.str()
    monkeypatch.setenv("TORCHREPRO_SEED", "11")  # a seed in the environment alone does not switch it on
    assert "torchrepro:" not in pytester.runpytest("-p", "no:randomly").stdout.str()
    monkeypatch.delenv("TORCHREPRO_SEED")
    pytester.runpytest("-p", "no:randomly", "--torchrepro-seed", "0").assert_outcomes(failed=1)  # on: reseeded


def test_header_names_the_seed_and_where_it_came_from(pytester, monkeypatch):
    pytester.makepyfile("def test_x():\n    pass\n")
    monkeypatch.delenv("TORCHREPRO_SEED", raising=False)
    pytester.runpytest("--torchrepro-seed", "7").stdout.fnmatch_lines(
        ["torchrepro: per-test seeding on, seed 7 (--torchrepro-seed); each test is seeded with derive_seed(7, "
         "'pytest', node id); repeat with --torchrepro-seed 7"])
    pytester.makeini("[pytest]\ntorchrepro_seed = 0\n")
    pytester.runpytest("-p", "no:randomly").stdout.fnmatch_lines(
        ["torchrepro: per-test seeding on, seed 0 (ini option torchrepro_seed)*"])
    monkeypatch.setenv("TORCHREPRO_SEED", "11")
    pytester.runpytest().stdout.fnmatch_lines(["torchrepro: per-test seeding on, seed 11 (TORCHREPRO_SEED)*"])
    pytester.runpytest("--torchrepro-seed", "7").stdout.fnmatch_lines(["torchrepro: * seed 7 (--torchrepro-seed)*"])
    assert "torchrepro:" not in pytester.runpytest("-p", "no:torchrepro").stdout.str()
    bad = pytester.runpytest("--torchrepro-seed", "-3")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--torchrepro-seed must be an integer in [0, 4294967295], got -3" in bad.stderr.str()
    monkeypatch.delenv("TORCHREPRO_SEED")
    pytester.makeini("[pytest]\ntorchrepro_seed = soon\n")
    bad = pytester.runpytest()
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "the ini option torchrepro_seed must be an integer in [0, 4294967295], got 'soon'" in bad.stderr.str()


def test_each_test_gets_the_same_seed_and_numbers_whatever_the_order(pytester, monkeypatch, tmp_path):
    pytester.makepyfile(test_order=ORDER_TESTS)
    pytester.makeconftest(REVERSE)
    pytester.makeini("[pytest]\ntorchrepro_seed = 0\n")  # the project opts in
    out = tmp_path / "out.jsonl"
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.delenv("TORCHREPRO_SEED", raising=False)
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=5)
    forward = _records(out)
    monkeypatch.setenv("REVERSE", "1")
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=5)
    backward = _records(out)
    pytester.runpytest("-p", "no:randomly", "-k", "test_c and 2").assert_outcomes(passed=1, deselected=4)
    alone = _records(out)
    assert list(forward) == list(reversed(backward)) and len(forward) == 4
    assert forward == backward  # same seed, same torch/random/numpy numbers, even with the session fixture moved
    assert alone["test_order.py::test_c[2]"] == forward["test_order.py::test_c[2]"]
    for nodeid, row in forward.items():
        assert row["seed"] == derive_seed(0, "pytest", nodeid)
    assert len({r["seed"] for r in forward.values()}) == 4 and len({r["random"] for r in forward.values()}) == 4
    pytester.runpytest("-p", "no:randomly", "--torchrepro-seed", "5").assert_outcomes(passed=5)
    other = _records(out)
    assert all(other[k]["seed"] != forward[k]["seed"] and other[k]["torch"] != forward[k]["torch"] for k in forward)


MARKED = '''
import pytest
import torch

G = torch.Generator()  # created once, never seeded by the test: it goes on from where the last run left it
CALLS = []

@pytest.mark.reproducible(runs=3)
def test_global_rng_is_reproducible():
    CALLS.append(1)
    return {"x": torch.rand(3), "n": torch.randn(2, 2)}

def test_body_ran_three_times():
    assert len(CALLS) == 3

@pytest.mark.reproducible
def test_unseeded_generator():
    return torch.rand(3, generator=G)

@pytest.mark.reproducible
def test_returns_nothing():
    torch.rand(3)

@pytest.mark.reproducible(runs=1)
def test_bad_marker():
    return torch.zeros(1)
'''


def test_reproducible_marker(pytester):
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest("-p", "no:randomly", "-W", "error::pytest.PytestReturnNotNoneWarning")
    result.assert_outcomes(passed=2, failed=3)
    text = result.stdout.str()
    assert "test test_unseeded_generator is not deterministic (2 calls, each from the same RNG state; compared " \
           "bitwise (atol=0, rtol=0)): output differs between call 1 and call 2: 3 of 3 elements differ" in text
    assert "Cause: the calls differ under torchrepro.deterministic() too" in text
    assert "register it with torchrepro.register_generator" in text
    assert "test_returns_nothing returned nothing, so there is nothing to compare" in text
    assert "@pytest.mark.reproducible takes runs (an integer >= 2)" in text


def test_reproducible_marker_passes_for_a_seeded_generator(pytester):
    pytester.makepyfile('''
import pytest
import torch

@pytest.mark.reproducible(runs=2, rtol=0.0)
def test_own_generator(torchrepro_seed):
    g = torch.Generator().manual_seed(torchrepro_seed)
    return torch.rand(3, generator=g), torchrepro_seed
''')
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=1)


def test_reproducible_marker_compares_modules_and_objects_by_state(pytester):
    pytester.makepyfile('''
import dataclasses
import pytest
import torch

@dataclasses.dataclass
class Run:
    model: torch.nn.Module
    loss: float

@pytest.mark.reproducible
def test_module():
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))

@pytest.mark.reproducible
def test_dataclass_of_a_module():
    return Run(torch.nn.Linear(2, 2), 0.5)

@pytest.mark.reproducible
def test_unseeded_init():
    model = torch.nn.Linear(2, 2)
    g = torch.Generator()
    g.seed()
    with torch.no_grad():
        model.bias.copy_(torch.randn(2, generator=g))
    return model

@pytest.mark.reproducible
def test_opaque():
    return {"loss": torch.ones(1), "callback": object()}
''')
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=2)
    text = result.stdout.str()
    assert "test test_unseeded_init is not deterministic (2 calls, each from the same RNG state; compared bitwise " \
           "(atol=0, rtol=0)): output.bias differs between call 1 and call 2: 2 of 2 elements differ" in text
    assert "test test_opaque cannot be checked: output['callback'] is of type object (builtins.object), which " \
           "cannot be compared between calls" in text
    assert "Traceback" not in text and "UncomparableResultError" not in text
