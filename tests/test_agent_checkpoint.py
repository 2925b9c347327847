"""Checkpoint file: atomic write, checksum, validation on load."""

from __future__ import annotations

import json

from vmsched.services.policy_agent.policy import checkpoint, cpuset
from vmsched.services.policy_agent.policy.allocation import Pools

S = cpuset.parse


def pools() -> Pools:
    p = Pools(host_cpus=S("0-7"), pool=S("4-7"))
    p.assign("u1", "db", S("4-5"))
    return p


def test_roundtrip_is_atomic_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "state" / checkpoint.FILENAME
    checkpoint.save(path, checkpoint.Checkpoint.of("h1", pools()))
    checkpoint.save(path, checkpoint.Checkpoint.of("h1", pools()))
    assert [p.name for p in path.parent.iterdir()] == [checkpoint.FILENAME]
    loaded, reason = checkpoint.load(path, "h1", S("0-7"))
    assert reason is None and loaded.allocations == {"u1": S("4-5")} and loaded.pool == S("4-7")
    assert loaded.names == {"u1": "db"}


def test_unusable_checkpoints_say_why(tmp_path):
    path = tmp_path / checkpoint.FILENAME
    assert checkpoint.load(path, "h1", S("0-7")) == (None, "no checkpoint yet")
    checkpoint.save(path, checkpoint.Checkpoint.of("h1", pools()))
    good = path.read_text()
    assert "written for host 'h1', this is host 'h2'" in checkpoint.load(path, "h2", S("0-7"))[1]
    assert "do not exist" in checkpoint.load(path, "h1", S("0-3"))[1]  # CPUs went away
    path.write_text(good[: len(good) // 2])
    assert "not a valid checkpoint document" in checkpoint.load(path, "h1", S("0-7"))[1]
    doc = json.loads(good)
    doc["checkpoint"]["pool"] = "4-6"
    path.write_text(json.dumps(doc))
    assert "checksum mismatch" in checkpoint.load(path, "h1", S("0-7"))[1]
    bad = pools()
    bad.allocations["u2"] = S("5-6")
    checkpoint.save(path, checkpoint.Checkpoint.of("h1", bad))
    assert "CPU 5 is allocated to both" in checkpoint.load(path, "h1", S("0-7"))[1]
    moved = checkpoint.quarantine(path)
    assert moved is not None and moved.exists() and not path.exists()
