"""The replay's report as one self-contained HTML page: inline SVG plots, an inline style sheet, no script.

Everything a recording or a plugin supplied (host and VM IDs, unit names, reasons, errors) is escaped; property
values are never shown (the report has none: :mod:`.report`). The page's Content-Security-Policy forbids
scripts and anything loaded from elsewhere, so it can be opened offline and passed around.
"""

from __future__ import annotations

import math
from datetime import datetime
from html import escape
from typing import Any

from vmsched.whatif.report import Report

#: changed calls the page explains at most (--json has them all)
MOST = 1000
_CSP = "default-src 'none'; style-src 'unsafe-inline'"
_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:80em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;
vertical-align:top}th{background:#f3f3f3}.num{text-align:right}.changed{background:#fff4d6}
dt{font-weight:600}details{margin:.4em 0}summary{cursor:pointer}.note{color:#666}svg{background:#fafafa;border:1px solid #ddd}
.base{fill:#999}.cand{fill:#2a6fdb}.plots svg{margin:0 .5em .5em 0}
"""
#: duration bins of the plots: 4 a decade from 10 us to 100 s
_LOW, _DECADES, _PER_DECADE = -5, 7, 4


def e(value: object) -> str:
    return escape(str(value), quote=True)


def _when(at: float | None) -> str:
    return datetime.fromtimestamp(at).isoformat(sep=" ", timespec="seconds") if at is not None else "-"


def _ms(value: float | None) -> str:
    return f"{value * 1000:.2f}" if value is not None else "-"


def render(report: Report) -> str:
    data = report.data()
    change = ", ".join(data["change"]) or "none"
    head = (f"<h1>vmsched replay</h1><dl><dt>candidate</dt><dd>{e(data['candidate'])}</dd><dt>changes</dt>"
            f"<dd>{e(change)}</dd><dt>baseline</dt><dd>{e(data['baseline'])}</dd><dt>calls</dt>"
            f"<dd>{data['calls']} from {data['files']} file(s), {e(_when(data['first']))} to "
            f"{e(_when(data['last']))}</dd></dl>")
    ops = "".join(f"<tr><td>{e(op)}</td><td class=num>{c['calls']}</td><td class=num>{c['changed']}</td>"
                  f"<td>{e(c['change'])}</td><td class=num>{c['unknown']}</td><td class=num>{c['ties']}</td></tr>"
                  for op, c in data["ops"].items())
    body = [head, "<h2>Decisions</h2><table><tr><th>operation</th><th>calls</th><th>changed</th><th>a change is</th>"
                  f"<th>unknown units</th><th>tied best</th></tr>{ops}</table>",
            "<p class=note>Score calls: the engine adds its own units and its selector may still choose otherwise. "
            "A call whose units the candidate lacks counts as unknown, not as a change.</p>"]
    skipped = "".join(f"<li>{n} call(s): {e(why)}</li>" for why, n in data["skipped"].items())
    notes = "".join(f"<li>{e(n)}</li>" for n in data["notes"])
    if skipped or notes:
        body.append(f"<h2>Not replayed</h2><ul>{skipped}{notes}</ul>")
    body += [_units(data), _durations(report), _ranks(data), _changes(data["changes"])]
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}"><title>vmsched replay</title>'
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n")


def _units(data: dict[str, Any]) -> str:
    rows = []
    for name, sides in data["units"].items():
        b, c = sides["baseline"], sides["candidate"]
        cells = "".join(f"<td class=num>{b[k]}</td><td class=num>{c[k]}</td>" for k in ("errors", "timeouts", "unknown"))
        cells += "".join(f"<td class=num>{_ms(b[k])}</td><td class=num>{_ms(c[k])}</td>" for k in ("p50", "p99"))
        rows.append(f"<tr><td>{e(name)}</td>{cells}</tr>")
    pairs = "".join(f"<th colspan=2>{k}</th>" for k in ("errors", "timeouts", "unknown", "p50 ms", "p99 ms"))
    sub = "<th>baseline</th><th>candidate</th>" * 5
    note = ("" if data["side_by_side"] else "<p class=note>The baseline is the recorded outcome: durations recorded "
            "under live load are not compared with the replay's (give a baseline folder to compare them).</p>")
    return (f"<h2>Units</h2><table><tr><th rowspan=2>unit</th>{pairs}</tr><tr>{sub}</tr>{''.join(rows)}</table>"
            + note)


def _bin(seconds: float) -> int:
    if seconds <= 0:
        return 0
    slot = math.floor((math.log10(seconds) - _LOW) * _PER_DECADE)
    return min(max(slot, 0), _DECADES * _PER_DECADE - 1)


_DECADE_LABELS = ("10 µs", "100 µs", "1 ms", "10 ms", "100 ms", "1 s", "10 s", "100 s")


def _histogram(name: str, base: list[float], cand: list[float]) -> str:
    """One unit's durations on a log scale (4 bins a decade): the baseline's row above the candidate's."""
    bins = _DECADES * _PER_DECADE
    counts = [[0] * bins, [0] * bins]
    for series, values in enumerate((base, cand)):
        for v in values:
            counts[series][_bin(v)] += 1
    used = [i for i in range(bins) if counts[0][i] or counts[1][i]]
    if not used:
        return ""
    lo = used[0] // _PER_DECADE * _PER_DECADE
    hi = min(-(-(used[-1] + 1) // _PER_DECADE) * _PER_DECADE, bins)
    width, bar = 360, 340 / (hi - lo)
    top = max(max(c[lo:hi]) for c in counts) or 1
    parts = [f'<text x="10" y="12" font-size="11">{e(name)}: baseline (grey), candidate (blue)</text>']
    for series, cls, floor in ((0, "base", 60), (1, "cand", 104)):
        total = sum(counts[series]) or 1
        for i in range(lo, hi):
            n = counts[series][i]
            if n:
                h = 40 * n / top
                parts.append(f'<rect class={cls} x="{10 + (i - lo) * bar:.1f}" y="{floor - h:.1f}" '
                             f'width="{max(bar - 1, 1):.1f}" height="{h:.1f}"><title>{n} ({100 * n / total:.0f} %)'
                             "</title></rect>")
    for d in range(lo, hi + 1, _PER_DECADE):
        x = 10 + (d - lo) * bar
        anchor = "start" if d == lo else "end" if d == hi else "middle"
        parts.append(f'<line x1="{x:.1f}" y1="106" x2="{x:.1f}" y2="110" stroke="#666"/>'
                     f'<text x="{x:.1f}" y="122" font-size="10" text-anchor="{anchor}">'
                     f"{_DECADE_LABELS[d // _PER_DECADE]}</text>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="128" role="img">{"".join(parts)}'
            "</svg>")


def _durations(report: Report) -> str:
    plots = []
    for name, sides in sorted(report.units.items()):
        svg = _histogram(name, sides["baseline"].durations, sides["candidate"].durations)
        if svg:
            plots.append(svg)
    if not plots:
        return ""
    return ("<h2>Durations per unit</h2><p class=note>Each unit's call durations, 4 bins a decade.</p><div class=plots>"
            + "".join(plots) + "</div>")


def _ranks(data: dict[str, Any]) -> str:
    ranks = {int(k): n for k, n in data["ranks"].items()}
    if not ranks:
        return ""
    shown = [(str(r), ranks.get(r, 0)) for r in range(1, 11)] + [(">10", sum(n for r, n in ranks.items() if r > 10))]
    top = max(n for _, n in shown) or 1
    bars = []
    for i, (label, n) in enumerate(shown):
        h = 100 * n / top
        bars.append(f'<rect class=cand x="{20 + i * 40}" y="{110 - h:.1f}" width="30" height="{h:.1f}">'
                    f"<title>{n} call(s)</title></rect><text x=\"{25 + i * 40}\" y=\"124\" font-size=\"10\">{label}"
                    f'</text><text x="{22 + i * 40}" y="{106 - h:.1f}" font-size="9">{n}</text>')
    return ("<h2>How far the chosen host moved</h2><p>Per score call, the candidate's rank of the host the baseline "
            "ranked first (1: still first; of tied hosts, the best placed).</p>"
            f'<svg xmlns="http://www.w3.org/2000/svg" width="480" height="130" role="img">{"".join(bars)}</svg>')


def _changes(changes: list[dict[str, Any]]) -> str:
    if not changes:
        return "<h2>Changed calls</h2><p>None.</p>"
    out = [f"<h2>Changed calls</h2><p>{min(MOST, len(changes))} of {len(changes)}.</p>"]
    for ch in changes[:MOST]:
        base, cand = ch["baseline"], ch["candidate"]
        units = list(dict.fromkeys(u for cells in (*base.values(), *cand.values()) for u in cells if u != "result"))
        head = "".join(f"<th>{e(u)}</th>" for u in units)
        rows = []
        for host in cand:
            cells = []
            for u in [*units, "result"]:
                b, c = base.get(host, {}).get(u, "-"), cand.get(host, {}).get(u, "-")
                text = e(c) if b == c else f"{e(b)} &rarr; {e(c)}"
                cells.append(f'<td{" class=changed" if b != c else ""}>{text}</td>')
            rows.append(f"<tr><td>{e(host)}</td>{''.join(cells)}</tr>")
        keys = ", ".join(ch["properties"]) or "none"
        omitted = f"; left out of the recording: {e(', '.join(ch['omitted']))}" if ch["omitted"] else ""
        out.append(f"<details><summary>{e(_when(ch['time']))} {e(ch['op'])} {e(ch['id'])} (VM {e(ch['vm'] or '-')}): "
                   f"{e(ch['what'])}</summary><p class=note>gateway {e(ch['gateway'])}; units "
                   f"{e(', '.join(ch['units']))}; property keys {e(keys)}{omitted}</p>"
                   f"<table><tr><th>host</th>{head}<th>result</th></tr>{''.join(rows)}</table></details>")
    return "".join(out)
