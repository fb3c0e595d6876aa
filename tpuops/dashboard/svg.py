"""Draw a ``Timeline`` and a goodput split as inline SVG (pure; server-side, so a page needs no chart library).

Every drawn element carries what it shows as data attributes (``data-state``, ``data-kind``,
``data-lane``) and a ``<title>`` tooltip: the browser tests assert on those, not on pixels.
Text is escaped once, here.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from tpuops.accounting.timeline import Timeline

WIDTH = 960
LANE_H = 22
LABEL_W = 170
AXIS_H = 24


def _x(at: float, timeline: Timeline) -> float:
    span = max(timeline.end - timeline.start, 1e-9)
    return LABEL_W + (at - timeline.start) / span * (WIDTH - LABEL_W - 10)


def timeline_svg(timeline: Timeline) -> str:
    """Lanes of bars by state, marks as vertical lines across every lane, a time axis in seconds."""
    height = AXIS_H + LANE_H * max(len(timeline.lanes), 1) + 8
    rows = {lane: i for i, lane in enumerate(timeline.lanes)}
    parts = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="run timeline">']
    for lane, i in rows.items():
        y = AXIS_H + i * LANE_H
        parts.append(f'<text class="lane-label" x="4" y="{y + 15}">{escape(lane)}</text>')
    for bar in timeline.bars:
        x0, x1 = _x(bar.start, timeline), _x(bar.end, timeline)
        y = AXIS_H + rows[bar.lane] * LANE_H + 3
        parts.append(f'<rect class="bar state-{escape(bar.state)}" data-state="{escape(bar.state)}" '
                     f'data-lane="{escape(bar.lane)}" x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1.0):.1f}" '
                     f'height="{LANE_H - 6}"><title>{escape(bar.lane)}: {escape(bar.state)} '
                     f'{bar.end - bar.start:.0f} s</title></rect>')
    bottom = AXIS_H + LANE_H * max(len(timeline.lanes), 1)
    for mark in timeline.marks:
        x = _x(mark.at, timeline)
        parts.append(f'<line class="mark mark-{mark.kind.value}" data-kind="{mark.kind.value}" x1="{x:.1f}" '
                     f'x2="{x:.1f}" y1="{AXIS_H - 6}" y2="{bottom}"><title>{escape(mark.label)}</title></line>')
    span = timeline.end - timeline.start
    for tick in range(5):
        at = timeline.start + span * tick / 4
        parts.append(f'<text class="tick" x="{_x(at, timeline):.1f}" y="12">+{at - timeline.start:.0f} s</text>')
    parts.append("</svg>")
    return "".join(parts)


def stacked_bar_svg(parts: Sequence[tuple[str, float]]) -> str:
    """One horizontal bar split by named seconds (the goodput split); nothing to split draws an empty bar."""
    total = sum(max(v, 0.0) for _, v in parts)
    out = [f'<svg class="stacked" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="28" '
           f'viewBox="0 0 {WIDTH} 28" role="img" aria-label="goodput split">']
    x = 0.0
    for name, value in parts:
        if total <= 0 or value <= 0:
            continue
        width = value / total * WIDTH
        out.append(f'<rect class="part part-{escape(name)}" data-part="{escape(name)}" x="{x:.1f}" y="2" '
                   f'width="{width:.1f}" height="24"><title>{escape(name)}: {value:.0f} s '
                   f'({value / total:.0%})</title></rect>')
        x += width
    out.append("</svg>")
    return "".join(out)
