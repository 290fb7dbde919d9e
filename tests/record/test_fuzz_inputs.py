"""Files torchrepro did not just write are untrusted input: run directories, env files, lock files, child summaries.

Every way such a file can be wrong (JSON nested 3,000 deep, a 5,000-digit integer, a directory or FIFO in its
place, non-UTF-8 bytes, a cut-off file, a field of the wrong type) must end in exit 2 with a message naming the
file, never exit 3 ("internal error") or a traceback. The cases first, then hypothesis fuzzing of each reader.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import torchrepro
from torchrepro._core import readjson as _readjson
from torchrepro._core.errors import OutputDirError, RunDirError, StateFileError
from torchrepro.analysis import report
from torchrepro.cli import main
from torchrepro.env.info import environment
from torchrepro.record import launcher
from torchrepro.record.outdir import LOCK, lock_dir
from torchrepro.record.store import load_run

DEEP = "[" * 3000 + "]" * 3000
HUGE = "1" * 5000
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _train(run_dir: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    with torchrepro.watch(model, opt, run_dir=run_dir):
        for _ in range(2):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two identical recorded runs, ``a`` and ``b``, and an environment file ``env.json``."""
    root = tmp_path_factory.mktemp("fuzz")
    _train(root / "a")
    _train(root / "b")
    (root / "env.json").write_text(json.dumps(environment().to_json()))
    return root


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    """The plot is not what is tested here, and it is the slowest part of `diff`."""
    monkeypatch.setattr(report, "plot_check", lambda *args, **kwargs: None)


def cli(*args: str) -> tuple[int, str]:
    """``torchrepro ARGS`` in this process: (exit code, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(args))
    return code, err.getvalue()


def assert_input_error(code: int, err: str, *expected: str) -> None:
    """Exit 2 with torchrepro's one-line error (no traceback) holding each of ``expected``."""
    assert code == 2 and err.startswith("torchrepro: error: "), (code, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    for text in expected:
        assert text in err, (text, err)


def _copy(runs: Path, where: Path) -> Path:
    shutil.copytree(runs / "b", where / "b")
    return where / "b"


def _manifest_text(run: Path, key: str, raw: str) -> None:
    """Set manifest field ``key`` to the JSON text ``raw`` (which json.dumps may not be able to write)."""
    doc = json.loads((run / "manifest.json").read_text())
    doc[key] = "@@HOLE@@"
    (run / "manifest.json").write_text(json.dumps(doc).replace('"@@HOLE@@"', raw))


def _event_text(run: Path, index: int, key: str, raw: str) -> None:
    lines = (run / "trace.jsonl").read_text().splitlines()
    event = json.loads(lines[index])
    event[key] = "@@HOLE@@"
    lines[index] = json.dumps(event).replace('"@@HOLE@@"', raw)
    (run / "trace.jsonl").write_text("\n".join(lines) + "\n")


def _diff(runs: Path, b: Path, out: Path) -> tuple[int, str]:
    return cli("diff", str(runs / "a"), str(b), "--out", str(out))


# --- run directories: the cases of issue 21 -----------------------------------------------------------
MANIFEST_CASES = {
    "deep": ("seed", DEEP, "manifest.json: is JSON nested too deeply to read"),
    "deep-under-the-limit": ("seed", "[" * 500 + "]" * 500, "manifest.json: is JSON nested more than 64 levels"),
    "huge-int": ("seed", HUGE, "manifest.json: holds a value that cannot be read (Exceeds the limit"),
    "ranks-int": ("ranks", "5", "'ranks' is the number 5, expected a list of strings"),
    "ranks-dict": ("ranks", '{"rank0": 1}', "'ranks' is an object with 1 key, expected a list of strings"),
    "ranks-escape": ("ranks", '["../../etc"]', "'ranks' names the string '../../etc', expected rank0, rank1"),
    "command": ("command", '"python x.py"', "'command' is the string 'python x.py', expected a list of strings"),
    "trace-records": ("trace_records", '"5"', "'trace_records' is the string '5', expected an int"),
    "version-bool": ("version", "true", "has format version true; this torchrepro reads version 1"),
    "format-list": ("format", "[1]", "has format a list of 1 item, expected 'torchrepro.run'"),
    "values-failed": ("values_failed", "5", "'values_failed' is the number 5, expected a list"),
    "compiled-int": ("compiled", "[5]", "'compiled' is a list of 1 item, expected a list of objects"),
    "compiled-fields": ("compiled", '[{"index": "0", "target": "Net"}]', "'compiled[0].index' is the string '0'"),
    "step-mode": ("step_mode", '"sideways"', "'step_mode' is the string 'sideways', expected one of optimizer"),
    "environment": ("environment", "[]", "'environment' is a list of 0 items, expected an object"),
    "fingerprint": ("fingerprint_algorithm", "{}", "'fingerprint_algorithm' is an object with 0 keys"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_a_bad_manifest_field_is_exit_2_naming_it(runs, tmp_path, case):
    key, raw, message = MANIFEST_CASES[case]
    b = _copy(runs, tmp_path)
    _manifest_text(b, key, raw)
    assert_input_error(*_diff(runs, b, tmp_path / "out"), f"{b}/manifest.json: ", message)


EVENT_CASES = {
    "params-list": (1, "params", "[1, 2]", "line 2 is not a valid event: 'params' is a list of 2 items, expected "
                                           "an object of strings or nulls"),
    "kind-int": (0, "kind", "5", "line 1 is not a valid event: 'kind' is the number 5, expected a string"),
    "losses-int": (2, "losses", "5", "'losses' is the number 5, expected a list of objects"),
    "loss-value": (2, "losses", '[{"value": "zz"}]', "'loss.value' is the string 'zz', expected a hex float string"),
    "batches": (2, "batches", '"abc"', "'batches' is the string 'abc', expected a list"),
    "deep": (3, "grads", DEEP, "trace.jsonl: line 4 is JSON nested too deeply to read"),
    "huge-int": (3, "n", HUGE, "trace.jsonl: line 4 holds a value that cannot be read"),
    "t-huge": (3, "t", "1" * 400, "'t' is the number 11111111111111111111... (400 digits), expected a number"),
    "step-type": (0, "step", '"3"', "'step' is the string '3', expected an int"),
}


@pytest.mark.parametrize("case", sorted(EVENT_CASES))
def test_a_bad_event_is_exit_2_naming_its_line(runs, tmp_path, case):
    index, key, raw, message = EVENT_CASES[case]
    b = _copy(runs, tmp_path)
    _event_text(b, index, key, raw)
    assert_input_error(*_diff(runs, b, tmp_path / "out"), f"{b}/trace.jsonl: " if "line" in message else str(b),
                       message)


def test_a_backward_event_without_its_loss_is_named(runs, tmp_path):
    b = _copy(runs, tmp_path)
    lines = (b / "trace.jsonl").read_text().splitlines()
    event = json.loads(lines[1])
    del event["loss"]
    lines[1] = json.dumps(event)
    (b / "trace.jsonl").write_text("\n".join(lines) + "\n")
    assert_input_error(*_diff(runs, b, tmp_path / "out"), "line 2 is not a valid event: a 'backward' event needs "
                       "'loss'")


@pytest.mark.parametrize("name", ["manifest.json", "trace.jsonl"])
def test_a_directory_in_place_of_a_run_file(runs, tmp_path, name):
    b = _copy(runs, tmp_path)
    (b / name).unlink()
    (b / name).mkdir()
    assert_input_error(*_diff(runs, b, tmp_path / "out"), f"{b / name}: is a directory, expected a regular file.")


def test_non_utf8_and_cut_off_files(runs, tmp_path):
    b = _copy(runs, tmp_path)
    lines = (b / "trace.jsonl").read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"step"', b'"st\xffep"')
    (b / "trace.jsonl").write_bytes(b"\n".join(lines))
    assert_input_error(*_diff(runs, b, tmp_path / "o1"), f"{b}/trace.jsonl: line 3 is not UTF-8 text (byte 12 is "
                       "b'\\xff')")
    manifest = (runs / "b" / "manifest.json").read_bytes()
    (b / "manifest.json").write_bytes(manifest[:len(manifest) // 2])
    assert_input_error(*_diff(runs, b, tmp_path / "o2"), f"{b}/manifest.json: is not valid JSON (")


def test_a_fifo_in_place_of_a_run_file_or_env_file_is_refused_not_waited_on(runs, tmp_path):
    """Opening a FIFO for reading blocks until a writer comes: the reader must look before it opens. In a child
    process, so that a regression fails by its timeout instead of hanging the suite."""
    b = _copy(runs, tmp_path)
    (b / "manifest.json").unlink()
    os.mkfifo(b / "manifest.json")
    os.mkfifo(tmp_path / "pipe.json")
    c = _copy(runs, tmp_path / "c")
    (c / "values" / "init.pt").unlink()
    os.mkfifo(c / "values" / "init.pt")
    (c.parent / "out").mkdir()
    for command, message in ((["env", "diff", str(runs / "a"), "b"], "b/manifest.json: is a FIFO (named pipe), "
                                                                     "expected a regular file."),
                             (["env", "diff", str(runs / "a"), "pipe.json"], "pipe.json: is a FIFO (named pipe), "
                              "expected a regular file. Pass an environment file"),
                             (["diff", str(runs / "a"), str(c), "--out", str(c.parent / "out")],
                              "values/init.pt: is a FIFO (named pipe), expected a regular file.")):
        code = f"from torchrepro.cli import main; raise SystemExit(main({command!r}))"
        p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(Path(torchrepro.__file__).parent.parent)})
        assert p.returncode == 2 and p.stderr.startswith("torchrepro: error: "), p.stderr
        assert message in p.stderr, p.stderr


def test_reader_refuses_devices_and_oversized_files(tmp_path):
    with pytest.raises(StateFileError, match=r"/dev/zero: is a character device, expected a regular file\."):
        _readjson.read_json("/dev/zero")
    big = tmp_path / "big.json"
    big.write_text(json.dumps(list(range(1000))))
    with pytest.raises(RunDirError, match=r"big.json: is larger than 100 bytes"):
        _readjson.read_json(big, error=RunDirError, limit=100)
    with pytest.raises(StateFileError, match="nope.json: does not exist"):
        _readjson.read_json(tmp_path / "nope.json")


# --- env files ------------------------------------------------------------------------------------------
ENV_CASES = {
    "deep": (DEEP, "is JSON nested too deeply to read"),
    "huge-int": ('{"schema": ' + HUGE + "}", "holds a value that cannot be read (Exceeds the limit"),
    "deep-section": ('{"schema": "torchrepro.env/1", "env": ' + "[" * 200 + "]" * 200 + "}",
                     "is JSON nested more than 64 levels deep"),
}


@pytest.mark.parametrize("case", sorted(ENV_CASES))
def test_a_bad_env_file_is_exit_2(runs, tmp_path, case):
    text, message = ENV_CASES[case]
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert_input_error(*cli("env", "diff", str(runs / "env.json"), str(bad)), f"{bad}: {message}")


def test_an_env_file_that_is_a_device(runs):
    assert_input_error(*cli("env", "diff", "/dev/null", str(runs / "env.json")),
                       "/dev/null: is a character device, expected a regular file.")


# --- lock files and child summaries -----------------------------------------------------------------------
def test_a_corrupt_lock_file_of_a_held_lock_names_no_holder(tmp_path):
    import fcntl

    (tmp_path / LOCK).write_text(DEEP)
    with open(tmp_path / LOCK) as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another command holds it, and its lock file is garbage
        with pytest.raises(OutputDirError, match=r"is in use by another torchrepro command \(holder unknown\)"), \
                lock_dir(tmp_path):
            pass


def test_a_lock_file_that_is_a_symlink_is_never_written_through(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's data")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).symlink_to(precious)
    with pytest.raises(OutputDirError, match=r".torchrepro.lock is a symbolic link, not a lock file"), \
            lock_dir(out):
        pass
    assert precious.read_text() == "the user's data" and (out / LOCK).is_symlink()
    (out / LOCK).unlink()
    os.mkfifo(out / LOCK)
    with pytest.raises(OutputDirError, match=r".torchrepro.lock is not a regular file, not a lock file"), \
            lock_dir(out):
        pass


GARBLED = {"deep": DEEP, "huge-int": HUGE, "list": '["a list"]', "cut": '{"child_exit_c',
           "code-type": '{"child_exit_code": "0", "child_ended": 1}',
           "end-too-large": '{"child_exit_code": 0, "child_ended": ' + "1" * 400 + "}"}


@pytest.mark.parametrize("case", sorted(GARBLED))
def test_a_cut_off_or_garbled_child_summary_counts_as_missing(tmp_path, case):
    """The launcher's reads of its child's summary: a child killed while writing it must not crash the parent."""
    (tmp_path / "child.json").write_text(GARBLED[case])
    assert launcher._rank_exit(tmp_path, {0: 7}, 0) == (7, None)  # torchrun's report is used instead
    assert isinstance(launcher.read_summary(tmp_path / "child.json"), dict)
    if not GARBLED[case].startswith('{"child_exit_code"'):
        assert launcher.read_summary(tmp_path / "child.json") == {}


# --- fuzzing --------------------------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)
raw_texts = json_values.map(json.dumps) | st.sampled_from(
    [DEEP, HUGE, "1" * 400, "NaN", "-Infinity", "1e999", '"0x1p+5000"', '{"a": [' * 40 + "0" + "]}" * 40])
MANIFEST_KEYS = ["format", "version", "command", "trace_records", "step_mode", "steps", "fingerprint_algorithm",
                 "device", "environment", "ranks", "unreplicated", "values_error", "values_failed", "compiled",
                 "seed", "deterministic", "pythonhashseed", "exit_code", "status", "other"]
EVENT_KEYS = ["kind", "t", "n", "opt", "params", "grads", "state", "batches", "losses", "loss", "lr", "step",
              "name", "value", "other"]


def _never_internal(code: int, err: str) -> None:
    assert code in (0, 1, 2), (code, err[-3000:])
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    if code == 2:
        assert err.startswith("torchrepro: error: "), err


@FUZZ
@given(key=st.sampled_from(MANIFEST_KEYS), raw=raw_texts)
def test_fuzz_manifest_fields(runs, key, raw):
    with tempfile.TemporaryDirectory() as tmp:
        b = _copy(runs, Path(tmp))
        _manifest_text(b, key, raw)
        _never_internal(*_diff(runs, b, Path(tmp) / "out"))


@FUZZ
@given(index=st.integers(0, 4), key=st.sampled_from(EVENT_KEYS), raw=raw_texts)
def test_fuzz_event_fields(runs, index, key, raw):
    with tempfile.TemporaryDirectory() as tmp:
        b = _copy(runs, Path(tmp))
        _event_text(b, index, key, raw)
        _never_internal(*_diff(runs, b, Path(tmp) / "out"))


@FUZZ
@given(name=st.sampled_from(["manifest.json", "trace.jsonl"]), cut=st.floats(0, 1),
       edits=st.lists(st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=3)), max_size=3))
def test_fuzz_run_file_bytes(runs, name, cut, edits):
    """Cut off and overwrite bytes of a run file at random places."""
    with tempfile.TemporaryDirectory() as tmp:
        b = _copy(runs, Path(tmp))
        data = bytearray((b / name).read_bytes())
        for where, new in edits:
            i = int(where * (len(data) - 1))
            data[i:i + len(new)] = new
        (b / name).write_bytes(bytes(data[:max(1, int(cut * len(data)))] if cut < 0.5 else data))
        _never_internal(*_diff(runs, b, Path(tmp) / "out"))


def _paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON document."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@FUZZ
@given(data=st.data(), raw=raw_texts)
def test_fuzz_env_files(runs, data, raw):
    """Replace any value of an env file (or the whole document) with another JSON text."""
    doc = json.loads((runs / "env.json").read_text())
    path = data.draw(st.sampled_from(_paths(doc)))
    mutated = copy.deepcopy(doc)
    if path:
        parent = mutated
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = "@@HOLE@@"
        text = json.dumps(mutated).replace('"@@HOLE@@"', raw)
    else:
        text = raw
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "env.json"
        bad.write_text(text)
        _never_internal(*cli("env", "diff", str(runs / "env.json"), str(bad)))
        _never_internal(*cli("env", "diff", str(bad), str(runs / "a")))


@FUZZ
@given(data=st.binary(max_size=200) | raw_texts.map(str.encode), trace=st.booleans())
def test_fuzz_readers_raise_only_input_errors(tmp_path_factory, data, trace):
    """Each reader on random bytes: a value, or torchrepro's input error (or its documented fallback); nothing else."""
    from torchrepro.cli import scan_cmd
    from torchrepro.record.outdir import _holder

    root = tmp_path_factory.mktemp("raw")
    path = root / ("trace.jsonl" if trace else "manifest.json")
    path.write_bytes(data)
    for read in (_readjson.read_json, _readjson.read_jsonl):
        with contextlib.suppress(StateFileError):
            read(path)
    assert isinstance(launcher.read_summary(path), dict)
    assert isinstance(_holder(path), str)
    assert scan_cmd._read_report(path) is None or isinstance(scan_cmd._read_report(path), dict)
    if trace:
        (root / "manifest.json").write_text(json.dumps({"format": "torchrepro.run", "version": 1,
                                                        "trace_records": 1}))
    with contextlib.suppress(RunDirError):
        load_run(root)


def test_a_garbled_child_summary_is_derived_from_the_trace(tmp_path):
    """A child killed while writing child.json: the parent writes the manifest from the trace instead of crashing."""
    (tmp_path / "trace.jsonl").write_text(json.dumps({"kind": "init", "t": 0.0, "params": {}}) + "\n"
                                          + json.dumps({"kind": "step", "n": 1, "t": 1.0, "params": {}}) + "\n")
    (tmp_path / "child.json").write_text('["a list"]')
    result = launcher._finish_run(["python", "x.py"], launcher.LaunchOptions(record=str(tmp_path)), 0, 0.0,
                                  interrupted=None)
    assert result.manifest["steps"] == 1 and result.manifest["step_mode"] == "optimizer"
    assert not (tmp_path / "child.json").exists()
    assert load_run(tmp_path).manifest["trace_records"] == 2


def test_jsonl_reader_lines_cut_off_last_line_and_limit(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n{"a": 3')
    assert _readjson.read_jsonl(path) == ([{"a": 1}, {"a": 2}], True)
    path.write_bytes(b'{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(StateFileError, match=r"t.jsonl: line 2 is not valid JSON \(Expecting value"):
        _readjson.read_jsonl(path)
    path.write_bytes(b'{"a": 1}\n' * 20)
    with pytest.raises(StateFileError, match=r"t.jsonl: is larger than 50 bytes"):
        _readjson.read_jsonl(path, limit=50)
    with pytest.raises(StateFileError, match=r"t.jsonl: line 1 is not a number: it is an object"):
        _readjson.read_jsonl(path, check=lambda v: [] if len(str(v)) < 0 or v is None else ["it is an object"],
                             what="a number")
