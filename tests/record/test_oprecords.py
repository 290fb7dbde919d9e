"""Op records (ops.jsonl) are untrusted input: a run directory may come from anywhere.

Readers never open the source files a record names, and every record of the wrong shape is refused with a
RunDirError naming the file and line (exit 2 from the CLI), never another exception.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import torchrepro
from torchrepro._core.errors import ReproError, RunDirError
from torchrepro.record.optrace import read_ops


def _rec(i: int, **over) -> dict:
    return {"i": i, "step": 1, "op": "aten.add", "phase": "forward", "module": "", "file": None, "line": None,
            "in": ["a"], "out": ["b"], "rng": False, **over}


def _write(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _recorded_run(run_dir: Path, ops: list[dict], x: float = 1.0) -> Path:
    """A one-step recorded run whose op trace is replaced by OPS; runs with different X diverge at step 1
    (``diff --locate`` of identical runs has nothing to locate and reads no trace)."""
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchrepro.watch(model, opt, run_dir=run_dir, keep_values=False):
        model(torch.full((1, 2), x)).sum().backward()
        opt.step()
    _write(run_dir / "ops.jsonl", ops)
    return run_dir


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_diff_locate_never_reads_the_files_op_records_name(tmp_path):
    """A crafted ops.jsonl naming a FIFO hung `diff --locate`; /dev/zero ate memory; another file's line was
    copied into the output files."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-TEXT-1\nSECRET-TEXT-2\n")
    crafted = [_rec(0, file=str(fifo), line=1), _rec(1, file="/dev/zero", line=1),
               _rec(2, file=str(secret), line=2, op="aten.index_put_", out=["x"])]
    other = [*crafted[:2], {**crafted[2], "out": ["y"]}]
    a, b = _recorded_run(tmp_path / "a", crafted), _recorded_run(tmp_path / "b", other, x=2.0)
    p = subprocess.run([sys.executable, "-m", "torchrepro", "diff", "--locate", "--json", "--out",
                        str(tmp_path / "out"), str(a), str(b)], capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), p.stderr
    loc = json.loads(p.stdout)["locate"]
    assert loc["verdict"] == "origin" and loc["op"]["op"] == "aten.index_put_"
    assert loc["op"]["file"] == str(secret) and loc["op"]["code"] == ""
    written = "".join(f.read_text() for f in (tmp_path / "out").rglob("*") if f.is_file() and f.suffix != ".png")
    assert "SECRET-TEXT" not in written + p.stdout + p.stderr
    assert all(row["code"] == "" for row in loc["context"])


def test_the_tracer_stores_the_line_text_and_reads_only_regular_files(tmp_path):
    path = tmp_path / "ops.jsonl"
    with torchrepro.trace_ops(path=path):
        torch.ones(2).add(1)  # THE-TRACED-LINE
    stored = [json.loads(line) for line in path.read_text().splitlines()]
    assert stored and all(r["code"] == "torch.ones(2).add(1)  # THE-TRACED-LINE" for r in stored)
    from torchrepro.record.optrace import _code_line

    assert _code_line("/dev/zero", 1, {}) == "" and _code_line(str(tmp_path), 1, {}) == ""


# --- records of the wrong shape --------------------------------------------------------------------------------
BAD_RECORDS = {
    "line is a string": (_rec(1, line="x"), "`line` is 'x' (str), expected a non-negative integer or null"),
    "no out": ({k: v for k, v in _rec(1).items() if k != "out"}, "`out` is missing"),
    "in is a number": (_rec(1, **{"in": 5}), "`in` is 5 (int), expected a list of strings"),
    "op is a number": (_rec(1, op=5), "`op` is 5 (int), expected a string"),
    "step is a string": (_rec(1, step="1"), "`step` is '1' (str), expected a non-negative integer or null"),
    "rng is a string": (_rec(1, rng="yes"), "`rng` is 'yes' (str), expected true or false"),
    "line is true": (_rec(1, line=True), "`line` is True (bool), expected a non-negative integer or null"),
    "out holds numbers": (_rec(1, out=[1]), "`out` is [1] (list), expected a list of strings"),
    "deep": ("[" * 3000 + "]" * 3000, "is JSON nested too deeply to read; torchrepro writes at most 64 levels"),
    "5000 digits": ('{"i": ' + "9" * 5000 + "}", "holds a value that cannot be read (Exceeds the limit (4300 digits)"),
    "a list": ("[1, 2]", "it is a list, expected a JSON object"),
}


@pytest.mark.parametrize("name", list(BAD_RECORDS))
def test_a_record_of_the_wrong_shape_is_refused_naming_file_and_line(tmp_path, name):
    bad, reason = BAD_RECORDS[name]
    path = _write(tmp_path / "ops.jsonl", [_rec(0), bad, _rec(2)])
    with pytest.raises(RunDirError) as exc:
        list(read_ops(path))
    msg = str(exc.value)
    prefix = "line 2 " if name in ("deep", "5000 digits") else "line 2 is not a valid op record: "
    assert msg.startswith(f"{path}: {prefix}{reason}"), msg
    assert msg.endswith("Trace the run again (`torchrepro check --locate -- ...`).")


def test_an_ops_file_that_is_a_directory_or_a_fifo_is_refused(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(RunDirError, match=r"dir: is a directory, expected a regular file"):
        list(read_ops(tmp_path / "dir"))
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(RunDirError, match=r"fifo: is a FIFO \(named pipe\), expected a regular file"):
            list(read_ops(tmp_path / "fifo"))  # never blocks waiting for a writer


@pytest.mark.parametrize("bad", ['{"line": "x", "op": "aten.add", "in": [], "out": []}', "[" * 3000])
def test_diff_locate_on_bad_records_exits_2(tmp_path, bad):
    a = _recorded_run(tmp_path / "a", [_rec(0)])
    b = _recorded_run(tmp_path / "b", [_rec(0), bad, _rec(2)], x=2.0)
    p = subprocess.run([sys.executable, "-m", "torchrepro", "diff", "--locate", "--out", str(tmp_path / "out"),
                        str(a), str(b)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"{b / 'ops.jsonl'}: line 2 " in p.stderr and "Trace the run again" in p.stderr
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr


# --- fuzz: a clean parse or RunDirError, never anything else ------------------------------------------------------
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                max_size=4), max_leaves=12)
_field_values = {"i": st.integers(), "step": st.none() | st.integers() | st.text(max_size=3),
                 "op": st.text(max_size=12) | st.integers(), "phase": st.none() | st.text(max_size=8) | _json,
                 "module": _json, "file": _json, "line": _json, "in": _json | st.lists(st.text(max_size=4)),
                 "out": _json | st.lists(st.text(max_size=4)), "rng": _json, "generator": _json, "code": _json}
_records = st.fixed_dictionaries({}, optional=_field_values) | _json


def _as_line(value) -> str:
    return json.dumps(value)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_records | st.text(max_size=20).map(lambda s: s.replace("\n", "")), min_size=1,
                        max_size=5))
def test_fuzz_read_ops_parses_or_refuses_cleanly(tmp_path, records):
    path = tmp_path / "fuzz.jsonl"
    path.write_text("".join((r if isinstance(r, str) else _as_line(r)) + "\n" for r in records))
    try:
        ops = list(read_ops(path))
    except ReproError:
        return
    from torchrepro.analysis.locate import locate_ops

    locate_ops(ops, ops)  # what was accepted can be compared
    locate_ops(ops, ops[:1])


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_trace_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    from torchrepro.record.store import load_run

    run_dir = _recorded_run(tmp_path / "r", [_rec(0)])
    (run_dir / "trace.jsonl").unlink()
    if kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("needs FIFOs")
        os.mkfifo(run_dir / "trace.jsonl")
    else:
        (run_dir / "trace.jsonl").mkdir()
    expected = r"trace.jsonl: is (a directory|a FIFO \(named pipe\)), expected a regular file"
    with pytest.raises(RunDirError, match=expected):
        load_run(run_dir)
