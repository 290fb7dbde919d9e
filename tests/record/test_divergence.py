"""DivergenceWatch: the first divergence found as traces are written, by compare's rules, and the exact stop step."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

from torchrepro.analysis.compare import compare_runs
from torchrepro.record.divergence import DivergenceWatch
from torchrepro.record.store import load_run, write_manifest


def step(n: int, w: str = "a", loss: str = "l", batches: list[str] | None = None, **extra: object) -> dict:
    return {"kind": "step", "n": n, "opt": 0, "t": 0.0, "losses": [{"fp": loss, "value": None}],
            "batches": batches or [], "grads": {"w": "g"}, "params": {"w": w}, "state": {}, **extra}


def write(run: Path, events: list[dict], *, ended: bool = False) -> None:
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "trace.jsonl", "a") as f:
        for e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    if ended:
        lines = (run / "trace.jsonl").read_text().splitlines()
        write_manifest(run, {"trace_records": len(lines), "steps": sum('"kind":"step"' in x for x in lines),
                             "step_mode": "optimizer"})


INIT = {"kind": "init", "t": 0.0, "params": {"w": "i"}}


def watch(tmp_path: Path, after: int, n: int = 2) -> DivergenceWatch:
    return DivergenceWatch(runs=[tmp_path / f"r{i}" for i in range(1, n + 1)], me=n - 1, after=after)


def test_stops_exactly_after_steps_past_the_first_divergence(tmp_path):
    write(tmp_path / "r1", [INIT, *(step(k, w=f"w{k}") for k in range(1, 10))], ended=True)
    w = watch(tmp_path, after=2)
    for k in range(1, 6):
        write(tmp_path / "r2", ([INIT] if k == 1 else []) + [step(k, w=f"w{k}" if k < 3 else "other")])
        assert w.after_step(k) is (k == 5), k
    assert w.first == 3 and w.diverged_runs == [2]
    assert w.facts(5)["reason"] == "it diverged from run 1 at step 3; it was stopped 2 steps later"
    assert w.facts(None) is None


def test_initial_parameters_diverge_at_step_0(tmp_path):
    write(tmp_path / "r1", [INIT, step(1), step(2), step(3)], ended=True)
    write(tmp_path / "r2", [{**INIT, "params": {"w": "j"}}, step(1)])
    w = watch(tmp_path, after=1)
    assert w.after_step(1) is True and w.first == 0


def test_a_missing_name_is_a_null_fingerprint_as_in_compare(tmp_path):
    write(tmp_path / "r1", [INIT, step(1), step(2)], ended=True)
    write(tmp_path / "r2", [INIT, {**step(1), "grads": {"w": "g", "v": None}}, step(2)])
    w = watch(tmp_path, after=0)
    assert w.after_step(2) is False and w.first is None


def test_a_run_longer_than_run_1_diverges_where_run_1_ended(tmp_path):
    write(tmp_path / "r1", [INIT, step(1), step(2)], ended=True)
    write(tmp_path / "r2", [INIT, step(1), step(2), step(3)])
    w = watch(tmp_path, after=1)
    assert w.after_step(3) is False and w.first == 3
    write(tmp_path / "r2", [step(4)])
    assert w.after_step(4) is True


def test_waits_for_a_slower_run_so_that_the_stop_is_exact(tmp_path):
    """--parallel: run 2 at step 4 (after=2) must know whether run 1 differs at step 2, which run 1 writes later."""
    write(tmp_path / "r1", [INIT, step(1)])
    write(tmp_path / "r2", [INIT, step(1), step(2, w="other"), step(3), step(4)])
    w = watch(tmp_path, after=2)
    assert w.after_step(1) is False and w.after_step(2) is False  # nothing to wait for yet (2 - 2 = 0)
    later = threading.Timer(0.4, write, args=(tmp_path / "r1", [step(2)]))
    t0 = time.perf_counter()
    later.start()
    assert w.after_step(3) is False  # needs run 1 through step 1 only
    assert time.perf_counter() - t0 < 0.3
    assert w.after_step(4) is True and w.first == 2  # waited for run 1's step 2
    assert time.perf_counter() - t0 >= 0.4 and w.waited_s >= 0.3
    later.join()


def test_every_run_stops_at_the_first_divergence_of_any(tmp_path):
    """--parallel with 3 runs: run 1 compares runs 2 and 3 with itself; run 3 diverges first."""
    write(tmp_path / "r1", [INIT, *(step(k) for k in range(1, 5))])
    write(tmp_path / "r2", [INIT, *(step(k, w="x" if k >= 4 else "a") for k in range(1, 5))])
    write(tmp_path / "r3", [INIT, *(step(k, loss="y" if k >= 2 else "l") for k in range(1, 5))])
    w = DivergenceWatch(runs=[tmp_path / f"r{i}" for i in (1, 2, 3)], me=0, after=1)
    assert w.after_step(2) is False and w.after_step(3) is True
    assert w.first == 2 and w.diverged_runs == [3]
    assert w.facts(3)["reason"] == "run 3 diverged from run 1 at step 2; every run was stopped 1 steps later"


def _random_step(rng: random.Random, k: int) -> dict:
    names = rng.sample(["a", "b", "c"], rng.randint(1, 3))
    return {"kind": "step", "n": k, "opt": 0, "t": 0.0, "losses": [{"fp": rng.choice("pq"), "value": None}],
            "batches": [rng.choice("xy")] * rng.randint(0, 1),
            **{part: {n: rng.choice(["0", "1", None]) for n in names} for part in ("grads", "params", "state")}}


def test_first_divergence_is_compares_first_divergent_step(tmp_path):
    rng = random.Random(7)
    for case in range(60):
        root = tmp_path / str(case)
        steps = rng.randint(1, 5)
        a = [{**INIT, "params": {"w": rng.choice("ij")}}, *(_random_step(rng, k) for k in range(1, steps + 1))]
        b = [dict(e) for e in a] if rng.random() < 0.7 else \
            [{**INIT, "params": {"w": rng.choice("ij")}}, *(_random_step(rng, k) for k in range(1, steps + 1))]
        for e in b[1:]:  # change one field of some step now and then
            if rng.random() < 0.2:
                e[rng.choice(["params", "grads", "state"])] = {"a": rng.choice(["0", "1", None])}
            elif rng.random() < 0.1:
                e["batches"] = ["z"]
        if rng.random() < 0.2:
            b = b[:-1] if len(b) > 2 and rng.random() < 0.5 else [*b, _random_step(rng, len(b))]
        write(root / "r1", a, ended=True)
        write(root / "r2", b, ended=True)
        expected = compare_runs([load_run(root / "r1"), load_run(root / "r2")]).first_step
        w = DivergenceWatch(runs=[root / "r1", root / "r2"], me=1, after=0)
        steps_b = sum(e["kind"] == "step" for e in b)
        for k in range(1, steps_b + 1):
            if w.after_step(k):
                break
        # a run shorter than run 1 ends by itself: compare finds its step count, the watch has nothing to stop
        assert w.first == (expected if expected is None or expected <= steps_b else None), (case, a, b)


def test_compare_leaves_out_a_stopped_runs_step_count_and_final_parameters(tmp_path):
    final = {"kind": "final", "t": 0.0, "params": {"w": "end"}}
    write(tmp_path / "r1", [INIT, *(step(k) for k in range(1, 8)), final], ended=True)
    events = [INIT, step(1), step(2, loss="other"), step(3), {**final, "params": {"w": "at step 3"}}]
    write(tmp_path / "r2", events)
    stop = {"after_step": 3, "first_divergent_step": 2, "steps_after": 1, "diverged_runs": [2], "reason": "r"}
    write_manifest(tmp_path / "r2", {"trace_records": len(events), "steps": 3, "step_mode": "optimizer",
                                     "stopped": stop})
    result = compare_runs([load_run(tmp_path / "r1"), load_run(tmp_path / "r2")])
    assert (result.verdict, result.first_step, result.cause) == ("diverged", 2, "compute")
    assert result.kind_first_steps == {"loss": 2} and result.steps == [7, 3] and result.stopped == [None, stop]
    write_manifest(tmp_path / "r2", {"trace_records": len(events), "steps": 3, "step_mode": "optimizer"})
    result = compare_runs([load_run(tmp_path / "r1"), load_run(tmp_path / "r2")])  # not stopped: it ended early
    assert result.kind_first_steps == {"loss": 2, "steps": 4} and result.stopped == [None, None]


def test_a_long_run_1_is_read_only_as_far_as_needed(tmp_path, monkeypatch):
    import torchrepro.record.divergence as divergence

    monkeypatch.setattr(divergence, "CHUNK", 512)
    write(tmp_path / "r1", [INIT, *(step(k) for k in range(1, 2001))], ended=True)
    write(tmp_path / "r2", [INIT, step(1), step(2), step(3)])
    w = watch(tmp_path, after=2)
    assert [w.after_step(k) for k in (1, 2, 3)] == [False, False, False]
    run1 = w._tails[0]
    assert run1.count < 10 and len(run1.steps) < 10 and not run1.ended  # not 2000 steps held in memory
    assert run1.offset < (tmp_path / "r1" / "trace.jsonl").stat().st_size / 100
