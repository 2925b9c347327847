"""A recording under faults: the gateway killed while it records, and a full disk under live calls."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
import zlib
from pathlib import Path

import httpx
import pytest

from tests.support.engine_wire import call
from tests.support.paths import ROOT
from tests.support.stack import Stack, start_all_in_one
from tests.support.waiting import wait_until
from vmsched.whatif.writer import recording_files

HOSTS = [str(uuid.UUID(int=i + 1)) for i in range(100)]
VM = str(uuid.uuid4())
PLUGINS = '''
import zlib


class Hashed:
    """Drop a tenth of the hosts."""
    def do_filter(self, hosts, vm, args):
        return {h: "hash" for h in hosts if zlib.crc32(h.encode()) % 10 == 0}


class Spread:
    """A pseudo load."""
    def do_score(self, hosts, vm, args):
        return [(h, zlib.crc32((h + vm).encode()) % 100) for h in hosts]
'''
FILTER = call("runFilters", ["Hashed"], HOSTS, VM, {"a": "b"})
SCORE = call("runCostFunctions", [["Spread", 2]], HOSTS, VM, {})


def _plugins(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "units.py").write_text(PLUGINS)
    return folder


class Caller:
    """An engine calling without pause on threads of its own; every reply must be a full answer."""

    def __init__(self, stack: Stack, threads: int = 3) -> None:
        self.url = stack.url + "/"
        self.ok = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                try:
                    r = client.post(self.url, content=FILTER if i % 2 else SCORE, headers={"Content-Type": "text/xml"})
                except httpx.HTTPError as exc:
                    if not self.stop.is_set():
                        self.failed.append(repr(exc))
                    return
                if b"<name>result_code</name><value><int>0</int>" in r.content.replace(b"\n", b""):
                    self.ok += 1
                else:
                    self.failed.append(r.text[:300])

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def replay(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vmsched.cli", "replay", *map(str, args), "--workers", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def _member_starts(path: Path) -> list[int]:
    """Where each whole gzip member of a file begins (a member cut short at the end is none)."""
    data, at, starts = path.read_bytes(), 0, []
    while at < len(data):
        d = zlib.decompressobj(31)
        d.decompress(data[at:])
        if not d.eof:
            break
        starts.append(at)
        at = len(data) - len(d.unused_data)
    return starts


def _members(folder: Path) -> int:
    """The whole gzip members of a recording folder's files."""
    return sum(len(_member_starts(path)) for path in recording_files(folder))


def test_a_recording_cut_by_sigkill_replays_and_a_torn_record_is_one_line(tmp_path: Path):
    """What a SIGKILL under load leaves replays. The kill seldom lands inside a member (one write() of about
    100 us every 0.25 s), so the newest file's last member is then cut as such a kill leaves it."""
    plugins = _plugins(tmp_path)
    rec = tmp_path / "rec"
    stack = start_all_in_one(tmp_path, "memory://", "--record", str(rec), plugins=plugins)
    caller = Caller(stack)
    try:
        wait_until(lambda: caller.ok >= 300, 60, 0.05, "300 calls answered")
        # a call is queued for the writer before it is answered: two members later it is on disk (and the
        # recording holds earlier members than the one cut below)
        written = _members(rec)
        wait_until(lambda: _members(rec) >= written + 2, 30, 0.05, "the answered calls recorded")
        stack.procs[0].kill(signal.SIGKILL)  # mid-load: the writer may be anywhere, mid-member too
    finally:
        caller.end()
        stack.stop()
    done = replay(rec, "--plugins", plugins, "--json", "--fail-on-change")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["calls"] >= 100 and data["changed"] == 0 and data["skipped"] == {}
    torn = done.stderr.splitlines()
    assert all("skipped a torn record at its end" in line for line in torn), torn
    assert len(torn) <= len(recording_files(rec))  # one line a file at most
    if not torn:
        newest = recording_files(rec)[-1]
        start = _member_starts(newest)[-1]  # no torn record: the file ends with a whole member
        os.truncate(newest, start + (newest.stat().st_size - start) // 2)
        again = replay(rec, "--plugins", plugins, "--json", "--fail-on-change")
        assert again.returncode == 0, again.stderr
        assert again.stderr.splitlines() == [f"vmsched replay: {newest}: skipped a torn record at its end "
                                             f"(byte {start}: the writer stopped mid-write)"]
        fewer = json.loads(again.stdout)
        assert 0 < fewer["calls"] <= data["calls"] and fewer["changed"] == 0


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 512 KiB tmpfs (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root, and this test runs as an ordinary user")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(disk)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()})")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_never_fails_a_live_call_and_the_recording_says_it_stopped_and_resumed(
        tmp_path: Path, small_disk: Path):
    plugins = _plugins(tmp_path)
    filler = small_disk / "filler"
    filler.write_bytes(os.urandom(400_000))  # leaves about 100 KiB
    stack = start_all_in_one(tmp_path, "memory://", "--record", str(small_disk / "rec"), plugins=plugins)
    log = stack.procs[0]
    caller = Caller(stack)
    try:
        wait_until(lambda: "stopped: writing" in log.output(), 60, 0.1, "the recording to stop")
        assert "No space left on device (ENOSPC)" in log.output()
        served = caller.ok
        wait_until(lambda: caller.ok > served + 100, 30, 0.1, "live calls to go on")
        filler.unlink()
        wait_until(lambda: "resumed (" in log.output(), 30, 0.1, "the recording to resume")
        assert not caller.failed, caller.failed[:3]
    finally:
        caller.end()
        stack.stop()
    assert not caller.failed, caller.failed[:3]
    lines = [line for line in log.output().splitlines() if "vmsched.record" in line]
    assert sum("stopped" in line for line in lines) >= 1 and sum("resumed" in line for line in lines) >= 1
    done = replay(small_disk / "rec", "--plugins", plugins, "--json")
    assert done.returncode == 0 and done.stderr == "", done.stderr  # every member whole: cut back, not torn
    assert json.loads(done.stdout)["calls"] > 0
