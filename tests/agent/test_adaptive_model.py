"""The adaptive block of a guest's policy: validation against the static policy, metadata, CLI, file, contract."""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET

import pytest

from vmsched.agent_contract import OPERATIONS, AgentOp, PolicyExplain
from vmsched.services.policy_agent.errors import PolicyError
from vmsched.services.policy_agent.policy.model import parse_policy, parse_policy_partial
from vmsched.services.policy_agent.surfaces.cli import load_policy_file
from vmsched.services.policy_agent.surfaces import cli
from vmsched.services.policy_agent.virt import metadata


def problems(data: dict) -> list[str]:
    return parse_policy_partial(data)[1]


def test_valid_block_round_trips_through_metadata():
    p = parse_policy({"weight": 1000, "cap_percent": 40, "vcpu_pins": {0: "1"},
                      "adaptive": {"weight": [500, 4000], "cap_percent": [20, 80], "may_move": True,
                                   "target_wait_percent": 5, "keep_on_restart": True}})
    xml = metadata.to_xml(p)
    assert "<adaptive" in xml
    assert metadata.from_element(ET.fromstring(xml))[0] == p
    assert p.to_dict()["adaptive"]["weight"] == [500, 4000]


@pytest.mark.parametrize("data, expected", [
    ({"dedicated": 2, "adaptive": {"may_move": True}}, "a guest with dedicated CPUs cannot move"),
    ({"weight": 5000, "adaptive": {"weight": [500, 4000]}}, "does not contain weight 5000"),
    ({"adaptive": {"weight": [2000, 4000]}}, "does not contain the default weight 1024"),
    ({"cap_percent": 90, "adaptive": {"cap_percent": [10, 50]}}, "does not contain cap 90%"),
    ({"quota": 50000, "adaptive": {"cap_percent": [10, 50]}}, "give the static cap as cap_percent"),
    ({"adaptive": {"weight": [4000, 500]}}, "min above max"),
    ({"adaptive": {"weight": [1, 4000]}}, "outside libvirt's range"),
    ({"adaptive": {"cap_percent": [0, 50]}}, "outside (0, 100]"),
    ({"adaptive": {"may_move": True, "target_wait_percent": 100}}, "target_wait_percent 100 outside"),
    ({"adaptive": {}}, "give at least one of weight, cap_percent or may_move"),
    ({"adaptive": {"speed": 3}}, "Extra inputs are not permitted"),
])
def test_contradictions_are_refused_with_a_reason(data, expected):
    found = problems(data)
    assert any(expected in p for p in found), found


def test_every_problem_is_reported_at_once():
    found = problems({"dedicated": 2, "weight": 5000, "adaptive": {"weight": [500, 4000], "may_move": True}})
    assert len(found) == 2


def _set_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub, lambda a: 0)
    return parser.parse_args(["policy", "set", "g", *argv])


def test_cli_builds_the_adaptive_block_and_merges_a_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("weight: 1000\nadaptive:\n  weight: [500, 2000]\n")
    args = _set_args("--file", str(f), "--may-move", "--adaptive-cap", "20:80", "--target-wait", "15")
    doc = cli.build_policy(args)
    assert doc["adaptive"] == {"weight": [500, 2000], "cap_percent": [20.0, 80.0], "may_move": True,
                               "target_wait_percent": 15.0}
    assert load_policy_file(f)[1].adaptive.weight == (500, 2000)
    with pytest.raises(PolicyError, match="expected MIN:MAX"):
        cli.build_policy(_set_args("--adaptive-weight", "500"))
    assert "adaptive" not in cli.build_policy(_set_args("--no-adaptive"), {"adaptive": {"may_move": True}})


def test_agent_options_and_explain_in_the_contract():
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(), lambda a: 0)
    args = parser.parse_args(["agent", "--tune-interval", "2", "--tune-dry-run"])
    assert (args.tune_interval, args.tune_hysteresis, args.tune_dry_run) == (2.0, 3, True)
    assert parser.parse_args(["policy", "explain", "g"]).guest == "g"
    assert OPERATIONS[AgentOp.EXPLAIN_POLICY].reply is PolicyExplain


def test_the_adaptive_block_travels_through_the_contract():
    from vmsched.services.policy_agent.surfaces.ops import parse

    op, request = parse("set_policy", {"guest": "g", "policy": {"adaptive": {"weight": [512, 2048], "may_move": True}}})
    body = request.policy.model_dump(mode="json", exclude_unset=True)
    assert body == {"adaptive": {"weight": [512, 2048], "may_move": True}}
    assert parse_policy(body).adaptive.may_move
    with pytest.raises(PolicyError, match="adaptive.speed: Extra inputs are not permitted"):
        parse("set_policy", {"guest": "g", "policy": {"adaptive": {"speed": 1}}})
    op, request = parse("explain_policy", {"guest": "g"})
    assert op is AgentOp.EXPLAIN_POLICY and request.guest == "g"
