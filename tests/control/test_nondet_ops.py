"""The registry and TR203 agree: both come from ``_core/nondet_ops``, and its rows agree with PyTorch's own list.

* every entry of TR203's table names a registry entry (op, device, condition) with the same deterministic-mode
  effect, and every registry row reachable from Python has its linted spellings in TR203's table;
* linting a call of each linted spelling gives the message of the row's effect (switch kernel / raise / nothing);
* every item of ``torch.use_deterministic_algorithms.__doc__`` (the installed torch) is a spelling of a row with the
  same effect, and every row that cites that documentation has such an item.
"""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from torchrepro._core import nondet_ops as facts
from torchrepro._core.nondet_ops import Arg, Row, Spelling
from torchrepro.control.registry import nondeterministic_ops
from torchrepro.lint import LintConfig, lint_source
from torchrepro.lint.rules.determinism import NONDETERMINISTIC_OPS, STATIC_TESTS, Op

# Rows reachable from Python whose spellings TR203 deliberately does not flag (each spelling says why).
NOT_LINTED_ROWS = {("aten.bmm",), ("aten.nll_loss2d_forward",), ("aten.cumsum", "aten.cumsum_")}
# Items of PyTorch's list that are not rows yet (docs/policy.md, "Not covered yet").
NOT_ROWS = {"Tensor.resize_"}
# What a TR203 message says for each effect (the cuDNN flag's rows name the flag instead).
PHRASE = {facts.SWITCHES: "which would switch it to a deterministic kernel", facts.RAISES: "no deterministic kernel",
          facts.NOTHING: "sets neither the variable nor deterministic mode", "cudnn": "torch.backends.cudnn"}


def _lint_ops() -> list[tuple[str, Op]]:
    return [(key, op) for key, ops in NONDETERMINISTIC_OPS.items() for op in ops]


def _key(spelling: Spelling) -> str:
    return spelling.name.removeprefix("Tensor")


def _registry(row: Row) -> list:
    return [e for e in nondeterministic_ops(row.device) if e.op in row.ops and e.condition == row.condition]


@pytest.mark.parametrize(("key", "op"), _lint_ops(), ids=lambda v: v if isinstance(v, str) else v.row.ops[0])
def test_every_lint_entry_is_a_registry_entry_with_the_same_effect(key: str, op: Op) -> None:
    entries = _registry(op.row)
    assert [e.op for e in entries] == list(op.row.ops), f"{key}: TR203 entry without a registry row"
    assert {e.deterministic_mode for e in entries} == {op.row.effect}, key


@pytest.mark.parametrize("row", facts.ROWS, ids=lambda r: f"{r.device}:{r.ops[0]}[{r.condition}]")
def test_every_registry_row_reachable_from_python_is_in_the_lint_table(row: Row) -> None:
    assert row.spellings, f"{row.ops}: no Python spelling recorded"
    entries = _registry(row)
    assert entries, f"{row.ops} ({row.device}): not in the registry"
    linted = [s for s in row.spellings if not s.not_linted]
    assert bool(linted) != (row.ops in NOT_LINTED_ROWS and row.device == "cuda"), row.ops
    for spelling in linted:
        ops = [op for op in NONDETERMINISTIC_OPS.get(_key(spelling), ()) if op.row is row]
        assert [(op.label, op.when) for op in ops] == [(spelling.label, spelling.when)], spelling
        assert {e.deterministic_mode for e in entries} == {ops[0].row.effect}


def test_the_lint_table_has_nothing_else() -> None:
    spelled = {(_key(s), id(row), s.when) for row in facts.ROWS for s in row.spellings if not s.not_linted}
    assert {(key, id(op.row), op.when) for key, op in _lint_ops()} == spelled


def test_every_linted_condition_can_be_judged_in_source() -> None:
    assert set(STATIC_TESTS) == facts.STATIC_TESTS
    for row in facts.ROWS:
        for s in row.spellings:
            assert s.not_linted or s.when is None or s.when.test in facts.STATIC_TESTS, s
            assert s.when is None or s.when.name is None or s.when.position is not None, s


# ---- linting each spelling gives the row's effect --------------------------------------------------------------
_SATISFY = {facts.TRUE: lambda a: "True", facts.FALSE: lambda a: "False", facts.GIVEN: lambda a: "w",
            facts.IN: lambda a: repr(a.values[0]), facts.TENSOR: lambda a: "src"}


def _call(spelling: Spelling) -> str:
    """Source that calls ``spelling`` with its condition met, e.g. ``t.index_put_(i, v, accumulate=False)``."""
    name = "t." + spelling.name.removeprefix("Tensor.") if spelling.name.startswith("Tensor.") else spelling.name
    when: Arg | None = spelling.when
    args = ["a"] * (when.position if when is not None else 1)
    if when is not None:
        args.append(f"{when.name}={_SATISFY[when.test](when)}")
    return f"{name}({', '.join(args)})"


def _reporting_row(spelling: Spelling) -> Row:
    """The row a call of ``spelling`` is reported with: the first with this spelling and condition (CUDA first)."""
    return next(op.row for op in NONDETERMINISTIC_OPS[_key(spelling)] if op.when == spelling.when)


_CASES = [(row, s) for row in facts.ROWS for s in row.spellings if not s.not_linted]


@pytest.mark.parametrize(("row", "spelling"), _CASES, ids=[f"{r.device}:{s.name}:{r.ops[0]}" for r, s in _CASES])
def test_linting_each_spelling_says_what_deterministic_mode_does(row: Row, spelling: Spelling) -> None:
    source = textwrap.dedent(f"""\
        import torch

        def f(t, a, w, src):
            return {_call(spelling)}

        if __name__ == "__main__":
            torch.manual_seed(0)
            torch.set_default_device("cuda")  # runs on CUDA: TR203 reports CUDA-only ops only then
        """)
    found = lint_source(source, "train.py", LintConfig(select=("TR203",)))
    assert [d.line for d in found] == [4], (source, found)
    message = found[0].message
    assert message.startswith(spelling.label), message
    reported = _reporting_row(spelling)
    assert PHRASE["cudnn" if reported.cudnn else reported.effect] in message, message
    if reported is not row:  # an earlier row with the same spelling and condition: a CUDA row
        assert reported.device == "cuda", (row.ops, reported.ops)
        # a CPU row fills gaps only; another CUDA row of the same call (conv forward/backward) says the same
        assert row.device == "cpu" or (reported.effect, reported.cudnn) == (row.effect, row.cudnn), row.ops


# ---- the rows agree with PyTorch's documented list --------------------------------------------------------------
_ITEM = re.compile(r"\*\s+:(?:class|func):`(?P<name>[\w.]+)`(?P<rest>[^*]*)")
_SECTIONS = {effect: re.compile(rf"normally-nondeterministic\s+operations\s+will\s+{verb}")
             for effect, verb in ((facts.SWITCHES, "act"), (facts.RAISES, "throw"))}


def _documented() -> list[tuple[str, str, frozenset[str]]]:
    """(spelling name, effect, device kinds) of each item of the installed torch's list."""
    doc = torch.use_deterministic_algorithms.__doc__ or ""
    starts = {effect: (m.start() if (m := marker.search(doc)) else -1) for effect, marker in _SECTIONS.items()}
    if min(starts.values()) < 0:
        pytest.skip("this torch's use_deterministic_algorithms docstring has another layout")
    end = doc.find("In addition", starts[facts.RAISES])
    parts = {facts.SWITCHES: doc[starts[facts.SWITCHES]:starts[facts.RAISES]],
             facts.RAISES: doc[starts[facts.RAISES]:end if end > 0 else None]}
    items = []
    for effect, text in parts.items():
        for m in _ITEM.finditer(text):
            name = m.group("name").replace("torch.Tensor.", "Tensor.")
            rest = m.group("rest")
            devices = frozenset(d for d in ("cpu", "cuda") if d.upper() in rest) or frozenset({"cpu", "cuda"})
            items.append((name, effect, devices))
    assert len(items) > 40, "the list was not parsed"
    return items


def _rows_spelling(name: str, device: str) -> list[Row]:
    return [r for r in facts.rows_for(device) if any(s.name == name for s in r.spellings)]


def test_every_documented_item_is_a_row_with_the_same_effect() -> None:
    missing = []
    for name, effect, devices in _documented():
        if name in NOT_ROWS:
            continue
        for device in sorted(devices):
            if effect not in {r.effect for r in _rows_spelling(name, device)}:
                missing.append(f"{name} on {device}: documented '{effect}', rows say "
                               f"{sorted({r.effect for r in _rows_spelling(name, device)})}")
    assert not missing, "\n".join(missing)


def test_every_row_citing_the_documentation_has_a_documented_item() -> None:
    documented = {(name, effect, d) for name, effect, devices in _documented() for d in devices}
    for row in facts.rows_for("cuda"):
        if row.source == facts.DOCS:
            assert any((s.name, row.effect, "cuda") in documented for s in row.spellings), row.ops
