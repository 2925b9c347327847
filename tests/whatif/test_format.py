"""The recording's records: what the gateway and the services write, read back as they were."""

from __future__ import annotations

import json
import math
import time

from vmsched.decide.rules import balance_decision, filter_decision, score_decision
from vmsched.facts.cache import FactsCache
from vmsched.facts.model import FactsMessage, GuestFacts, HostFacts
from vmsched.messages import (BalanceOutcome, BalanceRequest, FilterOutcome, FilterRequest, MissingFacts,
                              ScoreOutcomeOnBus, ScoreRequest)
from vmsched.whatif import format as fmt

H = ["h1", "h2", "h3"]
VM = "11111111-2222-3333-4444-555555555555"


def _line(item: object, state: fmt.FileState | None = None) -> list[object]:
    return [fmt.parse(line) for line in item.encode(state or fmt.FileState()).splitlines()]  # type: ignore[attr-defined]


def test_a_filter_call_keeps_the_engine_s_arguments_but_omitted_keys_and_each_unit_s_drops():
    req = FilterRequest(units=["A", "B"], hosts=H, vm=VM, properties={"password": "s3cret", "Max": "3"})
    outcomes = [FilterOutcome(unit="A", ok=True, hosts=["h1", "h3"], reasons={"h2": "full"}, duration=0.002),
                FilterOutcome(unit="B", ok=False, error="boom")]
    decision = filter_decision(H, outcomes)
    item = fmt.CallItem("c1", 100.0, "gw-1", "filter", req, decision, outcomes, False, 0.01, frozenset({"password"}))
    raw = item.encode(fmt.FileState())
    assert b"s3cret" not in raw
    (call,) = _line(item)
    assert isinstance(call, fmt.Call)
    assert call.method == "runFilters" and call.args == [["A", "B"], H, VM, {"Max": "3"}]
    assert call.omitted == ["password"] and call.gateway == "gw-1" and call.time == 100.0
    assert call.reply == decision.envelope()
    a, b = (fmt.outcome("filter", u, H) for u in call.units)
    assert a.hosts == ["h1", "h3"] and a.reasons == {"h2": "full"} and a.duration == 0.002
    assert not b.ok and b.error == "boom"


def test_score_outcomes_come_back_aligned_or_paired_and_infinite_scores_survive():
    req = ScoreRequest.model_validate({"units": [{"name": "S", "factor": 3}, {"name": "T"}], "hosts": H, "vm": VM})
    aligned = ScoreOutcomeOnBus(unit="S", ok=True, factor=3, values=[1.0, 2.5, float("inf")])
    aligned.scores = list(zip(H, aligned.values))  # as the gateway pairs them
    partial = ScoreOutcomeOnBus(unit="T", ok=True, scores=[("h2", -float("inf")), ("h1", 4.0)])
    decision = score_decision(H, [aligned, partial])
    decision.missing_facts = MissingFacts(units=["S"], hosts={"no agent reports them": ["h3"]})
    item = fmt.CallItem("c2", 1.0, "gw", "score", req, decision, [aligned, partial], False, 0.01)
    (call,) = _line(item)
    assert call.args[0] == [["S", 3], ["T", 1]] and call.missing_facts["hosts"] == {"no agent reports them": ["h3"]}
    json.loads(item.encode(fmt.FileState()))  # strict JSON: no Infinity literal
    s, t = (fmt.outcome("score", u, H) for u in call.units)
    assert s.factor == 3 and s.scores[:2] == [("h1", 1.0), ("h2", 2.5)] and math.isinf(s.scores[2][1])
    assert t.scores[0][0] == "h2" and t.scores[0][1] == -math.inf and t.scores[1] == ("h1", 4.0)
    assert score_decision(H, [s, t]).result == decision.result  # the baseline a replay recomputes is what was sent


def test_a_balance_call_keeps_the_proposal_and_its_reason():
    req = BalanceRequest(unit="Move", hosts=H, properties={})
    o = BalanceOutcome(unit="Move", ok=True, vm=VM, hosts=["h2"], reason="h1 is hot", reasons={"h2": "cool"})
    item = fmt.CallItem("c3", 1.0, "gw", "balance", req, balance_decision(H, o), o, False, 0.01)
    (call,) = _line(item)
    assert call.args == ["Move", H, {}]
    back = fmt.outcome("balance", call.units[0], H)
    assert (back.vm, back.hosts, back.reason, back.reasons) == (VM, ["h2"], "h1 is hot", {"h2": "cool"})


def _cache() -> FactsCache:
    cache = FactsCache("scoring")
    for i, host in enumerate(H[:2]):
        cache.ingest(FactsMessage(host_id=host, instance="a", seq=1, time=time.time(), interval=5.0,
                                  host=HostFacts(memory_free_mib=1000 * (i + 1), cpu_history=[1.5, 2.0]),
                                  guests=[GuestFacts(uuid=f"g{i}", memory_mib=512)]).model_dump_json().encode())
    return cache


def test_inputs_write_each_host_s_facts_once_per_generation_and_file():
    cache = _cache()
    state = fmt.FileState()
    first = _line(fmt.InputsItem("c1", "scoring", cache.prepared(H, VM)), state)
    again = _line(fmt.InputsItem("c2", "scoring", cache.prepared(H, VM)), state)
    kinds = [type(r).__name__ for r in first]
    assert kinds == ["HostFacts", "HostFacts", "Inputs"] and [type(r).__name__ for r in again] == ["Inputs"]
    inputs = first[-1]
    assert set(inputs.hosts) == {"h1", "h2"} and set(inputs.missing) == {"h3"} and inputs.guests is None
    entry, _ = cache.resolve("h1")
    assert first[0].facts == json.loads(entry.fragment) and first[0].stale_at == entry.stale_at
    fresh_file = _line(fmt.InputsItem("c3", "scoring", cache.prepared(H, VM)), fmt.FileState())
    assert len(fresh_file) == 3  # a new file has them again: each file stands alone


def test_balance_inputs_carry_the_guest_lists_and_no_cache_says_so():
    cache = _cache()
    records = _line(fmt.InputsItem("b1", "balancer", cache.prepared(H[:2], with_guests=True)))
    guests = [r for r in records if isinstance(r, fmt.GuestList)]
    assert len(guests) == 2 and {g.guests[0]["uuid"] for g in guests} == {"g0", "g1"}
    assert set(records[-1].guests) == {"h1", "h2"}
    (none,) = _line(fmt.InputsItem("b2", "balancer", None))
    assert none.cache is False
