"""Writing a recording: gzip members, private files, a bound on disk, drops counted and said once."""

from __future__ import annotations

import gzip
import json
import logging
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from vmsched.whatif import format as fmt
from vmsched.whatif.reader import lines
from vmsched.metrics import REGISTRY
from vmsched.whatif.writer import RecordWriter, recording_files


def dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("vmsched_record_dropped_total", {"reason": reason}) or 0.0


@dataclass
class Line:
    """An item whose line is given (the writer does not care what a record says)."""

    text: str

    def encode(self, state: fmt.FileState) -> bytes:
        return json.dumps({"k": "note", "text": self.text}).encode() + b"\n"


def test_each_flush_is_one_gzip_member_of_json_lines_in_a_private_file(tmp_path: Path):
    folder = tmp_path / "rec"
    writer = RecordWriter(folder, "gw 1/x", 64 << 20)
    for batch in (["a", "b"], ["c"]):
        for text in batch:
            writer.submit(Line(text))
        writer.flush()
    writer.stop()
    (path,) = recording_files(folder)
    assert path.name.startswith("gw-1-x-") and path.name.endswith(".jsonl.gz")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    records = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]  # what zcat reads
    assert records[0]["k"] == "recording" and records[0]["version"] == fmt.VERSION
    assert [r["text"] for r in records[1:]] == ["a", "b", "c"]
    assert path.read_bytes().count(b"\x1f\x8b\x08") >= 2  # two members
    notes: list[str] = []
    assert len(list(lines(path, notes))) == 4 and notes == []


def test_the_folder_stays_under_its_bound_dropping_the_oldest_files(tmp_path: Path):
    writer = RecordWriter(tmp_path, "w", 4 << 20)  # files of 1 MiB
    for i in range(24):
        writer.submit(Line(os.urandom(300_000).hex()))  # about 300 kB a member once compressed
        writer.flush()
    writer.stop()
    files = recording_files(tmp_path)
    assert sum(p.stat().st_size for p in files) <= 4 << 20
    assert len(files) >= 3
    seqs = [int(p.name[-13:-9]) for p in files]  # ...-<pid>-<seq>.jsonl.gz
    assert seqs[-1] == max(seqs) and min(seqs) > 1  # the newest kept, the first gone


def test_a_file_another_writer_holds_is_never_deleted(tmp_path: Path):
    other = RecordWriter(tmp_path, "other", 4 << 20)
    other.submit(Line("kept"))
    other.flush()  # its file stays open, the oldest in the folder
    mine = RecordWriter(tmp_path, "mine", 4 << 20)
    for _ in range(20):
        mine.submit(Line(os.urandom(300_000).hex()))
        mine.flush()
    assert any(p.name.startswith("other-") for p in recording_files(tmp_path))
    other.stop()
    mine.stop()


def test_a_full_queue_drops_records_counts_them_and_says_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    writer = RecordWriter(tmp_path, "q", 64 << 20, queue=3)
    before = dropped("queue_full")
    with caplog.at_level(logging.WARNING, logger="vmsched.record"):
        for i in range(7):
            writer.submit(Line(str(i)))
        assert dropped("queue_full") - before == 4
        stopped = [r.message for r in caplog.records if "stopped" in r.message]
        assert len(stopped) == 1 and "3 records waited for the writer" in stopped[0]
        writer.flush()
        resumed = [r.message for r in caplog.records if "resumed" in r.message]
        assert resumed == [f"recording to {tmp_path} resumed (4 records were dropped)"]
    writer.stop()


CHILD = r"""
import json, logging, os, resource, signal, sys
from pathlib import Path
from vmsched.metrics import REGISTRY
from vmsched.whatif import writer as w
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
folder = Path(sys.argv[1])
rec = w.RecordWriter(folder, "full", 64 << 20)
rec.flush()
w.RETRY = 0.0
class Line:
    def __init__(self, text): self.text = text
    def encode(self, state): return json.dumps({"k": "note", "text": self.text}).encode() + b"\n"
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))
for i in range(6):
    rec.submit(Line(os.urandom(60_000).hex()))
    rec.flush()
print("DROPPED", REGISTRY.get_sample_value("vmsched_record_dropped_total", {"reason": "write_error"}), flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
rec.submit(Line("after"))
rec.flush()
rec.stop()
"""


def test_a_failed_write_drops_its_records_cuts_the_file_back_and_the_recording_resumes(tmp_path: Path):
    """A file size limit (RLIMIT_FSIZE) makes writes fail as a full disk does, without root."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()
    stopped = [line for line in out if "stopped" in line]
    assert len(stopped) == 1 and "File too large" in stopped[0], out
    assert any(line.startswith("DROPPED") and float(line.split()[1]) >= 1 for line in out), out
    assert [line for line in out if "resumed" in line], out
    notes: list[str] = []
    texts = [json.loads(line).get("text") for path in recording_files(tmp_path) for line in lines(path, notes)]
    assert notes == [] and texts[-1] == "after"  # every member whole: the failed ones were cut back
