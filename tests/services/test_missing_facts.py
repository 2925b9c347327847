"""What the units that read host facts lacked: from the call's facts to the reply's missing_facts and the summary."""

from __future__ import annotations

import time

from vmsched.facts.model import FactsMessage, HostFacts
from vmsched.facts.cache import NO_AGENT, NO_CACHE, SILENT_AGENT, FactsCache, cause
from tests.support.decisions import build
from vmsched.decide.rules import filter_decision
from vmsched.messages import FilterOutcome, FilterRequest
from vmsched.runtime.types import CallResult
from vmsched.service import UnitRun, missing_facts

HOSTS = ["h1", "h2", "h3", "h4"]


def cache() -> FactsCache:
    """h1 reports; engine host h2 is mapped to agent a2, which sent nothing; h3 and h4 have no agent."""
    found = FactsCache("scoring", host_map={"h2": "a2"})
    found.ingest(FactsMessage(host_id="h1", instance="i", seq=1, time=time.time(), interval=5.0,
                              host=HostFacts(hostname="h1")).model_dump_json().encode())
    return found


def runs(facts: object) -> list[UnitRun]:
    ok = CallResult(ok=True, value=HOSTS)
    return [UnitRun("Memory", ok, read_facts=True, facts=facts), UnitRun("Plain", ok),
            UnitRun("Dedicated", ok, read_facts=True, facts=facts)]


def test_the_hosts_without_facts_are_grouped_by_why() -> None:
    found = missing_facts(runs(cache().prepared(HOSTS, "vm-1")), HOSTS, "vm-1")
    assert found is not None and found.units == ["Memory", "Dedicated"]
    assert found.hosts == {SILENT_AGENT: ["h2"], NO_AGENT: ["h3", "h4"]}
    assert found.vm is not None and "runs on no host with facts" in found.vm


def test_nothing_is_missing_when_no_unit_reads_facts_or_every_host_has_them() -> None:
    facts = cache().prepared(["h1"], "")
    assert missing_facts(runs(facts), ["h1"]) is None
    assert missing_facts([UnitRun("Plain", CallResult(ok=True))], HOSTS, "vm-1") is None


def test_without_a_facts_cache_every_host_lacks_them() -> None:
    found = missing_facts(runs(None), HOSTS, "vm-1")
    assert found is not None and found.hosts == {NO_CACHE: HOSTS} and found.vm == NO_CACHE


def test_each_reason_of_the_cache_has_its_cause() -> None:
    c = cache()
    assert cause(c.resolve("h3")[1]) == NO_AGENT and cause(c.resolve("h2")[1]) == SILENT_AGENT
    assert cause("something else") == "something else"


def test_the_summary_says_how_many_hosts_had_no_facts_and_why() -> None:
    req = FilterRequest(units=["Memory", "Dedicated"], hosts=HOSTS, vm="vm-1")
    outcomes = [FilterOutcome(unit="Memory", ok=True, hosts=HOSTS), FilterOutcome(unit="Dedicated", ok=True, hosts=HOSTS)]
    decision = filter_decision(HOSTS, outcomes)
    decision.missing_facts = missing_facts(runs(cache().prepared(HOSTS, "vm-1")), HOSTS, "vm-1")
    record = build("filter", req, decision, outcomes, bus_failed=False, gateway="gw", duration=0.01)
    assert record["summary"] == (f"kept 4 of 4 hosts: no facts for 3 of 4 hosts (1: {SILENT_AGENT}; 2: {NO_AGENT}) "
                                 "for Memory, Dedicated")
    assert record["missing_facts"]["hosts"][NO_AGENT] == ["h3", "h4"]
    decision.missing_facts = None
    record = build("filter", req, decision, outcomes, bus_failed=False, gateway="gw", duration=0.01)
    assert record["summary"] == "kept 4 of 4 hosts" and record["missing_facts"] is None
