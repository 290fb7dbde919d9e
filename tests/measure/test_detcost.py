"""What each setting of deterministic mode costs, and the search for the cheapest bitwise configuration."""

from __future__ import annotations

import pytest

from torchrepro.cli._explain import render_explain
from torchrepro.control.determinism import SETTING_NAMES, without
from torchrepro.measure import detcost


def test_settings_that_do_nothing_on_the_device_are_not_applicable_and_not_timed():
    cpu = {p.name: p for p in detcost.plan("cpu", compiled=False)}
    assert list(cpu) == list(SETTING_NAMES)
    for name in ("cudnn-deterministic", "cudnn-benchmark", "cublas-workspace"):
        assert cpu[name].reason == "not applicable on cpu" and cpu[name].with_variant is None
    assert cpu["inductor"].reason == "not applicable: the script does not call torch.compile"
    # the fill acts only under deterministic algorithms: algorithms are timed with the fill off
    assert (cpu["algorithms"].with_variant, cpu["algorithms"].without_variant) == (
        "deterministic-without-fill-uninitialized-memory", "deterministic-without-algorithms")
    assert (cpu["fill-uninitialized-memory"].with_variant, cpu["fill-uninitialized-memory"].without_variant) == (
        "deterministic", "deterministic-without-fill-uninitialized-memory")
    assert detcost.variants(list(cpu.values())) == {
        "deterministic": {}, "deterministic-without-fill-uninitialized-memory": {"fill_uninitialized_memory": False},
        "deterministic-without-algorithms": {"use_deterministic_algorithms": False}}
    cuda = {p.name: p for p in detcost.plan("cuda:0", compiled=True)}
    assert all(p.reason is None for p in cuda.values())
    assert cuda["cudnn-benchmark"].without_variant == "deterministic-without-cudnn-benchmark"
    assert detcost.variants(list(cuda.values()))["deterministic-without-cublas-workspace"] == {
        "cublas_workspace": None}
    assert detcost.plan("mps", compiled=False)[2].reason == "not applicable on mps"


def test_costs_pair_each_setting_with_the_variant_without_it():
    parts = detcost.plan("cpu", compiled=False)
    durations = {"deterministic": [12.0] * 5, "deterministic-without-fill-uninitialized-memory": [10.0] * 5,
                 "deterministic-without-algorithms": [10.0] * 5}
    found = {c.name: c for c in detcost.costs(parts, durations)}
    assert found["fill-uninitialized-memory"].overhead == pytest.approx(0.2)
    assert found["algorithms"].overhead == pytest.approx(0.0)
    assert found["cudnn-benchmark"].overhead is None and found["cudnn-benchmark"].ci is None
    assert [c.name for c in detcost.ranking(list(found.values()))] == ["fill-uninitialized-memory", "algorithms"]


def _verifier(identical_when):
    tried = []

    def verify(left_out):
        tried.append(list(left_out))
        ok = identical_when(set(left_out))
        return detcost.Candidate(list(left_out), "identical" if ok else "diverged")

    return verify, tried


def _ranked(*names):
    return [detcost.Cost(n, n, None, overhead=0.1 * (len(names) - i), ci=(0.0, 1.0)) for i, n in enumerate(names)]


APPLICABLE = ["algorithms", "fill-uninitialized-memory"]


def test_the_search_keeps_only_what_a_check_confirmed():
    verify, tried = _verifier(lambda out: "algorithms" not in out)  # needs deterministic algorithms
    left, candidates = detcost.cheapest(_ranked("algorithms", "fill-uninitialized-memory"), APPLICABLE, verify)
    # leaving out algorithms leaves out the fill too (it acts only under them): diverged; the fill alone: identical
    assert tried == [["algorithms", "fill-uninitialized-memory"], ["fill-uninitialized-memory"]]
    assert left == ["fill-uninitialized-memory"] and [c.verdict for c in candidates] == ["diverged", "identical"]
    rec = detcost.recommendation(left, APPLICABLE)
    assert rec["call"] == "torchrepro.deterministic(fill_uninitialized_memory=False)"
    assert rec["flags"] == ["--deterministic", "--deterministic-except", "fill-uninitialized-memory"]
    assert rec["variant"] == "deterministic-without-fill-uninitialized-memory"


def test_full_deterministic_mode_is_checked_when_nothing_can_be_left_out_and_may_fail_too():
    verify, tried = _verifier(lambda out: not out)
    left, _ = detcost.cheapest(_ranked("fill-uninitialized-memory", "algorithms"), APPLICABLE, verify)
    assert left == [] and tried[-1] == [] and detcost.recommendation(left, APPLICABLE)["call"] == \
        "torchrepro.deterministic()"
    verify, tried = _verifier(lambda out: False)
    left, candidates = detcost.cheapest(_ranked("fill-uninitialized-memory"), APPLICABLE, verify)
    assert left is None and tried == [["fill-uninitialized-memory"], []]
    doc = {"results": [{"config": "default", "overhead": None, "overhead_ci": None},
                       {"config": "deterministic", "overhead": 0.1, "overhead_ci": [0.0, 0.2]}],
           "explain": [{"precision": None, "default": "default", "full": "deterministic", "recommended": None,
                        "settings": [c.to_json() for c in detcost.costs(detcost.plan("cpu", compiled=False), {
                            "deterministic": [1.0], "deterministic-without-fill-uninitialized-memory": [1.0],
                            "deterministic-without-algorithms": [1.0]})],
                        "checks": [c.to_json() for c in candidates]}]}
    text = render_explain(doc)
    assert "No configuration is recommended: not even full deterministic mode was bitwise reproducible" in text
    assert "Cheapest configuration" not in text


def test_leaving_out_every_applicable_setting_is_the_scripts_own_settings():
    rec = detcost.recommendation(APPLICABLE, APPLICABLE)
    assert rec["deterministic"] is False and rec["call"] is None and rec["variant"] == "default"
    assert without(["algorithms", "fill-uninitialized-memory"]) == {"use_deterministic_algorithms": False}
    with pytest.raises(ValueError, match="unknown deterministic-mode setting 'tf32'; known: algorithms, "):
        without(["tf32"])
