"""Reading recordings back: files (gzip members of JSON lines), joined by call ID into :class:`RecordedCall`.

A gateway's ``call`` records and the services' ``inputs`` records may be in other files (other processes, other
folders): :func:`load` reads the calls first (filtered by time and VM), then the inputs of those calls, each
with the host facts and guest lists of its own file. A call's facts (:attr:`RecordedCall.facts`) are a
:class:`vmsched.facts.wire.PreparedFacts`, as the service built them: the plugin pool sends them to its workers
as it sends live facts, so a unit reads what it could read then, ages counted from the service's time of the call.

A member cut short at the end of a file (the writer was killed mid-write) is skipped and said in
:attr:`Loaded.notes`, one line per file; anything else that is not a recording raises :class:`RecordingError`
with one line that says what and where.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from vmsched.facts.wire import PreparedFacts
from vmsched.whatif import format as fmt
from vmsched.whatif.writer import SUFFIX

_CHUNK = 1 << 20
#: generations of replayed host facts, unique in the process (every file counts its own from 1)
_GENERATIONS = itertools.count(1)


class RecordingError(ValueError):
    """Not a recording, or a damaged one: the message is one line saying what and where."""


@dataclass
class ReplayHost:
    """One host's recorded facts (and guest list, for balance calls), as the plugin pool sends them
    (:class:`vmsched.facts.wire.HostPart`)."""

    gen: int
    guests_gen: int
    fragment: str
    stale_at: float
    guests_text: str = "[]"

    def guests_json(self) -> str:
        return self.guests_text


@dataclass
class RecordedCall:
    """One engine call and what its units could read."""

    call: fmt.Call
    inputs: fmt.Inputs | None = None
    facts: PreparedFacts | None = None
    source: str = ""  # the file of the call

    @property
    def id(self) -> str:
        return self.call.id

    @property
    def op(self) -> str:
        return self.call.op

    @property
    def time(self) -> float:
        return self.call.time

    @property
    def hosts(self) -> list[str]:
        return list(self.call.args[1])

    @property
    def vm(self) -> str:
        return "" if self.op == "balance" else str(self.call.args[2])

    @property
    def properties(self) -> dict[str, str]:
        return dict(self.call.args[-1])

    @property
    def units(self) -> list[tuple[str, int]]:
        """The units called, with their factors (1 but for score units)."""
        if self.op == "balance":
            return [(str(self.call.args[0]), 1)]
        if self.op == "score":
            return [(str(name), int(factor)) for name, factor in self.call.args[0]]
        return [(str(name), 1) for name in self.call.args[0]]

    def outcomes(self) -> list[Any]:
        """The recorded outcomes of its units (vmsched.messages models)."""
        hosts = self.hosts
        return [fmt.outcome(self.op, u, hosts) for u in self.call.units]


@dataclass
class Loaded:
    """What :func:`load` found: the calls to replay, oldest first, and what it left out and why."""

    calls: list[RecordedCall] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # why -> calls
    notes: list[str] = field(default_factory=list)  # one line per torn file
    files: int = 0

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def files_of(paths: Iterable[Path]) -> list[Path]:
    """The recording files of files and folders (a folder's ``*.jsonl.gz``, oldest first)."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob(f"*{SUFFIX}"), key=lambda p: (p.stat().st_mtime, p.name))
            if not found:
                raise RecordingError(f"{path}: no recording files (*{SUFFIX}) in this folder")
            out += found
        elif path.is_file():
            out.append(path)
        else:
            raise RecordingError(f"{path}: no such file or folder")
    return out


def lines(path: Path, notes: list[str]) -> Iterator[bytes]:
    """The lines of one recording file, member by member; a member cut short at the end is noted and left out."""
    member = b""
    try:
        with path.open("rb") as f:
            d = zlib.decompressobj(31)
            pending = b""
            at = 0  # bytes of the file before the current member
            used = 0
            while True:
                chunk = pending or f.read(_CHUNK)
                pending = b""
                if not chunk:
                    break
                try:
                    member += d.decompress(chunk)
                except zlib.error as exc:
                    where = "is not gzip-compressed" if at == 0 else f"is damaged at byte {at}"
                    raise RecordingError(f"{path} {where} ({exc}): not a vmsched recording") from None
                used += len(chunk) - len(d.unused_data)
                if d.eof:
                    yield from member.splitlines()
                    member, pending = b"", d.unused_data
                    at += used
                    used = 0
                    d = zlib.decompressobj(31)
            if used:  # a member begun and not ended: the writer stopped mid-write
                notes.append(f"{path}: skipped a torn record at its end (byte {at}: the writer stopped mid-write)")
    except OSError as exc:
        raise RecordingError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _records(path: Path, notes: list[str], wanted: bytes | None) -> Iterator[Any]:
    """The records of one file; ``wanted``: only lines whose kind is that (b"call"), or all but calls (None)."""
    first = True
    for number, line in enumerate(lines(path, notes), 1):
        if not line:
            continue
        call = line.startswith(b'{"k":"call"')
        if not first and (call if wanted is None else not call):
            continue
        try:
            record = fmt.parse(line)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(map(str, err["loc"]))
            raise RecordingError(f"{path}, record {number}: not a recording record ({where}: {err['msg']})") from None
        if first:
            if not isinstance(record, fmt.Header) or record.format != fmt.FORMAT:
                raise RecordingError(f"{path}: not a vmsched recording (no '{fmt.FORMAT}' header)")
            if record.version != fmt.VERSION:
                raise RecordingError(f"{path}: recording format version {record.version}; this vmsched reads "
                                     f"version {fmt.VERSION}")
            first = False
            continue
        if wanted is None and isinstance(record, fmt.Call):
            continue
        yield record


def load(paths: Iterable[Path], since: float | None = None, until: float | None = None,
         vm: str | None = None) -> Loaded:
    """The recorded calls of ``paths`` (files or folders) in the time range and about ``vm``, with their inputs."""
    found = Loaded()
    files = files_of(paths)
    found.files = len(files)
    calls: dict[str, RecordedCall] = {}
    for path in files:
        for record in _records(path, found.notes, b"call"):
            if (since is not None and record.time < since) or (until is not None and record.time > until):
                continue
            if vm and not _about(record, vm):
                continue
            calls[record.id] = RecordedCall(record, source=str(path))
    for path in files:
        _join(path, calls, [])  # the first pass noted what is torn
    for rc in sorted(calls.values(), key=lambda c: c.time):
        if rc.call.bus_failed:
            found.skip("nothing ran (the bus failed)")
        elif not rc.call.units:
            found.skip("no units were called")
        elif rc.inputs is None:
            found.skip("no recorded inputs (the service that ran it recorded elsewhere, or not at all)")
        else:
            found.calls.append(rc)
    return found


def _about(call: fmt.Call, vm: str) -> bool:
    return (call.op != "balance" and call.args[2] == vm) or any(u.vm == vm for u in call.units)


def _join(path: Path, calls: dict[str, RecordedCall], notes: list[str]) -> None:
    """Attach to ``calls`` their inputs found in ``path``, with the facts of that file."""
    hosts: dict[int, fmt.HostFacts] = {}
    guests: dict[int, str] = {}
    made: dict[tuple[int, int], ReplayHost] = {}
    for record in _records(path, notes, None):
        if isinstance(record, fmt.HostFacts):
            hosts[record.gen] = record
        elif isinstance(record, fmt.GuestList):
            guests[record.gen] = orjson.dumps(record.guests).decode()
        elif isinstance(record, fmt.Inputs) and record.id in calls:
            rc = calls[record.id]
            rc.inputs = record
            rc.facts = _facts(record, hosts, guests, made, path) if record.cache else None


def _facts(inputs: fmt.Inputs, hosts: dict[int, fmt.HostFacts], guests: dict[int, str],
           made: dict[tuple[int, int], ReplayHost], path: Path) -> PreparedFacts:
    refs: dict[str, Any] = {}
    with_guests = inputs.guests is not None
    for host_id, gen in inputs.hosts.items():
        guests_gen = (inputs.guests or {}).get(host_id, 0)
        part = made.get((gen, guests_gen))
        if part is None:
            stored = hosts.get(gen)
            if stored is None:
                raise RecordingError(f"{path}: call {inputs.id} reads host facts of generation {gen}, which the "
                                     "file lacks: a damaged recording")
            text = guests.get(guests_gen, "[]") if with_guests else "[]"
            part = made[(gen, guests_gen)] = ReplayHost(next(_GENERATIONS), next(_GENERATIONS),
                                                        orjson.dumps(stored.facts).decode(), stored.stale_at, text)
        refs[host_id] = part
    return PreparedFacts(float(inputs.time or 0.0), refs, dict(inputs.missing), inputs.vm, inputs.vm_problem,
                         with_guests, dict(inputs.agents))
