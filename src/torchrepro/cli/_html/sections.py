"""The parts of a report that ``check``, ``diff``, ``compare`` and ``bisect`` share.

Every function takes the result object (or the JSON document the command also writes) and returns markup; the
sentences come from the result (``explanation``, ``action``, ``value_delta_text``, ``locate``'s ``title``/``fix``)
or from :mod:`torchrepro.cli._render`, so the report and the terminal say the same thing. The Locate section and the
box right under the verdict (what was found, the fix, the next command) are :mod:`.locate`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .page import Raw, badge, code, dl, esc, link, name, num, para, section, table, td
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


def cause_block(cause: str | None, explanation: str | None, notes: list[str],
                warnings: list[str] | None = None) -> Raw:
    """Cause, warnings and notes (the next action is in the box right under the verdict: :func:`.locate.answer`)."""
    parts = []
    if cause:
        parts.append(f"<p><strong>Cause:</strong> {esc(cause)} - {esc(explanation)}</p>")
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
        rows.append([td(label, cls="nowrap"), td(Raw(code(command)), cls="code"), "-" if seed is None else seed,
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
    # |Δ loss| beside |Δ param|: two loss curves that lie on each other still show how far apart they are
    loss_delta = [(float(k + 1), v) for k, v in enumerate(result.loss_delta) if v is not None]
    params = [(float(k), result.param_delta[k]) for k in steps]
    loss_drawn = any(v > 0 for _, v in loss_delta)
    said = loss_drawn and not any(v > 0 for _, v in params)  # the frame's text is not shown: the legend says it
    series = [Series(f"max |Δ param| vs {labels[0]}" + (f": {empty}" if said else ""), params)]
    if loss_drawn:
        series.append(Series(f"max |Δ loss| vs {labels[0]}", loss_delta))
    delta = line_chart(series, title="How the difference grew", xlabel="step (0 = initial parameters)",
                       ylabel="max |Δ|", log_y=True, marker_x=first, empty_text=empty)
    return Raw(f'<div class="plots"><div class="plot">{loss}</div><div class="plot">{delta}</div></div>')


def diverged_first(result: CheckResult) -> Raw:
    """What diverged first, in causal order (the terminal's list), every tensor named."""
    from ...analysis.compare import LABELS

    rows = [[td(i, i), td(d.label, cls="nowrap"), td(d.step, d.step), Raw(", ".join(name(n) for n in d.names))]
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
        body.append([td(name(r["tensor"]), cls="name"), r["label"], td(r["step"], r["step"]),
                     td(share, r["elements_differing"]), td(num(r["max_abs_delta"]), r["max_abs_delta"]),
                     td(num(r["max_ulp"]), r["max_ulp"])])
    return table(["tensor", "kind", "step", "elements differing", "max |Δ|", "max ULP"], body, sortable=True,
                 caption=cut)


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
