"""tools/gpu_check.py: the one prepared GPU check (issue 41 item 5).

On this CPU machine: the exit without CUDA, the whole dry run (every part on the CPU, smallest sizes: commands,
JSON, parsing), the time limits (a step that runs over is stopped, its process group with it, and the next part
still runs) and how each part's output is judged on a GPU (fabricated outputs: no GPU here).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "gpu_check.py"
PARTS = ["registry", "check", "invariance", "fingerprint", "bench"]


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gc = _load()


def _run(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_checks_nothing_says_so_and_exits_0(tmp_path):
    p = _run("--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "no CUDA device: nothing checked"
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["schema"] == "torchrepro.gpu-check/1"
    assert (doc["cuda"], doc["dry_run"], doc["message"], doc["parts"], doc["exit_code"]) == (
        False, False, "no CUDA device: nothing checked", {}, 0)
    assert doc["environment"]["torch"] == torch.__version__
    assert "no CUDA device: nothing checked" in (tmp_path / "gpu_check.txt").read_text()


# --- the dry run, end to end ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    # generous limits: this machine is shared; the limits themselves are tested below with a step that sleeps
    p = _run("--dry-run", "--out", str(out), "--time-factor", "4", "--budget", "4000", timeout=4200)
    return p, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.txt").read_text()


def _step(doc, part, step):
    return doc["parts"][part]["steps"][step]


@pytest.mark.slow
def test_the_dry_run_runs_every_part_and_reads_its_output(dry):
    p, doc, text = dry
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert (doc["schema"], doc["dry_run"], doc["exit_code"]) == ("torchrepro.gpu-check/1", True, 0)
    assert list(doc["parts"]) == PARTS  # bench last: it takes the time that is left
    assert {k: [(s, v["status"]) for s, v in part["steps"].items()] for k, part in doc["parts"].items()} == {
        "registry": [("registry", "passed")],
        "check": [("check", "passed"), ("check --locate", "passed"), ("check --deterministic", "passed")],
        "invariance": [("invariance", "passed")],
        "fingerprint": [("fingerprint", "passed")],
        "bench": [("fp32", "passed"), ("bf16", "passed")],
    }
    assert p.stdout == text  # the summary printed is the summary written
    assert text.splitlines()[1].startswith("DRY RUN on the CPU")


@pytest.mark.slow
def test_the_dry_run_keeps_the_registry_json_whole(dry):
    _, doc, _ = dry
    result = _step(doc, "registry", "registry")["result"]
    rows = result["document"]["rows"]
    assert result["document"]["gpu"] == "cpu" and result["rows"] == len(rows) > 20
    assert {"op", "condition", "claim", "verdict"} <= set(rows[0])
    assert _step(doc, "registry", "registry")["command"].startswith(
        "python tools/verify_cuda_registry.py --json --device cpu")


@pytest.mark.slow
def test_the_dry_run_checks_the_script_with_its_cpu_nondeterministic_op(dry):
    _, doc, text = dry
    plain, located, det = (_step(doc, "check", s)["result"] for s in
                           ("check", "check --locate", "check --deterministic"))
    assert det["verdict"] == "identical" and det["as_expected"]
    assert located["expected"] == "diverged with aten.index_put_ named"
    if torch.get_num_threads() < 2:
        pytest.skip("index_put_(accumulate=True) varies only with 2+ CPU threads")
    assert plain["verdict"] == located["verdict"] == "diverged"
    assert located["locate"]["op"] == "aten.index_put_"
    assert located["locate"]["file"] == "tools/cuda_nondet_train.py"
    assert located["as_expected"] and plain["as_expected"]
    assert "--locate: origin: aten.index_put_ at tools/cuda_nondet_train.py:" in text


@pytest.mark.slow
def test_the_dry_run_benches_both_precisions_beside_the_earlier_figures(dry):
    _, doc, text = dry
    for precision, earlier in (("fp32", 0.165), ("bf16", 0.156)):
        result = _step(doc, "bench", precision)["result"]
        assert result["device"] == "cpu" and result["default_ms"] > 0 and result["deterministic_ms"] > 0
        assert result["earlier"]["overhead"] == earlier
        assert [s["setting"] for s in result["settings"]][:2] == ["algorithms", "fill-uninitialized-memory"]
        assert result["recommended"]["summary"]
    assert "earlier figure: 17.94 -> 20.90 ms, +16.5%" in text
    assert "earlier figure: 12.42 -> 14.37 ms, +15.6%" in text


@pytest.mark.slow
def test_the_dry_run_captures_the_batch_invariance_tool_and_the_fingerprint_checks(dry):
    _, doc, _ = dry
    inv = _step(doc, "invariance", "invariance")["result"]
    models = [r["model"] for r in inv["results"]]
    assert models[:2] == ["Linear(4096, 4096) float32", "Linear(4096, 4096) bfloat16"]
    assert all(r["verdict"] and r["sizes"] == [2, 3] for r in inv["results"])
    fp = _step(doc, "fingerprint", "fingerprint")["result"]
    assert fp["checks"] == {"repeatable": True, "one_bit_flip_changes_it": True, "flip_back_restores_it": True,
                            "same_as_on_cpu": None}
    assert fp["ratio_fingerprint_vs_sum"] > 0 and fp["numel"] == 1 << 20
    assert set(fp["timings"]) >= {"tensor.sum()", "torchrepro.fingerprint", "plain copy"}


# --- time limits: one slow step never loses the others' results ----------------------------------------------------
def _fake_parts(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    sleeper = ("import subprocess, sys, time; "
               f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
               f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(120)")

    def worker(status):
        doc = {"status": status, "reason": None if status == "passed" else "it said so",
               "result": {"summary": [f"said {status}"]}}
        return [sys.executable, "-c", f"print({json.dumps(json.dumps(doc))})"]

    def steps(*specs):
        return lambda *a: [gc.Step(name, argv, gc.parse_worker, limit) for name, argv, limit in specs]

    parts = (gc.Part("slow", 1, "sleeps", steps(("sleeps", [sys.executable, "-c", sleeper], 1.0))),
             gc.Part("fast", 2, "passes", steps(("passes", worker("passed"), 60.0))),
             gc.Part("bad", 3, "fails", steps(("fails", worker("failed"), 60.0))))
    return parts, pidfile


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return True


def test_a_step_over_its_limit_is_stopped_with_its_children_and_the_next_parts_still_run(tmp_path, monkeypatch,
                                                                                           capsys):
    parts, pidfile = _fake_parts(tmp_path)
    monkeypatch.setattr(gc, "PARTS", parts)
    rc = gc.main(["--dry-run", "--out", str(tmp_path / "out")])
    doc = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    slow = doc["parts"]["slow"]["steps"]["sleeps"]
    assert slow["status"] == "skipped" and slow["exit_code"] is None
    assert slow["reason"] == "out of time: ran over its 1 s limit and was stopped"
    assert _gone(int(pidfile.read_text()))  # the step's own children were stopped with it
    assert doc["parts"]["fast"]["status"] == "passed"
    assert doc["parts"]["bad"] == {"number": 3, "title": "fails", "status": "failed", "reason": "it said so",
                                   "steps": doc["parts"]["bad"]["steps"]}
    assert rc == doc["exit_code"] == 1  # a step that ran failed; the skipped one does not count
    text = (tmp_path / "out" / "gpu_check.txt").read_text()
    assert "[skipped] 1. sleeps -- out of time: ran over its 1 s limit and was stopped" in text
    assert "said passed" in text and capsys.readouterr().out == text


def test_with_the_budget_spent_no_step_starts_and_nothing_counts_as_failed(tmp_path, monkeypatch):
    parts, _ = _fake_parts(tmp_path)
    monkeypatch.setattr(gc, "PARTS", parts)
    rc = gc.main(["--dry-run", "--out", str(tmp_path), "--budget", "1"])
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rc == doc["exit_code"] == 0
    for key in ("slow", "fast", "bad"):
        (step,) = doc["parts"][key]["steps"].values()
        assert step["status"] == "skipped" and step["elapsed_s"] is None
        assert step["reason"].startswith("out of time: not started")


def test_parts_are_named_and_checked():
    with pytest.raises(SystemExit):
        gc.main(["--parts", "registry,nonsense"])
    assert gc._parts(" bench, check ") == ["bench", "check"]


# --- how each part's output is judged on a GPU (fabricated outputs) -------------------------------------------------
def _check_doc(verdict, op=None):
    doc = {"verdict": verdict, "first_divergent_step": 1 if verdict == "diverged" else None, "cause": "compute",
           "diverged_first": [{"kind": "loss"}] if verdict == "diverged" else []}
    if op:
        doc["locate"] = {"verdict": "origin", "op": {"op": op, "file": "tools/cuda_nondet_train.py", "line": 30,
                                                     "module": "layers.0", "phase": "forward", "code": "x"}}
    return json.dumps(doc)


def test_check_steps_are_judged_by_their_expected_verdict_and_op():
    locate = gc.parse_check("diverged", "aten.index_add_", dry=False)
    assert locate(_check_doc("diverged", "aten.index_add_"), 1)[:2] == ("passed", None)
    assert locate(_check_doc("diverged", "aten.index_add"), 1)[0] == "passed"  # the out-of-place spelling
    assert locate(_check_doc("diverged", "aten.scatter_add_"), 1)[:2] == (
        "failed", "--locate named aten.scatter_add_, expected aten.index_add_")
    status, reason, result = locate(_check_doc("identical"), 0)
    assert (status, reason) == ("failed", "verdict identical, expected diverged; --locate named nothing, expected "
                                          "aten.index_add_")
    assert result["as_expected"] is False
    det = gc.parse_check("identical", None, dry=False)
    assert det(_check_doc("identical"), 0)[0] == "passed"
    assert det(_check_doc("diverged"), 1)[:2] == ("failed", "verdict diverged, expected identical")
    assert det("", 2)[:2] == ("failed", "check exited 2 (the script failed or a usage error)")
    # the dry run checks the plumbing: an unexpected verdict on the CPU is said, not failed
    status, reason, _ = gc.parse_check("identical", None, dry=True)(_check_doc("diverged"), 1)
    assert (status, reason) == ("passed", "dry run, not a verdict on a GPU: verdict diverged, expected identical")


def test_the_registry_step_fails_on_a_row_that_does_not_hold():
    rows = [{"op": "aten.index_add_", "condition": None, "verdict": "ok"},
            {"op": "aten.cumsum", "condition": None, "verdict": "not observed"},
            {"op": "aten.bincount", "condition": "weights", "verdict": "CLAIM FAILS"}]
    out = json.dumps({"gpu": "NVIDIA H100", "torch": "2.11.0", "runs": 8, "rows": rows})
    status, reason, result = gc.parse_registry(dry=False)(out, 1)
    assert (status, reason) == ("failed", "1 of 3 rows do not hold (exit 1)")
    assert result["summary"][1] == "  does not hold: aten.bincount [weights]: CLAIM FAILS"
    assert gc.parse_registry(dry=False)(json.dumps({"gpu": "H100", "torch": "2.11.0", "runs": 8,
                                                    "rows": rows[:2]}), 0)[0] == "passed"
    assert gc.parse_registry(dry=False)(json.dumps({"gpu": None, "message": "no CUDA GPU here"}), 0)[:2] == (
        "failed", "no CUDA GPU here")
    assert gc.parse_registry(dry=True)(out, 1)[0] == "passed"  # CUDA claims observed on a CPU mean nothing


def test_an_unreadable_output_is_an_error_with_the_output_kept(tmp_path):
    step = gc.Step("garbled", [sys.executable, "-c", "print('Traceback: no JSON here')"], gc.parse_worker, 60.0)
    record = gc.run_step(step, gc.Clock(100.0), tmp_path)
    assert record["status"] == "error" and record["reason"].startswith("could not read its output: ValueError")
    assert "Traceback: no JSON here" in record["result"]["stdout_tail"]
    assert gc.read_json('warming up\n{"a": 1}\n') == {"a": 1}


def test_a_part_is_skipped_only_when_all_its_steps_were():
    s = {"status": "skipped", "reason": "out of time: x"}
    p = {"status": "passed", "reason": None}
    f = {"status": "failed", "reason": "bad"}
    assert gc.aggregate({"fp32": p, "bf16": s}) == ("passed", "bf16: skipped: out of time: x")
    assert gc.aggregate({"fp32": s, "bf16": s})[0] == "skipped"
    assert gc.aggregate({"a": p, "b": f, "c": {"status": "error", "reason": "e"}})[0] == "failed"


# --- the running step never outlives the check (SIGTERM, SIGHUP, and SIGKILL where no handler runs) ----------------
_DRIVER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gpu_check_driven", sys.argv[1])
gc = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gc
spec.loader.exec_module(gc)
step = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
gc.PARTS = (gc.Part("slow", 1, "sleeps",
                    lambda *a: [gc.Step("sleeps", [sys.executable, "-c", step, sys.argv[2]], gc.parse_worker, 600.0)]),)
sys.exit(gc.main(["--dry-run", "--out", sys.argv[3]]))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_the_running_step_is_stopped_when_the_check_is(tmp_path, sig):
    """Each step leads a session of its own (so that a limit stops its whole group): a signal to the check must reach
    it. SIGTERM/SIGHUP stop it as Ctrl-C does and say so in gpu_check.json; SIGKILL reaches it through the parent-death
    signal the step was started with."""
    pidfile, out = tmp_path / "step.pid", tmp_path / "out"
    check = subprocess.Popen([sys.executable, "-c", _DRIVER, str(TOOL), str(pidfile), str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    step = None
    try:
        deadline = time.monotonic() + 120
        while step is None and time.monotonic() < deadline and check.poll() is None:
            text = pidfile.read_text() if pidfile.exists() else ""
            step = int(text) if text.strip() else None
            time.sleep(0.05)
        assert step is not None, check.communicate(timeout=5)
        check.send_signal(sig)
        _, err = check.communicate(timeout=60)
        deadline = time.monotonic() + 30
        while not _gone(step) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(step), f"the step ({step}) outlived the check stopped by {sig.name}"
    finally:
        check.kill()
        if step is not None and not _gone(step):
            os.kill(step, signal.SIGKILL)
    if sig == signal.SIGKILL:
        assert check.returncode == -signal.SIGKILL
        return
    message = (f"stopped by {sig.name}: the running step was stopped with its processes; the parts before it are "
               "kept")
    assert check.returncode == 128 + sig, err
    doc = json.loads((out / "gpu_check.json").read_text())
    assert (doc["exit_code"], doc["message"]) == (128 + sig, message)
    assert f"gpu_check: {message}" in err
