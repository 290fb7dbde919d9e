"""The resume verdict of `check --resume-at K` on hand-made traces: splicing run 2's two processes and naming what
was not restored, in causal order (the end-to-end cases are in tests/cli/test_check_resume_at.py)."""

from __future__ import annotations

from pathlib import Path

from torchrepro.analysis.compare import compare_runs
from torchrepro.analysis.resumeat import RanksResume, diagnose, splice, used_generators
from torchrepro.record.store import Run

K = 2
RNG = {"torch": "t{}", "cuda": None, "random": "r0", "numpy": None}  # torch's state moves every step; random's not


def step(n: int, *, params: str = "", state: str = "", batch: str = "", index: str = "", lr: float = 0.1,
         rng: str = "", before: dict | None = None, loss: str = "") -> dict:
    event = {"kind": "step", "n": n, "opt": 0, "t": 0.0, "losses": [{"fp": f"l{n}{loss}", "value": None}],
             "batches": [f"b{n}{batch}"], "batch_indices": [f"i{n}{index}"], "grads": {"w": f"g{n}{loss}"},
             "params": {"w": f"p{n}{params}"}, "state": {"w.exp_avg": f"s{n}{state}"}, "lr": [lr],
             "rng": {k: (v.format(n) + rng if v and k == "torch" else v) for k, v in RNG.items()}}
    if before is not None:
        event["state_before"] = before
    return event


def run(path: str, events: list[dict]) -> Run:
    steps = sum(e["kind"] == "step" for e in events)
    manifest = {"command": ["python", "t.py"], "step_mode": "optimizer", "steps": steps,
                "fingerprint_algorithm": "xxh3-128-chunks-1MiB/1", "trace_records": len(events)}
    return Run(path=Path(path), manifest=manifest, events=events)


def boundary(rng: str = "") -> dict:
    return {"kind": "boundary", "after_step": K, "t": 0.0, "rng": {"torch": f"t{K}{rng}", "cuda": None,
                                                                    "random": "r0", "numpy": None}}


def init(params: str) -> dict:
    return {"kind": "init", "t": 0.0, "params": {"w": params}}


def straight(n: int = 4) -> Run:
    return run("run1", [init("p0"), *[step(i) for i in range(1, K + 1)], boundary(),
                        *[step(i) for i in range(K + 1, n + 1)]])


def stopped() -> Run:
    return run("run2", [init("p0"), *[step(i) for i in range(1, K + 1)]])


def resumed(*, start: str = f"p{K}", n: int = 4, first: dict | None = None, rng: str = "", **later: object) -> Run:
    """The restarted process: local steps 1..n-K recorded as global K+1..n, with ``later`` on its first step."""
    before = {"w.exp_avg": f"s{K}"} if first is None else first
    steps = [step(K + 1, before=before, **later)] + [step(i) for i in range(K + 2, n + 1)]
    for local, e in enumerate(steps, start=1):
        e["n"] = local
    return run("run2-resumed", [boundary(rng), init(start), *steps])


def verdict(res: Run, base: Run | None = None):
    base = base or straight()
    stop = stopped()
    comparison = compare_runs([base, splice(stop, res, K, base)])
    return diagnose(base, stop, res, comparison, K)


def test_splice_renumbers_the_resumed_steps_and_joins_at_k():
    spliced = splice(stopped(), resumed(), K)
    assert [e["n"] for e in spliced.steps()] == [1, 2, 3, 4]
    assert spliced.of_kind("init")[0]["params"] == {"w": "p0"}  # the first process's, not the restarted one's
    assert spliced.manifest["steps"] == 4


def test_an_exact_resume_is_identical_with_every_check_passed():
    result = verdict(resumed())
    assert result.verdict == "identical" and result.cause is None
    assert [r.restored for r in result.restored] == [True] * 5


def test_parameters_come_first_in_causal_order():
    result = verdict(resumed(start="pX", params="x", state="x", lr=0.2, rng="x"))
    assert result.cause == "parameters" and result.step == K + 1 and result.tensors == ["w"]
    assert "w" in result.restored[0].text


def test_lr_scheduler_state():
    result = verdict(resumed(lr=0.05, params="x", state="x"))
    assert result.cause == "scheduler-state" and "0.1" in result.restored[2].text
    assert "scheduler" in (result.fix or "")


def test_same_indices_other_values_is_augmentation_rng():
    result = verdict(resumed(batch="x", loss="x", params="x", state="x"))
    assert result.cause == "data-values"
    assert result.restored[3].text == "the same samples (same indices) with other values"


def test_a_batch_seen_before_names_the_step():
    res = resumed(params="x", state="x", loss="x")
    first = res.steps()[0]
    first["batches"], first["batch_indices"] = ["b1"], ["i1"]
    result = verdict(res)
    assert result.cause == "data-position" and "saw at step 1" in result.restored[3].text


def test_rng_of_a_generator_training_never_drew_from_is_not_blamed():
    res = resumed()
    for e in res.of_kind("boundary"):
        e["rng"]["random"] = "other"
    result = verdict(res)
    assert result.verdict == "identical" and result.restored[4].restored is True
    assert "Python's random also differs, but training never drew from it" in result.restored[4].text
    assert used_generators(straight()) == ["torch"]


def test_rng_state_not_restored():
    result = verdict(resumed(rng="x", loss="x", params="x", state="x"))
    assert result.cause == "rng-state" and result.tensors == ["torch"]


def test_everything_restored_but_the_step_differs_is_compute():
    result = verdict(resumed(loss="x", params="x", state="x"))
    assert result.cause == "compute" and "nondeterministic" in (result.detail or "")


def test_more_steps_after_the_restart_is_the_step_counter():
    result = verdict(resumed(n=5))
    assert result.cause == "steps" and result.step == 5


def test_a_divergence_before_the_checkpoint_is_not_about_the_resume():
    base = run("run1", [init("p0"), step(1, params="x"), step(2), boundary(), step(3), step(4)])
    result = verdict(resumed(), base)
    assert result.cause == "before-checkpoint" and result.step == 1


def test_extra_batches_before_the_first_resumed_step_are_not_compared():
    res = resumed()
    first = res.steps()[0]
    first["batches"], first["batch_indices"] = ["skip1", "skip2", *first["batches"]], ["j1", "j2",
                                                                                       *first["batch_indices"]]
    result = verdict(res)
    assert result.verdict == "identical"
    assert any("fetched 2 more batch" in note for note in result.notes)


def test_batches_the_uninterrupted_run_fetched_after_step_k_are_not_expected_again():
    """Lightning validates after step K: run 1's step K+1 holds the validation batch, the resumed process (which
    stopped before that validation in run 2) does not fetch it again; the training batch is the same."""
    base = straight()
    first = base.steps()[K]
    first["batches"], first["batch_indices"] = ["val1", *first["batches"]], ["vi1", *first["batch_indices"]]
    result = verdict(resumed(), base)
    assert result.verdict == "identical"
    assert any("fetched 1 batch(es) after step 2" in note for note in result.notes)
    # and a resumed batch that is not the last one run 1 fetched is still a data difference
    result = verdict(resumed(batch="x"), base)
    assert result.verdict == "diverged" and result.cause.startswith("data")


# --- several ranks (torchrun): the lead rank, and the ranks its divergence reached through the all-reduce ----------
def test_ranks_that_all_resume_exactly_lead_with_rank_0():
    check = RanksResume(2, [verdict(resumed()), verdict(resumed())])
    assert check.verdict == "identical" and check.lead[0] == 0 and check.follows == {}
    doc = check.to_json()
    assert doc["lead_rank"] == 0 and doc["nproc_per_node"] == 2 and doc["cause"] is None
    assert [(r["rank"], r["follows_rank"], r["verdict"]) for r in doc["ranks"]] == [(0, None, "identical"),
                                                                                    (1, None, "identical")]


def test_the_rank_that_names_what_was_not_restored_leads_and_the_all_reduce_reaches_the_others():
    """Rank 1 lost its RNG state; rank 0 restored everything, but DDP averages rank 1's gradients into its own
    at the same step: rank 0's cause is compute, it follows rank 1, and rank 1 leads."""
    reached = verdict(resumed(loss="x", params="x", state="x"))
    check = RanksResume(2, [reached, verdict(resumed(rng="x", loss="x", params="x", state="x"))])
    assert check.lead[0] == 1 and check.verdict == "diverged" and check.follows == {0: 1}
    assert reached.cause == "compute" and "rank 1 did not resume exactly (RNG state)" in (reached.explanation or "")
    doc = check.to_json()
    assert doc["lead_rank"] == 1 and doc["cause"] == "rng-state" and doc["ranks"][0]["follows_rank"] == 1


def test_an_earlier_divergence_leads_whatever_its_cause():
    early = verdict(resumed(loss="x", params="x", state="x"))  # compute at step K+1
    late = resumed(rng="")
    late.steps()[1]["params"] = {"w": "px"}  # diverges at step K+2 only
    check = RanksResume(2, [verdict(late), early])
    assert check.lead == (1, early) and check.follows == {}
