"""Reading recordings back: calls joined with their inputs across files; a torn end skipped, damage refused."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import orjson
import pytest

from vmsched.decide.rules import filter_decision
from vmsched.facts.cache import FactsCache
from vmsched.facts.model import FactsMessage, HostFacts
from vmsched.facts.wire import FactsWire
from vmsched.messages import FilterOutcome, FilterRequest
from vmsched.whatif import format as fmt
from vmsched.whatif.reader import RecordingError, lines, load
from vmsched.whatif.writer import RecordWriter, recording_files

H = ["h1", "h2"]


class Worker:
    """A plugin worker, as the pool's facts wire keys it."""


def _call(call_id: str, at: float, vm: str = "vm-1", units: list[str] | None = None) -> fmt.CallItem:
    units = ["A"] if units is None else units
    req = FilterRequest(units=units, hosts=H, vm=vm, properties={"k": "v"})
    outcomes = [FilterOutcome(unit=u, ok=True, hosts=["h1"]) for u in units]
    return fmt.CallItem(call_id, at, "gw", "filter", req, filter_decision(H, outcomes), outcomes, False, 0.01)


def _cache() -> FactsCache:
    cache = FactsCache("scoring")
    cache.ingest(FactsMessage(host_id="h1", instance="a", seq=1, time=time.time() - 3, interval=5.0,
                              host=HostFacts(memory_free_mib=4096)).model_dump_json().encode())
    return cache


def _recording(folder: Path) -> FactsCache:
    """A gateway's file and a scoring service's file, as two processes write them; the scoring's facts."""
    gateway, scoring = RecordWriter(folder, "gateway", 64 << 20), RecordWriter(folder, "scoring", 64 << 20)
    cache = _cache()
    for i, at in enumerate((100.0, 200.0, 300.0)):
        gateway.submit(_call(f"c{i}", at, vm=f"vm-{i}"))
        scoring.submit(fmt.InputsItem(f"c{i}", "scoring", cache.prepared(H, f"vm-{i}")))
    gateway.submit(_call("no-inputs", 400.0))
    gateway.submit(_call("no-units", 500.0, units=[]))
    for w in (gateway, scoring):
        w.flush()
        w.stop()
    return cache


def test_calls_join_their_inputs_across_files_in_time_order_with_the_facts_the_units_had(tmp_path: Path):
    cache = _recording(tmp_path)
    found = load([tmp_path])
    assert [c.id for c in found.calls] == ["c0", "c1", "c2"] and found.files == 2
    assert found.skipped == {"no recorded inputs (the service that ran it recorded elsewhere, or not at all)": 1,
                             "no units were called": 1}
    call = found.calls[0]
    assert call.hosts == H and call.vm == "vm-0" and call.properties == {"k": "v"} and call.units == [("A", 1)]
    assert [o.hosts for o in call.outcomes()] == [["h1"]]
    facts = call.facts
    assert facts is not None and set(facts.refs) == {"h1"} and set(facts.missing) == {"h2"}
    assert orjson.loads(facts.refs["h1"].fragment) == orjson.loads(cache.resolve("h1")[0].fragment)
    # what a plugin worker gets: the same frame a live call's facts make
    frame = orjson.loads(FactsWire().encode(Worker(), facts))
    assert frame["hosts"] == ["h1"] and frame["now"] == facts.now and "h2" in frame["missing"]
    assert found.calls[1].facts.refs["h1"] is facts.refs["h1"]  # one host message, one object: sent once


def test_time_range_and_vm_select_calls(tmp_path: Path):
    _recording(tmp_path)
    assert [c.id for c in load([tmp_path], since=150, until=250).calls] == ["c1"]
    assert [c.id for c in load([tmp_path], vm="vm-2").calls] == ["c2"]


def _two_members(path: Path) -> int:
    """A file of two members; the size of the first."""
    first = gzip.compress(fmt.header("w", 1, "h", 1.0))
    second = gzip.compress(_call("c9", 1.0).encode(fmt.FileState()))
    path.write_bytes(first + second)
    return len(first)


def test_a_member_cut_short_at_the_end_is_skipped_with_one_line(tmp_path: Path):
    path = tmp_path / "a.jsonl.gz"
    first = _two_members(path)
    data = path.read_bytes()
    path.write_bytes(data[: first + (len(data) - first) // 2])  # what a writer killed mid-write leaves
    notes: list[str] = []
    assert len(list(lines(path, notes))) == 1
    assert notes == [f"{path}: skipped a torn record at its end (byte {first}: the writer stopped mid-write)"]
    assert load([path]).notes == notes


@pytest.mark.parametrize("damage, message", [
    (lambda data, first: b"not gzip at all" + data, "is not gzip-compressed"),
    (lambda data, first: data[:first] + b"\x1f\x8b\x08\x00garbage" + data[first + 9:], "is damaged at byte"),
])
def test_a_damaged_file_is_refused_in_one_line(tmp_path: Path, damage, message: str):
    path = tmp_path / "a.jsonl.gz"
    first = _two_members(path)
    path.write_bytes(damage(path.read_bytes(), first))
    with pytest.raises(RecordingError, match=message) as raised:
        load([path])
    assert "\n" not in str(raised.value)


def test_other_formats_versions_records_and_paths_are_refused(tmp_path: Path):
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"k":"recording","format":"vmsched-recording","version":9}\n'))
    with pytest.raises(RecordingError, match="format version 9; this vmsched reads version 1"):
        load([path])
    path.write_bytes(gzip.compress(b'{"some":"json"}\n'))
    with pytest.raises(RecordingError, match="record 1: not a recording record"):
        load([path])
    path.write_bytes(gzip.compress(fmt.header("w", 1, "h", 1.0) + b'{"k":"call","id":"x"}\n'))
    with pytest.raises(RecordingError, match="record 2: not a recording record"):
        load([path])
    with pytest.raises(RecordingError, match="no such file or folder"):
        load([tmp_path / "nothing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordingError, match="no recording files"):
        load([tmp_path / "empty"])
    assert recording_files(tmp_path) == [path]
