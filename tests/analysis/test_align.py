"""The pieces behind `compare` and `bisect`, without processes: op-stream alignment, where two programs part,
tolerances, the bisection with skips, and the localization tied to a commit's diff."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from torchrepro.analysis.align import align_ops, common_pairs
from torchrepro.analysis.bisect import Search, relocate, tie_to_diff
from torchrepro.analysis.proglocate import locate_programs
from torchrepro.analysis.tolerance import Tolerance, value_delta
from torchrepro.record.gitrepo import FileHunks


def _lcs(a: list, b: list) -> int:
    t = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            t[i + 1][j + 1] = t[i][j] + 1 if x == y else max(t[i][j + 1], t[i + 1][j])
    return t[-1][-1]


def test_common_pairs_is_a_longest_common_subsequence():
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.choice("abc") for _ in range(rng.randint(0, 10))]
        b = [rng.choice("abc") for _ in range(rng.randint(0, 10))]
        pairs = common_pairs(a, b)
        assert all(a[i] == b[j] for i, j in pairs)
        assert all(p[0] < q[0] and p[1] < q[1] for p, q in zip(pairs, pairs[1:]))
        assert len(pairs) == _lcs(a, b)
    # past the edit limit: the k-th occurrences, kept in order
    pairs = common_pairs("abab" * 5, "baba" * 5, max_edits=1)
    assert all(p[0] < q[0] and p[1] < q[1] for p, q in zip(pairs, pairs[1:])) and len(pairs) >= 10


def op(name: str, ins: list[str], outs: list[str], code: str = "x", line: int = 1, **extra) -> dict:
    return {"op": name, "in": ins, "out": outs, "code": code, "line": line, "file": "t.py", "phase": "forward",
            "module": "m", **extra}


# A: y = mm(x); s = sum(y); l = mul(s)     B: y = mm(x); f = flip(y); s = sum(f); l = mul(s)
A = [op("aten.mm", ["x"], ["y"], "y = x @ w"), op("aten.sum", ["y"], ["s"], "s = y.sum()", 2),
     op("aten.mul", ["s"], ["l"], "l = s * 2", 3)]
B = [op("aten.mm", ["x"], ["y"], "y = x @ w"), op("aten.flip", ["y"], ["f"], "s = y.flip(0).sum()", 2),
     op("aten.sum", ["f"], ["s2"], "s = y.flip(0).sum()", 2), op("aten.mul", ["s2"], ["l2"], "l = s * 2", 4)]


def test_alignment_pairs_moved_lines_and_marks_the_inserted_op():
    rows = align_ops(A, B)
    assert [(r.a, r.b, r.kind) for r in rows] == [(0, 0, "same"), (None, 1, "inserted"), (1, 2, "changed"),
                                                 (2, 3, "same")]  # the mul moved from line 3 to 4: still "same"


def test_an_inserted_op_that_makes_the_first_differing_input_is_the_program_difference():
    found = locate_programs(A, B, {}, {}, Tolerance(bitwise=True))
    assert found.verdict == "program" and found.rows[found.cause].kind == "inserted"
    doc = found.to_json()
    assert doc["cause"]["b"]["op"] == "aten.flip" and doc["op"]["a"]["op"] == doc["op"]["b"]["op"] == "aten.sum"
    assert doc["aligned"] == {"same": 2, "changed": 1, "deleted": 0, "inserted": 1}


@pytest.mark.parametrize("b_sum, rng, verdict", [
    (op("aten.sum", ["y"], ["s2"], "s = y.sum()", 2), False, "origin"),  # same inputs, other bits: the kernel
    (op("aten.sum", ["y"], ["s2"], "s = y.sum()", 2), True, "rng"),
    (op("aten.sum", ["z"], ["s2"], "s = y.sum()", 2), False, "external-input"),  # its input made by no traced op
    (op("aten.sum", ["y"], ["s"], "s = y.sum()", 2), False, "not-reproduced"),
])
def test_verdicts_for_aligned_ops(b_sum, rng, verdict):
    a = [A[0], dict(A[1], rng=rng)]
    b = [B[0], dict(b_sum, rng=rng)]
    found = locate_programs(a, b, {}, {}, Tolerance(bitwise=True))
    assert found.verdict == verdict
    if verdict in ("origin", "rng"):
        assert found.to_json()["op"]["a"]["line"] == 2


def test_the_first_op_past_the_tolerance_is_the_one_that_amplifies():
    """mm's outputs differ a little (within rtol 1e-3), then a division blows the difference up."""
    x, y, d, y2, d2 = (f"{k:032x}" for k in range(5))  # fingerprints: 32 hex digits
    a = [op("aten.mm", [x], [y]), op("aten.div", [y], [d], line=2)]
    b = [op("aten.mm", [x], [y2]), op("aten.div", [y2], [d2], line=2)]
    va = {y: torch.tensor([1.0, 2.0]), d: torch.tensor([1.0, 1.0])}
    vb = {y2: torch.tensor([1.0, 2.0001]), d2: torch.tensor([1.0, 1.5])}
    found = locate_programs(a, b, va, vb, Tolerance(rtol=1e-3))
    assert found.verdict == "origin" and found.at == 0  # bitwise: mm is where the bits part
    assert found.tolerance_at == 1 and found.tolerance_delta.max_abs == pytest.approx(0.5)
    # without values the tolerance cannot be judged: said, not guessed
    assert locate_programs(a, b, {}, {}, Tolerance(rtol=1e-3)).tolerance_at is None


def test_value_delta_within_and_beyond_a_tolerance():
    a, b = torch.tensor([1.0, float("nan"), 0.0]), torch.tensor([1.0 + 1e-6, float("nan"), 0.0])
    d = value_delta(a, b, Tolerance())
    assert d.within and d.differing == 1 and d.max_abs == pytest.approx(1e-6, rel=0.1)
    assert not value_delta(a, b, Tolerance(rtol=0.0, atol=0.0)).within
    mixed = value_delta(torch.ones(3), torch.ones(3, dtype=torch.bfloat16) * 1.004, Tolerance())
    assert mixed.within and mixed.rtol == 1.6e-2 and "bfloat16" in mixed.note  # the looser dtype's tolerance
    assert value_delta(torch.ones(2), torch.ones(3), Tolerance()) is None


def test_search_with_a_skip_before_the_first_bad_is_a_range():
    def run(n: int, first: int, skips: set[int]) -> tuple[int | None, list[int]]:
        s = Search(n)
        while (i := s.next()) is not None:
            s.record(i, "skip" if i in skips else "bad" if i >= first else "good")
        return s.first_bad, s.candidates

    assert run(5, 4, {2}) == (4, [4])
    assert run(6, 4, {3}) == (None, [3, 4])


def test_the_localization_is_tied_to_the_lines_the_commit_changes(tmp_path: Path):
    parent, commit = tmp_path / "p", tmp_path / "c"
    doc = {"cause": {"b": {"op": "aten.flip", "file": str(commit / "train.py"), "line": 12}},
           "op": {"a": {"op": "aten.sum", "file": str(parent / "train.py"), "line": 12},
                  "b": {"op": "aten.sum", "file": str(commit / "other.py"), "line": 3}}}
    located = relocate(doc, {"parent": parent, "commit": commit})
    assert located["cause"]["b"]["file"] == "train.py" and located["cause"]["b"]["checkout"] == "commit"
    hunks = {"train.py": FileHunks(removed={12: "out = h.sum(1)"}, added={12: "out = h.flip(1).sum(1)"},
                                   old_path="train.py")}
    tie = tie_to_diff(located, hunks)
    assert tie["touched"] and {(t["checkout"], t["change"], t["text"]) for t in tie["touches"]} == {
        ("commit", "added", "out = h.flip(1).sum(1)"), ("parent", "removed", "out = h.sum(1)")}
    assert tie["files"] == {"train.py": {"added": 1, "removed": 1}}
