"""The Locate section of a report, and the answer the page puts right under its verdict (what was found, the fix).

Every locate document goes through the same code: ``check``'s and ``diff``'s (one op, seen in two runs) and
``compare``'s and ``bisect``'s (an op on each side, A and B). A row of compare's op table
(``{"a": site, "b": site, "inputs": "equal"}``) is first read as a row of check's
(``{"op": ..., "op_other_run": ..., "inputs_equal": True}``), so both pages show one table: the ops around the
origin, the origin highlighted, module, source line, whether inputs and outputs agreed.

>>> rows = op_rows([{"row": 3, "kind": "inserted", "a": None, "mark": "*", "inputs": None, "outputs": None,
...                  "b": {"op": "aten.flip", "index": 9, "line": 23, "module": "Net", "code": "h.flip(1)"}}])
>>> rows[0]["op"], rows[0]["op_other_run"], rows[0]["origin"]
(None, 'aten.flip', True)
"""

from __future__ import annotations

from typing import Any

from .page import Raw, badge, code, dl, esc, name, section, table, td

NOT_LOCATED = ("nothing-to-locate", "skipped", "failed")  # locate verdicts with no op to show
SAME = {"equal": True, "differ": False, None: None}  # compare's words for check's booleans
SHOWN = {True: "= same", False: "≠ differ", None: "-"}


def _sided(doc: dict[str, Any]) -> bool:
    """Whether the document names an op on each side (compare, bisect) rather than one op of two runs (check)."""
    return any(isinstance(doc.get(k), dict) and ("a" in doc[k] or "b" in doc[k]) for k in ("op", "cause"))


def _from_sides(r: dict[str, Any]) -> dict[str, Any]:
    """A compare row (A's and B's site) as a check row: A's values, B's beside them (``*_other_run``)."""
    a, b = r.get("a") or {}, r.get("b") or {}
    ref = a or b
    return {"i": a.get("index"), "i_other_run": b.get("index"), "op": a.get("op"), "op_other_run": b.get("op"),
            "phase": ref.get("phase"), "module": a.get("module"), "module_other_run": b.get("module"),
            "line": a.get("line"),
            "line_other_run": b.get("line"), "code": a.get("code"), "code_other_run": b.get("code"),
            "inputs_equal": SAME.get(r.get("inputs")), "outputs_equal": SAME.get(r.get("outputs")),
            "mark": r.get("mark") or ""}


def op_rows(context: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of any locate document's ``context`` as check rows, each with ``origin`` (the row to highlight) and
    ``effect`` (compare's first changed value, when it is not the origin: where the programs part is)."""
    rows = [_from_sides(r) if "a" in r or "b" in r else dict(r) for r in context]
    first = "*" if any(r.get("mark") == "*" for r in rows) else "=>"  # the program difference, else the op
    for r in rows:
        if "mark" in r:
            r["origin"], r["effect"] = r["mark"] == first, r["mark"] in ("*", "=>") and r["mark"] != first
    return rows


def _pair(value: Any, other: Any, has_other: bool) -> str:
    """``value``, or ``value | other`` where the two sides differ (``-`` for a side without the op)."""
    if not has_other or other == value:
        return "-" if value in (None, "") else str(value)
    return f"{'-' if value in (None, '') else value} | {'-' if other in (None, '') else other}"


def _module_cell(r: dict[str, Any]) -> Raw:
    a, b = r.get("module") or "-", r.get("module_other_run") or "-"
    if "module_other_run" not in r or a == b or r.get("op") is None or r.get("op_other_run") is None:
        shown = a if a != "-" or r.get("op") is not None else b
        return td(name(shown), cls="name")
    return td(Raw(f"{name(a)} | {name(b)}"), cls="name")


def _code_cell(r: dict[str, Any], sides: tuple[str, str]) -> Raw:
    """The source line (both, labelled, where the sides differ); the column keeps a readable width on a narrow
    window (the table scrolls in its box instead)."""
    mine, other = r.get("code") or "", r.get("code_other_run") or ""
    if "code_other_run" not in r or mine == other or not (mine and other):
        return td(Raw(code(mine or other)), cls="code")
    return td(Raw(f"{code(f'{sides[0]}: {mine}')}<br>{code(f'{sides[1]}: {other}')}"), cls="code")


def op_table(context: list[dict[str, Any]], sides: tuple[str, str] = ("run A", "run B")) -> Raw:
    """The ops around the origin (the terminal's ``locate_ops.txt``), the origin row highlighted and marked ⇒;
    ``x | y`` where the two sides differ (``sides`` names them)."""
    body, classes = [], []
    for r in op_rows(context):
        index = _pair(r.get("i"), r.get("i_other_run"), "line_other_run" in r)  # check's rows: run A's index
        line = _pair(r.get("line"), r.get("line_other_run"), "line_other_run" in r)
        body.append([td(index, r.get("i") if r.get("i") is not None else r.get("i_other_run")),
                     td(_pair(r.get("op"), r.get("op_other_run"), bool(r.get("op_other_run"))), cls="nowrap"),
                     td(r.get("phase") or "-", cls="nowrap"), _module_cell(r),
                     td(line, r.get("line") if r.get("line") is not None else r.get("line_other_run"),
                        cls="nowrap"),
                     td(SHOWN[r.get("inputs_equal")], cls="nowrap"), td(SHOWN[r.get("outputs_equal")], cls="nowrap"),
                     _code_cell(r, sides)])
        classes.append("origin" if r.get("origin") else "effect" if r.get("effect") else "")
    effect = ", → the first value it changes" if "effect" in classes else ""
    return table(["#", "op", "phase", "module", "line", "inputs", "outputs", "code"], body, row_classes=classes,
                 caption=f"the ops around the origin (⇒ marks it{effect}; “x | y”: {sides[0]} | {sides[1]} where "
                         "they differ)")


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
    where = f"{op.get('file')}" if op.get("file") else "source"
    return Raw(f"<h3>Source ({esc(where)})</h3><div class=\"tablebox\"><table class=\"src\"><tbody>{''.join(rows)}"
               "</tbody></table></div>")


def _where(site: dict[str, Any]) -> str:
    return f"{site['file']}:{site.get('line')}" if site.get("file") else "(no user source line)"


def _at(site: dict[str, Any]) -> str:
    """`` at file:line`` (markup), or `` (no user source line)``."""
    return f" at {code(_where(site))}" if site.get("file") else ' <span class="muted">(no user source line)</span>'


def _site(label: str, site: dict[str, Any] | None) -> str:
    """One side of a compare row: ``B aten.flip (forward, op #9, module Net) at file:23`` and its line."""
    if site is None:
        return f'<div><strong>{esc(label)}</strong> <span class="muted">(not in this program)</span></div>'
    how = f"{esc(site.get('phase') or '-')}, op #{esc(site.get('index'))}, module {name(site.get('module') or '-')}"
    line = f"<br>{code(site['code'])}" if site.get("code") else ""
    return f"<div><strong>{esc(label)}</strong> {code(str(site.get('op')))} ({how}){_at(site)}{line}</div>"


def _both(row: dict[str, Any]) -> Raw:
    return Raw(_site("A", row.get("a")) + _site("B", row.get("b")))


def _sided_details(doc: dict[str, Any]) -> Raw:
    """What compare's (or bisect's) locate found, on both sides: the program difference, the op, the sizes."""
    from .._compare_locate_render import _counts, _delta, _tolerance_lines

    verdict, cause, op = doc.get("verdict"), doc.get("cause"), doc.get("op")
    items: list[tuple[str, Any]] = []
    if verdict == "program" and cause:
        items.append((f"where the programs part ({cause.get('kind')})", _both(cause)))
        if op and op.get("row") != cause.get("row"):
            items.append(("the first value it changes", _both(op)))
    elif op:
        same = "identical" if verdict in ("origin", "rng") else "DIFFERENT"
        items += [("op", _both(op)), ("inputs", f"{same} in both commands; outputs differ")]
    elif cause:
        items.append(("the programs differ (no value did in the traced step)", _both(cause)))
    delta = _delta(doc.get("difference"), "outputs")
    items.append(("difference", delta.strip() if delta else None))
    if verdict != "not-reproduced":
        lines = _tolerance_lines(doc)
        if doc.get("tolerance_op"):
            items.append((lines[0].strip().rstrip(":"), _both(doc["tolerance_op"])))
            delta = _delta(doc.get("tolerance_difference"), "outputs")
            items.append(("its difference", delta.strip() if delta else None))
        else:
            items.append(("tolerance", " ".join(line.strip() for line in lines)))
    named = {d.get("row") for d in (cause, op) if d}
    more = [d for d in doc.get("program_differences") or [] if d.get("row") not in named]
    if more:
        items.append(("other program differences", Raw("".join(
            f"<div>{esc(d.get('kind'))}: {_both(d)}</div>" for d in more[:4]) + ("…" if len(more) > 4 else ""))))
    steps = ", ".join(map(str, doc.get("traced_steps") or [])) or "-"
    n = doc.get("ops_traced") or [0, 0]
    traced = f"traced step {steps}: {n[0]} ops in A, {n[1]} in B; {_counts(doc)}"
    return Raw(f'<p class="muted">{esc(traced)}</p>' + dl(items))


def _one_run_details(doc: dict[str, Any]) -> Raw:
    """What check's (or diff's) locate found: the op, its module and source, whether its inputs agreed."""
    op = doc.get("op") or {}
    where = _where(op)
    same_in = "identical" if doc.get("verdict") in ("origin", "rng") else "DIFFERENT"
    return Raw(dl([("op", Raw(code(op["op"]))), ("phase", op.get("phase")),
                   ("op #", f"{doc.get('op_index')} of step {doc.get('step')}"),
                   ("module", name(op.get("module") or "-")),
                   ("created at" if op.get("phase") == "backward" else "source", Raw(code(where))),
                   ("line", Raw(code(op["code"])) if op.get("code") else None),
                   ("inputs", f"{same_in} in both runs; outputs differ"),
                   (f"deterministic kernel on {doc.get('device')}", doc.get("deterministic_kernel"))]))


def locate(doc: dict[str, Any] | None, text: str, *, title: str = "Locate") -> Raw:
    """The --locate section: what was found, the source lines, the ops around it, why. The fix is not repeated
    here: the page shows it under the verdict (:func:`answer`). ``text`` is the terminal's rendering of the same
    document, shown for shapes this page does not lay out (a compiled program, a failed trace)."""
    if doc is None:
        return Raw("")
    verdict = str(doc.get("verdict") or "")
    parts = [f"<p>{badge(verdict or 'info', verdict.upper())}<strong>{esc(doc.get('title') or verdict or 'locate')}"
             "</strong></p>"]
    sided = _sided(doc)
    if verdict in ("nothing-to-locate", "skipped"):
        return section(title, "".join(parts), anchor="locate")
    if doc.get("compiled") or verdict == "failed" or not isinstance(doc.get("op") or doc.get("cause"), dict):
        kept = [line for line in text.splitlines() if not line.lstrip().startswith("Fix:")]
        parts.append(f"<pre>{esc_lines(chr(10).join(kept).strip(chr(10)))}</pre>")
    elif sided:
        parts.append(_sided_details(doc))
    else:
        parts += [_one_run_details(doc), _source(doc)]
    context = doc.get("context") or []
    if context and verdict != "failed":
        two = any("a" in r or "b" in r for r in context)  # compare's rows: two commands, A and B
        parts.append(op_table(context, ("A", "B") if two else ("run A", "run B")))
    for label, key in (("Why", "explanation"), ("Note", "note")):
        if doc.get(key):
            parts.append(f"<p><strong>{label}:</strong> {esc(doc[key])}</p>")
    return section(title, "".join(parts), anchor="locate")


def esc_lines(text: str) -> str:
    """Multi-line terminal text for a ``<pre>``: each line escaped on its own (newlines kept)."""
    return "\n".join(esc(line) for line in text.splitlines())


def found(doc: dict[str, Any] | None) -> Raw | None:
    """One line for the box under the verdict: what --locate found and where, linking to the Locate section; None
    when it found nothing to show."""
    if not doc or doc.get("verdict") in NOT_LOCATED:
        return None
    more = ' (<a href="#locate">Locate</a> below: the source and the ops around it)'
    title = esc(doc.get("title") or doc.get("verdict"))
    op = doc.get("op")
    if _sided(doc):
        row = doc.get("cause") if doc.get("verdict") == "program" and doc.get("cause") else op
        sites = [] if not row else [f"{side} {code(s.get('op'))}{_at(s)}"
                                    for side, s in (("A", row.get("a")), ("B", row.get("b"))) if s]
        if row and len(sites) == 2 and (row["a"].get("op"), _where(row["a"])) == (row["b"].get("op"),
                                                                                    _where(row["b"])):
            sites = [f"{code(row['a'].get('op'))}{_at(row['a'])} on both sides"]
        return Raw(f"{title}: {'; '.join(sites)}{more}" if sites else f"{title}{more}")
    if isinstance(op, dict) and op.get("op"):
        module = f" in module {name(op['module'])}" if op.get("module") else ""
        return Raw(f"{title}: {code(op['op'])}{module}{_at(op)}{more}")
    return Raw(f"{title}{more}")


POINTS_DOWN = ("See Locate below",)  # a terminal Next that only points at the Locate part: the box shows it instead


def answer(*, fix: str | None = None, action: str | None = None, located: dict[str, Any] | None = None,
           first: list[tuple[str, Any]] | None = None) -> Raw:
    """The box right under the verdict: ``first`` (e.g. bisect's first bad commit), what --locate found, the fix,
    and the next command (the terminal's ``Next:``; left out when it only says "See Locate below" and the box
    already says what Locate found). Nothing when there is nothing to do."""
    shown = found(located)
    fix = fix or (located or {}).get("fix")
    if action and (shown is not None or fix) and action.startswith(POINTS_DOWN):
        action = None
    items = [*(first or []), ("Found", shown), ("Fix", fix), ("Next", action)]
    rows = [f"<p><strong>{esc(k)}:</strong> {v if isinstance(v, Raw) else esc(v)}</p>" for k, v in items if v]
    return Raw(f'<div class="next" id="next">{"".join(rows)}</div>') if rows else Raw("")
