"""Aligning the op streams of two *different* programs, with insertions and deletions (layer L4).

``check --locate`` pairs the ops of two runs of one program by identity (:func:`torchrepro.analysis.locate.align`).
Two different commands may run different ops: an extra ``flip``, a fused op instead of two, a cast under autocast,
a line that moved when a comment was added above it. Here the streams are aligned as sequences, the way ``diff``
aligns lines:

1. each op gets a key: phase, op name, module path and the text of its source line (not the line number, so code
   that only moved still matches);
2. a shortest edit script over the keys (Myers' O((N+M)·D) algorithm, after stripping the common prefix and
   suffix: cheap when the programs are alike, whatever their length) pairs the ops whose keys are equal;
3. inside each stretch left unpaired, ops with the same phase, op name and module are paired too (the call
   changed: ``h.sum(1)`` became ``h.flip(1).sum(1)``), and what is still left was inserted or deleted.

Example:
    >>> a = [{"op": "aten.mm", "code": "y = x @ w"}, {"op": "aten.sum", "code": "s = y.sum()"}]
    >>> b = [{"op": "aten.mm", "code": "y = x @ w"}, {"op": "aten.flip", "code": "s = y.flip(0).sum()"},
    ...      {"op": "aten.sum", "code": "s = y.flip(0).sum()"}]
    >>> [(r.a, r.b, r.kind) for r in align_ops(a, b)]
    [(0, 0, 'same'), (None, 1, 'inserted'), (1, 2, 'changed')]
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_EDITS = 1000  # beyond this many edits (~1 s) the alignment falls back to pairing occurrences (O(n log n))


@dataclass(frozen=True)
class Row:
    """One line of an alignment: indices into A's and B's ops (None: the op is in one program only)."""

    a: int | None
    b: int | None
    kind: str  # "same" (equal keys), "changed" (same op and module, another call), "deleted", "inserted"


def op_key(op: dict[str, Any]) -> tuple[Any, ...]:
    """What must agree for two ops of two programs to be the same op: phase, op, module, source text."""
    return (op.get("phase"), op["op"], op.get("module"), " ".join(str(op.get("code") or "").split()))


def loose_key(op: dict[str, Any]) -> tuple[Any, ...]:
    """What is left when the call itself changed: phase, op and module."""
    return (op.get("phase"), op["op"], op.get("module"))


def _ids(keys_a: list[Hashable], keys_b: list[Hashable]) -> tuple[list[int], list[int]]:
    """The keys as small integers (faster to compare than tuples)."""
    table: dict[Hashable, int] = {}
    return ([table.setdefault(k, len(table)) for k in keys_a], [table.setdefault(k, len(table)) for k in keys_b])


def _myers(a: Sequence[int], b: Sequence[int], max_edits: int) -> list[tuple[int, int]] | None:
    """Pairs (i, j) of a longest common subsequence by Myers' greedy algorithm; None past ``max_edits`` edits."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return []
    limit = min(n + m, max_edits)
    off = limit + 1
    v = [0] * (2 * limit + 3)
    trace: list[list[int]] = []
    for d in range(limit + 1):
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[off + k - 1] < v[off + k + 1]):
                x = v[off + k + 1]
            else:
                x = v[off + k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[off + k] = x
            if x >= n and y >= m:
                trace.append(v[off - d: off + d + 1])
                return _backtrack(trace, n, m)
        trace.append(v[off - d: off + d + 1])
    return None


def _backtrack(trace: list[list[int]], n: int, m: int) -> list[tuple[int, int]]:
    pairs: list[tuple[int, int]] = []
    x, y = n, m
    for d in range(len(trace) - 1, 0, -1):
        prev = trace[d - 1]  # v after round d-1, for k in [-(d-1), d-1]
        k = x - y
        down = k == -d or (k != d and prev[k - 1 + d - 1] < prev[k + 1 + d - 1])
        pk = k + 1 if down else k - 1
        px = prev[pk + d - 1]
        py = px - pk
        mid = px if down else px + 1
        while x > mid:
            x, y = x - 1, y - 1
            pairs.append((x, y))
        x, y = px, py
    while x > 0 and y > 0:
        x, y = x - 1, y - 1
        pairs.append((x, y))
    return pairs[::-1]


def _occurrences_in_order(a: Sequence[int], b: Sequence[int]) -> list[tuple[int, int]]:
    """The k-th occurrence of each element of ``a`` paired with its k-th in ``b``; of those pairs, a longest
    subset in order in both (a longest increasing subsequence, O(n log n))."""
    where: dict[int, list[int]] = {}
    for j, x in enumerate(b):
        where.setdefault(x, []).append(j)
    seen: dict[int, int] = {}
    pairs = []
    for i, x in enumerate(a):
        k = seen.get(x, 0)
        seen[x] = k + 1
        if k < len(where.get(x, ())):
            pairs.append((i, where[x][k]))
    tails: list[int] = []  # tails[L]: smallest j ending an increasing run of length L+1 (index into pairs)
    back: list[int] = [-1] * len(pairs)
    for n, (_, j) in enumerate(pairs):
        pos = _search(pairs, tails, j)
        back[n] = tails[pos - 1] if pos else -1
        if pos == len(tails):
            tails.append(n)
        else:
            tails[pos] = n
    out, n = [], tails[-1] if tails else -1
    while n >= 0:
        out.append(pairs[n])
        n = back[n]
    return out[::-1]


def _search(pairs: list[tuple[int, int]], tails: list[int], j: int) -> int:
    """The first position in ``tails`` whose pair's j is not below ``j`` (binary search)."""
    lo, hi = 0, len(tails)
    while lo < hi:
        mid = (lo + hi) // 2
        if pairs[tails[mid]][1] < j:
            lo = mid + 1
        else:
            hi = mid
    return lo


def common_pairs(a: Sequence[Hashable], b: Sequence[Hashable], *, max_edits: int = MAX_EDITS) -> list[tuple[int, int]]:
    """Index pairs of equal elements, in order, from a shortest edit script (when the programs differ in more than
    ``max_edits`` places: the k-th occurrence of each element paired with its k-th, kept where in order).

    >>> common_pairs("abcd", "axcd")
    [(0, 0), (2, 2), (3, 3)]
    """
    ia, ib = _ids(list(a), list(b))
    head = 0
    while head < len(ia) and head < len(ib) and ia[head] == ib[head]:
        head += 1
    tail = 0
    while tail < len(ia) - head and tail < len(ib) - head and ia[-1 - tail] == ib[-1 - tail]:
        tail += 1
    mid_a, mid_b = ia[head:len(ia) - tail], ib[head:len(ib) - tail]
    middle = _myers(mid_a, mid_b, max_edits)
    if middle is None:
        middle = _occurrences_in_order(mid_a, mid_b)
    return ([(i, i) for i in range(head)] + [(i + head, j + head) for i, j in middle]
            + [(len(ia) - tail + t, len(ib) - tail + t) for t in range(tail)])


def align_ops(ops_a: list[dict[str, Any]], ops_b: list[dict[str, Any]], *,
              max_edits: int = MAX_EDITS) -> list[Row]:
    """Align two op streams (module docstring): rows in program order, each op of A and of B exactly once."""
    rows: list[Row] = []
    pairs = common_pairs([op_key(o) for o in ops_a], [op_key(o) for o in ops_b], max_edits=max_edits)
    i = j = 0
    for pi, pj in [*pairs, (len(ops_a), len(ops_b))]:
        rows += _refine(ops_a, ops_b, i, pi, j, pj)
        if pi < len(ops_a):
            rows.append(Row(pi, pj, "same"))
        i, j = pi + 1, pj + 1
    return rows


def _refine(ops_a: list[dict[str, Any]], ops_b: list[dict[str, Any]], a0: int, a1: int, b0: int,
            b1: int) -> list[Row]:
    """Rows for the unpaired stretch A[a0:a1] / B[b0:b1]: same op and module paired ("changed"), the rest alone
    (A's deleted ops before B's inserted ones between two pairs)."""
    if a0 >= a1 and b0 >= b1:
        return []
    pairs = common_pairs([loose_key(o) for o in ops_a[a0:a1]], [loose_key(o) for o in ops_b[b0:b1]])
    rows: list[Row] = []
    i, j = a0, b0
    for pi, pj in [*((x + a0, y + b0) for x, y in pairs), (a1, b1)]:
        rows += [Row(k, None, "deleted") for k in range(i, pi)] + [Row(None, k, "inserted") for k in range(j, pj)]
        if pi < a1:
            rows.append(Row(pi, pj, "changed"))
        i, j = pi + 1, pj + 1
    return rows
