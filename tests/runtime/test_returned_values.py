"""What a plugin returns that is not a requested host ID never reaches the engine verbatim."""

from __future__ import annotations

from vmsched.decide.rules import filter_decision
from vmsched.messages import FilterOutcome

SECRET = "root:$y$j9T$0123456789abcdefSECRETHASH:19000:0:99999:7:::\n"


def test_foreign_values_are_counted_and_excerpted() -> None:
    hosts = ["h1", "h2"]
    outcome = FilterOutcome(unit="Evil", ok=True, hosts=["h1", SECRET, "x" * 5000, "\x1b[31mred", "a", "b"])
    decision = filter_decision(hosts, [outcome])
    [message] = decision.plugin_errors["Evil"]
    assert "returned 5 host IDs not in the request" in message and "and 2 more" in message
    assert "SECRETHASH" not in message and "x" * 20 not in message and "\x1b" not in message
    assert "\\x1b" in message  # escaped, not interpreted


def test_one_foreign_value_is_one_host_id() -> None:
    decision = filter_decision(["h1"], [FilterOutcome(unit="Odd", ok=True, hosts=["h1", "h9"])])
    assert decision.plugin_errors["Odd"] == ["returned 1 host ID not in the request, dropped: 'h9'"]
