"""Line charts as inline SVG, drawn here (no plotting library, no script): linear or log y axis, each series with
its own dash pattern, marker and a text legend (readable without colour), long series downsampled.

Curves that lie on each other (two runs with the same loss) both stay visible: with more than one series the first
is drawn wide and pale underneath, the others thin, dashed and marked on top of it.

>>> from torchrepro.cli._html.svg import Series, line_chart
>>> svg = line_chart([Series("run 1", [(1, 0.5), (2, 0.25)])], title="Loss", xlabel="step", ylabel="loss")
>>> svg.startswith("<svg") and "run 1" in svg
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .page import esc

MAX_POINTS = 1200  # per series: a 100k-step run stays a small file
DASHES = ("", "6 4", "2 3", "10 3 2 3", "1 4", "8 2")
MARKERS = ("", "circle", "square", "triangle", "diamond", "cross")  # series 2 on: a shape every tenth of the curve
MARKS_PER_SERIES = 10
UNDER = ' stroke-width="4.5" stroke-opacity="0.4"'  # the first of several series: wide and pale, drawn first
OVER = ' stroke-width="1.6"'


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]] = field(default_factory=list)


def downsample(points: list[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ``limit`` points: each bucket keeps its lowest and highest y, so spikes survive.

    >>> len(downsample([(float(i), float(i % 7)) for i in range(100_000)], 1000)) <= 1000
    True
    """
    if len(points) <= limit:
        return points
    buckets = max(1, limit // 2)
    size = len(points) / buckets
    out: list[tuple[float, float]] = []
    for b in range(buckets):
        chunk = points[int(b * size):int((b + 1) * size)]
        if not chunk:
            continue
        lo, hi = min(chunk, key=lambda p: p[1]), max(chunk, key=lambda p: p[1])
        out.extend(sorted({lo, hi}))
    return out


def _nice(span: float) -> float:
    """A step of 1, 2 or 5 times a power of ten giving about 5 ticks over ``span``."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / 5
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _ticks(lo: float, hi: float, step: float | None = None) -> list[float]:
    step = step or _nice(hi - lo)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(0, int((hi - first) / step + 1e-9) + 1)]


def _label(v: float, step: float | None = None) -> str:
    """A tick label with as many digits as the tick spacing needs (close values stay apart: 84.1203, 84.1204)."""
    if v == 0:
        return "0"
    if step is None or not 1e-3 <= abs(v) < 1e6:
        return f"{v:.3g}" if 1e-3 <= abs(v) < 1e5 else f"{v:.0e}"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{v:.{min(decimals, 12)}f}"


def _marker(kind: str, x: float, y: float, colour: str) -> str:
    """A hollow shape centred on (x, y): the series is told apart without colour where curves overlap."""
    r = 3.5
    shape = {"circle": f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}"',
             "square": f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r}" height="{2 * r}"',
             "triangle": f'<polygon points="{x:.1f},{y - r - 1:.1f} {x + r + 0.5:.1f},{y + r:.1f} '
                         f'{x - r - 0.5:.1f},{y + r:.1f}"',
             "diamond": f'<polygon points="{x:.1f},{y - r - 1:.1f} {x + r + 1:.1f},{y:.1f} {x:.1f},{y + r + 1:.1f} '
                        f'{x - r - 1:.1f},{y:.1f}"',
             "cross": f'<path d="M{x - r:.1f} {y - r:.1f}L{x + r:.1f} {y + r:.1f}M{x - r:.1f} {y + r:.1f}'
                      f'L{x + r:.1f} {y - r:.1f}"'}.get(kind)
    return f'{shape} fill="none" stroke="{colour}" stroke-width="1.4"/>' if shape else ""


def _style(i: int, several: bool) -> tuple[str, str, str]:
    """Colour, line attributes and marker of series ``i`` (``several``: the chart has more than one series)."""
    dash = DASHES[i % len(DASHES)]
    width = UNDER if several and i == 0 else OVER
    return f"var(--s{i % 6})", width + (f' stroke-dasharray="{dash}"' if dash else ""), MARKERS[i % len(MARKERS)]


def line_chart(series: Sequence[Series], *, title: str, xlabel: str, ylabel: str, log_y: bool = False,
               marker_x: float | None = None, marker_label: str | None = None, empty_text: str | None = None,
               width: int = 520, height: int = 300) -> str:
    """An ``<svg>`` element; with ``log_y`` only positive values are drawn. ``marker_x``: a labelled vertical line
    (the first divergent step). With no point to draw, ``empty_text`` is written in the frame instead."""
    left, right, top, bottom = 88, 12, 28, 44
    longest = 36 + 6.5 * max((len(s.label) for s in series), default=0)  # px: the line, a gap, 11px text
    columns = next(c for c in (3, 2, 1) if c == 1 or longest <= (width - left - right) / c)  # labels never overlap
    legend_h = 18 * ((len(series) + columns - 1) // columns) + 8 if series else 0
    height += legend_h
    pw, ph = width - left - right, height - top - bottom - legend_h
    drawn = [Series(s.label, downsample([(x, y) for x, y in s.points
                                          if math.isfinite(x) and math.isfinite(y) and (y > 0 or not log_y)]))
             for s in series]
    xs = [x for s in drawn for x, _ in s.points] + ([marker_x] if marker_x is not None else [])
    ys = [y for s in drawn for _, y in s.points]
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" aria-label="{esc(title)}"><title>{esc(title)}</title>',
           f'<text x="{left}" y="16" font-weight="600" font-size="13">{esc(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="currentColor" '
           'stroke-opacity="0.35"/>']
    if not ys:
        out.append(f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle">'
                   f'{esc(empty_text or "nothing to draw")}</text></svg>')
        return "".join(out)
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if log_y:
        e0, e1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
        if e1 == e0:
            e1 += 1
        y0, y1 = float(e0), float(e1)

        def ty(v: float) -> float:
            return top + ph - (math.log10(v) - y0) / (y1 - y0) * ph
        every = max(1, math.ceil((e1 - e0) / 6))
        mantissas = (1, 2, 5) if e1 - e0 <= 2 else (1,)  # a short range gets 2 and 5 times each power of ten
        yticks = [m * 10.0 ** e for e in range(e0, e1 + 1, every) for m in mantissas if m * 10.0 ** e <= 10.0 ** e1]
        ystep = None
    else:
        lo, hi = min(ys), max(ys)
        if hi == lo:
            lo, hi = lo - (abs(lo) or 1) * 0.5, hi + (abs(hi) or 1) * 0.5
        pad = (hi - lo) * 0.05
        y0, y1 = lo - pad, hi + pad

        def ty(v: float) -> float:
            return top + ph - (v - y0) / (y1 - y0) * ph
        yticks = [t for t in _ticks(y0, y1) if y0 <= t <= y1]
        ystep = _nice(y1 - y0)

    def tx(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw
    for t in yticks:
        y = ty(t)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="currentColor" '
                   f'stroke-opacity="0.12"/><text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f'{_label(t, ystep)}</text>')
    xstep = max(1.0, _nice(x1 - x0))  # steps are whole numbers
    for t in [t for t in _ticks(x0, x1, xstep) if x0 <= t <= x1]:
        x = tx(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="currentColor"/>'
                   f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{_label(t, xstep)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{top + ph + 32}" text-anchor="middle">{esc(xlabel)}</text>'
               f'<text transform="translate(12 {top + ph / 2}) rotate(-90)" text-anchor="middle">{esc(ylabel)}'
               f'{" (log scale)" if log_y else ""}</text>')
    if marker_x is not None:
        x = tx(marker_x)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="var(--bad)" '
                   f'stroke-width="1.5" stroke-dasharray="4 3"/>')
        if marker_label:
            anchor = "end" if x > left + pw * 0.7 else "start"
            dx = -4 if anchor == "end" else 4
            out.append(f'<text x="{x + dx:.1f}" y="{top + 12}" text-anchor="{anchor}" fill="var(--bad)">'
                       f'{esc(marker_label)}</text>')
    several = len(series) > 1
    for i, s in enumerate(drawn):
        colour, line, marker = _style(i, several)
        if len(s.points) == 1:
            (x, y), = s.points
            out.append(_marker(marker, tx(x), ty(y), colour) if marker else
                       f'<circle cx="{tx(x):.1f}" cy="{ty(y):.1f}" r="3" fill="{colour}"/>')
        elif s.points:
            path = " ".join(f"{tx(x):.1f},{ty(y):.1f}" for x, y in s.points)
            out.append(f'<polyline fill="none" stroke="{colour}"{line} points="{path}"/>')
            every = max(1, len(s.points) // MARKS_PER_SERIES)  # each series' marks start elsewhere: none hide
            out += [_marker(marker, tx(x), ty(y), colour)
                    for x, y in s.points[(every * (i - 1) // 3) % every::every]] if marker else []
    for i, s in enumerate(series):  # the legend names every series, drawn or not
        row, col = divmod(i, columns)
        lx, ly = left + col * (pw / columns), top + ph + 54 + row * 18
        colour, line, marker = _style(i, several)
        out.append(f'<line x1="{lx:.1f}" x2="{lx + 26:.1f}" y1="{ly - 4:.1f}" y2="{ly - 4:.1f}" stroke="{colour}"'
                   f'{line}/>{_marker(marker, lx + 13, ly - 4, colour)}'
                   f'<text x="{lx + 32:.1f}" y="{ly:.1f}">{esc(s.label)}</text>')
    out.append("</svg>")
    return "".join(out)
