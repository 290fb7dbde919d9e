"""The cause registry: one record per cause, read by check, compare, resume-at, --locate and the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrepro.analysis import causes
from torchrepro.analysis.causes import REGISTRY, Cause, ResumeWording, Wording, cause, register, untraced_note
from torchrepro.analysis.compare import CheckResult, Difference
from torchrepro.analysis.crossrun import CompareResult
from torchrepro.analysis.tolerance import Tolerance
from torchrepro.record.store import Run

DUMMY = Cause(
    "dummy-cause",
    check=Wording("CHECK-EXPLANATION of the dummy cause.", "CHECK-ACTION for the dummy cause."),
    compare=Wording("COMPARE-EXPLANATION of the dummy cause.", "COMPARE-ACTION {a} vs {b}{tolerance}."),
    resume=ResumeWording("dummy state", "RESUME-FIX after step {k}{callback}."),
    untraced="DUMMY-UNTRACED reason",
)


@pytest.fixture
def dummy(monkeypatch: pytest.MonkeyPatch) -> Cause:
    monkeypatch.setitem(REGISTRY, DUMMY.name, DUMMY)
    return DUMMY


def _diverged(name: str) -> CheckResult:
    return CheckResult(verdict="diverged", runs=["a", "b"], step_mode="optimizer", steps=[3, 3], first_step=1,
                       first=[Difference("grads", 1, ["fc.weight"])], kind_first_steps={"grads": 1}, cause=name,
                       losses=[[1.0, 0.5, 0.25], [1.0, 0.6, 0.3]], loss_delta=[0.0, 0.1, 0.05])


def test_every_setting_reads_one_record() -> None:
    """check's, compare's and resume-at's wording of the causes they share come from one record each."""
    for name in ("initial-weights", "data", "compute", "steps", causes.SHARED_CWD):
        c = cause(name)
        assert c.check is not None and c.compare is not None, name
    assert cause("data").resume is not None and cause("parameters").check is None
    assert [n for n, c in REGISTRY.items() if c.traced] == ["initial-weights", "compute"] + [
        n for n, c in REGISTRY.items() if c.check is None]  # resume-only causes are never located
    with pytest.raises(KeyError, match="unknown cause 'nope'; known: .*compute"):
        cause("nope")


def test_a_new_cause_is_one_entry_that_check_compare_resume_and_the_report_render(dummy: Cause,
                                                                                   tmp_path: Path) -> None:
    from torchrepro.analysis.resumeat import ResumeResult
    from torchrepro.cli._compare_render import render_compare
    from torchrepro.cli._html.reports import check_report, compare_report
    from torchrepro.cli._render import render

    check = _diverged(dummy.name)
    text = render(check, what="`python t.py`")
    assert "Cause: dummy-cause - CHECK-EXPLANATION of the dummy cause." in text
    assert "Next:  CHECK-ACTION for the dummy cause." in text
    assert check.to_json()["action"] == "CHECK-ACTION for the dummy cause."
    html = check_report(check, check.to_json(), [], tmp_path, command="`python t.py`")
    assert "CHECK-EXPLANATION of the dummy cause." in html and "CHECK-ACTION for the dummy cause." in html

    compared = CompareResult(check=_diverged(dummy.name), tolerance=Tolerance(bitwise=True),
                             commands=["python a.py", "python b.py"], verdict="diverged")
    text = render_compare(compared)
    assert "Cause: dummy-cause - COMPARE-EXPLANATION of the dummy cause." in text
    assert "Next:  COMPARE-ACTION 'python a.py' vs 'python b.py'; `--rtol/--atol` say" in text
    sides = [Run(path=tmp_path / side, manifest={}, events=[]) for side in "ab"]
    html = compare_report(compared, compared.to_json(), sides, tmp_path)
    assert "COMPARE-EXPLANATION of the dummy cause." in html

    resumed = ResumeResult(k=4, comparison=check, trainer="script", checkpoint=None, runs={}, steps={},
                           cause=dummy.name)
    assert resumed.what == "dummy state" and resumed.fix == "RESUME-FIX after step 4."
    assert untraced_note(dummy.name) == ("not traced: DUMMY-UNTRACED reason (the summary above says what differs "
                                         "and what to do)")


def test_check_locate_skips_what_the_registry_says_is_untraced(dummy: Cause, tmp_path: Path) -> None:
    from torchrepro.cli._locate import run_locate
    from torchrepro.record.launcher import LaunchOptions

    located = run_locate(["python", "t.py"], tmp_path, _diverged(dummy.name), LaunchOptions(), 1)
    assert located == {"verdict": "skipped", "title": untraced_note(dummy.name)}
    traced = register(Cause("dummy-traced", check=dummy.check))
    try:
        assert untraced_note(traced.name) is None
    finally:
        del REGISTRY[traced.name]


def test_compare_falls_back_to_checks_wording(monkeypatch: pytest.MonkeyPatch) -> None:
    only_check = Cause("check-only", check=Wording("E.", "A."))
    monkeypatch.setitem(REGISTRY, only_check.name, only_check)
    compared = CompareResult(check=_diverged(only_check.name), tolerance=Tolerance(),
                             commands=["a", "b"], verdict="diverged")
    assert (compared.explanation, compared.action) == ("E.", "A.")
