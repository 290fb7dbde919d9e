"""report.html, rendered in a real headless browser: what a reader sees, that nothing is fetched from the network,
and that hostile strings (file names, commands, op names, env values, source lines) stay text."""

from __future__ import annotations

import html
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.browser import dump_dom, ink, network_references, screenshot
from tests.inprocess import torchrepro as in_process

ROOT = Path(__file__).resolve().parents[2]
ANSI, BIDI = "\x1b[31m", "\u202e"
HOSTILE_DIR = 'evil<b>&"q\'</script>'  # a '/' ends a name: the path itself spells </script>
HOSTILE_TAG = "</script><img src=x onerror=alert(1)>&amp;"
SCRIPT = f'''
import sys
import torch
from torch import nn

torch.set_num_threads(2)
torch.manual_seed(0)
nodes, edges = 2000, 600_000
h0, target = torch.randn(nodes, 16), torch.randn(nodes)
dst = torch.randint(0, nodes, (edges,))
model = nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    msg = model(h0).repeat(edges // nodes, 1)  # its backward is a sum in a fixed order: one nondeterministic op
    index = (dst.unsqueeze(1) * 16 + torch.arange(16)).reshape(-1)
    out = torch.zeros(nodes * 16).index_put_((index,), msg.reshape(-1), accumulate=True)  # <i>&"{ANSI}{BIDI}
    nn.functional.mse_loss(out.view(nodes, 16).sum(1), target).backward()
    opt.step()
'''


def _torchrepro(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``torchrepro ARGS`` in ``cwd``, in this process (tests/inprocess.py): `check`'s runs are processes of their
    own; `env` and `audit` describe this process's environment."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return in_process(*args, cwd=cwd, env=env, timeout=600)


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict:
    """`check --locate` of a scatter-add script (nondeterministic on 2 threads) whose path, arguments and source
    line hold hostile strings."""
    root = tmp_path_factory.mktemp("report")
    folder = root / HOSTILE_DIR.split("/")[0]
    (folder / HOSTILE_DIR.split("/")[1]).mkdir(parents=True)
    script = folder / HOSTILE_DIR.split("/")[1] / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    out = root / "out"
    p = _torchrepro("check", "--locate", "--json", "--out", str(out), "--", "python", str(script), "--tag",
                    HOSTILE_TAG, "--name", ANSI + BIDI, cwd=root)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    return {"doc": json.loads(p.stdout), "out": out, "script": script, "root": root}


def test_check_writes_a_report_that_the_browser_shows_with_verdict_op_source_and_plots(checked):
    out, doc = checked["out"], checked["doc"]
    page = out / "report.html"
    assert doc["report"] == str(page) and page.is_file()
    assert doc["locate"]["verdict"] == "origin" and doc["locate"]["op"]["op"] == "aten.index_put_"
    dom = dump_dom(page)
    assert "DIVERGED" in dom and "at step 1" in dom
    assert "aten.index_put_" in dom and "nondeterministic operation" in dom
    assert html.escape(doc["locate"]["op"]["code"].split("#")[0].strip(), quote=False) in dom  # the source line
    assert doc["locate"]["fix"] in html.unescape(dom)  # the fix, word for word as the terminal prints it
    assert dom.count("<svg") >= 2 and "<polyline" in dom  # the loss curves and the growth of |Δ|
    assert 'class="origin"' in dom  # the origin row of the op table and of the source excerpt
    assert "Tensors where they first differ" in dom


def _box(page: str) -> str:
    """The box right under the verdict (what was found, the fix, the next command)."""
    start = page.index('<div class="next" id="next">')
    return page[start:page.index("</div>", start)]


def test_the_fix_comes_right_after_the_verdict_before_the_evidence(checked):
    """The verdict, then what --locate found and the fix; the runs, the op table and the per-tensor table after.
    The terminal's "See Locate below" is not repeated: the box says what Locate found."""
    doc, page = checked["doc"], (checked["out"] / "report.html").read_text(encoding="utf-8")
    box = html.unescape(_box(page))
    assert f"Fix: {doc['locate']['fix']}" in box.replace("<strong>", "").replace("</strong>", "")
    assert "Found:" in box and "aten.index_put_" in box and f"{checked['script']}:" in box
    assert 'href="#locate"' in _box(page)
    order = [page.index(mark) for mark in ("</header>", 'id="next"', 'id="runs"', 'id="locate"', 'id="tensors"')]
    assert order == sorted(order), order
    assert "See Locate below" not in page and page.count("<strong>Fix:</strong>") == 1  # once, at the top


def test_every_report_opens_with_the_verdict_then_what_to_do(tmp_path):
    """compare, bisect and check --resume-at (check's own: the test above): the box comes right after the header,
    before the first section."""
    from torchrepro.analysis.compare import CheckResult, Difference
    from torchrepro.analysis.crossrun import CompareResult
    from torchrepro.analysis.resumeat import ResumeResult
    from torchrepro.analysis.tolerance import Tolerance
    from torchrepro.cli._html.reports import bisect_report, compare_report, resume_report
    from torchrepro.record.store import Run

    check = CheckResult("diverged", ["a", "b"], "optimizer", [2, 2], first_step=1,
                        first=[Difference("params", 1, ["w"])], kind_first_steps={"params": 1}, cause="compute",
                        losses=[[1.0, 0.5], [1.0, 0.6]], loss_delta=[0.0, 0.1], param_delta={0: 0.0, 1: 1e-3})
    compared = CompareResult(check=check, tolerance=Tolerance(bitwise=True), commands=["python a.py", "python b.py"],
                             verdict="diverged")
    sides = [Run(path=tmp_path / side, manifest={}, events=[]) for side in "ab"]
    resumed = ResumeResult(k=4, comparison=check, trainer="script", checkpoint=None, runs={}, steps={},
                           cause="rng-state", step=5)
    pages = {"compare": compare_report(compared, compared.to_json() | {"locate": SIDED}, sides, tmp_path),
             "bisect": bisect_report({"verdict": "found", "command": "python t.py", "chain": [
                 {"sha": "a" * 40, "subject": "good", "verdict": "good"},
                 {"sha": "b" * 40, "subject": "flip the sum", "verdict": "bad"}],
                 "first_bad_commit": {"sha": "b" * 40, "subject": "flip the sum"}, "locate": SIDED,
                 "tested": [{"index": 1, "sha": "b" * 40, "subject": "flip the sum", "verdict": "bad"}]},
                 tmp_path, "torchrepro: FOUND - bbbbbbbbbbbb 'flip the sum'"),
             "resume": resume_report(resumed, {}, tmp_path, command="`python t.py`",
                                     text="torchrepro: RESUME DIVERGED at step 5")}
    for command, page in pages.items():
        assert page.index("</header>") < page.index('id="next"') < page.index("<section"), command
    for command in ("compare", "bisect"):
        box = _box(pages[command])
        assert "Found:</strong> the programs differ: B runs an op A does not: B <code>aten.flip</code> at " \
               "<code>/s/b.py:23</code>" in box, command
    assert "First bad commit:</strong> <code>bbbbbbbbbbbb</code> flip the sum" in _box(pages["bisect"])
    assert f"Fix:</strong> {html.escape(resumed.fix)}" in _box(pages["resume"]) and resumed.fix


SITE = {"phase": "forward", "module": "layers.0.update_gate", "file": "/s/a.py", "step": 1}
SIDED = {  # compare --locate of `x.sum()` against `x.flip(0).sum()`: B runs an op A does not
    "verdict": "program", "title": "the programs differ: B runs an op A does not", "traced_steps": [1],
    "ops_traced": [3, 4], "aligned": {"same": 2, "changed": 1, "deleted": 0, "inserted": 1},
    "cause": {"row": 1, "kind": "inserted", "a": None, "inputs": None, "outputs": None,
              "b": {**SITE, "op": "aten.flip", "index": 1, "file": "/s/b.py", "line": 23, "code": "x.flip(0).sum()"}},
    "op": {"row": 2, "kind": "changed", "inputs": "differ", "outputs": "differ",
           "a": {**SITE, "op": "aten.sum", "index": 1, "line": 24, "code": "x.sum()"},
           "b": {**SITE, "op": "aten.sum", "index": 2, "file": "/s/b.py", "line": 23, "code": "x.flip(0).sum()"}},
    "difference": None, "tolerance": {"bitwise": True}, "tolerance_op": None, "program_differences": [],
    "context": [
        {"row": 0, "kind": "same", "mark": "", "inputs": "equal", "outputs": "equal",
         "a": {**SITE, "op": "aten.mul", "index": 0, "line": 20, "code": "x = w * 2"},
         "b": {**SITE, "op": "aten.mul", "index": 0, "file": "/s/b.py", "line": 20, "code": "x = w * 2"}},
        {"row": 1, "kind": "inserted", "mark": "*", "inputs": None, "outputs": None, "a": None,
         "b": {**SITE, "op": "aten.flip", "index": 1, "file": "/s/b.py", "line": 23, "code": "x.flip(0).sum()"}},
        {"row": 2, "kind": "changed", "mark": "=>", "inputs": "differ", "outputs": "differ",
         "a": {**SITE, "op": "aten.sum", "index": 1, "line": 24, "code": "x.sum()"},
         "b": {**SITE, "op": "aten.sum", "index": 2, "file": "/s/b.py", "line": 23, "code": "x.flip(0).sum()"}}]}


def test_compare_locate_is_the_same_op_table_as_checks(tmp_path):
    """compare's (and bisect's) locate: an op table, the program difference highlighted as the origin, B's op
    beside A's missing one, the module and both source lines; no terminal dump."""
    from torchrepro.cli._compare_locate_render import render_compare_locate
    from torchrepro.cli._html.locate import locate

    markup = str(locate(SIDED, render_compare_locate(SIDED)))
    assert "<pre>" not in markup and "<table>" in markup
    rows = markup[markup.index("<tbody>"):].split("<tr")[1:]
    assert [r[:r.index(">")] for r in rows] == ["", ' class="origin"', ' class="effect"']
    origin = rows[1]
    assert '<td data-sort="1">- | 1</td>' in origin and ">- | aten.flip<" in origin and ">- | 23<" in origin
    assert "layers.<wbr>0.<wbr>update_<wbr>gate" in origin and "<code>x.flip(0).sum()</code>" in origin
    assert ">24 | 23<" in rows[2] and "<code>A: x.sum()</code><br><code>B: x.flip(0).sum()</code>" in rows[2]
    assert "Fix:" not in markup  # the fix (when there is one) is in the box under the verdict


def test_check_rows_and_compare_rows_give_the_same_table():
    """One renderer: a check row and the compare row of the same op on both sides give the same cells."""
    from torchrepro.cli._html.locate import op_table

    site = {**SITE, "op": "aten.index_put_", "index": 7, "line": 19, "code": "out.index_put_(i, m)"}
    check_row = {"i": 7, "i_other_run": 7, "op": "aten.index_put_", "op_other_run": "aten.index_put_",
                 "phase": "forward", "module": SITE["module"], "line": 19, "code": "out.index_put_(i, m)",
                 "inputs_equal": True, "outputs_equal": False, "origin": True}
    compare_row = {"row": 7, "kind": "same", "a": site, "b": site, "inputs": "equal", "outputs": "differ", "mark": "=>"}
    body = [str(op_table([r]))[str(op_table([r])).index("<tbody>"):] for r in (check_row, compare_row)]
    assert body[0] == body[1] and '<tr class="origin">' in body[0] and "≠ differ" in body[0]


def test_a_long_module_name_wraps_only_at_dots_and_underscores(tmp_path):
    """In a narrow column a dotted name breaks after '.' or '_', never inside a word; a table wider than its box
    scrolls inside the box, not the page."""
    from torchrepro.cli._html.page import document, name, table, td

    long = "transformer.layers.0.update_gate.linear_projection.weight"
    word = "x" * 120  # a name with no dot cannot wrap: its table box scrolls
    # the character before each line break of the name's cell, and the name as the reader's text
    probe = """
    var c=document.querySelector('td.name span'),out=[],last=null,text='';
    var w=document.createTreeWalker(c,NodeFilter.SHOW_TEXT),n;
    while((n=w.nextNode())){for(var i=0;i<n.length;i++){var r=document.createRange();r.setStart(n,i);
     r.setEnd(n,i+1);var y=r.getClientRects()[0].top;if(last!==null&&y>last+2)out.push(text.slice(-1));last=y;
     text+=n.data[i];}}
    var box=document.querySelectorAll('.tablebox')[1],wrap=document.getElementById('w');
    document.body.setAttribute('data-breaks',out.join(''));document.body.setAttribute('data-text',text);
    document.body.setAttribute('data-scrolls',String(box.scrollWidth>box.clientWidth));
    document.body.setAttribute('data-contained',String(wrap.scrollWidth<=wrap.clientWidth+1));"""
    page = document("names", ['<div id="w" style="width:130px">', table(["module"], [[td(name(long), cls="name")]]),
                              table(["module"], [[td(name(word), cls="name")]]), "</div>"])
    (tmp_path / "names.html").write_text(page.replace("</body>", f"<script>{probe}</script></body>"))
    dom = dump_dom(tmp_path / "names.html")
    import re

    breaks = re.search(r'data-breaks="([^"]*)"', dom).group(1)
    assert f'data-text="{long}"' in dom  # the name reads (and copies) as it is: <wbr> adds no character
    assert len(breaks) >= 2 and set(breaks) <= {".", "_"}, breaks  # wrapped, and only after a dot or underscore
    assert 'data-scrolls="true"' in dom and 'data-contained="true"' in dom


def test_equal_loss_curves_both_show_and_the_difference_is_drawn():
    """Two runs with the same loss at every step but the last: run 1 wide and pale under run 2, which is dashed
    and marked; the growth chart draws |Δ loss| beside |Δ param|."""
    import re

    from torchrepro.analysis.compare import CheckResult
    from torchrepro.cli._html.sections import plots

    losses = [[1.0 / k for k in range(1, 31)], [1.0 / k for k in range(1, 30)] + [0.04]]
    result = CheckResult("diverged", ["a", "b"], "optimizer", [30, 30], first_step=30, cause="compute",
                         losses=losses, loss_delta=[0.0] * 29 + [abs(0.04 - 1 / 30)], param_delta={30: 1e-3})
    loss_chart, growth_chart = str(plots(result)).split("</svg>")[:2]
    lines = re.findall(r"<polyline [^>]*>", loss_chart)
    assert len(lines) == 2 and 'stroke-width="4.5" stroke-opacity="0.4"' in lines[0]
    assert 'stroke-dasharray="6 4"' in lines[1] and 'stroke-dasharray' not in lines[0]
    assert loss_chart.count('fill="none" stroke="var(--s1)" stroke-width="1.4"') >= 10  # run 2's markers
    assert "max |Δ loss| vs run 1" in growth_chart and "max |Δ param| vs run 1" in growth_chart


def test_the_report_references_nothing_outside_itself(checked):
    text = (checked["out"] / "report.html").read_text(encoding="utf-8")
    assert network_references(text) == []
    assert text.count("<script") == 1  # ours, at the end; no other script element


def test_the_report_links_the_files_it_names_relative_to_itself(checked):
    import re
    from urllib.parse import unquote

    out = checked["out"]
    page = (out / "report.html").read_text(encoding="utf-8")
    hrefs = re.findall(r'href="([^"]+)"', page)
    assert hrefs and not any(h.startswith(("/", "file:")) for h in hrefs)
    for h in hrefs:
        if h.startswith("#"):  # the section links at the top
            assert f'id="{h[1:]}"' in page, h
        else:
            assert (out / unquote(h)).exists(), h
    assert {"#locate", "#plots", "#tensors"} <= set(hrefs)
    assert "check.json" in hrefs and "run1/" in hrefs


def test_hostile_strings_stay_text(checked):
    text = (checked["out"] / "report.html").read_text(encoding="utf-8")
    dom = dump_dom(checked["out"] / "report.html")
    for raw in (ANSI, BIDI, "\x1b"):
        assert raw not in text and raw not in dom
    assert "\\x1b[31m\\u202e" in html.unescape(text)  # shown as Python writes them
    assert "<img" not in dom and "<i>" not in dom and "<b>" not in dom  # no element made of recorded text
    assert html.escape(HOSTILE_TAG) in text  # the argument, escaped (its &amp; too)
    assert html.escape("evil<b>&\"q'", quote=True) in text  # the file name


def test_the_screenshot_is_not_blank_in_light_and_dark_mode(checked, tmp_path):
    light = ink(screenshot(checked["out"] / "report.html", tmp_path / "light.png"))
    dark = ink(screenshot(checked["out"] / "report.html", tmp_path / "dark.png", dark=True))
    for share, colours in (light, dark):
        assert share > 0.02 and colours > 20, (share, colours)
    from PIL import Image

    corner = [Image.open(tmp_path / f"{m}.png").convert("L").getpixel((5, 5)) for m in ("light", "dark")]
    assert corner[0] > 200 and corner[1] < 60  # the page follows the system's colour scheme


def test_the_tables_sort_when_a_column_is_clicked(tmp_path):
    from torchrepro.cli._html.page import document, num, table, td

    rows = [[name, td(num(v), v)] for name, v in (("w", 3e-3), ("x", 1e-9), ("y", 2.0), ("z", None))]
    order = ("Array.from(document.querySelectorAll('tbody tr')).map(r=>r.cells[0].textContent).join('')")
    clicks = ("var b=document.querySelectorAll('th button')[1];b.click();document.body.setAttribute('data-up',"
              f"{order});b.click();document.body.setAttribute('data-down',{order});")
    page = document("sort", [table(["tensor", "max"], rows, sortable=True)])
    (tmp_path / "sort.html").write_text(page.replace("</body>", f"<script>{clicks}</script></body>"))
    dom = dump_dom(tmp_path / "sort.html")
    assert 'data-up="xwyz"' in dom and 'data-down="ywxz"' in dom  # numbers by value (1e-9 < 3e-3); "-" last
    assert 'aria-sort="descending"' in dom


def test_compare_bisect_and_env_reports_escape_the_same_way():
    """Op names, module names and env values from another machine are escaped in every report."""
    from torchrepro.cli._html.locate import locate
    from torchrepro.cli._html.reports import env_diff_report

    evil = f"aten.<script>alert(1)</script>&{ANSI}{BIDI}"
    loc = locate({"verdict": "origin", "title": "t", "op": {"op": evil, "module": evil, "file": evil,
                                                                     "line": 3, "code": evil, "phase": "forward"},
                           "op_index": 1, "step": 1, "context": [{"i": 1, "op": evil, "module": evil, "line": 3,
                                                                  "code": evil, "origin": True,
                                                                  "inputs_equal": True, "outputs_equal": False}],
                           "fix": evil}, evil)
    env = env_diff_report({"verdict": "breaks-bitwise", "counts": {"breaks-bitwise": 1}, "changes": [
        {"key": evil, "a": evil, "b": 3, "rank": "breaks-bitwise", "reason": evil}]}, a=evil, b=evil, headline=evil)
    for markup in (loc, env):
        assert "<script>alert" not in markup and "\x1b" not in markup and BIDI not in markup
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;\\x1b[31m\\u202e" in markup


def test_a_long_run_gives_a_small_report(tmp_path):
    """100,000 steps: the curves are downsampled and the growth table cut around the first divergence."""
    from torchrepro.analysis.compare import CheckResult, Difference
    from torchrepro.cli._html.reports import check_report
    from torchrepro.cli._html.svg import MAX_POINTS

    n = 100_000
    result = CheckResult("diverged", ["a", "b"], "optimizer", [n, n], first_step=50_000,
                         first=[Difference("params", 50_000, ["w"])], kind_first_steps={"params": 50_000},
                         cause="compute", losses=[[1.0 / (k + 1) for k in range(n)]] * 2,
                         loss_delta=[0.0] * n, param_delta={k: (k >= 50_000) * 1e-7 * k for k in range(n)})
    page = check_report(result, {}, [], tmp_path, command="`python long.py`")
    assert len(page.encode()) < 2_000_000
    import re

    for points in re.findall(r'points="([^"]+)"', page):
        assert len(points.split()) <= MAX_POINTS
    assert "steps left out (check.json holds them all)" in page
    assert ">50000<" in page  # the first divergent step is in the table


def test_env_diff_and_audit_write_html_on_request(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert _torchrepro("env", "--json", "-o", str(a), cwd=tmp_path).returncode == 0
    env = json.loads(a.read_text())
    env["env"]["OMP_NUM_THREADS"] = f"<b>{ANSI}</b>"
    env["threads"]["intra_op"] = 99
    b.write_text(json.dumps(env))
    p = _torchrepro("env", "diff", str(a), str(b), "--html", str(tmp_path / "env.html"), cwd=tmp_path)
    assert p.returncode in (0, 1), p.stderr
    page = (tmp_path / "env.html").read_text()
    assert "Environment differences" in page and "&lt;b&gt;\\x1b[31m&lt;/b&gt;" in page
    assert f"wrote {tmp_path / 'env.html'}" in p.stderr
    p = _torchrepro("env", "diff", str(a), str(b), "--json", "--html", str(tmp_path), cwd=tmp_path)
    doc = json.loads(p.stdout)
    assert p.returncode == 2 and doc["report"] is None and "is a directory" in doc["report_error"]
    p = _torchrepro("audit", "--html", str(tmp_path / "audit.html"), cwd=tmp_path)
    assert p.returncode in (0, 1), p.stderr
    dom = dump_dom(tmp_path / "audit.html")
    assert "Checklist" in dom and "torchrepro audit of this environment" in dom


def test_html_to_a_directory_or_a_missing_folder_is_refused_with_the_verdict_kept(tmp_path):
    p = _torchrepro("audit", "--html", str(tmp_path), cwd=tmp_path)
    assert p.returncode == 2 and "is a directory, expected a file name such as" in p.stderr
    assert "torchrepro audit of this environment" in p.stdout  # the checklist is printed all the same
    (tmp_path / "a-file").write_text("kept")
    p = _torchrepro("audit", "--html", str(tmp_path / "a-file" / "r.html"), cwd=tmp_path)
    assert p.returncode == 2 and "a-file/r.html" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert (tmp_path / "a-file").read_text() == "kept"
    p = _torchrepro("audit", "--json", "--html", str(tmp_path), cwd=tmp_path)
    doc = json.loads(p.stdout)  # one document, which says what the exit status says
    assert p.returncode == 2 and doc["exit_code"] == 2 and doc["report"] is None
    assert doc["report_error"] == (f"--html {tmp_path} is a directory, expected a file name such as "
                                   f"{tmp_path}/report.html")
    p = _torchrepro("audit", "--json", "--html", str(tmp_path / "audit.html"), cwd=tmp_path)
    doc = json.loads(p.stdout)
    assert p.returncode == doc["exit_code"] in (0, 1) and doc["report"] == str(tmp_path / "audit.html")
    assert "report_error" not in doc


def test_a_later_check_may_replace_an_output_directory_that_holds_a_report(checked):
    from torchrepro.record.outdir import check_check_dir

    check_check_dir(checked["out"], flag="--out")  # report.html is torchrepro's own output, like check.json


HOSTILE = {
    "angle brackets": ("<b>bold</b>", "&lt;b&gt;bold&lt;/b&gt;"),
    "ampersand": ("a&b &amp; c", "a&amp;b &amp;amp; c"),
    "quotes": ('say "hi" \'there\'', "say &quot;hi&quot; &#x27;there&#x27;"),
    "script end": ("</script><script>alert(1)</script>", "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;"),
    "ANSI escape": ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    "bidi override": ("abc\u202edcba\u2066", "abc\\u202edcba\\u2066"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_each_hostile_string_is_escaped_in_every_place_a_report_shows_recorded_text(name, tmp_path):
    """As a file name, a command, an op and module name, a source line and an env key and value."""
    from torchrepro.analysis.compare import CheckResult, Difference
    from torchrepro.cli._html.locate import locate
    from torchrepro.cli._html.reports import check_report, env_diff_report

    raw, shown = HOSTILE[name]
    op = {"op": f"aten.{raw}", "module": raw, "file": f"/x/{raw}.py", "line": 3, "code": raw, "phase": "forward"}
    located = {"verdict": "origin", "title": "nondeterministic operation", "op": op, "op_index": 1, "step": 1,
               "context": [{**op, "i": 1, "origin": True, "inputs_equal": True, "outputs_equal": False}],
               "fix": raw, "explanation": raw, "ops_traced": [5, 5], "traced_steps": [1]}
    result = CheckResult("diverged", [str(tmp_path / raw)], "optimizer", [2, 2], first_step=1,
                         first=[Difference("params", 1, [raw])], kind_first_steps={"params": 1}, cause="compute",
                         losses=[[1.0, 0.5], [1.0, 0.6]], loss_delta=[0.0, 0.1], param_delta={0: 0.0, 1: 1e-3},
                         notes=[raw])
    env = {"verdict": "breaks-bitwise", "counts": {"breaks-bitwise": 1}, "compared": True,
           "changes": [{"key": raw, "a": raw, "b": None, "rank": "breaks-bitwise", "reason": raw}]}
    pages = [check_report(result, {"locate": located, "environment_diff": env}, [], tmp_path,
                          command=f"`python {raw}.py --tag {raw}`"),
             env_diff_report(env, a=raw, b=raw, headline=raw), locate(located, raw)]
    for page in pages:
        body = page[page.find("<body>"):page.rfind("<script>")] if "<body>" in page else page
        assert raw not in body and shown in body, name
        assert "<b>" not in body and "<script" not in body and "\x1b" not in body and "\u202e" not in body


def test_a_report_that_fails_to_build_is_a_warning_and_a_disk_error_is_named(tmp_path, capsys):
    from torchrepro.cli._report import write_report

    def broken() -> str:
        raise KeyError("ops_traced")

    errors: list = []
    assert write_report(tmp_path / "report.html", broken, errors) is None and errors == []
    assert "report.html was not written: building it failed (KeyError: 'ops_traced')" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()
    (tmp_path / "file").write_text("x")
    assert write_report(tmp_path / "file" / "report.html", lambda: "<html>", errors) is None
    assert len(errors) == 1 and "file/report.html" in errors[0][0]


def test_the_growth_plot_does_not_call_runs_equal_when_nothing_was_saved_after_the_divergence():
    """Values saved at steps 0-2, a divergence at step 3, run 2 stopped before the next saved step: the plot said
    "finite parameter values equal at every saved step" (true, and misleading)."""
    from torchrepro.analysis.compare import CheckResult
    from torchrepro.cli._html.sections import plots

    result = CheckResult(verdict="diverged", runs=["a", "b"], step_mode="optimizer", steps=[6, 4], first_step=3,
                         cause="compute", losses=[[1.0] * 6, [1.0] * 4], param_delta={0: 0.0, 1: 0.0, 2: 0.0},
                         stopped=[None, {"after_step": 4, "first_divergent_step": 3}])
    page = str(plots(result))
    assert "equal at every saved step" not in page
    assert ("parameter values were saved only before the first divergence (step 3): none from there on (a "
            "diverged run stopped before the next saved step)") in page
