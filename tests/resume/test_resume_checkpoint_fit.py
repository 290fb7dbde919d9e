"""load_checkpoint checks everything before it restores anything, and names every mismatch in full."""

from __future__ import annotations

import copy
import json
import random
import re
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import torchrepro
from torchrepro._core.errors import CheckpointError


def _net(seed: int, out: int = 2, extra_layer: bool = False, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    layers = [nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, out)]
    if extra_layer:
        layers += [nn.ReLU(), nn.Linear(out, 2)]
    return nn.Sequential(*layers).to(dtype)


def _objects(*, seed: int, model: nn.Module | None = None, split: int | None = 2, opt: str = "sgd",
             sched: str = "step", batch_size: int = 3) -> dict:
    """Model, optimizer (with state), scheduler and loader, all differing in value from another ``seed``'s."""
    model = model if model is not None else _net(seed)
    params = list(model.parameters())
    groups = [{"params": params}] if split is None else [{"params": params[:split]}, {"params": params[split:]}]
    optimizer = (torch.optim.Adam(groups, lr=1e-3) if opt == "adam"
                 else torch.optim.SGD(groups, lr=0.1 * (seed + 1), momentum=0.9))
    scheduler = (torch.optim.lr_scheduler.StepLR(optimizer, step_size=2) if sched == "step"
                 else torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, generator=g).to(params[0].dtype)
    model(x).sum().backward()
    optimizer.step()
    scheduler.step()
    loader = torchrepro.ResumableLoader(list(range(10)), batch_size=batch_size, seed=seed)
    next(iter(loader))
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}


def _bits(value):
    """A structure equal to another's exactly when their tensors are bitwise equal."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape), bytes(value.detach().reshape(-1).view(torch.uint8).tolist()))
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.tobytes())
    if isinstance(value, dict):
        return {k: _bits(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_bits(v) for v in value]
    return value


def _snapshot(objs: dict) -> dict:
    return _bits({
        "model": objs["model"].state_dict(),
        "optimizer": copy.deepcopy(objs["optimizer"].state_dict()),
        "scheduler": copy.deepcopy(objs["scheduler"].state_dict()),
        "loader": objs["loader"].state_dict(),
        "random": random.getstate(),
        "numpy": list(np.random.get_state()),
        "torch": torch.get_rng_state(),
    })


@pytest.fixture
def saved(tmp_path):
    """A checkpoint of SGD with two parameter groups, StepLR and a loader; every RNG moved on afterwards."""
    objs = _objects(seed=0)
    path = tmp_path / "ckpt.pt"
    torchrepro.save_checkpoint(path, model=objs["model"], optimizer=objs["optimizer"],
                               scheduler=objs["scheduler"], loader=objs["loader"], step=3)
    random.random(), np.random.rand(), torch.rand(1)
    return path


def _load(path, objs: dict, **kw):
    return torchrepro.load_checkpoint(path, model=objs["model"], optimizer=objs["optimizer"],
                                      scheduler=objs["scheduler"], loader=objs["loader"], **kw)


def _refused(path, objs: dict, **kw) -> str:
    """Load must fail, change nothing at all, and return the error text."""
    before = _snapshot(objs)
    with pytest.raises(CheckpointError) as info:
        _load(path, objs, **kw)
    assert _snapshot(objs) == before, "a refused load changed the model, optimizer, scheduler, loader or RNG"
    text = str(info.value)
    assert text.startswith(f"{path}: does not fit the objects passed; nothing was restored.")
    return text


def test_matching_objects_load(saved):
    objs = _objects(seed=1)
    assert _load(saved, objs)["step"] == 3
    assert objs["optimizer"].param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize("case, expected", [
    ("architecture", ["model: shape of '2.weight' is [2, 8] in the checkpoint, [3, 8] in the model",
                      "model: shape of '2.bias' is [2] in the checkpoint, [3] in the model"]),
    ("extra layer", ["model: 2 key(s) of the model missing from the checkpoint: ['4.weight', '4.bias']",
                     "optimizer: parameters per group are [2, 2] in the checkpoint, [2, 4] in the optimizer"]),
    ("missing layer", ["model: 2 unexpected key(s) in the checkpoint: ['2.weight', '2.bias']",
                       "optimizer: parameters per group are [2, 2] in the checkpoint, [2, 0] in the optimizer"]),
    ("dtype", [f"model: dtype of '{key}' is torch.float32 in the checkpoint, torch.float64 in the model "
               "(loading would round the values)" for key in ("0.weight", "0.bias", "2.weight", "2.bias")]),
    ("group count", ["optimizer: 2 parameter group(s) in the checkpoint, 1 in the optimizer"]),
    ("group sizes", ["optimizer: parameters per group are [2, 2] in the checkpoint, [1, 3] in the optimizer"]),
    ("optimizer class", ["optimizer: the checkpoint holds the state of a torch.optim.sgd.SGD but a "
                         "torch.optim.adam.Adam was passed (loading it would change its settings)"]),
    ("scheduler class", ["scheduler: the checkpoint holds the state of a torch.optim.lr_scheduler.StepLR but a "
                         "torch.optim.lr_scheduler.ExponentialLR was passed"]),
    ("loader", ["data: loader state has batch_size=3 but this loader has 4"]),
])
def test_each_mismatch_is_named_and_changes_nothing(saved, case, expected):
    objs = {
        "architecture": lambda: _objects(seed=1, model=_net(1, out=3)),
        "extra layer": lambda: _objects(seed=1, model=_net(1, extra_layer=True)),
        "missing layer": lambda: _objects(seed=1, model=nn.Sequential(nn.Linear(4, 8))),
        "dtype": lambda: _objects(seed=1, model=_net(1, dtype=torch.float64)),
        "group count": lambda: _objects(seed=1, split=None),
        "group sizes": lambda: _objects(seed=1, split=1),
        "optimizer class": lambda: _objects(seed=1, opt="adam"),
        "scheduler class": lambda: _objects(seed=1, sched="exp"),
        "loader": lambda: _objects(seed=1, batch_size=4),
    }[case]()
    text = _refused(saved, objs)
    for line in expected:
        assert f"\n  - {line}\n" in text + "\n", text
    assert text.count("\n  - ") == len(expected), text


def test_adam_checkpoint_is_refused_by_sgd_and_sgd_keeps_its_lr(tmp_path):
    adam = _objects(seed=0, opt="adam")
    path = tmp_path / "adam.pt"
    torchrepro.save_checkpoint(path, model=adam["model"], optimizer=adam["optimizer"], step=1)
    sgd = _objects(seed=1)
    lr = sgd["optimizer"].param_groups[0]["lr"]
    before = _snapshot(sgd)
    with pytest.raises(CheckpointError, match=r"optimizer: the checkpoint holds the state of a "
                                              r"torch\.optim\.adam\.Adam but a torch\.optim\.sgd\.SGD was passed"):
        torchrepro.load_checkpoint(path, model=sgd["model"], optimizer=sgd["optimizer"])
    assert _snapshot(sgd) == before and sgd["optimizer"].param_groups[0]["lr"] == lr

    # a checkpoint saved before classes were recorded: Adam's own settings give it away
    data = torch.load(path, weights_only=True)
    del data["classes"]
    torch.save(data, path)
    with pytest.raises(CheckpointError) as info:
        torchrepro.load_checkpoint(path, model=sgd["model"], optimizer=sgd["optimizer"])
    assert ("optimizer: the checkpoint's parameter groups have settings ['amsgrad', 'betas', "
            "'capturable', 'decoupled_weight_decay', 'eps'] that a SGD does not have; it was saved from another "
            "optimizer class") in str(info.value)
    assert _snapshot(sgd) == before


def test_missing_generator_is_found_before_anything_is_restored(tmp_path):
    objs = _objects(seed=0)
    path = tmp_path / "gen.pt"
    torchrepro.register_generator("aug", torch.Generator().manual_seed(5))
    try:
        torchrepro.save_checkpoint(path, model=objs["model"], optimizer=objs["optimizer"],
                                   scheduler=objs["scheduler"], loader=objs["loader"], step=3)
    finally:
        torchrepro.unregister_generator("aug")
    target = _objects(seed=1)
    text = _refused(path, target)
    assert ("\n  - RNG: the state includes generator 'aug', which was neither passed nor registered; pass "
            "generators={'aug': gen} or call register_generator('aug', gen).\n") in text
    text = _refused(path, target, generators={"aug": np.random.default_rng(0)})
    assert "RNG: generator 'aug' was saved as a torch generator but a numpy generator was given." in text
    aug = torch.Generator().manual_seed(9)
    _load(path, target, generators={"aug": aug})
    assert torch.equal(aug.get_state(), torch.Generator().manual_seed(5).get_state())
    # generators= passed to save_checkpoint work like registered ones
    torchrepro.save_checkpoint(path, model=objs["model"], step=4, generators={"aug": torch.Generator().manual_seed(6)})
    assert torchrepro.load_checkpoint(path, model=target["model"], generators={"aug": aug})["step"] == 4
    assert torch.equal(aug.get_state(), torch.Generator().manual_seed(6).get_state())


def test_corrupt_rng_payload_is_found_before_anything_is_restored(saved):
    data = torch.load(saved, weights_only=True)
    rng = json.loads(data["rng"])
    rng["numpy"]["name"] = "PCG64"
    data["rng"] = json.dumps(rng)
    torch.save(data, saved)
    objs = _objects(seed=1)
    before = _snapshot(objs)
    with pytest.raises(CheckpointError) as info:
        _load(saved, objs)
    assert _snapshot(objs) == before
    assert str(info.value) == (f"{saved}: has a corrupt RNG state (field 'numpy.name' is 'PCG64', expected "
                               "'MT19937' (the bit generator of NumPy's global RNG)); nothing was restored. Use an "
                               "earlier checkpoint.")


def test_every_problem_is_listed_in_full(saved):
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(40)])
    objs = _objects(seed=1, model=model, batch_size=5)
    text = _refused(saved, objs)
    missing = [f"{i}.{w}" for i in range(40) if i not in (0, 2) for w in ("weight", "bias")]
    assert f"model: 76 key(s) of the model missing from the checkpoint: {missing}" in text
    assert "model: shape of '0.weight' is [8, 4] in the checkpoint, [4, 4] in the model" in text
    assert "model: shape of '0.bias' is [8] in the checkpoint, [4] in the model" in text
    assert "model: shape of '2.weight' is [2, 8] in the checkpoint, [4, 4] in the model" in text
    assert "data: loader state has batch_size=3 but this loader has 5" in text
    assert text.endswith("Build the model, optimizer, scheduler, scaler and loader exactly as in the run that "
                         "saved it, or do not pass the ones that differ.")


class _FailingScaler:
    """A scaler-like component whose state passes every check but whose load still fails."""

    def __init__(self) -> None:
        self.loads = 0

    def state_dict(self) -> dict:
        return {"scale": 1.0}

    def load_state_dict(self, state: dict) -> None:
        self.loads += 1
        if self.loads == 1:
            raise RuntimeError("boom")


def test_a_load_that_still_fails_puts_back_what_was_loaded(tmp_path):
    objs = _objects(seed=0)
    path = tmp_path / "c.pt"
    torchrepro.save_checkpoint(path, model=objs["model"], optimizer=objs["optimizer"], scheduler=objs["scheduler"],
                               scaler=_FailingScaler(), loader=objs["loader"], step=3)
    target = _objects(seed=1)
    target["loader"].next_batch()
    before = _snapshot(target)
    with pytest.raises(CheckpointError, match=r"could not be loaded into the scaler passed \(RuntimeError: boom\)"
                                              r"\. Nothing was changed\."):
        _load(path, target, scaler=_FailingScaler())
    assert _snapshot(target) == before  # loader and scheduler (loaded before the scaler) were put back


def test_directory_is_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory, not a checkpoint file"):
        torchrepro.load_checkpoint(tmp_path, model=nn.Linear(1, 1))


# --- optimizer state per parameter, metadata types, fuzzing the reader ------------------------------------------
def _adam_over(model: nn.Module, order: list[int]) -> torch.optim.Adam:
    params = list(model.parameters())
    return torch.optim.Adam([params[i] for i in order], lr=1e-3)


def _trained_adam(tmp_path, order: list[int]):
    model = _net(0)
    opt = _adam_over(model, order)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    path = tmp_path / "adam.pt"
    torchrepro.save_checkpoint(path, model=model, optimizer=opt, step=1)
    return path


def _model_and_optimizer_refused(path, model: nn.Module, opt) -> str:
    before = _bits({"model": model.state_dict(), "optimizer": copy.deepcopy(opt.state_dict())})
    with pytest.raises(CheckpointError) as info:
        torchrepro.load_checkpoint(path, model=model, optimizer=opt)
    assert _bits({"model": model.state_dict(), "optimizer": copy.deepcopy(opt.state_dict())}) == before
    return str(info.value)


def test_adam_state_over_parameters_in_another_order_is_refused(tmp_path):
    path = _trained_adam(tmp_path, [0, 1, 2, 3])  # [w1, b1, w2, b2]
    model = _net(1)
    opt = _adam_over(model, [2, 0, 1, 3])  # [w2, w1, b1, b2]
    text = _model_and_optimizer_refused(path, model, opt)
    assert text.startswith(f"{path}: does not fit the objects passed; nothing was restored. 3 problem(s):")
    for line in ("optimizer: group 0, parameter 0 is '2.weight' of shape [2, 8] but its saved state has "
                 "exp_avg [8, 4], exp_avg_sq [8, 4]",
                 "optimizer: group 0, parameter 1 is '0.weight' of shape [8, 4] but its saved state has "
                 "exp_avg [8], exp_avg_sq [8]",
                 "optimizer: group 0, parameter 2 is '0.bias' of shape [8] but its saved state has "
                 "exp_avg [2, 8], exp_avg_sq [2, 8]"):
        assert f"\n  - {line}" in text, text
    opt.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # the refused load left an optimizer that still works


@pytest.mark.parametrize("key, value, expected", [
    ("exp_avg", torch.zeros(1), "optimizer: group 0, parameter 0 is '0.weight' of shape [8, 4] but its saved "
                                "state has exp_avg [1]"),
    ("exp_avg", [1.0], "optimizer: group 0, parameter 0 ('0.weight'): saved state 'exp_avg' is a list, expected "
                       "a tensor"),
    ("step", torch.tensor([1.0, 2.0]), "optimizer: group 0, parameter 0 ('0.weight'): saved state 'step' has "
                                       "shape [2], expected a single number"),
    ("step", "1", "optimizer: group 0, parameter 0 ('0.weight'): saved state 'step' is a str, expected a number"),
])
def test_crafted_optimizer_state_is_refused(tmp_path, key, value, expected):
    path = _trained_adam(tmp_path, [0, 1, 2, 3])
    data = torch.load(path, weights_only=True)
    data["optimizer"]["state"][0][key] = value
    torch.save(data, path)
    model = _net(1)
    text = _model_and_optimizer_refused(path, model, _adam_over(model, [0, 1, 2, 3]))
    assert f"\n  - {expected}\n" in text + "\n", text


def test_crafted_group_settings_and_scheduler_state_are_refused(saved):
    data = torch.load(saved, weights_only=True)
    data["optimizer"]["param_groups"][1]["lr"] = "fast"
    data["optimizer"]["param_groups"][0]["params"] = [[0], 1]
    data["scheduler"]["base_lrs"] = 0.1
    data["scheduler"]["last_epoch"] = "x"
    torch.save(data, saved)
    text = _refused(saved, _objects(seed=1))
    for line in ("optimizer: group 1 setting 'lr' is a str in the checkpoint, a float in the optimizer",
                 "optimizer: group 0 lists parameter ids [[0], 1], expected integers",
                 "scheduler: 'base_lrs' is a float in the checkpoint, a list in the scheduler",
                 "scheduler: 'last_epoch' is a str in the checkpoint, an int in the scheduler"):
        assert f"\n  - {line}" in text, text


@pytest.mark.parametrize("field, value, expected", [
    ("env", "cpu", "has a corrupt 'env' field: a str, expected a dict"),
    ("step", "3", "has a corrupt 'step' field: a str, expected a non-negative integer"),
    ("step", -1, "has a corrupt 'step' field: -1, expected a non-negative integer"),
    ("classes", {"optimizer": 5}, "has a corrupt 'classes' field: the class of 'optimizer' is an int, expected "
                                  "a 'module:QualName' string"),
    ("classes", ["x"], "has a corrupt 'classes' field: a list, expected a dict"),
    ("rng", 7, "has a corrupt RNG state"),
])
def test_metadata_of_the_wrong_type_is_a_clear_error(saved, field, value, expected):
    data = torch.load(saved, weights_only=True)
    data[field] = value
    torch.save(data, saved)
    objs = _objects(seed=1)
    before = _snapshot(objs)
    with pytest.raises(CheckpointError, match=re.escape(f"{saved}: {expected}")):
        _load(saved, objs)
    assert _snapshot(objs) == before


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8)
    | st.builds(torch.zeros, st.integers(0, 3)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4) | st.integers(-2, 4), inner,
                                                                 max_size=3),
    max_leaves=6)
_PLACES = [("format",), ("version",), ("step",), ("model",), ("model", "0.weight"), ("optimizer",),
           ("optimizer", "state"), ("optimizer", "state", 0), ("optimizer", "state", 0, "momentum_buffer"),
           ("optimizer", "param_groups"), ("optimizer", "param_groups", 0),
           ("optimizer", "param_groups", 0, "params"), ("optimizer", "param_groups", 0, "lr"), ("scheduler",),
           ("scheduler", "last_epoch"), ("scheduler", "base_lrs"), ("data",), ("data", "epoch"), ("data", "seed"),
           ("classes",), ("classes", "optimizer"), ("rng",), ("env",), ("env", "torch")]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    objs = _objects(seed=0)
    path = tmp_path_factory.mktemp("fuzz") / "ckpt.pt"
    torchrepro.save_checkpoint(path, model=objs["model"], optimizer=objs["optimizer"],
                               scheduler=objs["scheduler"], loader=objs["loader"], step=3)
    return path


def _load_only_our_errors(path, data_or_bytes) -> None:
    if isinstance(data_or_bytes, bytes):
        path.write_bytes(data_or_bytes)
    else:
        torch.save(data_or_bytes, path)
    objs = _objects(seed=1)
    before = _snapshot(objs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a fuzzed `env` warns, a fuzzed pickle header too
            _load(path, objs)
    except CheckpointError:
        assert _snapshot(objs) == before, "a refused load changed something"
    random.seed(0), np.random.seed(0), torch.manual_seed(0)  # a load that passed restored the saved RNG


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(place=st.sampled_from(_PLACES), value=_VALUES)
def test_fuzz_wrong_field_types_give_only_checkpoint_errors(pristine, tmp_path, place, value):
    data = torch.load(pristine, weights_only=True)
    holder = data
    for key in place[:-1]:
        holder = holder[key]
    holder[place[-1]] = value
    _load_only_our_errors(tmp_path / "fuzzed.pt", data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_corrupt_and_truncated_bytes_give_only_checkpoint_errors(pristine, tmp_path, data):
    raw = bytearray(pristine.read_bytes())
    cut = data.draw(st.integers(0, len(raw)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), max_size=8))
    for at, byte in flips:
        raw[at] = byte
    _load_only_our_errors(tmp_path / "fuzzed.pt", bytes(raw[:cut] if data.draw(st.booleans()) else raw))
