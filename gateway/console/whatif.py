"""The console's what-if view: shadow comparisons (``/console/whatif``), a decision's comparison (its "Shadow"
section), and the replay reports of ``--whatif-reports`` (``/console/whatif/reports/{name}``).

A comparison comes from a shadow candidate's run of a live call (:mod:`vmsched.gateway.decisions.shadow`); a
report is the JSON of ``vmsched replay --json`` (:meth:`vmsched.whatif.report.Report.data`). Both are data:
everything in them (what changed, reasons, unit names, host IDs, VMs) is escaped. A report is read only when its
name is a plain ``*.json`` file name of the folder, and only up to :data:`MAX_REPORT` bytes; a report that cannot
be read gets one line saying why. Property values are in neither, and nothing here shows property keys.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ValidationError

from vmsched.gateway.console.markup import e, number, when
from vmsched.gateway.decisions.record import OPS
from vmsched.gateway.decisions.shadow import STATUSES, ShadowStore, first_problem
from vmsched.messages import SHADOW_ROWS, ShadowComparison

#: comparisons the page lists at most
SHOWN = 100
#: reports listed at most (the newest files), and the largest report read, bytes
MAX_REPORTS = 100
MAX_REPORT = 32 << 20
#: changed calls a report's page shows at most, and hosts per call
SHOWN_CHANGES = 200
SHOWN_HOSTS = 50
#: a report's name: a plain file name ending in .json
REPORT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}\.json$")


class ReportError(ValueError):
    """A report that cannot be shown: one line saying why."""


# --- shadow comparisons -------------------------------------------------------------------------------
def page(store: ShadowStore, reports: Path | None, status: str, op: str) -> str:
    """The what-if page's HTML (inside ``<main>``)."""
    wanted = (status,) if status in STATUSES[1:] else STATUSES[1:]
    listed = store.recent(SHOWN, statuses=wanted, op=op if op in OPS else None)
    counts = "".join(f'<tr class="{"problem" if s != "same" and n else ""}"><td>{s}</td><td>{n}</td></tr>'
                     for s, n in store.counts().items())
    options = "".join(f'<option value="{s}"{" selected" if s == status else ""}>{s or "changed, unknown, error"}'
                      "</option>" for s in ("", *STATUSES[1:]))
    op_options = "".join(f'<option value="{o}"{" selected" if o == op else ""}>{o or "any"}</option>'
                         for o in ("", *OPS))
    form = ('<form method="get" action="/console/whatif" class="search">'
            f'<label>status <select name="status">{options}</select></label>'
            f'<label>operation <select name="op">{op_options}</select></label><button type="submit">Show</button></form>')
    rows = "".join(_row(c) for c in listed)
    table = ('<table id="shadow-table"><thead><tr><th>time</th><th>op</th><th>VM</th><th>status</th><th>what</th>'
             f'<th>candidate</th><th>decision</th></tr></thead><tbody>{rows}</tbody></table>' if rows
             else '<p id="shadow-none">No comparison matches.</p>')
    invalid = (f'<p class="error" id="shadow-invalid">{store.invalid} message{"s" if store.invalid != 1 else ""} on '
               "the shadow keys refused (not a comparison of this version; see the gateway's log).</p>"
               if store.invalid else "")
    return ('<h1>What if</h1><section id="shadow"><h2>Shadow candidates</h2>'
            '<p class="note">A shadow candidate runs each live call again after it is answered; each comparison says '
            "whether its decision is the same as the live one. The engine adds its own units: a changed score is a "
            "change of vmsched's ranking, not certainly of the engine's choice.</p>"
            f'<table id="shadow-counts"><thead><tr><th>status</th><th>comparisons kept</th></tr></thead>'
            f'<tbody>{counts}</tbody></table>{invalid}<h3>Recent changed, unknown and error calls</h3>{form}{table}'
            f'<p class="note">Newest {SHOWN} at most; this gateway keeps the newest {store.size}. JSON: '
            '<code>/v1/shadow?status=changed</code></p></section>' + reports_section(reports))


def _row(c: ShadowComparison) -> str:
    change = "".join(f"<li>{e(x)}</li>" for x in c.change)
    return (f'<tr class="shadow-{c.status}"><td>{when(c.time)}</td><td>{e(c.op)}</td><td>{e(c.vm) or "-"}</td>'
            f'<td><span class="status {c.status}">{c.status}</span></td><td class="what">{e(c.what)}</td>'
            f'<td>{e(c.candidate)}' + (f'<ul class="change">{change}</ul>' if change else "") + "</td>"
            f'<td><a href="/console/decisions/{e(c.id)}">{e(c.id)}</a></td></tr>')


def shadow_section(c: ShadowComparison | None) -> str:
    """A decision page's "Shadow" section: the comparison of that call, when this gateway has one."""
    if c is None:
        return ""
    facts = [("status", f'<span class="status {c.status}">{c.status}</span>'), ("what", e(c.what)),
             ("candidate", e(c.candidate)), ("service", e(c.service)), ("when", when(c.time)),
             ("candidate's run", f"{c.seconds * 1000:.1f} ms")]
    if c.change:
        facts.append(("changes", e("; ".join(c.change))))
    if c.rank is not None:
        facts.append(("candidate's rank of the live best host", str(c.rank) + (" (tied)" if c.tie else "")))
    if c.unknown:
        facts.append(("units the candidate lacks", e(", ".join(c.unknown))))
    errors = "".join(f"<li><strong>{e(unit)}</strong>: {e(why)}</li>" for unit, why in c.errors.items())
    dl = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
    return (f'<h2>Shadow</h2><div id="shadow-section"><dl>{dl}</dl>'
            + (f'<h3>Candidate errors</h3><ul id="shadow-errors">{errors}</ul>' if errors else "")
            + (_hosts_table(c) if c.status == "changed" and c.rows else "")
            + f'<p class="note">JSON: <code>/v1/shadow/{e(c.id)}</code></p></div>')


def _hosts_table(c: ShadowComparison) -> str:
    units = _columns([side for row in c.rows for side in (row.live, row.candidate)])
    head = "".join(f"<th>{e(u)}</th>" for u in units)
    body = "".join(f"<tr><td>{e(row.host)}</td>"
                   + "".join(_pair(row.live.get(u), row.candidate.get(u)) for u in units) + "</tr>" for row in c.rows)
    more = (f'<p class="note">{c.hosts} hosts in the call; those whose result differs are shown ({SHADOW_ROWS} '
            "at most).</p>")
    return (f'<h3>Hosts whose result differs</h3>{more}<table id="shadow-hosts"><thead><tr><th>host</th>{head}'
            f"</tr></thead><tbody>{body}</tbody></table>")


def _columns(sides: list[dict[str, str]]) -> list[str]:
    """Every unit named on either side, in order of appearance, and ``result`` last."""
    names = list(dict.fromkeys(k for side in sides for k in side))
    return [n for n in names if n != "result"] + (["result"] if "result" in names else [])


def _pair(live: str | None, candidate: str | None, label: str = "live") -> str:
    """One cell: the live (or baseline) and candidate verdicts, with reasons; one when they are the same."""
    if live == candidate:
        return f'<td>{e(live or "")}</td>'
    return (f'<td class="differs"><div class="live">{label}: {e(live or "-")}</div>'
            f'<div class="candidate">candidate: {e(candidate or "-")}</div></td>')


# --- replay reports ------------------------------------------------------------------------------------
class OpFigures(BaseModel):
    calls: int = 0
    changed: int = 0
    unknown: int = 0
    ties: int = 0


class SideFigures(BaseModel):
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    unknown: int = 0
    p50: float | None = None
    p99: float | None = None


class Change(BaseModel):
    id: str = ""
    time: float = 0.0
    op: str = ""
    vm: str = ""
    status: str = ""
    what: str = ""
    hosts: int = 0
    rank: int | None = None
    unknown: list[str] = []
    baseline: dict[str, dict[str, str]] = {}
    candidate: dict[str, dict[str, str]] = {}


class ReplayReport(BaseModel):
    """What the console reads of a ``vmsched replay --json`` report (the rest is ignored)."""

    candidate: str = ""
    baseline: str = ""
    change: list[str] = []
    first: float | None = None
    last: float | None = None
    calls: int
    changed: int
    unknown: int = 0
    ops: dict[str, OpFigures]
    units: dict[str, dict[str, SideFigures]] = {}
    changes: list[Change] = []
    notes: list[str] = []


def report_files(folder: Path) -> list[Path]:
    """The newest MAX_REPORTS ``*.json`` files of ``folder`` (plain files only)."""
    found = [p for p in folder.iterdir() if REPORT_NAME.match(p.name) and p.is_file() and not p.is_symlink()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)[:MAX_REPORTS]


def read_report(folder: Path, name: str) -> ReplayReport:
    """The report ``name`` of ``folder``: a plain ``*.json`` file name, at most MAX_REPORT bytes (ReportError)."""
    if not REPORT_NAME.match(name) or ".." in name:
        raise ReportError(f"{name!r} is not a report name: a plain file name ending in .json")
    path = folder / name
    try:
        if path.is_symlink() or not path.is_file():
            raise ReportError(f"no report {name} in the reports folder")
        with path.open("rb") as f:
            data = f.read(MAX_REPORT + 1)
    except OSError as exc:
        raise ReportError(f"{name}: cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_REPORT:
        raise ReportError(f"{name}: larger than {MAX_REPORT >> 20} MiB: not read")
    try:
        return ReplayReport.model_validate(json.loads(data))
    except ValidationError as exc:
        raise ReportError(f"{name}: not a `vmsched replay --json` report: {first_problem(exc, 'the report')}") \
            from None
    except ValueError as exc:  # not JSON, or not UTF-8
        raise ReportError(f"{name}: not JSON ({str(exc).splitlines()[0][:200]})") from None


def reports_section(folder: Path | None) -> str:
    if folder is None:
        return ('<section id="reports"><h2>Replay reports</h2><p>No reports folder: start the gateway with '
                "<code>--whatif-reports DIR</code> to list the <code>vmsched replay --json</code> reports in "
                "DIR.</p></section>")
    try:
        files = report_files(folder)
    except OSError as exc:
        return (f'<section id="reports"><h2>Replay reports</h2><p class="error">the reports folder cannot be read: '
                f"{e(exc.strerror or exc)}</p></section>")
    rows = []
    for path in files:
        link = f'<a href="/console/whatif/reports/{e(path.name)}">{e(path.name)}</a>'
        try:
            r = read_report(folder, path.name)
        except ReportError as exc:
            rows.append(f'<tr class="problem"><td>{link}</td><td colspan="4" class="error">{e(exc)}</td></tr>')
            continue
        per_op = ", ".join(f"{op} {f.changed} of {f.calls}" for op, f in r.ops.items() if op in OPS)
        rows.append(f"<tr><td>{link}</td><td>{e(r.candidate)}</td><td>{_span(r)}</td><td>{r.calls}</td>"
                    f"<td>{r.changed} ({e(per_op)})</td></tr>")
    table = ('<table id="reports-table"><thead><tr><th>report</th><th>candidate</th><th>calls recorded</th>'
             f'<th>calls</th><th>changed</th></tr></thead><tbody>{"".join(rows)}</tbody></table>' if rows
             else "<p>No <code>*.json</code> report in the folder yet (<code>vmsched replay ... --json &gt; "
                  "DIR/name.json</code>).</p>")
    return f'<section id="reports"><h2>Replay reports</h2>{table}</section>'


def report_page(name: str, r: ReplayReport) -> str:
    """One report's page (inside ``<main>``): per operation, the changed calls explained, the per-unit figures."""
    ops = "".join(f"<tr><td>{e(op)}</td><td>{f.calls}</td><td>{f.changed}</td><td>{f.unknown}</td><td>{f.ties}</td></tr>"
                  for op, f in r.ops.items())
    facts = (f"<dl><dt>candidate</dt><dd>{e(r.candidate)}</dd><dt>against</dt><dd>{e(r.baseline)}</dd>"
             + (f'<dt>changes</dt><dd>{e("; ".join(r.change))}</dd>' if r.change else "")
             + f"<dt>calls</dt><dd>{r.calls}, {_span(r)}</dd><dt>changed</dt><dd>{r.changed}</dd>"
               f"<dt>unknown</dt><dd>{r.unknown}</dd></dl>")
    notes = "".join(f"<li>{e(n)}</li>" for n in r.notes)
    changes = "".join(_change(c) for c in r.changes[:SHOWN_CHANGES])
    cut = (f'<p class="note">The first {SHOWN_CHANGES} of {len(r.changes)} are shown; all are in the report.</p>'
           if len(r.changes) > SHOWN_CHANGES else "")
    return (f'<h1>Replay report {e(name)}</h1>{facts}' + (f"<ul>{notes}</ul>" if notes else "")
            + '<h2>Per operation</h2><table id="report-ops"><thead><tr><th>op</th><th>calls</th><th>changed</th>'
              f"<th>unknown</th><th>ties</th></tr></thead><tbody>{ops}</tbody></table>"
            + f"<h2>Per unit</h2>{_units(r)}"
            + f'<h2>Changed and unknown calls ({len(r.changes)})</h2>{cut}<div id="report-changes">'
            + (changes or "<p>No call changed.</p>") + '</div><p class="note"><a href="/console/whatif">'
              "Back to the what-if view</a></p>")


def _span(r: ReplayReport) -> str:
    """When the report's calls were recorded: from the first to the last."""
    return f"{when(r.first)} to {when(r.last)}" if r.first is not None and r.last is not None else "-"


def _units(r: ReplayReport) -> str:
    def side(f: SideFigures | None) -> str:
        if f is None:
            return "<td>-</td>" * 4
        p = "-" if f.p50 is None else f"{number(f.p50 * 1000)} / {number((f.p99 or 0) * 1000)}"
        return f"<td>{f.calls}</td><td>{f.errors}</td><td>{f.timeouts} / {f.unknown}</td><td>{e(p)}</td>"

    rows = "".join(f"<tr><td>{e(name)}</td>{side(sides.get('baseline'))}{side(sides.get('candidate'))}</tr>"
                   for name, sides in r.units.items())
    head = "<th>calls</th><th>errors</th><th>timeouts / unknown</th><th>p50 / p99 ms</th>"
    return ('<table id="report-units"><thead><tr><th rowspan="2">unit</th><th colspan="4">baseline</th>'
            f'<th colspan="4">candidate</th></tr><tr>{head}{head}</tr></thead><tbody>{rows}</tbody></table>')


def _change(c: Change) -> str:
    hosts = list(dict.fromkeys([*c.baseline, *c.candidate]))
    units = _columns([side for h in hosts for side in (c.baseline.get(h, {}), c.candidate.get(h, {}))])
    head = "".join(f"<th>{e(u)}</th>" for u in units)
    rows = "".join(f"<tr><td>{e(h)}</td>"
                   + "".join(_pair(c.baseline.get(h, {}).get(u), c.candidate.get(h, {}).get(u), "baseline")
                             for u in units) + "</tr>" for h in hosts[:SHOWN_HOSTS])
    decision = f'<a href="/console/decisions/{e(c.id)}">{e(c.id)}</a>' if c.id else "-"
    return (f'<div class="change-call"><h3>{when(c.time)} {e(c.op)} <span class="status {e(c.status)}">'
            f'{e(c.status)}</span></h3><p class="what">{e(c.what)}</p><p class="note">VM {e(c.vm) or "-"}; decision '
            f"{decision}; {c.hosts} hosts"
            + (f"; the candidate lacks {e(', '.join(c.unknown))}" if c.unknown else "") + "</p>"
            + (f'<table class="report-hosts"><thead><tr><th>host</th>{head}</tr></thead><tbody>{rows}</tbody></table>'
               if hosts else "") + "</div>")
