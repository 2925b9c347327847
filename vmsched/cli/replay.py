"""``vmsched replay``: recorded engine calls run through a candidate policy, and what it would have changed.

The library does the work (:mod:`vmsched.whatif`); this module reads the command line, prints the summary (a
progress bar on stderr when it is a terminal), writes ``--json`` and ``--html``, and sets the exit status:
0, 1 with ``--fail-on-change`` when a decision changed (or the candidate lacks a unit), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from vmsched.cli.plugin import sandbox_options, settings_of
from vmsched.config import parse_factor, parse_timeouts, stock_plugins_dir
from vmsched.messages import Kind
from vmsched.service import plugin_sandbox
from vmsched.whatif.html import render
from vmsched.whatif.reader import RecordingError, load
from vmsched.whatif.replay import Change, Policy, replay
from vmsched.whatif.report import OPS, Report

#: changed calls the terminal summary shows (all are in --json and --html)
SHOWN = 10


class BadInput(ValueError):
    """One line saying what is wrong and what to do."""


def _time(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise BadInput(f"{option} {text!r}: give a time as 2026-05-01T12:00 (ISO 8601, local time unless it says "
                       "otherwise) or UNIX seconds") from None


def _factors(items: list[str]) -> dict[str, int]:
    try:
        return dict(parse_factor(item) for item in items)
    except ValueError as exc:
        raise BadInput(f"--factor {exc}") from None


def _added(items: list[str]) -> tuple[tuple[str, str, int], ...]:
    out = []
    for item in items:
        kind, sep, rest = item.partition(":")
        unit, eq, value = rest.partition("=")
        if not sep or kind not in OPS or not unit or (eq and not value.lstrip("-").isdigit()):
            raise BadInput(f"--add {item!r}: expected KIND:UNIT (KIND filter, score or balance), or score:UNIT=FACTOR")
        out.append((kind, unit, int(value) if eq else 1))
    return tuple(out)


def _check_units(policy: Policy, change: Change) -> None:
    """Every unit --factor and --add name is one of the candidate's, of that kind."""
    units = policy.units()
    names = {(u.kind.value, u.name) for u in units}
    for unit in change.factors:
        if ("score", unit) not in names:
            known = ", ".join(sorted(u.name for u in units if u.kind is Kind.SCORE)) or "none"
            raise BadInput(f"--factor {unit}: no score unit {unit!r} in {policy.folder} (its score units: {known})")
    for kind, unit, _ in change.add:
        if (kind, unit) not in names:
            known = ", ".join(sorted(u.name for u in units if u.kind.value == kind)) or "none"
            raise BadInput(f"--add {kind}:{unit}: no {kind} unit {unit!r} in {policy.folder} (its {kind} units: "
                           f"{known})")


def _folder(path: Path, option: str) -> Path:
    if not path.is_dir():
        raise BadInput(f"{option} {path}: no such folder (the plugins folder of the policy to replay)")
    return path


class Progress:
    """A progress bar on stderr, only when it is a terminal."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.on = sys.stderr.isatty() and total > 0
        self.shown = 0.0

    def step(self, done: int) -> None:
        now = time.monotonic()
        if not self.on or (now - self.shown < 0.2 and done < self.total):
            return
        self.shown = now
        width = 30
        filled = width * done // self.total
        sys.stderr.write(f"\rreplaying [{'#' * filled}{' ' * (width - filled)}] {done}/{self.total} calls")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def cmd_replay(args: argparse.Namespace) -> int:
    try:
        return _replay(args)
    except (BadInput, RecordingError) as exc:
        print(f"vmsched replay: error: {exc}", file=sys.stderr)
        return 2


def _replay(args: argparse.Namespace) -> int:
    change = Change(_factors(args.factor), _added(args.add), frozenset(args.drop))
    since, until = _time(args.since, "--since"), _time(args.until, "--until")
    candidate_dir = _folder(args.plugins or stock_plugins_dir(), "--plugins")
    baseline_dir = _folder(args.baseline, "--baseline") if args.baseline else None
    settings = settings_of(args)
    if args.plugin_timeouts:
        settings = settings.model_copy(update={"plugin_timeouts": parse_timeouts(args.plugin_timeouts)})
    loaded = load(args.recording, since, until, args.vm)
    for note in loaded.notes:
        print(f"vmsched replay: {note}", file=sys.stderr)
    limits, confinement = plugin_sandbox(settings)
    workers = args.workers or os.cpu_count() or 2
    policies = []
    try:
        for path, name in ((candidate_dir, "candidate"), (baseline_dir, "baseline")):
            if path is not None:
                try:
                    policies.append(Policy(path, limits, confinement, workers, settings.timeout_for, name,
                                           settings.plugin_bundle_ms / 1000).start())
                except RuntimeError as exc:  # the sandbox refused, as it would in a service
                    raise BadInput(f"--plugins {path}: {exc}") from None
        candidate, baseline = policies[0], (policies[1] if len(policies) > 1 else None)
        _check_units(candidate, change)
        report = Report(str(candidate_dir), str(baseline_dir) if baseline_dir else "the recorded outcomes",
                        change.describe(), baseline is not None)
        report.skipped, report.notes, report.files = loaded.skipped, loaded.notes, loaded.files
        progress = Progress(len(loaded.calls))
        for done, result in enumerate(replay(loaded.calls, candidate, change, baseline, workers), 1):
            report.add(result)
            progress.step(done)
    finally:
        for policy in policies:
            policy.close()
    data = report.data()
    if args.html is not None:
        args.html.write_text(render(report), encoding="utf-8")
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(summary(data))
        if args.html is not None:
            print(f"report: {args.html}")
    failing = data["changed"] + data["unknown"]
    return 1 if args.fail_on_change and failing else 0


def _when(at: float | None) -> str:
    return datetime.fromtimestamp(at).isoformat(sep=" ", timespec="seconds") if at is not None else "-"


def _ms(value: float | None) -> str:
    return f"{value * 1000:.1f}" if value is not None else "-"


def summary(data: dict[str, Any]) -> str:
    """The terminal summary of a report's data."""
    change = f" with {', '.join(data['change'])}" if data["change"] else ""
    out = [f"replayed {data['calls']} calls from {data['files']} file(s), {_when(data['first'])} to "
           f"{_when(data['last'])}: candidate {data['candidate']}{change}, against {data['baseline']}"]
    for op, c in data["ops"].items():
        if c["calls"]:
            extra = f", {c['unknown']} unknown" if c["unknown"] else ""
            ties = f"; {c['ties']} with tied best hosts" if op == "score" and c["ties"] else ""
            out.append(f"  {op:8} {c['calls']:6} calls: {c['changed']} changed ({c['change']}){extra}{ties}")
    if data["ops"]["score"]["changed"]:
        out.append("  (score: the engine adds its own units and its selector may still choose otherwise)")
    for why, n in data["skipped"].items():
        out.append(f"  skipped {n} call(s): {why}")
    out.append("per unit: errors, timeouts, p50 and p99 ms (baseline -> candidate)"
               + ("" if data["side_by_side"] else "; recorded durations are not compared: give --baseline DIR"))
    for name, sides in data["units"].items():
        b, c = sides["baseline"], sides["candidate"]
        lacking = f", unknown to the candidate in {c['unknown']} call(s)" if c["unknown"] else ""
        out.append(f"  {name}: errors {b['errors']} -> {c['errors']}, timeouts {b['timeouts']} -> {c['timeouts']}, "
                   f"p50 {_ms(b['p50'])} -> {_ms(c['p50'])}, p99 {_ms(b['p99'])} -> {_ms(c['p99'])}{lacking}")
    changes = data["changes"]
    if changes:
        out.append(f"changed calls ({min(SHOWN, len(changes))} of {len(changes)}; all in --json and --html):")
    for ch in changes[:SHOWN]:
        out.append(f"  {_when(ch['time'])} {ch['op']} {ch['id']} (VM {ch['vm'] or '-'}): {ch['what']}")
        for host, cells in ch["candidate"].items():
            before = ch["baseline"].get(host, {})
            differ = {u: (before.get(u, "-"), v) for u, v in cells.items() if before.get(u) != v}
            if differ:
                out.append(f"    {host}: " + "; ".join(f"{u} {b} -> {v}" for u, (b, v) in differ.items()))
    if data["notes"]:
        out += [f"note: {n}" for n in data["notes"]]
    return "\n".join(out)


def register(sub: Any) -> None:  # sub: what argparse's add_subparsers() returned
    p = sub.add_parser("replay", help="run recorded engine calls through a candidate policy: what would change",
                       description="Run the engine's calls recorded with --record through a candidate plugins "
                                   "folder (with changed units and factors), in the same sandbox as the services, "
                                   "and report the decisions that change (docs/testing-policies.md).")
    p.add_argument("recording", type=Path, nargs="+", metavar="PATH", help="recording files or folders")
    p.add_argument("--plugins", type=Path, metavar="DIR",
                   help="the candidate's plugins folder (default: the stock plugins shipped with vmsched)")
    p.add_argument("--baseline", type=Path, metavar="DIR",
                   help="compare with this plugins folder run side by side (default: the recorded outcomes)")
    p.add_argument("--factor", action="append", default=[], metavar="UNIT=N", help="a score unit's factor; repeat")
    p.add_argument("--add", action="append", default=[], metavar="KIND:UNIT[=F]",
                   help="run this unit too in every call of KIND (filter, score with factor F, or balance in place "
                        "of the recorded balancer); repeat")
    p.add_argument("--drop", action="append", default=[], metavar="UNIT", help="leave this unit out of every call")
    p.add_argument("--since", metavar="TIME", help="calls from this time (ISO 8601 or UNIX seconds)")
    p.add_argument("--until", metavar="TIME", help="calls up to this time")
    p.add_argument("--vm", metavar="ID", help="only the calls about this VM")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--html", type=Path, metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--fail-on-change", action="store_true",
                   help="exit 1 when a decision changed or the candidate lacks a unit (a CI guard)")
    p.add_argument("--workers", type=int, metavar="N", help="plugin worker processes per side (default: the CPUs)")
    p.add_argument("--plugin-timeouts", metavar="UNIT=S,...", help="per-unit timeouts (default: --timeout)")
    sandbox_options(p)
    p.set_defaults(func=cmd_replay)
