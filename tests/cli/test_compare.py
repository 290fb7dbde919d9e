"""End to end: `torchrepro compare 'CMD_A' 'CMD_B'` on real processes (tests/scripts/sum_order.py: the
summation-order script, its parameters updated by hand: without torch.optim, whose first use costs a run 1 CPU s).

Every command runs in this process (tests/inprocess.py): its training runs are processes of their own. The compares
that train are run once per module (fixtures); the tests that only read their recordings call the CLI in this
process on the run directories they left.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.inprocess import torchrepro
from torchrepro.cli import main

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SCRIPT = SCRIPTS / "sum_order.py"


def _line_of(marker: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), start=1) if marker in line)


def _compare(out: Path, *args: str) -> tuple[int, dict, str]:
    """`compare --json`, in this process."""
    p = torchrepro("compare", "--json", "--out", str(out), *args, timeout=900)
    return p.returncode, (json.loads(p.stdout) if p.stdout.strip() else {}), p.stderr


@pytest.fixture(scope="module")
def order(tmp_path_factory):
    """Summation order (--locate): compared once, read by several tests."""
    a, b = f"python {SCRIPT}", f"python {SCRIPT} --reverse"
    return _compare(tmp_path_factory.mktemp("order"), "--locate", "--max-steps", "2", a, b)


def test_same_command_is_identical(tmp_path):
    a = f"python {SCRIPT}"
    rc, doc, err = _compare(tmp_path / "same", "--max-steps", "2", a, a)
    assert rc == 0, err
    assert doc["schema"] == "torchrepro.compare/1" and doc["verdict"] == "identical" and doc["exit_code"] == 0
    assert doc["first_divergent_step"] is None and doc["differences"] == [] and doc["steps"] == [2, 2]


def test_summation_order_diverges_at_step_1_and_locate_names_both_lines(order):
    rc, doc, err = order
    assert rc == 1, err
    assert doc["verdict"] == "diverged" and doc["first_divergent_step"] == 1 and doc["cause"] == "compute"
    assert doc["tolerance"]["bitwise"] is True and doc["action"] is None  # located: no advice to locate
    loc = doc["locate"]
    assert loc["verdict"] == "program" and loc["traced_steps"] == [1]
    cause, op = loc["cause"], loc["op"]
    assert cause["kind"] == "inserted" and cause["a"] is None
    assert (cause["b"]["op"], cause["b"]["line"]) == ("aten.flip", _line_of("REVERSED-SUM"))
    # the first value it changes: the sum, named on both sides with its own line
    assert op["a"]["op"] == op["b"]["op"] == "aten.sum"
    assert (op["a"]["line"], op["b"]["line"]) == (_line_of("FORWARD-SUM"), _line_of("REVERSED-SUM"))
    assert loc["difference"]["max_abs"] > 0 and loc["values_kept"][0] > 0
    assert Path(loc["op_table"]).is_file()


def test_the_same_pair_within_a_tolerance_is_equivalent(order, tmp_path, capsys):
    """The recordings of the pair, compared again in this process within rtol=1e-4 (no new training runs)."""
    runs = order[1]["runs"]
    assert main(["compare", "--json", "--rtol", "1e-4", "--out", str(tmp_path / "eq"), *runs]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "equivalent" and doc["first_out_of_tolerance"] is None
    worst = doc["largest_abs_difference"]
    assert worst["within"] is True and 0 < worst["max_abs"] and worst["rtol"] == 1e-4
    assert doc["compared_by_value"] > 0 and doc["bitwise_only"] == []
    # and bitwise (the default), the text names the step, the tolerance it would need and the runs
    assert main(["compare", "--out", str(tmp_path / "bw"), *runs]) == 1
    text = capsys.readouterr().out
    assert "DIVERGED at step 1" in text and "`--rtol dtype` would accept them" in text
    assert f"Next:  `torchrepro compare --locate {runs[0]} {runs[1]}` names the first op" in text
    assert "within what you accept." in text
    # within a tolerance, the advice no longer offers one
    assert main(["compare", "--json", "--rtol", "1e-4", "--out", str(tmp_path / "eq2"), *runs]) == 0
    action = json.loads(capsys.readouterr().out)["action"]
    assert action.endswith("with its module and source line on both sides.") and "--rtol/--atol" not in action
    assert action.startswith(f"`torchrepro compare --rtol 0.0001 --locate {runs[0]} {runs[1]}`")  # pasted: the same


def test_locate_text_from_recorded_traces(order, tmp_path, capsys):
    """`compare --locate` on the traced re-runs' directories: the text names the op and both lines."""
    traced = order[1]["locate"]["traced_in"]
    assert main(["compare", "--locate", "--out", str(tmp_path / "loc"), *traced]) == 1
    text = capsys.readouterr().out
    assert "Locate: the programs differ: B runs an op A does not" in text
    assert "aten.flip" in text and f"{SCRIPT}:{_line_of('REVERSED-SUM')}" in text
    assert f"{SCRIPT}:{_line_of('FORWARD-SUM')}" in text
    # the outputs differ; the tolerance line must not read as if they did not
    assert "the difference comes from the program difference above" in text and "Within the" not in text


def test_eager_vs_compiled_names_the_compiled_kernel(tmp_path):
    rc, doc, err = _compare(tmp_path / "compiled", "--locate", "--max-steps", "1", f"python {SCRIPT}",
                            f"python {SCRIPT} --compile")
    assert rc == 1, err
    assert doc["verdict"] == "diverged"
    assert doc["compiled"]["a"] == [] and doc["compiled"]["b"][0]["target"] == "Net"
    loc = doc["locate"]
    assert loc["compiled"] is True and loc["side"] == "B" and loc["verdict"] == "compiled-kernel", loc
    assert loc["op"]["file"] == str(SCRIPT) and loc["op"]["line"] and loc["op"]["op"].startswith("aten.")
    assert loc["difference"]["max_abs"] > 0


@pytest.mark.parametrize("args, message", [
    (["python nope.py", "python nope.py"], "command A (`python nope.py`): script 'nope.py' does not exist"),
    (["python -c 1", "ls -l"], "command B (`ls -l`): torchrepro records Python training scripts"),
    ([".", "python x.py"], "A '.' is a directory but not a run directory (it holds no manifest.json)"),
    (["", "python x.py"], "command A '' holds no command"),
    (["python 'x.py", "python x.py"], "cannot be split into words"),
    (["--rtol", "-1", "a", "b"], "expected a tolerance"),
])
def test_bad_input_is_exit_2_with_one_json_document(args, message, capsys, tmp_path):
    assert main(["compare", "--json", "--out", str(tmp_path / "o"), *args]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["schema"] == "torchrepro.compare/1" and doc["verdict"] == "error" and doc["exit_code"] == 2
    assert message in doc["error"]
    assert not (tmp_path / "o").exists()


def test_the_report_shows_the_verdict_the_tensors_and_both_lines(order):
    """report.html of the summation-order pair, rendered: the verdict, the tensors by value, the located program
    difference with both source lines, and the plots."""
    from tests.cli.browser import dump_dom, network_references

    page = Path(order[1]["report"])
    assert page == Path(order[1]["out"]) / "report.html"
    dom = dump_dom(page)
    assert "torchrepro compare" in dom and "DIVERGED" in dom and "at step 1" in dom
    assert "Tensors compared by value" in dom and "x tolerance" in dom
    assert "aten.flip" in dom and f"{SCRIPT}:{_line_of('REVERSED-SUM')}" in dom
    assert "<polyline" in dom and network_references(page.read_text()) == []
    # right under the verdict: what --locate found, on B's side; then (as in check's page) Locate, then the tensors
    box = dom[dom.index('<div class="next" id="next">'):]
    box = box[:box.index("</div>")]
    assert "Found:" in box and f"B <code>aten.flip</code> at <code>{SCRIPT}:{_line_of('REVERSED-SUM')}</code>" in box
    assert dom.index('id="next"') < dom.index('id="runs"') < dom.index('id="locate"') < dom.index('id="tensors"')
    # the Locate section is check's op table, not the terminal's text: B's flip (A has none) is the origin row
    located = dom[dom.index('<section id="locate">'):]
    located = located[:located.index("</section>")]
    assert "<pre>" not in located and "<table>" in located
    origin = located[located.index('<tr class="origin">'):]
    origin = origin[:origin.index("</tr>")]
    assert ">- | aten.flip<" in origin and f">- | {_line_of('REVERSED-SUM')}<" in origin
    assert 'class="effect"' in located and f"{_line_of('FORWARD-SUM')} | {_line_of('REVERSED-SUM')}" in located


def test_an_end_state_without_values_is_not_called_equivalent(order, tmp_path, capsys):
    """The pair again, as if recorded without --keep-values (no snapshots): the losses agree within rtol=1e-4,
    but the differing parameters cannot be measured, so the verdict is diverged and says why (it was equivalent),
    and what to do: record with values (not "raise --values-budget", which cannot help)."""
    import shutil

    runs = []
    for run in order[1]["runs"]:
        copy = tmp_path / Path(run).parent.name
        shutil.copytree(run, copy)
        shutil.rmtree(copy / "values")
        runs.append(str(copy))
    assert main(["compare", "--json", "--rtol", "1e-4", "--out", str(tmp_path / "nv"), *runs]) == 1
    doc = json.loads(capsys.readouterr().out)
    measured = {d["kind"] for d in doc["differences"] if d["max_abs"] is not None}
    assert doc["verdict"] == "diverged" and measured <= {"loss"}
    first = doc["first_out_of_tolerance"]
    assert first["kind"] == "params" and first["within"] is False
    assert first["reason"] == ("no values of it were recorded (the run was recorded without --keep-values), so it "
                               "cannot be shown to be within the tolerance; record it with `torchrepro run "
                               "--keep-values --record DIR -- ...`")
    assert main(["compare", "--rtol", "1e-4", "--out", str(tmp_path / "nv2"), *runs]) == 1
    text = capsys.readouterr().out
    assert "A and B were recorded without values" in text and "raise --values-budget" not in text


def test_an_out_over_a_run_it_reads_is_refused_and_the_run_kept(order, tmp_path, capsys):
    run_a, run_b = order[1]["runs"]
    before = (Path(run_a) / "manifest.json").read_bytes()
    for out in (run_a, str(Path(run_a).parent), str(Path(run_a) / "sub")):
        assert main(["compare", "--json", "--out", out, run_a, run_b]) == 2
        doc = json.loads(capsys.readouterr().out)
        assert f"--out {out} overlaps run directory A ({run_a}): compare would write over the run it reads" \
            in doc["error"]
    assert (Path(run_a) / "manifest.json").read_bytes() == before and not (Path(run_a) / "sub").exists()


def test_a_damaged_run_directory_is_refused_before_the_other_command_runs(tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text('{"format": "torchrepro-run", "vers')
    assert main(["compare", "--json", "--out", str(tmp_path / "o"), str(bad), "python -c 1"]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "manifest.json: is not valid JSON" in doc["error"] and "command B" not in captured.err
    assert not (tmp_path / "o").exists()


SNAPSHOT_SCRIPT = """import os, torch
torch.manual_seed(0)
m = torch.nn.Linear(8, 1)
if os.path.exists("snap.pt"):
    m.load_state_dict(torch.load("snap.pt", weights_only=True))
x, y = torch.randn(16, 8), torch.randn(16, 1)
for _ in range(2):  # updated by hand (torch.optim's first use costs about 1 s of CPU)
    ((m(x) - y) ** 2).mean().backward()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
torch.save(m.state_dict(), "snap.pt")
"""


def test_b_reading_what_a_wrote_in_the_working_directory_is_the_cause(tmp_path):
    """As check does: B starts from A's snapshot.pt, so the divergence is blamed on the shared directory (it was
    blamed on initial weights)."""
    (tmp_path / "train.py").write_text(SNAPSHOT_SCRIPT)
    p = torchrepro("compare", "--json", "--out", str(tmp_path / "o"), "python train.py", "python train.py",
                   cwd=tmp_path, timeout=600)
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["verdict"] == "diverged", p.stderr
    assert doc["cause"] == "shared-working-directory"
    assert doc["explanation"].startswith("B read what A wrote in the working directory both commands ran in: "
                                         "B opened snap.pt (created by A).")
    assert doc["working_directory"]["read_from_earlier_run"][0]["path"] == "snap.pt"
    assert doc["working_directory"]["cause_otherwise"] == "initial-weights"


NUDGE = textwrap.dedent("""
    import sys, torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for _ in range(3):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    if "--nudge" in sys.argv:  # after training: e.g. a weight tying or rounding pass before saving
        with torch.no_grad():
            model.weight.add_(1e-3)
""")


def test_parameters_changed_after_the_last_step_are_called_final_parameters(tmp_path, capsys, monkeypatch):
    (tmp_path / "t.py").write_text(NUDGE)
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--out", str(tmp_path / "out"), "python t.py", "python t.py --nudge"]) == 1
    text = capsys.readouterr().out
    headline = text.splitlines()[0]
    assert headline.endswith("; even out of the per-dtype default tolerance in the final parameters (changed after "
                             "the last step)."), headline
    assert "from step 4 on" not in text
