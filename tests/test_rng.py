from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchrepro
from torchrepro import rng
from torchrepro.errors import DeviceMismatchError, MissingGeneratorError, StateFileError


def _draw_all(tg: torch.Generator, ng: np.random.Generator) -> tuple:
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist(),
            torch.rand(2, generator=tg).tolist(), float(ng.random()))


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=50), st.integers(0, 2**32 - 1))
def test_capture_restore_round_trip(n_draws, seed):
    tg = torch.Generator().manual_seed(seed)
    ng = np.random.default_rng(seed)
    torchrepro.seed_everything(seed, workers=False)
    state = torchrepro.RNGState.capture({"tg": tg, "ng": ng})
    expected = _draw_all(tg, ng)
    for _ in range(n_draws):
        _draw_all(tg, ng)
        random.gauss(0, 1)  # exercise gauss_next
    state.restore({"tg": tg, "ng": ng})
    assert _draw_all(tg, ng) == expected


def test_save_load_file_round_trip(tmp_path):
    tg = torch.Generator().manual_seed(1)
    ng = np.random.default_rng(2)
    path = tmp_path / "rng.json"
    torchrepro.register_generator("tg", tg)
    try:
        torchrepro.save_rng_state(path, torchrepro.RNGState.capture({"ng": ng}))
        expected = _draw_all(tg, ng)
        _draw_all(tg, ng)
        torchrepro.load_rng_state(path, {"ng": ng})
        assert _draw_all(tg, ng) == expected
    finally:
        torchrepro.unregister_generator("tg")
    doc = json.loads(path.read_text())
    assert doc["format"] == "torchrepro.rng-state" and doc["version"] == 1
    assert not list(tmp_path.glob(".*tmp"))  # no temp file left behind


def test_isolate_rng_even_on_exception():
    torch.manual_seed(0)
    before = torch.rand(2).tolist()
    torch.manual_seed(0)
    with pytest.raises(KeyError), torchrepro.isolate_rng():
        torch.rand(100)
        random.random()
        raise KeyError("x")
    assert torch.rand(2).tolist() == before


def _untouched():
    """Return a snapshot, used to prove that a failed load restored nothing."""
    return random.getstate(), torch.get_rng_state().clone(), np.random.get_state()[1].copy()


def _same(a, b):
    return a[0] == b[0] and torch.equal(a[1], b[1]) and (a[2] == b[2]).all()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "not valid JSON"),
        (b'{"format": "torchrepro.rng-state", "version": 1, "sha', "not valid JSON"),
        (b'{"format": "other"}', "has format 'other', expected 'torchrepro.rng-state'"),
        (b"[1, 2]", "has format 'list'"),
        (b'{"format": "torchrepro.rng-state", "version": 99}', "format version 99"),
        (b"\x80\x02}q\x00.", "not valid JSON"),
    ],
)
def test_bad_files_name_file_and_problem_and_restore_nothing(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    snap = _untouched()
    with pytest.raises(StateFileError) as info:
        torchrepro.load_rng_state(path)
    assert str(path) in str(info.value) and message in str(info.value)
    assert _same(snap, _untouched())


def test_tampered_and_truncated_files(tmp_path):
    path = tmp_path / "s.json"
    torchrepro.save_rng_state(path)
    doc = json.loads(path.read_text())
    doc["state"]["python"][1][5] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(StateFileError, match="does not match its checksum"):
        torchrepro.load_rng_state(path)
    torchrepro.save_rng_state(path)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(StateFileError, match="truncated"):
        torchrepro.load_rng_state(path)
    with pytest.raises(StateFileError, match="does not exist"):
        torchrepro.load_rng_state(tmp_path / "missing.json")


def _write_doc(path, payload):
    doc = {"format": rng.FORMAT, "version": rng.VERSION, "sha256": rng._digest(payload), "state": payload}
    path.write_text(json.dumps(doc))


def test_more_cuda_devices_than_present(tmp_path):
    payload = torchrepro.RNGState.capture().to_dict()
    payload["cuda"] = [payload["torch_cpu"][:24]] * 3
    path = tmp_path / "cuda.json"
    _write_doc(path, payload)
    snap = _untouched()
    with pytest.raises(DeviceMismatchError, match="captured with 3 CUDA device"):
        torchrepro.load_rng_state(path)
    assert _same(snap, _untouched())


def test_valid_checksum_but_wrong_content(tmp_path):
    payload = torchrepro.RNGState.capture().to_dict()
    payload["python"][1] = payload["python"][1][:10]
    path = tmp_path / "short.json"
    _write_doc(path, payload)
    with pytest.raises(StateFileError, match="not a valid RNG state .*625"):
        torchrepro.load_rng_state(path)


def test_missing_generator_restores_nothing(tmp_path):
    path = tmp_path / "g.json"
    torchrepro.save_rng_state(path, torchrepro.RNGState.capture({"aug": torch.Generator()}))
    snap = _untouched()
    random.random()
    moved = _untouched()
    with pytest.raises(MissingGeneratorError, match="generator 'aug'.*register_generator"):
        torchrepro.load_rng_state(path)
    assert _same(moved, _untouched()) and not _same(snap, moved)


def test_wrong_generator_kind(tmp_path):
    path = tmp_path / "g.json"
    torchrepro.save_rng_state(path, torchrepro.RNGState.capture({"aug": torch.Generator()}))
    with pytest.raises(StateFileError, match="saved as a torch generator but a numpy generator"):
        torchrepro.load_rng_state(path, {"aug": np.random.default_rng()})
    with pytest.raises(TypeError, match="must be a torch.Generator or numpy.random.Generator"):
        torchrepro.register_generator("x", random.Random())
