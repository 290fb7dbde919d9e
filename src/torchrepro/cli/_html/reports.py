"""One function per command: the report of ``check``/``diff``, ``compare``, ``bisect``, ``env diff`` and ``audit``.

Each returns the page as a string; the command writes it atomically as ``report.html`` beside its JSON document.
Every page opens the same way: the verdict, then the box that says what to do (what --locate found, the fix, the
next command: :func:`.locate.answer`), then the evidence.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import sections as s
from .locate import answer, esc_lines, locate
from .page import Raw, badge, code, dl, document, esc, link, name, num, para, section, table, td

if TYPE_CHECKING:
    from ...analysis.compare import CheckResult
    from ...analysis.crossrun import CompareResult
    from ...record.store import Run


def loadable(paths: list[str]) -> list[Run]:
    """The run directories that can be read (a report of runs that are gone still shows the result)."""
    from ..._core.errors import ReproError
    from ...record.store import load_run

    runs = []
    for path in paths:
        try:
            runs.append(load_run(path))
        except (ReproError, OSError):  # gone or unreadable: the result is complete without it
            continue
    return runs


TENSOR_ROWS = 300  # rows of a per-tensor table; the JSON document beside the report holds every one


def check_report(result: CheckResult, doc: dict[str, Any], runs: list[Run], out: Path, *, command: str,
                 title: str = "torchrepro check") -> str:
    """The report of ``check`` (and of ``diff``: ``title`` says which) from its result and check.json document."""
    from .._render import headline, render_locate

    located = doc.get("locate")
    warning = (result.working_directory or {}).get("warning")
    body: list[str] = [s.header(command, result.verdict, headline(result, what=command), title=title),
                       answer(action=result.action if result.verdict != "identical" else None, located=located)]
    body.append(s.cause_block(result.cause, result.explanation, result.notes, [warning] if warning else None))
    body.append(section("Runs", s.setup(runs), anchor="runs"))
    if located is not None:  # the evidence for the answer first: the op, its line, the ops around it
        body.append(locate(located, render_locate(located)))
    body += comparison(result, runs)
    body.append(s.environment(doc.get("environment_diff"), a="run 1", b="other run"))
    outputs: list[tuple[str, str | Path | None]] = [("JSON", out / "check.json"), ("plot (PNG)", doc.get("plot"))]
    if located is not None:
        outputs += [("locate", out / "locate.json"), ("ops around the origin", located.get("op_table"))]
    outputs += [(f"run {i + 1}", r.path) for i, r in enumerate(runs)]
    outputs += [(f"run {i + 1} stderr", r.path / "stderr.txt") for i, r in enumerate(runs)]
    body.append(s.files(out, [(k, v) for k, v in outputs if v]))
    return document(f"{title}: {result.verdict}", body)


def comparison(result: CheckResult, runs: list[Run], labels: list[str] | None = None) -> list[str]:
    """Plots, what diverged first, the tensors at the first divergent step and the growth table of one
    comparison (``check``, ``diff``, the lead rank of a torchrun check, the runs of ``check --resume-at``)."""
    from ...analysis.compare import first_step_tensors

    parts: list[str] = [section("Loss and difference per step", s.plots(result, labels), anchor="plots")]
    if result.verdict == "identical":
        return parts
    parts.append(section("What diverged first (causal order)", s.diverged_first(result), anchor="first"))
    parts.append(section("How the difference grew", s.growth(result), anchor="growth"))
    rows = first_step_tensors(runs, result) if runs else []
    if rows:
        parts.append(section(f"Tensors where they first differ ({(labels or ['run 1'])[0]} against the others)",
                             s.tensors(rows), anchor="tensors", note="click a column to sort"))
    return parts


def ranks_report(check: Any, doc: dict[str, Any], out: Path, *, command: str, text: str) -> str:
    """The report of a torchrun ``check``: the verdict, rank by rank and between ranks (as printed), then the lead
    rank's comparison in full."""
    rank, lead = check.lead
    lines = text.split("\n")
    detail = next((i for i, line in enumerate(lines) if line.startswith(f"Rank {rank} in detail")), len(lines))
    located = doc.get("locate")
    body: list[str] = [s.header(command, check.verdict, lines[0], title="torchrepro check (torchrun)"),
                       answer(action=lead.action if lead.verdict != "identical" else None, located=located)]
    body.append(s.cause_block(lead.cause, lead.explanation, lead.notes))
    body.append(section("Ranks", f"<pre>{esc_lines(chr(10).join(lines[1:detail]).strip())}</pre>",
                        anchor="ranks"))
    runs = loadable(lead.runs)
    body.append(section(f"Rank {rank}: runs", s.setup(runs), anchor="runs"))
    if located is not None:  # the lead rank's traced op, as check's
        from .._render import render_locate

        body.append(locate(located, render_locate(located)))
    body += comparison(lead, runs)
    body.append(s.environment(doc.get("environment_diff"), a="run 1", b="other run"))
    body.append(s.files(out, [("JSON", out / "check.json"), ("plot (PNG)", doc.get("plot"))]))
    return document(f"torchrepro check: {check.verdict}", body)


def resume_report(result: Any, doc: dict[str, Any], out: Path, *, command: str, text: str) -> str:
    """The report of ``check --resume-at K``: the resume verdict, what the resume restored (causal order), the fix,
    then run 1 against run 2 step by step."""
    marks = {True: "yes", False: "NO", None: "-"}
    head = text.split("\n")[0].replace("torchrepro: RESUME ", "torchrepro: ", 1)  # the badge says the verdict
    body: list[str] = [s.header(command, result.verdict, head, title="torchrepro check --resume-at"),
                       answer(fix=result.fix if result.verdict != "identical" else None)]
    if result.verdict != "identical":
        body.append(para(f"Not restored: {result.what} (first divergent step {result.step})"))
        body.append(para(result.explanation or ""))
    rows = [[td(i, i), r.label, r.where, td(marks[r.restored], cls={False: "bad"}.get(r.restored, "")), r.text]
            for i, r in enumerate(result.restored, start=1)]
    body.append(section(f"What the resume restored (checkpoint after step {result.k})", table(
        ["#", "what", "where", "restored", "how we know"], rows), anchor="restored"))
    body += [para(f"Note: {n}") for n in [*result.comparison.notes, *result.notes]]
    body += comparison(result.comparison, [], ["uninterrupted", "resumed"])
    body.append(s.environment(doc.get("environment_diff"), a="run 1", b="other run"))
    files: list[tuple[str, str | Path | None]] = [("JSON", out / "check.json"), ("plot (PNG)", doc.get("plot")),
                                                  ("checkpoint", result.checkpoint)]
    files += [(f"{k} run", v) for k, v in result.runs.items()]
    body.append(s.files(out, [(k, v) for k, v in files if v]))
    return document(f"torchrepro check --resume-at: {result.verdict}", body)


def compare_report(result: CompareResult, doc: dict[str, Any], runs: list[Run], out: Path) -> str:
    """The report of ``compare``: bitwise, equivalent within the tolerance, or diverged, and where."""
    from .._compare_locate_render import render_compare_locate
    from .._compare_render import _entry, _headline

    check = result.check
    a, b = result.commands
    located = doc.get("locate")
    body: list[str] = [s.header(f"A: {a}   B: {b}", result.verdict, _headline(result), title="torchrepro compare"),
                       answer(action=doc.get("action"), located=located)]
    body.append(s.cause_block(doc.get("cause"), doc.get("explanation"), check.notes))
    body.append(section("Runs", s.setup(runs, ["A", "B"]), anchor="runs"))
    if located is not None:  # as in check's page: the evidence for the answer first, the same op table
        body.append(locate(located, render_compare_locate(located)))
    body.append(section("Loss and difference per step", s.plots(check, ["A", "B"]), anchor="plots"))
    if result.verdict != "identical":
        body.append(section("What differed first (bitwise, causal order)", s.diverged_first(check), anchor="first"))
        from ...analysis.compare import LABELS

        rows = []
        entries = sorted((e for e in result.compared if e.delta is not None),
                         key=lambda e: -e.delta.ratio if e.delta is not None else 0)
        for e in entries[:TENSOR_ROWS]:
            d = e.delta
            if d is None:
                continue
            rows.append([td(name(e.tensor), cls="name"), LABELS.get(e.kind, e.kind), td(e.step, e.step),
                         td(num(d.max_abs), d.max_abs),
                         td(num(d.max_rel), d.max_rel), td(f"{d.ratio:.3g}", d.ratio),
                         td(f"{d.differing} of {d.elements}", d.differing)])
        first = result.first_out
        cut = (f"the {TENSOR_ROWS} largest of {len(entries)} (by x tolerance; compare.json lists them all)"
               if len(entries) > TENSOR_ROWS else None)
        intro = para(f"Tolerance: {result.tolerance.describe()}") + (
            para(f"first out of tolerance: {_entry(first, result)}") if first is not None else "")
        body.append(section("Tensors compared by value", Raw(intro + table(
            ["tensor", "kind", "step", "max |Δ|", "max relative |Δ|", "x tolerance", "elements differing"], rows,
            sortable=True, caption=cut)), anchor="tensors", note="click a column to sort"))
        ratios = {k: v.get("ratio") for k, v in result.per_step().items()}
        body.append(section("How the difference grew", s.growth(check, ratios, "x tolerance"), anchor="growth"))
    body.append(s.environment(doc.get("environment_diff")))
    body.append(s.files(out, [("JSON", out / "compare.json"), ("A", runs[0].path), ("B", runs[1].path)]))
    return document(f"torchrepro compare: {result.verdict}", body)


def bisect_report(doc: dict[str, Any], out: Path, text: str) -> str:
    """The report of ``bisect``: the commit line with each tested commit's verdict, the first bad commit, the op."""
    from .._compare_locate_render import render_compare_locate

    verdict = str(doc.get("verdict"))
    head = text.splitlines()[0] if text else f"bisect: {verdict}"
    first = doc.get("first_bad_commit") or {}
    located = doc.get("locate")
    commit = [("First bad commit", Raw(f'{code(str(first.get("sha", ""))[:12])} {esc(first.get("subject") or "")}'
                                       ' (<a href="#chain">commits</a>)'))] if first else []
    body: list[str] = [s.header(str(doc.get("command") or ""), "found" if verdict == "found" else verdict, head,
                                title="torchrepro bisect"), answer(located=located or None, first=commit)]
    items = []
    for c in doc.get("chain") or []:
        v = c.get("verdict")
        word = "not tested" if v is None else str(v)
        is_first = bool(first) and c.get("sha") == first.get("sha")
        label = "FIRST BAD" if is_first else word.upper()
        items.append(f'<li class="{"first" if is_first else ""}"><span class="mono">{esc(str(c.get("sha", ""))[:10])}'
                     f'</span> {badge("bad" if is_first else (str(v) if v else "info"), label)}<br>'
                     f'{esc(c.get("subject") or "")}</li>')
    body.append(section("Commits, oldest first", Raw(f'<ol class="chain">{"".join(items)}</ol>'), anchor="chain",
                        note="good: the run matches the good commit's; bad: it does not; the first bad commit is "
                             "outlined"))
    tested = doc.get("tested") or []
    if tested:
        rows = [[td(t.get("index"), t.get("index")), Raw(code(str(t.get("sha", ""))[:12])), t.get("subject") or "",
                 Raw(badge(str(t.get("verdict") or "info"))), t.get("reason") or "",
                 link(t.get("run"), out, "run") if t.get("run") else "-"] for t in tested]
        body.append(section("Tested, in the order bisect ran them", table(
            ["#", "commit", "subject", "verdict", "why", "recording"], rows, sortable=True), anchor="tested"))
    if located:  # the same section, op table and all, as check's and compare's
        body.append(locate(located, render_compare_locate(located), title="Located op"))
    body.append(section("Summary (as printed)", f"<pre>{esc_lines(text)}</pre>", anchor="summary"))
    body.append(s.files(out, [("JSON", out / "bisect.json")]))
    return document(f"torchrepro bisect: {verdict}", body)


def env_diff_report(env_doc: dict[str, Any], *, a: str, b: str, headline: str, conclusion: str | None = None) -> str:
    """The report of ``env diff``: the ranked table."""
    verdict = str(env_doc.get("verdict"))
    body = [s.header(f"A: {a}   B: {b}", verdict, headline, title="torchrepro env diff"),
            *([para(conclusion, "next")] if conclusion else []),
            s.environment(env_doc | {"compared": True}, a="A", b="B")]
    return document(f"torchrepro env diff: {verdict}", body, beside=None)


AUDIT_WORDS = {"ok": ("pass", "OK"), "info": ("info", "INFO"), "advice": ("warn", "ADVICE"),
               "threat": ("bad", "THREAT")}


def audit_report(doc: dict[str, Any], text: str) -> str:
    """The report of ``audit``: each item with its severity, what was found, and the fix of each finding."""
    rows, classes = [], []
    order = list(AUDIT_WORDS)
    for item in doc.get("items") or []:
        severity = str(item.get("severity"))
        klass, word = AUDIT_WORDS.get(severity, ("info", severity.upper()))
        rows.append([td(badge(klass, word), order.index(severity) if severity in order else 9), item.get("area") or "",
                     item.get("title") or "", item.get("state") or "",
                     item.get("fix") if item.get("finding") else ""])
        classes.append({"threat": "bad", "advice": "warn"}.get(severity, ""))
    threat = any(i.get("severity") == "threat" for i in doc.get("items") or [])
    verdict, word = ("pass", "CLEAN") if doc.get("clean") else ("bad" if threat else "warn", "FINDINGS")
    head = text.splitlines()[0] if text else "torchrepro audit"
    body = [s.header(" ".join(doc.get("command") or []), verdict, head, title="torchrepro audit", word=word),
            section("Checklist", table(["severity", "area", "check", "found", "fix"], rows, sortable=True,
                                       row_classes=classes), anchor="checks")]
    body += [para(f"Note: {n}") for n in doc.get("notes") or []]
    return document("torchrepro audit", body, beside=None)


INVARIANCE_CLASS = {"invariant": "pass", "variant": "bad", "row-mixing": "warn", "nondeterministic": "bad"}


def _variant_op(op: dict[str, Any] | None, title: str, anchor: str) -> list[str]:
    if not op:
        return []
    where = f"{op.get('file')}:{op.get('line')}" if op.get("file") else "(no user source line)"
    line = Raw(code(op["code"])) if op.get("code") else None
    return [section(title, dl([("op", Raw(code(str(op.get("op"))))), ("module", op.get("module") or "-"),
                               ("source", Raw(code(where))), ("line", line),
                               ("kind", op.get("kind")), ("batch sizes", op.get("text")),
                               ("max |Δ| of its row output", num(op.get("max_abs")) if op.get("max_abs") else None),
                               ("note", op.get("note") or None)]), anchor=anchor)]


def _forward_sections(doc: dict[str, Any], key: str = "") -> list[str]:
    rows = [[td(s["size"], s["size"]), td(s["compared"], s["compared"]), td(s["equal"], s["equal"]),
             td(num(s["max_abs"]), s["max_abs"]), td(s["max_ulp"], s["max_ulp"]),
             Raw(badge(INVARIANCE_CLASS.get(s["status"], "muted"), s["status"].upper()))]
            for s in doc.get("by_size") or []]
    what = str(doc.get("what") or "")
    title = f"{what.split(':')[0].capitalize()}, row by row" if what else "Rows alone against rows batched"
    note = "a context is one row at one position in a batch of that size, every output compared"
    body: list[str] = [section(title, table(
        ["batch size", "contexts", "bitwise equal", "max |Δ|", "max ULP", "status"], rows, sortable=True),
        anchor=f"rows{key}", note=f"{what[0].upper()}{what[1:]}; {note}" if what else note)]
    first = doc.get("first_op") or {}
    body += _variant_op(first, "First op that mixes rows" if first.get("kind") == "row-mixing" else
                        "First batch-variant op", f"locate{key}")
    body += _variant_op(doc.get("mixing_op"), "First op that mixes rows", f"mixing{key}")
    if not doc.get("first_op") and doc.get("locate_note"):
        body.append(para(f"Locate: {doc['locate_note']}"))
    return body


def invariance_report(doc: dict[str, Any], text: str) -> str:
    """The report of ``invariance``: the table by batch size (and, for a language model, by prompt), the first
    batch-variant op, the fix."""
    verdict = str(doc.get("verdict"))
    head = (text.splitlines()[0] if text else verdict.upper()).removeprefix("torchrepro invariance: ")
    body: list[str] = [s.header(" ".join(doc.get("command") or []), INVARIANCE_CLASS.get(verdict, "info"), head,
                                title="torchrepro invariance", word=verdict.upper())]
    if doc.get("fix"):
        body.append(Raw(f'<p class="next"><strong>Fix:</strong> {esc(doc["fix"])}</p>'))
    if doc.get("mode") == "generate":
        rows = []
        for p in doc.get("prompts") or []:
            for c in p.get("contexts") or []:
                div = c.get("first_divergent_token")
                rows.append([td(p["index"], p["index"]), p.get("prompt") or "", td(c["size"], c["size"]),
                             f"{c['position']}{' (padded)' if c.get('padded') else ''}",
                             "same" if div is None else f"differ from token {div}",
                             "equal" if c.get("logits_bitwise_equal") else "differ",
                             td(num(c.get("max_logit_abs")), c.get("max_logit_abs")),
                             td(num(max(c.get("logprob_deltas") or [0.0])), max(c.get("logprob_deltas") or [0.0])),
                             Raw(badge(INVARIANCE_CLASS.get(c.get("status"), "muted"), str(c.get("status")).upper()))])
        body.append(section("Generation, each prompt against itself alone", table(
            ["prompt", "text", "batch", "position", "tokens", "logits bitwise", "max |Δ logit|", "max |Δ logprob|",
             "status"], rows, sortable=True), anchor="generation"))
        for i, forward in enumerate(doc.get("forward") or []):
            body += _forward_sections(forward, str(i + 1))
    else:
        body += _forward_sections(doc)
    body += [para(f"Note: {n}") for n in doc.get("notes") or []]
    body.append(section("Summary (as printed)", f"<pre>{esc_lines(text)}</pre>", anchor="summary"))
    return document(f"torchrepro invariance: {verdict}", body)
