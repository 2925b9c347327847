"""A refused policy lists every problem at once: field errors (pydantic), the
model's own rules (cap forms) and the host-fit checks, through the model and
through the CLI on libvirt's test driver."""

from __future__ import annotations

import argparse

import pytest

from vmsched.services.policy_agent.serve import serve
from vmsched.services.policy_agent.errors import PolicyError
from vmsched.services.policy_agent.policy.model import parse_policy, parse_policy_partial
from vmsched.services.policy_agent.surfaces.cli import register
from tests.support.agent_driver import conn, make_agent, state_dir  # noqa: F401 - fixtures
from tests.support.agent_driver import guest


def test_field_and_model_errors_are_reported_together():
    with pytest.raises(PolicyError) as exc:
        parse_policy({"weight": 1, "cap_percent": 50, "quota": 5000, "period": 5, "colour": "red"})
    text = str(exc.value)
    assert "weight (cpu_shares) 1 outside" in text
    assert "period 5 us outside" in text
    assert "colour" in text
    assert "either as cap_percent or as quota" in text, text


def test_every_model_rule_is_reported():
    with pytest.raises(PolicyError) as exc:
        parse_policy({"cap_percent": 0.5, "quota": 5000})
    text = str(exc.value)
    assert "either as cap_percent or as quota" in text and "below libvirt's minimum" in text, text


def test_partial_policy_keeps_the_valid_fields():
    policy, problems = parse_policy_partial({"weight": 1, "vcpu_pins": {"0": "9"}, "dedicated": "1-1"})
    assert policy.vcpu_pins == {0: "9"} and policy.dedicated == "1" and policy.weight is None
    assert len(problems) == 1 and problems[0].startswith("weight:")
    assert parse_policy_partial({"weight": 300}) == (parse_policy({"weight": 300}), [])


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="vmsched")
    register(parser.add_subparsers(dest="command", required=True), serve)
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().err


def test_cli_reports_field_model_and_host_problems_at_once(conn, make_agent, capsys):  # noqa: F811
    a = make_agent()  # pool 4-7 on the test driver's 16 CPUs
    guest(conn, "t-all")
    code, err = run_cli(["policy", "set", "t-all", "--dedicated", "1-1", "--pin", "0=99", "--weight", "1",
                         "--socket", str(a.socket_path)], capsys)
    assert code != 0
    assert "weight (cpu_shares) 1 outside" in err, err
    assert "vCPU 0 pin 99: CPU 99 does not exist on this host" in err, err
    assert "dedicated set 1: CPU 1 is not in the host's dedicated pool" in err, err
    # and nothing was applied
    assert a.get_policy("t-all")["policy"] is None


def test_agent_reports_all_problems_of_a_request(conn, make_agent):  # noqa: F811
    a = make_agent()
    guest(conn, "t-all2", vcpus=1)
    a.set_policy("t-all2", {"dedicated": "4"})
    with pytest.raises(PolicyError) as exc:
        a.set_policy("t-all2", {"dedicated": "4-5", "vcpu_pins": {"0": "6", "3": "1"}, "weight": 1,
                                "cap_percent": 50, "quota": 5000})
    text = str(exc.value)
    for fragment in ("weight (cpu_shares) 1 outside", "either as cap_percent or as quota",
                     "vCPU 0 pin 6: CPU 6 is outside the guest's dedicated CPUs 4-5",
                     "vCPU 3 does not exist"):
        assert fragment in text, text
    assert a.get_policy("t-all2")["policy"] == {"dedicated": "4"}
