"""The page: escaping, the document skeleton (CSS, the table-sorting script), and small building blocks.

>>> from torchrepro.cli._html.page import esc, table
>>> esc('<script>"&"</script>\\x1b[31m')
'&lt;script&gt;&quot;&amp;&quot;&lt;/script&gt;\\\\x1b[31m'
>>> "<th" in table(["a"], [[1]])
True
>>> name("layers.0.update_gate")
'<span class="name">layers.<wbr>0.<wbr>update_<wbr>gate</span>'
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..._core.table import printable
from ..._version import __version__


def esc(value: Any) -> str:
    """Text safe inside HTML elements and quoted attributes: control and bidi characters escaped as Python writes
    them (an ANSI colour code shows as ``\\x1b[31m``), then ``<``, ``>``, ``&`` and quotes as entities."""
    return html.escape(printable("" if value is None else str(value)), quote=True)


def num(x: float | int | None, digits: int = 3) -> str:
    """A number as the terminal shows it: ``-`` for none, ``0``, or 3 significant digits in e-notation."""
    if x is None:
        return "-"
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    return "0" if x == 0 else f"{x:.{digits}e}"


def cell(value: Any, sort: float | int | None = None, cls: str = "") -> str:
    """A table cell; ``sort`` is the value the column sorts by (numbers sort as numbers, ``-`` last)."""
    attrs = f' data-sort="{esc(sort)}"' if sort is not None else ""
    attrs += f' class="{cls}"' if cls else ""
    return f"<td{attrs}>{value if isinstance(value, Raw) else esc(value)}</td>"


class Raw(str):
    """Markup built here (already escaped): put into a page as it is."""


BREAK_AFTER = (".", "_")  # where a dotted name (module, tensor, parameter) may wrap: never inside a word


def name(value: Any) -> Raw:
    """A module or tensor name that wraps only after a dot or an underscore (``layers.0.`` / ``update_gate``), never
    inside a word: ``<wbr>`` after each, and ``word-break: keep-all`` on the span (a copy keeps the plain name)."""
    text = esc(value)
    for ch in BREAK_AFTER:  # no escaped entity holds a dot or an underscore
        text = text.replace(ch, ch + "<wbr>")
    return Raw(f'<span class="name">{text}</span>')


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], *, sortable: bool = False, cls: str = "",
          caption: str | None = None, row_classes: Sequence[str] | None = None) -> Raw:
    """An HTML table; cells are escaped unless they are :class:`Raw` or already ``<td>`` markup."""
    classes = " ".join(c for c in ("sortable" if sortable else "", cls) if c)
    out = ['<div class="tablebox">' + (f'<table class="{classes}">' if classes else "<table>")]  # scrolls when narrow
    if caption:
        out.append(f"<caption>{esc(caption)}</caption>")
    if sortable:
        out.append("<thead><tr>" + "".join(f'<th scope="col"><button type="button">{esc(h)}</button></th>'
                                           for h in head) + "</tr></thead><tbody>")
    else:
        out.append("<thead><tr>" + "".join(f'<th scope="col">{esc(h)}</th>' for h in head) + "</tr></thead><tbody>")
    for i, row in enumerate(rows):
        klass = row_classes[i] if row_classes and i < len(row_classes) else ""
        tds = "".join(c if isinstance(c, Raw) and c.startswith("<td") else cell(c)
                      for c in row)
        out.append(f'<tr class="{klass}">{tds}</tr>' if klass else f"<tr>{tds}</tr>")
    out.append("</tbody></table></div>")
    return Raw("".join(out))


def td(value: Any, sort: float | int | None = None, cls: str = "") -> Raw:
    """A cell with a sort key or a class, for :func:`table` rows."""
    return Raw(cell(value, sort, cls))


def dl(items: Iterable[tuple[str, Any]]) -> Raw:
    """A definition list of label/value pairs (values escaped unless :class:`Raw`); pairs with None are left out."""
    rows = [f"<dt>{esc(k)}</dt><dd>{v if isinstance(v, Raw) else esc(v)}</dd>" for k, v in items if v is not None]
    return Raw(f"<dl>{''.join(rows)}</dl>") if rows else Raw("")


def link(target: str | Path | None, base: Path, text: str | None = None, *, written: bool = False) -> Raw:
    """A link to a file of the output, relative to the report's directory (the report moves with its folder);
    a path that does not exist is shown as text, unless ``written`` (the command writes it after the report)."""
    if not target:
        return Raw("-")
    path = Path(target)
    shown = text if text is not None else str(target)
    if not path.exists() and not written:
        return Raw(f"{esc(shown)} <span class=\"muted\">(missing)</span>")
    try:
        rel = os.path.relpath(path, base)
    except ValueError:  # another drive (Windows)
        rel = str(path)
    href = quote(Path(rel).as_posix() + ("/" if path.is_dir() else ""), safe="/._-~")
    return Raw(f'<a href="{href}">{esc(shown)}</a>')


VERDICT_CLASS = {"identical": "ok", "equivalent": "ok", "same": "ok", "good": "ok", "found": "bad",
                 "diverged": "bad", "breaks-bitwise": "bad", "differs": "warn", "bad": "bad", "skipped": "muted",
                 "ambiguous": "warn", "not-reproduced": "warn", "error": "bad", "fail": "bad", "warn": "warn",
                 "pass": "ok", "info": "muted", "origin": "bad", "rng": "bad", "control-flow": "warn",
                 "compiled-kernel": "bad", "compiled-rng": "bad", "none-differs": "warn"}


def badge(verdict: str, text: str | None = None) -> Raw:
    """The verdict as a word in a coloured box: the word carries the meaning, the colour only repeats it."""
    return Raw(f'<span class="badge {VERDICT_CLASS.get(verdict, "muted")}">{esc(text or verdict.upper())}</span>')


def section(title: str, body: str, *, anchor: str | None = None, note: str | None = None) -> Raw:
    ident = f' id="{esc(anchor)}"' if anchor else ""
    extra = f'<p class="muted">{esc(note)}</p>' if note else ""
    return Raw(f"<section{ident}><h2>{esc(title)}</h2>{extra}{body}</section>")


def para(text: str, cls: str = "") -> Raw:
    return Raw(f'<p class="{cls}">{esc(text)}</p>' if cls else f"<p>{esc(text)}</p>")


def code(text: str) -> Raw:
    return Raw(f"<code>{esc(text)}</code>")


CSS = """
:root{color-scheme:light dark;--fg:#1b1f24;--bg:#fff;--muted:#57606a;--line:#d0d7de;--soft:#f6f8fa;
--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700;--hl:#fff8c5;--s0:#0969da;--s1:#cf222e;--s2:#1a7f37;--s3:#8250df;
--s4:#bc4c00;--s5:#57606a;--link:#0969da}
@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--bg:#0d1117;--muted:#9198a1;--line:#3d444d;--soft:#151b23;
--ok:#3fb950;--bad:#f85149;--warn:#d29922;--hl:#3b2e00;--s0:#4493f8;--s1:#f85149;--s2:#3fb950;--s3:#ab7df8;
--s4:#ec8e2c;--s5:#9198a1;--link:#4493f8}}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1100px;padding:24px 20px 48px;font:15px/1.5 system-ui,-apple-system,"Segoe UI",
Roboto,"Noto Sans",Arial,sans-serif;color:var(--fg);background:var(--bg)}
h1{font-size:22px;margin:0 0 8px}h2{font-size:18px;margin:28px 0 8px;padding-bottom:4px;
border-bottom:1px solid var(--line)}h3{font-size:15px;margin:16px 0 6px}
a{color:var(--link)}code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",
monospace;font-size:13px}
pre{background:var(--soft);border:1px solid var(--line);border-radius:6px;padding:8px 10px;overflow-x:auto;
white-space:pre-wrap;word-break:break-word}
.muted{color:var(--muted)}.nowrap{white-space:nowrap}
.badge{display:inline-block;font-weight:700;letter-spacing:.04em;padding:2px 10px;
border-radius:6px;border:2px solid currentColor;margin-right:8px}
.ok{color:var(--ok)}.bad{color:var(--bad)}.warn{color:var(--warn)}
.headline{font-size:16px;margin:8px 0}.next{border-left:4px solid var(--link);padding:6px 12px;background:var(--soft)}
div.next{margin:12px 0}div.next p{margin:4px 0}
.tablebox{overflow-x:auto;max-width:100%}.name{overflow-wrap:normal;word-break:keep-all}
td.code>code{display:inline-block;min-width:12em}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:8px 0}dt{color:var(--muted)}
dd{margin:0;word-break:break-word}
table{border-collapse:collapse;margin:8px 0;width:100%;font-size:13px}caption{text-align:left;color:var(--muted);
padding:4px 0}th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top;
word-break:break-word}th{background:var(--soft);white-space:nowrap}td[data-sort]{font-variant-numeric:tabular-nums;white-space:nowrap}
th button{all:unset;cursor:pointer;font-weight:600}th button::after{content:" \\2195";color:var(--muted)}
th[aria-sort=ascending] button::after{content:" \\2191"}th[aria-sort=descending] button::after{content:" \\2193"}
tr.origin td{background:var(--hl);font-weight:600}tr.origin td:first-child::before{content:"\\21D2 "}
tr.effect td{background:var(--hl)}tr.effect td:first-child::before{content:"\\2192 "}
.plots{display:flex;flex-wrap:wrap;gap:16px}.plot{flex:1 1 480px;min-width:0}
svg.chart{max-width:100%;height:auto;display:block;color:var(--fg)}svg.chart text{fill:currentColor;font-size:11px}
.chain{display:flex;flex-wrap:wrap;gap:6px;padding:0;list-style:none}.chain li{border:1px solid var(--line);
border-radius:6px;padding:4px 8px;font-size:13px}.chain li.first{outline:3px solid var(--bad)}
.src td.ln{color:var(--muted);text-align:right;width:4em}.src tr.origin td{background:var(--hl)}
nav{margin:12px 0 4px;font-size:13px;color:var(--muted)}
footer{margin-top:40px;color:var(--muted);font-size:12px}
@media print{body{max-width:none;padding:0;font-size:11pt}th button::after{content:""}section{break-inside:auto}
table,svg,pre{break-inside:avoid}a{color:inherit}.tablebox{overflow:visible}}
"""

# Sort a table by a clicked column: numbers (data-sort) as numbers, the rest as text; "-" and empty last.
SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function(t){
 var ths=t.querySelectorAll("thead th");
 ths.forEach(function(th,i){th.querySelector("button").addEventListener("click",function(){
  var asc=th.getAttribute("aria-sort")!=="ascending";ths.forEach(function(h){h.removeAttribute("aria-sort")});
  th.setAttribute("aria-sort",asc?"ascending":"descending");var body=t.tBodies[0];
  var rows=Array.prototype.slice.call(body.rows);
  function key(r){var c=r.cells[i];if(!c)return null;var s=c.getAttribute("data-sort");
   if(s!==null&&s!==""&&!isNaN(Number(s)))return Number(s);var x=c.textContent.trim();return x==="-"||x===""?null:x}
  rows.sort(function(a,b){var x=key(a),y=key(b);if(x===null)return y===null?0:1;if(y===null)return -1;
   var r=(typeof x==="number"&&typeof y==="number")?x-y:String(x).localeCompare(String(y));return asc?r:-r});
  rows.forEach(function(r){body.appendChild(r)});});});});
"""


NAV = {"runs": "Runs", "locate": "Locate", "plots": "Plots", "first": "First divergence", "growth": "Growth",
       "tensors": "Tensors", "environment": "Environment", "files": "Files", "ranks": "Ranks",
       "restored": "Restored", "chain": "Commits", "tested": "Tested", "summary": "Summary", "checks": "Checklist"}
_SECTION = re.compile(r'<section id="([^"]+)"><h2>([^<]*)</h2>')  # both already escaped by section()


def document(title: str, body: Sequence[str], *, beside: str | None = "the JSON document beside this file") -> str:
    """The whole page: no external reference of any kind (no stylesheet, font, script or image is fetched)."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    found = [m for part in body[1:] for m in _SECTION.findall(part)]
    nav = ("<nav aria-label=\"sections\">" + " · ".join(f'<a href="#{a}">{NAV.get(a, t)}</a>' for a, t in found)
           + "</nav>" if len(found) > 2 else "")
    body = [*body[:1], nav, *body[1:]]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "script-src 'unsafe-inline'; img-src data:\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            + "".join(body)
            + f"<footer>Written by torchrepro {esc(__version__)} on {esc(stamp)}. The terminal output"
              + (f" and {esc(beside)}" if beside else " (and --json)") + " hold the same result.</footer>"
            f"<script>{SCRIPT}</script></body></html>\n")
