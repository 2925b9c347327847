"""One decision's page (``/console/decisions/{id}``): every unit's verdict on every host, and the result.

A filter page says of each host "kept", or which units dropped it and why. A score page lists the hosts in
vmsched's order (:mod:`vmsched.gateway.decisions.ranking`: lowest weight first) with their rank, ties, weighted
total and the weight sent; each unit's part of a host's total is a bar, inline SVG (its sizes are attributes,
not styles: the console's Content-Security-Policy holds); the unit that decided, the units that scored no host
and why, and a note that the engine adds units of its own. Everything from plugins and the engine is escaped.
"""

from __future__ import annotations

import json
from typing import Any

from vmsched.gateway.console.markup import age, e, number, when
from vmsched.gateway.decisions import ranking

#: a bar's size in pixels
BAR_WIDTH, BAR_HEIGHT = 120, 10


def body(d: dict[str, Any], shadow: str = "") -> str:
    """The page's HTML (inside ``<main>``) of a decision record; ``shadow``: its "Shadow" section, if any."""
    errors = "".join(f"<li>{e(x)}</li>" for x in d["errors"])
    unit_rows = "".join(
        f'<tr class="{"" if u["ok"] else "problem"}"><td>{e(u["unit"])}</td><td>{"ok" if u["ok"] else "failed"}'
        f'{" (timed out)" if u["timed_out"] else ""}</td><td>{u["duration"] * 1000:.1f} ms</td>'
        f'<td><pre>{e(u["error"] or "")}</pre></td><td class="reason">{e(u.get("reason") or "")}</td></tr>'
        for u in d["units"])
    table = _score_table(d) if d["op"] == "score" else _table(d)
    return (f'<h1>{e(d["op"])} decision</h1><p class="summary" id="summary">{e(d["summary"])}</p>'
            f'<dl><dt>time</dt><dd>{when(d["time"])}</dd><dt>VM</dt><dd>{e(d["vm"]) or "-"}</dd>'
            f'<dt>gateway</dt><dd>{e(d["gateway"])}</dd><dt>fallback</dt><dd>{"yes" if d["fallback"] else "no"}</dd>'
            f'<dt>duration</dt><dd>{d["duration"] * 1000:.1f} ms</dd></dl>{shadow}'
            f'<h2>Per unit, per host</h2>{table}'
            + (f'<h2>Errors</h2><ul>{errors}</ul>' if errors else "") + _missing_facts(d)
            + f'<h2>Units</h2><table id="units-detail"><thead><tr><th>unit</th><th>outcome</th><th>duration</th>'
              f'<th>error</th><th>reason</th></tr></thead><tbody>{unit_rows}</tbody></table>'
              f'<h2>Sent to the engine</h2><pre id="sent">{e(_envelope(d))}</pre>'
              f'<p class="note">JSON: <code>/v1/decisions/{e(d["id"])}</code></p>')


# --- filter and balance ---------------------------------------------------------------------------
def _table(d: dict[str, Any]) -> str:
    units = d["units"]
    head = "".join(f'<th>{e(u["unit"])}</th>' for u in units)
    dropped = [set(u.get("dropped", [])) for u in units]
    kept = set(d["result"]) if d["op"] == "filter" and isinstance(d["result"], list) else set()
    rows = []
    for h in d["hosts"]:
        by = [u for u, gone in zip(units, dropped) if u["ok"] and h in gone]
        result = _filter_result(h, kept, by) if d["op"] == "filter" else "<td></td>"
        rows.append(f'<tr><td>{e(h)}</td>{"".join(_cell(d["op"], u, h, gone) for u, gone in zip(units, dropped))}'
                    f'{result}<td>{e(age(d["facts_age"].get(h)))}</td></tr>')
    return (f'<table id="verdicts"><thead><tr><th>host</th>{head}<th>result</th><th>facts age</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _cell(op: str, unit: dict[str, Any], host: str, gone: set[str]) -> str:
    reason = (unit.get("reasons") or {}).get(host)
    why = f'<div class="reason">{e(reason)}</div>' if reason else ""
    if not unit["ok"]:
        return '<td class="failed">ignored</td>'
    if op == "filter":
        return f'<td class="dropped">dropped{why}</td>' if host in gone else f'<td class="kept">kept{why}</td>'
    return f'<td>{"proposed" if host in unit.get("hosts", []) else ""}{why}</td>'


def _filter_result(host: str, kept: set[str], by: list[dict[str, Any]]) -> str:
    """``kept``, or ``dropped by`` the units that dropped the host, each with its reason when it gave one."""
    if host in kept or not by:
        return '<td class="kept">kept</td>'
    reasons = [(u["unit"], u["reasons"][host]) for u in by if host in (u.get("reasons") or {})]
    why = "".join(f'<div class="reason">{e(f"{unit}: {text}" if len(by) > 1 else text)}</div>'
                  for unit, text in reasons)
    return f'<td class="out">dropped by {e(", ".join(u["unit"] for u in by))}{why}</td>'


# --- score ----------------------------------------------------------------------------------------
def _score_table(d: dict[str, Any]) -> str:
    places = ranking.places(d)
    shares = ranking.parts(d)
    idle = ranking.idle(d)
    lead = ranking.lead(places, shares)
    split = ranking.per_unit(d)
    units = d["units"]
    values = [v for share in shares.values() for v in share.values()]
    scale, signed = max(map(abs, values), default=0.0), any(v < 0 for v in values)
    totals = {p.host: sum(share.get(p.host, 0.0) for share in shares.values()) for p in places}
    total_scale, total_signed = max(map(abs, totals.values()), default=0.0), any(t < 0 for t in totals.values())
    deciding = lead.unit if lead is not None else None
    head = "".join(_score_head(u, u["unit"] == deciding, u["unit"] in idle) for u in units)
    rows = []
    for p in places:
        cells = "".join(_score_cell(u, p, shares, scale, signed, split, u["unit"] == deciding, u["unit"] in idle)
                        for u in units)
        total = totals[p.host]
        bar = _bar(total, total_scale, total_signed, f"weighted total {number(total)}")
        rows.append(
            f'<tr class="{"best" if p.rank == 1 else ""}"><td>{e(p.host)}</td>{cells}'
            f'<td class="total">{e(number(total))}{bar}</td>'
            + ("" if split else f'<td class="sent">{p.weight}</td>')
            + f'{_rank_cell(p)}<td>{e(age(d["facts_age"].get(p.host)))}</td></tr>')
    placed = {p.host for p in places}
    width = len(units) + (3 if split else 4)
    rows += [f'<tr><td>{e(h)}</td><td colspan="{width - 1}">no weight sent</td>'
             f'<td>{e(age(d["facts_age"].get(h)))}</td></tr>' for h in dict.fromkeys(d["hosts"]) if h not in placed]
    return (_score_notes(d, lead, idle, split)
            + f'<table id="verdicts" class="scores"><thead><tr><th>host</th>{head}<th>weighted total</th>'
            + ("" if split else "<th>weight sent</th>")
            + f'<th>result</th><th>facts age</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _score_head(unit: dict[str, Any], deciding: bool, idle: bool) -> str:
    marks = ('<div class="mark">deciding</div>' if deciding else "") + (
        '<div class="mark">scored no host</div>' if idle else "")
    return (f'<th class="{"deciding" if deciding else ""}">{e(unit["unit"])} '
            f'<span class="factor">x{e(unit.get("factor", 1))}</span>{marks}</th>')


def _score_notes(d: dict[str, Any], lead: ranking.Lead | None, idle: dict[str, str], split: bool) -> str:
    how = ("Weights were sent per unit (<code>[host, weight, unit]</code>): the engine multiplies each by the "
           "unit's factor and adds them up, which is the weighted total. A bar is a unit's part of it: factor x "
           "weight." if split else
           "A bar is a unit's part of the host's weighted total: factor x score (a host the unit did not score "
           "counts as its worst score). The weight sent is the weighted total as the integer the engine gets, in "
           "the same order.")
    notes = f'<p class="note" id="order">Lowest weight first: the engine prefers lower weights. {how}</p>'
    if lead is not None:
        notes += (f'<p id="deciding">Deciding unit: <strong>{e(lead.unit)}</strong>. {e(lead.best.host)} ranks '
                  f"ahead of {e(lead.next.host)}: {e(lead.unit)} gives {e(lead.next.host)} {e(number(lead.by))} more "
                  f"than {e(lead.best.host)}.</p>")
    if idle:
        items = "".join(f"<li>{e(unit)} scored no host ({e(why)}): it changes no host's rank</li>"
                        for unit, why in idle.items())
        notes += f'<ul id="idle-units">{items}</ul>'
    return notes + ('<p class="note" id="engine-note">The engine adds its own units (its built-in policy units) to '
                    "these weights, so the host it picks may differ.</p>")


def _score_cell(unit: dict[str, Any], place: ranking.Place, shares: dict[str, dict[str, float]], scale: float,
                signed: bool, split: bool, deciding: bool, idle: bool) -> str:
    if not unit["ok"]:
        return '<td class="failed">ignored</td>'
    host, name = place.host, unit["unit"]
    scores = unit.get("scores") or {}
    reason = (unit.get("reasons") or {}).get(host)
    why = f'<div class="reason">{e(reason)}</div>' if reason else ""
    if scores.get(host) is not None:
        text = e(number(scores[host]))
    else:
        text = "not a finite number" if host in scores else "no score"
        if not idle:
            text += ": counts as its worst"
    sent = f'<div class="sent">weight {place.sent[name]}</div>' if split and name in place.sent else ""
    share = shares.get(name, {}).get(host)
    bar = "" if idle or share is None else _bar(share, scale, signed, f"{name}: {number(share)}", deciding)
    return f"<td>{text}{sent}{bar}{why}</td>"


def _rank_cell(place: ranking.Place) -> str:
    tie = (f' <span class="tie" title="the same weight as {place.tied} other host{"s" if place.tied > 1 else ""}">'
           "tied</span>" if place.tied else "")
    best = "<div class=\"reason\">vmsched's best</div>" if place.rank == 1 else ""
    return f'<td class="rank">rank {place.rank}{tie}{best}</td>'


def _bar(value: float, scale: float, signed: bool, label: str, deciding: bool = False) -> str:
    """A horizontal bar of ``value`` on ``scale`` (the largest size shown beside it); ``signed`` puts zero in the
    middle, negative values to its left."""
    zero = BAR_WIDTH / 2 if signed else 0.0
    length = abs(value) / scale * (BAR_WIDTH - zero) if scale else 0.0
    length = max(length, 1.0) if value else 0.0  # a part that is not zero stays visible
    x = zero - length if value < 0 else zero
    axis = f'<line class="axis" x1="{zero:g}" y1="0" x2="{zero:g}" y2="{BAR_HEIGHT}"/>' if signed else ""
    return (f'<svg class="bar{" deciding" if deciding else ""}" width="{BAR_WIDTH}" height="{BAR_HEIGHT}" '
            f'viewBox="0 0 {BAR_WIDTH} {BAR_HEIGHT}" role="img" aria-label="{e(label)}"><title>{e(label)}</title>'
            f'<rect class="track" width="{BAR_WIDTH}" height="{BAR_HEIGHT}"/>'
            f'<rect class="{"neg" if value < 0 else "pos"}" x="{x:.1f}" width="{length:.1f}" height="{BAR_HEIGHT}"/>'
            f"{axis}</svg>")


# --- details ---------------------------------------------------------------------------------------
def _missing_facts(record: dict[str, Any]) -> str:
    """What the units that read host facts lacked: which hosts had no facts and why, and the VM's."""
    missing = record.get("missing_facts")
    if not missing:
        return ""
    causes = missing.get("hosts") or {}
    count = sum(len(hosts) for hosts in causes.values())
    items = "".join(f"<li>{len(hosts)} host{'s' if len(hosts) != 1 else ''}: {e(cause)} "
                    f"<span class=\"hosts\">({e(', '.join(hosts))})</span></li>" for cause, hosts in causes.items())
    if missing.get("vm"):
        items += f"<li>the VM: {e(missing['vm'])}</li>"
    return (f'<h2>Missing host facts</h2><div id="missing-facts"><p>{e(", ".join(missing.get("units", [])))} read '
            f'host facts; {count} of {len(record["hosts"])} hosts had none.</p><ul>{items}</ul></div>')


def _envelope(record: dict[str, Any]) -> str:
    """The engine's reply envelope of a decision as JSON (docs/plugins.md: what result_code 0 and 1 mean)."""
    sent = {k: record.get(k) for k in ("result_code", "result", "plugin_errors", "errors")}
    return json.dumps(sent, indent=2, ensure_ascii=False)
