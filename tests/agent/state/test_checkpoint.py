"""Checkpoint file: atomic write, checksum, validation on load, keyed to the machine."""

from __future__ import annotations

import json

from vmsched import cpuset
from vmsched.services.policy_agent.state import checkpoint, durable
from vmsched.services.policy_agent.policy.allocation import AllocationHint, Pools

S = cpuset.parse
M1, M2 = "6f0c2b5e-0000-4000-8000-000000000001", "6f0c2b5e-0000-4000-8000-000000000002"


def pools() -> Pools:
    p = Pools(host_cpus=S("0-7"), pool=S("4-7"))
    p.assign("u1", "db", S("4-5"))
    return p


def test_roundtrip_is_atomic_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "state" / checkpoint.FILENAME
    checkpoint.save(path, checkpoint.Checkpoint.of(M1, "h1", pools()))
    checkpoint.save(path, checkpoint.Checkpoint.of(M1, "h1", pools()))
    assert [p.name for p in path.parent.iterdir()] == [checkpoint.FILENAME]
    loaded, reason = checkpoint.load(path, M1, S("0-7"))
    assert reason is None and loaded.pools.allocations == {"u1": S("4-5")} and loaded.pools.pool == S("4-7")
    assert loaded.pools.names == {"u1": "db"}
    assert loaded.previous_host_id == "h1"


def test_state_belongs_to_the_machine_not_to_the_host_id(tmp_path):
    path = tmp_path / checkpoint.FILENAME
    checkpoint.save(path, checkpoint.Checkpoint.of(M1, "old-name", pools()))
    found = checkpoint.load_or_rebuild(path, M1, S("0-7"))  # the agent restarted as "new-name": same machine
    assert not found.rebuild and found.previous_host_id == "old-name" and found.pools.allocations == {"u1": S("4-5")}
    assert "written for machine" in checkpoint.load(path, M2, S("0-7"))[1]  # a state dir copied to another machine


def test_only_this_machines_hints_count():
    hints = [AllocationHint("node-a", S("4"), S("4-5")), AllocationHint(M1, S("6"), S("6-7")),
             AllocationHint(M2, S("2"), S("2-3")), None]
    assert checkpoint.pool_from_hints(hints, M1, Pools(host_cpus=S("0-7"))) == S("6-7")


def test_a_checkpoint_without_the_machine_is_unusable(tmp_path):
    path = tmp_path / checkpoint.FILENAME
    payload = {"version": 2, "host_id": "node-a", "pool": "4-7", "saved_at": 1.0,
               "allocations": {"u1": {"name": "db", "cpus": "4-5"}}}
    path.write_text(json.dumps({"checksum": durable.digest(payload), "checkpoint": payload}))
    found = checkpoint.load_or_rebuild(path, M1, S("0-7"))
    assert found.rebuild and "invalid content" in found.reason and found.quarantined is not None


def test_unusable_checkpoints_say_why(tmp_path):
    path = tmp_path / checkpoint.FILENAME
    assert checkpoint.load(path, M1, S("0-7")) == (None, "no checkpoint yet")
    checkpoint.save(path, checkpoint.Checkpoint.of(M1, "h1", pools()))
    good = path.read_text()
    assert "do not exist" in checkpoint.load(path, M1, S("0-3"))[1]  # CPUs went away
    path.write_text(good[: len(good) // 2])
    assert "not a valid checkpoint document" in checkpoint.load(path, M1, S("0-7"))[1]
    doc = json.loads(good)
    doc["checkpoint"]["pool"] = "4-6"
    path.write_text(json.dumps(doc))
    assert "checksum mismatch" in checkpoint.load(path, M1, S("0-7"))[1]
    doc["checkpoint"]["version"] = 3
    doc["checksum"] = durable.digest(doc["checkpoint"])
    path.write_text(json.dumps(doc))
    assert "unsupported version 3" in checkpoint.load(path, M1, S("0-7"))[1]
    bad = pools()
    bad.allocations["u2"] = S("5-6")
    checkpoint.save(path, checkpoint.Checkpoint.of(M1, "h1", bad))
    assert "CPU 5 is allocated to both" in checkpoint.load(path, M1, S("0-7"))[1]
    moved = durable.quarantine(path)
    assert moved is not None and moved.exists() and not path.exists()
