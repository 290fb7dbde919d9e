from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchrepro
from torchrepro._core.errors import DeviceMismatchError, MissingGeneratorError, StateFileError
from torchrepro.control import rng


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
    payload = torchrepro.RNGState.capture().to_json()
    payload["cuda"] = [payload["torch_cpu"][:24]] * 3
    path = tmp_path / "cuda.json"
    _write_doc(path, payload)
    snap = _untouched()
    with pytest.raises(DeviceMismatchError, match="captured with 3 CUDA device"):
        torchrepro.load_rng_state(path)
    assert _same(snap, _untouched())


def test_valid_checksum_but_wrong_content(tmp_path):
    payload = torchrepro.RNGState.capture().to_json()
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


# --- a bad payload is refused whole: one error class, the path and the field named, nothing restored ---------
def _full_snapshot(gens: dict) -> tuple:
    name, key, pos, has_gauss, cached = np.random.get_state()
    states = {n: (g.get_state().tolist() if isinstance(g, torch.Generator) else g.bit_generator.state)
              for n, g in gens.items()}
    return (random.getstate(), (name, key.tolist(), pos, has_gauss, cached), torch.get_rng_state().tolist(),
            json.dumps(states, sort_keys=True, default=str))


def _set(obj, key, value):
    obj[key] = value


BAD_PAYLOADS = {
    "numpy name missing": (lambda p: p["numpy"].pop("name"), "field 'numpy' lacks name"),
    "numpy bit generator": (lambda p: _set(p["numpy"], "name", "PCG64"),
                            "field 'numpy.name' is 'PCG64', expected 'MT19937' (the bit generator of NumPy's "
                            "global RNG)"),
    "numpy key overflow": (lambda p: _set(p["numpy"]["key"], 3, 2**32),
                           "field 'numpy.key' word 3 is 4294967296, expected an integer in [0, 2**32)"),
    "numpy key short": (lambda p: _set(p["numpy"], "key", p["numpy"]["key"][:5]),
                        "field 'numpy.key' has 5 words, expected 624"),
    "numpy pos": (lambda p: _set(p["numpy"], "pos", 700), "field 'numpy.pos' is 700, expected an integer in [0, 624]"),
    "numpy has_gauss": (lambda p: _set(p["numpy"], "has_gauss", 2), "field 'numpy.has_gauss' is 2, expected 0 or 1"),
    "generators empty list": (lambda p: _set(p, "generators", []),
                              "field 'generators' is a list, expected an object mapping generator names to states"),
    "generator kind": (lambda p: _set(p, "generators", {"g": {"kind": "jax", "state": ""}}),
                       "field 'generators.g.kind' is 'jax', expected 'torch' or 'numpy'"),
    "python gauss_next junk": (lambda p: _set(p["python"], 2, "junk"),
                               "field 'python' gauss_next is 'junk', expected null or a number"),
    "python word negative": (lambda p: _set(p["python"][1], 7, -1),
                             "field 'python' word 7 is -1, expected an integer in [0, 2**32)"),
    "python position": (lambda p: _set(p["python"][1], 624, 625),
                        "field 'python position' is 625, expected an integer in [0, 624]"),
    "torch_cpu empty": (lambda p: _set(p, "torch_cpu", ""), "field 'torch_cpu' is empty, expected a generator state"),
    "torch_cpu short": (lambda p: _set(p, "torch_cpu", p["torch_cpu"][:12]),
                        f"field 'torch_cpu' has 9 bytes, expected {torch.get_rng_state().numel()} bytes"),
    "cuda not a list": (lambda p: _set(p, "cuda", "AAAA"), "field 'cuda' is a str, expected a list"),
    "missing field": (lambda p: p.pop("torch_cpu"), "field(s) torch_cpu missing"),
    # checked against the generator passed at restore time
    "torch generator size": (lambda p: _set(p, "generators", {"tg": {"kind": "torch", "state": p["torch_cpu"][:12]}}),
                             f"field 'generators.tg.state' has 9 bytes, expected {torch.get_rng_state().numel()} "
                             "bytes; the generator given is on cpu"),
}


@pytest.mark.parametrize("case", list(BAD_PAYLOADS))
def test_bad_payload_is_refused_whole_naming_path_and_field(tmp_path, case):
    mutate, field = BAD_PAYLOADS[case]
    gens = {"tg": torch.Generator().manual_seed(3)}
    payload = torchrepro.RNGState.capture().to_json()
    mutate(payload)
    path = tmp_path / "bad.json"
    _write_doc(path, payload)
    random.random(), np.random.rand(), torch.rand(1), torch.rand(1, generator=gens["tg"])  # move away from it
    before = _full_snapshot(gens)
    with pytest.raises(StateFileError) as info:
        torchrepro.load_rng_state(path, gens)
    assert type(info.value) is StateFileError
    assert str(info.value) == f"{path}: is not a valid RNG state ({field}). {rng._RECREATE}"
    assert _full_snapshot(gens) == before


def test_numpy_generator_state_of_another_bit_generator_restores_nothing(tmp_path):
    path = tmp_path / "ng.json"
    torchrepro.save_rng_state(path, torchrepro.RNGState.capture({"ng": np.random.default_rng(1)}))
    random.random(), np.random.rand(), torch.rand(1)
    gens = {"ng": np.random.Generator(np.random.MT19937(2))}
    before = _full_snapshot(gens)
    with pytest.raises(StateFileError) as info:
        torchrepro.load_rng_state(path, gens)
    assert type(info.value) is StateFileError
    assert str(info.value).startswith(f"{path}: is not a valid RNG state (field 'generators.ng.state' does not fit "
                                      "the MT19937 bit generator given: ValueError: ")
    assert _full_snapshot(gens) == before


def test_directory_path_is_refused(tmp_path):
    before = _full_snapshot({})
    with pytest.raises(StateFileError) as info:
        torchrepro.load_rng_state(tmp_path)
    assert str(info.value) == (f"{tmp_path}: is a directory, not an RNG state file. Pass the path of a file written "
                               "by save_rng_state().")
    assert _full_snapshot({}) == before


def test_restore_of_a_hand_built_state_checks_before_setting_anything():
    state = torchrepro.RNGState.capture()
    state.numpy = {**state.numpy, "key": state.numpy["key"][:-1] + [2**32]}
    random.random()
    before = _full_snapshot({})
    with pytest.raises(StateFileError, match=r"RNGState: is not a valid RNG state \(field 'numpy.key' word 623"):
        state.restore()
    assert _full_snapshot({}) == before


# --- CUDA: captured even before its first use ---------------------------------------------------------------
def test_capture_includes_cuda_before_its_first_use(monkeypatch):
    """With CUDA available but not yet initialised, capture() still takes (and restore() puts back) its states."""
    fake = [torch.full((16,), 7, dtype=torch.uint8), torch.full((16,), 9, dtype=torch.uint8)]
    put = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [t.clone() for t in fake])
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=0: fake[device].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=0: put.append((device, state.tolist())))
    with torchrepro.isolate_rng() as state:
        assert [s.tolist() for s in state.cuda] == [t.tolist() for t in fake]
    assert put == [(0, fake[0].tolist()), (1, fake[1].tolist())]
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)  # a fork of a process that used CUDA
    assert torchrepro.RNGState.capture().cuda == []


CUDA_ISOLATE = r"""
import torch, torchrepro
assert not torch.cuda.is_initialized()
torch.manual_seed(0)
with torchrepro.isolate_rng():
    inside = torch.rand(4, device="cuda")  # the first CUDA use of this process
after = torch.rand(4, device="cuda")
torch.manual_seed(0)
fresh = torch.rand(4, device="cuda")
assert torch.equal(inside, fresh) and torch.equal(after, fresh), (inside, after, fresh)
print("ok")
"""

CUDA_SAVE = r"""
import json, sys, torch, torchrepro
torch.manual_seed(1)
assert not torch.cuda.is_initialized()
state = torchrepro.save_rng_state(sys.argv[1])  # before the first CUDA use
assert len(state.cuda) == torch.cuda.device_count() >= 1
a = [torch.rand(4, device=f"cuda:{i}").tolist() for i in range(torch.cuda.device_count())]
torchrepro.load_rng_state(sys.argv[1])
b = [torch.rand(4, device=f"cuda:{i}").tolist() for i in range(torch.cuda.device_count())]
assert a == b, (a, b)
print(json.dumps(a))
"""

CUDA_LOAD = r"""
import json, sys, torch, torchrepro
torch.manual_seed(5)
[torch.rand(3, device=f"cuda:{i}") for i in range(torch.cuda.device_count())]  # somewhere else in the stream
torchrepro.load_rng_state(sys.argv[1])
print(json.dumps([torch.rand(4, device=f"cuda:{i}").tolist() for i in range(torch.cuda.device_count())]))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rng_round_trip_around_first_use(tmp_path):
    from ..conftest import run_python

    proc = run_python(CUDA_ISOLATE)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    path = str(tmp_path / "cuda_rng.json")
    saved = run_python(CUDA_SAVE, path)
    assert saved.returncode == 0, saved.stderr
    loaded = run_python(CUDA_LOAD, path)
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout) == json.loads(saved.stdout)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[" * 100_000 + b"]" * 100_000, "its JSON cannot be read: it is nested too deeply"),
        (b'{"format": ' + b"9" * 5000 + b"}", "its JSON cannot be read: Exceeds the limit (4300 digits)"),
    ],
)
def test_unreadable_json_is_a_state_file_error(tmp_path, content, message):
    """An RNG state file is untrusted input: deep nesting or a huge integer was a RecursionError/ValueError."""
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    snap = _untouched()
    with pytest.raises(StateFileError) as info:
        torchrepro.load_rng_state(path)
    assert str(path) in str(info.value) and message in str(info.value)
    assert _same(snap, _untouched())


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_or_device_is_refused_not_waited_on(tmp_path):
    """Reading a FIFO blocked until a writer came, /dev/zero never ended: both are refused before they are opened.
    In a child process, so that a regression fails by its timeout instead of hanging the suite."""
    os.mkfifo(tmp_path / "pipe.json")
    code = ("import sys, torchrepro\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n"
            "        torchrepro.load_rng_state(p)\n"
            "    except torchrepro.StateFileError as e:\n"
            "        print(e)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(torchrepro.__file__).parents[1])}
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "pipe.json"), "/dev/zero"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    action = "Check the path, or create it with save_rng_state()."
    assert p.stdout.splitlines() == [f"{tmp_path}/pipe.json: is a FIFO (named pipe), expected a regular file. {action}",
                                     f"/dev/zero: is a character device, expected a regular file. {action}"]
