"""The op tracer's fast paths record exactly what the slow ones would: small tensors hashed in place, the
previous op's outputs reused as inputs only while unchanged, uninitialized marks kept, the same JSON text."""

from __future__ import annotations

import json

import pytest
import torch

import torchrepro
from torchrepro._core import fingerprint as fp_mod
from torchrepro.record import optrace


def _only(trace: optrace.OpTracer, name: str) -> list[dict]:
    return [op for op in trace.ops if op["op"] == name]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int8, torch.int64,
                                   torch.bool, torch.complex64, torch.uint8])
@pytest.mark.parametrize("numel", [1, 16, 4096 // 8, 4097, 70_000])  # around and above the small-tensor limit
def test_recorded_fingerprints_are_the_fingerprints(dtype, numel):
    x = (torch.arange(numel) % 7).to(dtype)
    with torchrepro.trace_ops() as trace:
        y = x.mul(2) if dtype != torch.bool else x.logical_not()
        z = y.add(1) if dtype != torch.bool else y.logical_not()
    first, second = trace.ops[0], trace.ops[1]
    assert first["in"][0] == torchrepro.fingerprint(x)
    assert first["out"][0] == second["in"][0] == torchrepro.fingerprint(y)
    assert second["out"][0] == torchrepro.fingerprint(z)


def test_small_path_agrees_with_the_checked_path_or_declines():
    cases = {"plain": torch.randn(16), "offset view": torch.arange(10.0)[3:], "bool": torch.tensor([True, False]),
             "conj": torch.randn(3, dtype=torch.complex64).conj(), "transposed": torch.randn(3, 3).t(),
             "neg": torch.randn(3, dtype=torch.complex64).conj().imag, "empty": torch.zeros(0),
             "big": torch.randn(5000), "channels_last": torch.randn(1, 2, 3, 4).to(memory_format=torch.channels_last)}
    cases |= {"sparse": torch.eye(3).to_sparse(), "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
              "meta": torch.empty(4, device="meta")}
    taken = {name for name, t in cases.items() if fp_mod.small_cpu_fingerprint_at(t) is not None}
    assert taken == {"plain", "offset view", "bool"}
    for name in taken:
        t = cases[name]
        assert fp_mod.small_cpu_fingerprint_at(t) == (torchrepro.fingerprint(t), t.data_ptr()), name
    freed, shrunk = torch.randn(16), torch.randn(16)
    freed.untyped_storage().resize_(0)
    shrunk.untyped_storage().resize_(8)  # the address is valid, the end is not
    assert fp_mod.small_cpu_fingerprint_at(freed) is None and fp_mod.small_cpu_fingerprint_at(shrunk) is None


def test_an_output_changed_in_place_is_hashed_again():
    a = torch.ones(8)
    with torchrepro.trace_ops() as trace:
        x = a + 1
        x.add_(5)  # the previous op's output, written by the next op
        y = x * 2
        x.data.fill_(3)  # an op on another tensor object with the same memory
        z = x * 2
    mul_in = [op["in"][0] for op in _only(trace, "aten.mul")]
    assert mul_in == [torchrepro.fingerprint(torch.full((8,), 7.0)), torchrepro.fingerprint(torch.full((8,), 3.0))]
    assert torch.equal(y, torch.full((8,), 14.0)) and torch.equal(z, torch.full((8,), 6.0))


def test_inference_tensors_are_hashed_each_time():
    with torch.inference_mode(), torchrepro.trace_ops() as trace:
        x = torch.ones(4) + 1
        x.add_(1)
        x * 2
    assert _only(trace, "aten.mul")[0]["in"][0] == torchrepro.fingerprint(torch.full((4,), 3.0))


def test_an_output_given_other_memory_through_data_is_hashed_again():
    a, nines = torch.ones(4), torch.full((4,), 9.0)
    with torchrepro.trace_ops() as trace:
        x = a + 1
        x.data = nines  # not an op, and no version bump: only the data pointer tells
        x * 2
    assert _only(trace, "aten.mul")[0]["in"][0] == torchrepro.fingerprint(torch.full((4,), 9.0))


def test_small_uninitialized_tensors_keep_their_mark_until_written():
    with torchrepro.trace_ops() as trace:
        e = torch.empty(8)
        e + 1  # reads garbage: recorded as uninitialized, not as whatever bytes were there
        e.fill_(2)
        e + 1
    adds = _only(trace, "aten.add")
    assert adds[0]["in"][0] == optrace.UNINITIALIZED
    assert adds[1]["in"][0] == torchrepro.fingerprint(torch.full((8,), 2.0))


@pytest.mark.parametrize("entry", [
    {"i": 0, "step": None, "op": "aten.add", "phase": "forward", "module": "", "file": None, "line": None,
     "in": ["0" * 32], "out": ["'x\"y\\\\z'", "<tuple>"], "rng": False, "code": ""},
    {"i": 7, "step": 3, "op": "aten.uniform_", "phase": "backward", "module": "enc.ü", "file": "/tmp/a b.py",
     "line": 12, "in": [], "out": ["unfingerprintable: caf\u00e9 \u2603"], "rng": True, "generator": "global",
     "code": "x = '\\t'  # ☃"},
])
def test_records_are_encoded_as_json_dumps_writes_them(entry):
    assert optrace._encode(entry) == json.dumps(entry, separators=(",", ":"))


_HOSTILE = ["", "plain", 'q"uote', "back\\slash", "tab\there", "new\nline", "caf\u00e9", "\u2603", "\x1b[31m",
            "\u202e", '","in":[],"out":[],"', "\x7f", " "]


def test_ops_file_lines_are_the_json_of_the_records(tmp_path):
    """ops.jsonl is written from pre-encoded pieces; every line must be the JSON text of the record itself."""
    import random

    rnd = random.Random(0)
    tracer = optrace.OpTracer(path=tmp_path / "ops.jsonl", keep=True)
    tracer._file = open(tmp_path / "ops.jsonl", "w", encoding="utf-8")  # noqa: SIM115 - closed below
    src = tmp_path / 'we"ird\\ \u2603.py'
    src.write_text("x = 1\ny = '\\x1b'  # \u202e\n")
    sites = [None, (str(src), 1, ""), (str(src), 2, ""), (str(src), 99, "")]
    fps = ["0123456789abcdef" * 2, optrace.UNINITIALIZED, "'x\"y\\\\z'", "<tuple>", "0x1.0p+0",
           "unfingerprintable: caf\u00e9 \u2603", "unfingerprintable: a\nb", *_HOSTILE]
    for i in range(3000):
        tracer._queue.append((i, rnd.choice([None, 0, 7, 10**12]), rnd.choice(["aten.add", "aten.uniform_", *_HOSTILE]),
                              rnd.choice(["forward", "backward", *_HOSTILE]), rnd.choice(["", "enc.0", *_HOSTILE]),
                              rnd.choice(sites), rnd.sample(fps, rnd.randint(0, 3)), rnd.sample(fps, rnd.randint(0, 3)),
                              rnd.choice([None, "global", "private", *_HOSTILE])))
    tracer.flush()
    tracer._file.close()
    lines = (tmp_path / "ops.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(tracer.ops) == 3000
    for line, entry in zip(lines, tracer.ops):
        assert line == json.dumps(entry, separators=(",", ":"))
    assert tracer.ops[5]["code"] in ("", "x = 1", "y = '\\x1b'  # \u202e")
    assert {op["code"] for op in tracer.ops} == {"", "x = 1", "y = '\\x1b'  # \u202e"}
