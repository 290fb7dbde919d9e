"""The parts of a report that ``check``, ``diff``, ``compare`` and ``bisect`` share.

Every function takes the result object (or the JSON document the command also writes) and returns markup; the
sentences come from the result (``explanation``, ``action``, ``value_delta_text``, ``locate``'s ``title``/``fix``)
or from :mod:`torchrepro.cli._render`, so the report and the terminal say the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .page import Raw, badge, code, dl, esc, link, num, para, section, table, td
from .svg import Series, line_chart

if TYPE_CHECKING:
    from ...analysis.compare import CheckResult
    from ...record.store import Run

GROWTH_TABLE_ROWS = 400  # a longer run shows the rows around its first divergence and its last ones


def header(command: str, verdict: str, headline: str, *, title: str, word: str | None = None) -> Raw:
    """The title, the verdict word and the terminal's first line."""
    text = headline.removeprefix("torchrepro: ")
    word = word or verdict.upper()
    for sep in (" - ", " "):  # the badge says the verdict word: the line goes on after it
        if text.startswith(word + sep):
            text = text[len(word + sep):]
            break
    shown = f'<p class="muted">{esc(command)}</p>' if command and command not in headline else ""
    return Raw(f'<header><h1>{esc(title)}</h1><p class="headline">{badge(verdict, word)}{esc(text)}</p>{shown}'
               "</header>")


def cause_block(cause: str | None, explanation: str | None, action: str | None, notes: list[str],
                warnings: list[str] | None = None) -> Raw:
    """Cause, the next action (as the terminal's ``Next:``), warnings and notes."""
    parts = []
    if cause:
        parts.append(f"<p><strong>Cause:</strong> {esc(cause)} - {esc(explanation)}</p>")
    if action:
        parts.append(f'<p class="next"><strong>Next:</strong> {esc(action)}</p>')
    parts += [f'<p class="warn"><strong>Warning:</strong> {esc(w)}</p>' for w in warnings or []]
    parts += [f"<p><strong>Note:</strong> {esc(n)}</p>" for n in notes]
    return Raw("".join(parts))


def setup(runs: list[Run], labels: list[str] | None = None) -> Raw:
    """What each run was: command, seed, deterministic mode, device, steps, torch, when."""
    rows = []
    for i, run in enumerate(runs):
        m = run.manifest
        label = labels[i] if labels else f"run {i + 1}"
        command = " ".join(map(str, m.get("command") or []))
        seed = m.get("seed")
        rows.append([td(label, cls="nowrap"), Raw(code(command)), "-" if seed is None else seed,
                     "on" if m.get("deterministic") else "off", m.get("device") or "-", len(run.steps()),
                     td(m.get("torch") or "-", cls="nowrap"), td(_when(m.get("started")), cls="nowrap"),
                     m.get("status") or "-"])
    return table(["run", "command", "seed", "deterministic", "device", "steps", "torch", "started", "ended"], rows)


def _when(started: Any) -> str:
    """A manifest's start time (seconds since the epoch) as UTC."""
    from datetime import datetime, timezone

    try:
        return datetime.fromtimestamp(float(started), timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "-" if started is None else str(started)


def plots(result: CheckResult, labels: list[str] | None = None) -> Raw:
    """Loss curves of all runs, and the per-step max |Δ parameter| on a log scale."""
    labels = labels or [f"run {i + 1}" for i in range(len(result.losses))]
    losses = [Series(labels[i], [(k + 1, v) for k, v in enumerate(run) if v is not None])
              for i, run in enumerate(result.losses)]
    first = result.first_step if result.verdict != "identical" else None
    mark = f"first divergence (step {first})" if first is not None else None
    loss = line_chart(losses, title="Loss per step (all runs)", xlabel="step", ylabel="loss", marker_x=first,
                      marker_label=mark, empty_text="no loss was recorded")
    steps = sorted(result.param_delta)
    empty = ("all parameters bitwise equal" if result.verdict == "identical" or steps else
             "no parameter values saved")
    if steps and not any(result.param_delta[k] > 0 for k in steps) and result.verdict != "identical":
        empty = "finite parameter values equal at every saved step"
        if first is not None and max(steps) < first:  # nothing saved at or after the divergence: say so
            stopped = " (a diverged run stopped before the next saved step)" if any(result.stopped) else ""
            empty = (f"parameter values were saved only before the first divergence (step {first}): none from "
                     f"there on{stopped}")
    delta = line_chart([Series(f"max |Δ param| vs {labels[0]}", [(k, result.param_delta[k]) for k in steps])],
                       title="How the difference grew", xlabel="step (0 = initial parameters)",
                       ylabel="max |Δ param|", log_y=True, marker_x=first, empty_text=empty)
    return Raw(f'<div class="plots"><div class="plot">{loss}</div><div class="plot">{delta}</div></div>')


def diverged_first(result: CheckResult) -> Raw:
    """What diverged first, in causal order (the terminal's list), every tensor named."""
    from ...analysis.compare import LABELS

    rows = [[td(i, i), td(d.label, cls="nowrap"), td(d.step, d.step), ", ".join(d.names)]
            for i, d in enumerate(result.first, start=1)]
    later = {k: s for k, s in result.kind_first_steps.items() if s != result.first_step}
    extra = para("then: " + ", ".join(f"{LABELS[k]} at step {s}" for k, s in later.items())) if later else ""
    return Raw(table(["#", "what", "step", "tensors"], rows) + extra)


def growth(result: CheckResult, extra: dict[int, float | None] | None = None, extra_head: str = "") -> Raw:
    """Step, max |Δ loss|, max |Δ param| (and ``extra``, e.g. compare's ratio to the tolerance), sortable."""
    rows_k = sorted(set(range(1, len(result.loss_delta) + 1)) | set(result.param_delta) | set(extra or {}))
    note = None
    if len(rows_k) > GROWTH_TABLE_ROWS:
        start = rows_k.index(result.first_step) if result.first_step in rows_k else 0
        kept = sorted(set(rows_k[start:start + GROWTH_TABLE_ROWS - 20] + rows_k[-20:]))
        note = f"{len(rows_k) - len(kept)} of {len(rows_k)} steps left out (check.json holds them all)"
        rows_k = kept
    rows = []
    for k in rows_k:
        ld = result.loss_delta[k - 1] if 1 <= k <= len(result.loss_delta) else None
        pd = result.param_delta.get(k)
        row: list[Any] = [td(k, k), td(num(ld), ld), td(num(pd), pd)]
        if extra is not None:
            r = extra.get(k)
            row.append(td("-" if r is None else f"{r:.3g}", r))
        rows.append(row)
    head = ["step", "max |Δ loss|", "max |Δ param|"] + ([extra_head] if extra is not None else [])
    from .._render import _final_line, stop_lines

    final = para(_final_line(result).strip()) if result.final_max_abs_delta is not None else ""
    final += "".join(para(line) for line in stop_lines(result))  # runs check stopped after the divergence
    texts = [para(f"{'final' if e.get('step') is None else 'step ' + str(e['step'])}: {e['text']}")
             for e in result.nonfinite]
    values = para(result.value_delta_text) if result.value_delta_text else ""
    return Raw(table(head, rows, sortable=True, caption=note) + final + "".join(texts) + values)


def tensors(rows: list[dict[str, Any]], limit: int = 300) -> Raw:
    """The per-tensor table at the first divergent step, sortable (largest |Δ| first)."""
    rows = sorted(rows, key=lambda r: -(r["max_abs_delta"] if r["max_abs_delta"] is not None else -1))
    cut = f"the {limit} largest of {len(rows)} tensors" if len(rows) > limit else None
    body = []
    for r in rows[:limit]:
        share = (f"{r['elements_differing']} of {r['elements']}" if r["elements"] is not None else
                 "values not kept")
        body.append([r["tensor"], r["label"], td(r["step"], r["step"]), td(share, r["elements_differing"]),
                     td(num(r["max_abs_delta"]), r["max_abs_delta"]), td(num(r["max_ulp"]), r["max_ulp"])])
    return table(["tensor", "kind", "step", "elements differing", "max |Δ|", "max ULP"], body, sortable=True,
                 caption=cut)


def _source(doc: dict[str, Any]) -> Raw:
    """The source lines the trace stored around the origin (the tracer's copy of each line: no file is read)."""
    op = doc.get("op") or {}
    lines: dict[int, str] = {}
    for row in doc.get("context") or []:
        if row.get("line") and row.get("code") is not None and (row.get("file") in (None, op.get("file"))):
            lines.setdefault(int(row["line"]), row["code"])
    if op.get("line") and op.get("code") is not None:
        lines[int(op["line"])] = op["code"]
    if not lines:
        return Raw("")
    rows, previous = [], None
    for n, text in sorted(lines.items()):
        if previous is not None and n > previous + 1:  # lines the trace did not pass through
            rows.append('<tr><td class="ln mono">…</td><td></td></tr>')
        rows.append(f'<tr class="{"origin" if n == op.get("line") else ""}"><td class="ln mono">{n}</td>'
                    f'<td class="mono">{esc(text)}</td></tr>')
        previous = n
    body = "".join(rows)
    where = f"{op.get('file')}" if op.get("file") else "source"
    return Raw(f"<h3>Source ({esc(where)})</h3><table class=\"src\"><tbody>{body}</tbody></table>")


def _op_table(rows: list[dict[str, Any]]) -> Raw:
    body, classes = [], []
    for r in rows:
        op = r.get("op") or "-"
        if r.get("op_other_run") and r["op_other_run"] != r.get("op"):
            op = f"{op} | {r['op_other_run']}"
        same = {True: "= same", False: "≠ differ", None: "-"}
        body.append([td(r.get("i"), r.get("i")), td(op, cls="nowrap"), td(r.get("phase") or "-", cls="nowrap"),
                     r.get("module") or "-",
                     td(r.get("line") or "-", r.get("line")), td(same[r.get("inputs_equal")], cls="nowrap"),
                     td(same[r.get("outputs_equal")], cls="nowrap"), Raw(code(r.get("code") or ""))])
        classes.append("origin" if r.get("origin") else "")
    return table(["#", "op", "phase", "module", "line", "inputs", "outputs", "code"], body, row_classes=classes,
                 caption="the ops around the origin (⇒ marks it)")


def locate(doc: dict[str, Any] | None, text: str) -> Raw:
    """The --locate section: the op, its module and source, the ops around it, why and the fix; ``text`` is the
    terminal's rendering of the same document (kept for shapes this page does not lay out)."""
    if doc is None:
        return Raw("")
    title = doc.get("title") or doc.get("verdict") or "locate"
    parts = [f"<p>{badge(str(doc.get('verdict') or 'info'), str(doc.get('verdict') or '').upper())}"
             f"<strong>{esc(title)}</strong></p>"]
    op = doc.get("op")
    if doc.get("verdict") in ("nothing-to-locate", "skipped"):
        return section("Locate", "".join(parts), anchor="locate")
    if doc.get("verdict") == "failed":
        return section("Locate", "".join(parts) + f"<pre>{esc_lines(text)}</pre>", anchor="locate")
    if isinstance(op, dict) and "op" in op and "context" in doc and not doc.get("compiled"):
        where = f"{op.get('file')}:{op.get('line')}" if op.get("file") else "(no user source line)"
        same_in = "identical" if doc.get("verdict") in ("origin", "rng") else "DIFFERENT"
        parts.append(dl([("op", Raw(code(op["op"]))), ("phase", op.get("phase")),
                         ("op #", f"{doc.get('op_index')} of step {doc.get('step')}"),
                         ("module", op.get("module") or "-"),
                         ("created at" if op.get("phase") == "backward" else "source", Raw(code(where))),
                         ("line", Raw(code(op["code"])) if op.get("code") else None),
                         ("inputs", f"{same_in} in both runs; outputs differ"),
                         (f"deterministic kernel on {doc.get('device')}", doc.get("deterministic_kernel"))]))
        parts.append(_source(doc))
        parts.append(_op_table(doc.get("context") or []))
    else:
        parts.append(f"<pre>{esc_lines(text)}</pre>")
    for label, key in (("Why", "explanation"), ("Note", "note")):
        if doc.get(key):
            parts.append(f"<p><strong>{label}:</strong> {esc(doc[key])}</p>")
    if doc.get("fix"):
        parts.append(f'<p class="next"><strong>Fix:</strong> {esc(doc["fix"])}</p>')
    return section("Locate", "".join(parts), anchor="locate")


def esc_lines(text: str) -> str:
    """Multi-line terminal text for a ``<pre>``: each line escaped on its own (newlines kept)."""
    return "\n".join(esc(line) for line in text.splitlines())


def environment(env_doc: dict[str, Any] | None, *, a: str = "A", b: str = "B") -> Raw:
    """The environment differences, ranked (can break bitwise equality, may change numerics, benign)."""
    if not env_doc:
        return Raw("")
    if env_doc.get("compared") is False:
        return section("Environment differences", para(f"not compared: {env_doc.get('note') or ''}"),
                       anchor="environment")
    changes = env_doc.get("changes") or []
    if not changes:
        return section("Environment differences", para("none: versions, hardware, threads, flags, seeds, variables "
                                                       "and packages are the same"), anchor="environment")
    from ...analysis.envdiff import RANK_TITLES, RANKS

    order = {r: i for i, r in enumerate(RANKS)}
    rows, classes = [], []
    for c in sorted(changes, key=lambda c: (order.get(c.get("rank"), 9), str(c.get("key")))):
        rank = c.get("rank")
        rows.append([td(RANK_TITLES.get(rank, rank), order.get(rank, 9)), Raw(code(c.get("key"))),
                     _value(c.get("a")), _value(c.get("b")), c.get("reason") or ""])
        classes.append({"breaks-bitwise": "bad", "may-change-numerics": "warn"}.get(str(rank), ""))
    counts = ", ".join(f"{RANK_TITLES[r]} {n}" for r, n in (env_doc.get("counts") or {}).items() if n)
    return section("Environment differences", table(["rank", "setting", a, b, "why"], rows, sortable=True,
                                                     row_classes=classes, caption=counts), anchor="environment")


def _value(v: Any) -> Raw:
    return Raw('<span class="muted">(absent)</span>') if v is None else Raw(code(v if isinstance(v, str) else
                                                                                  repr(v)))


def files(out: Path, paths: list[tuple[str, str | Path | None]]) -> Raw:
    """Links to what the command wrote, relative to the report (the folder can be moved or sent as a whole)."""
    return section("Files", dl([(label, link(p, out, written=True)) for label, p in paths]), anchor="files")
