"""Whatever is found at the checkpoint path, the agent starts: an unusable checkpoint is moved aside
with its reason and host state is rebuilt, within a bounded time (never a hang, never a traceback)."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Callable

import pytest

from tests.support.agent_driver import conn, domain_xml, make_agent, state_dir  # noqa: F401 - fixtures
from vmsched import cpuset
from vmsched.services.policy_agent.state import checkpoint, durable
from vmsched.services.policy_agent.policy.allocation import Pools

S = cpuset.parse
M1 = "6f0c2b5e-0000-4000-8000-000000000001"
HOST = S("0-7")
BOUND = 10.0  # seconds: far above what any of these takes, far below "forever"


def good_payload() -> dict:
    pools = Pools(host_cpus=HOST, pool=S("4-7"))
    pools.assign("u1", "db", S("4-5"))
    return checkpoint.Checkpoint.of(M1, "h1", pools).model_dump(mode="json")


def sealed(**changes: object) -> Callable[[Path], None]:
    """A checkpoint with a valid checksum whose content is wrong: written by a bug, not torn."""
    def write(path: Path) -> None:
        payload = {**good_payload(), **changes}
        path.write_text(json.dumps({"checksum": durable.digest(payload), "checkpoint": payload}))
    return write


def text(data: str | bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data.encode() if isinstance(data, str) else data)


def good_text() -> str:
    payload = good_payload()
    return json.dumps({"checksum": durable.digest(payload), "checkpoint": payload})


def fifo(path: Path) -> None:
    os.mkfifo(path)


def unix_socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()


DAMAGE: dict[str, Callable[[Path], None]] = {
    # torn, garbled or foreign bytes
    "empty": text(""),
    "truncated": lambda p: p.write_text(good_text()[: len(good_text()) // 2]),
    "torn_write": text('{"checkpoint": {"host_id": "h1", "pool": "4-7"'),
    "not_json": text("this is not JSON\n"),
    "binary": text(bytes(range(256)) * 4),
    "bad_utf8": text(b'{"checkpoint": "\xff\xfe"}'),
    "null": text("null"),
    "list": text("[1, 2, 3]"),
    "string": text('"checkpoint"'),
    "no_payload": text('{"checksum": "x"}'),
    "no_checksum": lambda p: p.write_text(json.dumps({"checkpoint": good_payload()})),
    "edited": lambda p: p.write_text(good_text().replace('"4-7"', '"4-6"')),
    "huge_int": text('{"checkpoint": ' + "9" * 5000 + "}"),
    # a valid checksum over wrong content
    "payload_not_object": lambda p: p.write_text(json.dumps({"checksum": durable.digest(5), "checkpoint": 5})),
    "no_host_id": lambda p: sealed()(p) or _drop(p, "host_id"),
    "allocations_list": sealed(allocations=[1, 2]),
    "future_version": sealed(version=99),
    "other_machine": sealed(machine="6f0c2b5e-0000-4000-8000-000000000002"),
    "pool_off_host": sealed(pool="4-11"),
    "pool_every_cpu": sealed(pool="0-7", allocations={}),
    "pool_syntax": sealed(pool="4-x"),
    "allocation_outside_pool": sealed(allocations={"u1": {"name": "db", "cpus": "1"}}),
    "overlap": sealed(allocations={"u1": {"name": "db", "cpus": "4-5"}, "u2": {"name": "web", "cpus": "5-6"}}),
    "empty_allocation": sealed(allocations={"u1": {"name": "db", "cpus": ""}}),
    "too_many_allocations": sealed(allocations={f"u{i}": {"name": f"g{i}", "cpus": "4"} for i in range(5000)}),
    "pool_160kb": sealed(pool=",".join(["0-16383"] * 20000) + ",^0-7,^16-16383"),  # parsing it took 10 s
    "allocation_160kb": sealed(allocations={"u1": {"name": "db", "cpus": ",".join(["4-5"] * 40000)}}),
    "allocation_off_host": sealed(allocations={"u1": {"name": "db", "cpus": "4-16383"}}),
    # shapes that used to stop the agent
    "nested_200000": text("[" * 200_000 + "]" * 200_000),
    "nested_object": text('{"checkpoint": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001),
    "fifo": fifo,
    "directory": lambda p: p.mkdir(),
    "unix_socket": unix_socket,
    "char_device": lambda p: p.symlink_to("/dev/zero"),
    "oversize": lambda p: p.write_bytes(b" " * (durable.MAX_BYTES + 1)),
    "symlink_loop": lambda p: p.symlink_to(p.name),
}


def _drop(path: Path, key: str) -> None:
    doc = json.loads(path.read_text())
    del doc["checkpoint"][key]
    doc["checksum"] = durable.digest(doc["checkpoint"])
    path.write_text(json.dumps(doc))


def bounded(fn: Callable[[], object]) -> object:
    """fn's result; fails (instead of hanging the suite) when it takes longer than BOUND."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(BOUND)
    assert not t.is_alive(), f"still running after {BOUND} s"
    assert out, "raised (see the thread's traceback above)"
    return out[0]


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_unusable_checkpoint_is_moved_aside_with_its_reason(tmp_path: Path, kind: str):
    path = tmp_path / checkpoint.FILENAME
    DAMAGE[kind](path)
    found = bounded(lambda: checkpoint.load_or_rebuild(path, M1, HOST))
    assert found.rebuild and found.pools.allocations == {}
    assert found.reason and found.reason != "no checkpoint yet"
    assert found.quarantined is not None and os.path.lexists(found.quarantined), "kept for inspection"
    assert not os.path.lexists(path), "out of the way of the next save"
    checkpoint.save(path, checkpoint.Checkpoint.of(M1, "h1", found.pools))  # the rebuilt state is written
    assert checkpoint.load(path, M1, HOST)[1] is None


def test_reasons_name_the_shape(tmp_path: Path):
    reasons = {}
    for kind in ("nested_200000", "fifo", "oversize", "directory", "too_many_allocations", "pool_160kb",
                 "allocation_off_host"):
        path = tmp_path / kind / checkpoint.FILENAME
        path.parent.mkdir()
        DAMAGE[kind](path)
        reasons[kind] = checkpoint.load(path, M1, HOST)[1]
    assert reasons == {
        "nested_200000": "not a valid checkpoint document: JSON nested too deeply",
        "fifo": "not a regular file but a FIFO",
        "oversize": f"larger than {durable.MAX_BYTES} bytes: not written by the agent",
        "directory": "not a regular file but a directory",
        "too_many_allocations": "inconsistent: 5000 allocations on a host of 8 CPUs",
        "pool_160kb": "invalid CPU set: CPU set '0-16383,0-16383,0-16383,0-16383,0-16383,'... is 160,014 characters"
                      " long; at most 65,536 are accepted: write it with ranges (0-63, not 0,1,2,...)",
        "allocation_off_host": "invalid CPU set: CPUs 8-16383 do not exist on this host (CPUs 0-7)",
    }


@pytest.mark.parametrize("kind", ["nested_200000", "fifo", "pool_160kb"])
def test_agent_starts_over_a_hostile_checkpoint(conn, make_agent, state_dir: Path, kind: str, caplog):
    """The two shapes that stopped the agent: it starts, rebuilds from the guests' metadata, saves."""
    a = make_agent()
    conn.defineXML(domain_xml("t-ded")).create()
    a.set_policy("t-ded", {"dedicated": 2})
    expected = a.cpus()["allocations"]
    a.stop()
    path = state_dir / checkpoint.FILENAME
    path.unlink()
    DAMAGE[kind](path)
    caplog.set_level("WARNING")
    b = bounded(lambda: make_agent(dedicated_pool=None))
    assert b.cpus()["allocations"] == expected and b.cpus()["dedicated_pool"] == "4-7"
    assert "unusable" in caplog.text and "moved to" in caplog.text
    assert checkpoint.load(path, b.machine, HOST)[1] is None
