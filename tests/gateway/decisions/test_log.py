"""The decision log: records, summaries, the bounded ring, the JSON API, and replicas on the bus."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.stack import Stack
from tests.support.waiting import wait_until
from vmsched.bus.options import BusOptions
from vmsched.bus.inprocess import InProcessTransport
from vmsched.bus.transport import open_transport
from vmsched.facts.model import FactsMessage, HostFacts
from vmsched.facts.cache import FactsCache
from vmsched.gateway.decisions import log as decision_log
from vmsched.gateway.decisions import peers as decision_peers
from vmsched.gateway.decisions import record as decisions
from vmsched.gateway.decisions.log import DecisionLog
from vmsched.gateway.decisions.record import gateway_label, record_of
from vmsched.gateway.decisions.ring import Ring
from tests.support.decisions import build
from vmsched.gateway.engine.operations import paired_scores
from vmsched.decide.rules import Decision, balance_decision, filter_decision, score_decision
from vmsched.messages import (
    BalanceOutcome,
    BalanceRequest,
    FilterOutcome,
    FilterRequest,
    ScoreOutcome,
    ScoreOutcomeOnBus,
    ScoreReply,
    ScoreRequest,
)

H = [f"aaaaaaaa-0000-0000-0000-00000000000{i}" for i in range(6)]
VM = "11111111-2222-3333-4444-555555555555"


def _filter_record(outcomes: list[FilterOutcome], hosts: list[str] = H[:5], bus_failed: bool = False,
                   vm: str = VM) -> dict[str, Any]:
    req = FilterRequest(units=[o.unit for o in outcomes], hosts=hosts, vm=vm)
    decision = Decision(result=list(hosts)) if bus_failed else filter_decision(hosts, outcomes)
    if bus_failed:  # what the scheduler does: the operation's fallback, saying why
        decision.errors.append("BusTimeout: no reply")
    return build("filter", req, decision, outcomes, bus_failed=bus_failed, gateway="gw-a", duration=0.01)


# --- records and summaries ----------------------------------------------------------------------
def test_filter_record_says_which_unit_dropped_which_host() -> None:
    record = _filter_record([
        FilterOutcome(unit="Memory", ok=True, hosts=H[:3], duration=0.002),
        FilterOutcome(unit="AllowDeny", ok=True, hosts=[H[0], H[2], H[3], H[4]]),
        FilterOutcome(unit="Slow", ok=False, timed_out=True, error="timed out after 1.0 s"),
    ])
    assert record["result"] == [H[0], H[2]] and not record["fallback"]
    memory, allow, slow = decisions.for_reader(record)["units"]  # the API's form: kept spelled out
    assert memory["dropped"] == H[3:5] and memory["kept"] == H[:3] and memory["duration"] == 0.002
    assert allow["dropped"] == [H[1]]
    assert slow["timed_out"] and slow["dropped"] == [] and slow["kept"] == H[:5]  # a failing filter drops nothing
    assert "kept" not in record["units"][0]  # the ring and the bus carry only what was dropped
    assert record["summary"].startswith("kept 2 of 5 hosts: Memory dropped 2 (")
    assert f"AllowDeny dropped 1 ({H[1]})" in record["summary"]
    assert "Slow timed out, ignored" in record["summary"]
    assert decisions.has_errors(record)


def test_reasons_a_unit_gives_are_in_the_summary() -> None:
    outcome = FilterOutcome(unit="Memory", ok=True, hosts=H[:1], reasons={H[1]: "free 1.2 GiB < 4 GiB needed"})
    record = _filter_record([outcome], hosts=H[:2])
    assert record["units"][0]["reasons"] == {H[1]: "free 1.2 GiB < 4 GiB needed"}
    assert record["summary"] == f"kept 1 of 2 hosts: Memory dropped 1 ({H[1]}: free 1.2 GiB < 4 GiB needed)"


def test_hosts_dropped_for_the_same_reason_are_grouped() -> None:
    same = "no fresh facts"
    outcome = FilterOutcome(unit="Fresh", ok=True, hosts=[H[0]],
                            reasons={H[1]: same, H[2]: "too busy", H[3]: same, H[4]: "x"})
    summary = _filter_record([outcome], hosts=H[:6])["summary"]
    assert summary == (f"kept 1 of 6 hosts: Fresh dropped 5 ({H[1]}, {H[3]}: {same}; {H[2]}: too busy; "
                       f"{H[4]}: x; 1 more reasons)")  # H[5]: dropped without a reason


def test_score_and_balance_summaries_carry_reasons() -> None:
    outcomes = [ScoreOutcome(unit="Guests", ok=True, scores=[(H[0], 3.0), (H[1], 1.0)],
                             reasons={H[0]: "3 guests", H[1]: "1 guest"})]
    req = ScoreRequest.model_validate({"units": [{"name": "Guests"}], "hosts": H[:2], "vm": VM})
    record = build("score", req, score_decision(H[:2], outcomes), outcomes, bus_failed=False,
                             gateway="gw-a", duration=0.1)
    assert record["summary"].startswith(f"best {H[1]} (weight ") and record["summary"].endswith(
        f"1 of 1 units scored; Guests on {H[1]}: 1 guest")
    breq = BalanceRequest(unit="Even", hosts=H[:2])
    move = BalanceOutcome(unit="Even", ok=True, vm=VM, hosts=[H[1]], reason="source host has 12 guests")
    record = build("balance", breq, balance_decision(H[:2], move), move, bus_failed=False,
                             gateway="gw-a", duration=0.1)
    assert record["units"][0]["reason"] == "source host has 12 guests"
    assert record["summary"] == f"Even proposes migrating VM {VM} to one of 1 hosts ({H[1]}): source host has 12 guests"


def test_fallbacks_are_marked_and_explained() -> None:
    bus_down = _filter_record([], bus_failed=True)
    assert bus_down["fallback"] and bus_down["result"] == H[:5]
    assert bus_down["summary"] == "kept 5 of 5 hosts [fallback: BusTimeout: no reply]"
    all_failed = _filter_record([FilterOutcome(unit="Raises", ok=False, error="ValueError: no\nTraceback")])
    assert all_failed["fallback"] and all_failed["errors"] == ["all filters failed"]
    assert "Raises failed (ValueError: no), ignored" in all_failed["summary"]
    assert all_failed["summary"].endswith("[fallback: all filters failed]")


def test_score_record_keeps_raw_scores_and_factor() -> None:
    outcomes = [ScoreOutcome(unit="Load", ok=True, factor=2, scores=[(H[0], 0.5), (H[1], 10.0)]),
                ScoreOutcome(unit="Exits", ok=False, error="plugin called sys.exit(1)")]
    req = ScoreRequest.model_validate({"units": [{"name": "Load", "factor": 2}, {"name": "Exits"}],
                                       "hosts": H[:3], "vm": VM})
    decision = score_decision(H[:3], outcomes)
    record = build("score", req, decision, outcomes, bus_failed=False, gateway="gw-a", duration=0.1)
    load = record["units"][0]
    assert load["factor"] == 2 and load["scores"] == {H[0]: 0.5, H[1]: 10.0}
    assert record["result"] == decision.result  # what the engine got, whatever the weighting rules
    best = min(decision.result, key=lambda pair: pair[1])  # lower is better for the engine
    assert best[0] == H[0] and record["summary"].startswith(f"best {H[0]} (weight {best[1]}, lowest) of 3 ")
    assert "1 of 2 units scored" in record["summary"]
    assert record["summary"].endswith("Exits failed (plugin called sys.exit(1)), ignored")
    assert not record["fallback"]


def test_an_infinite_raw_score_is_kept_as_null_so_the_record_stays_strict_json(
        capsys: pytest.CaptureFixture[str]) -> None:
    outcomes = [ScoreOutcome(unit="Unbounded", ok=True, scores=[(H[0], float("inf")), (H[1], -float("inf")),
                                                                (H[2], 1.0)])]
    req = ScoreRequest.model_validate({"units": [{"name": "Unbounded"}], "hosts": H[:3], "vm": VM})
    log = DecisionLog(10, "gw-a", stdout=True)
    log.start()

    async def engine_call() -> None:
        log.submit("score", req, score_decision(H[:3], outcomes), outcomes, False, 0.01)

    asyncio.run(engine_call())
    log.flush()
    log.stop()
    line = capsys.readouterr().out.strip()

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    record = json.loads(line, parse_constant=refuse)  # what Loki's and ELK's parsers read (--decisions-log)
    assert record["units"][0]["scores"] == {H[0]: None, H[1]: None, H[2]: 1.0}
    assert "not a finite number" in record["plugin_errors"]["Unbounded"][0]


def test_balance_record_and_its_timeout_fallback() -> None:
    req = BalanceRequest(unit="Drain", hosts=H[:3])
    good = BalanceOutcome(unit="Drain", ok=True, vm=VM, hosts=H[1:3])
    record = build("balance", req, balance_decision(H[:3], good), good, bus_failed=False,
                             gateway="gw-a", duration=0.1)
    assert record["summary"] == f"Drain proposes migrating VM {VM} to one of 2 hosts ({H[1]}, {H[2]})"
    assert decisions.matches(record, vm=VM)  # the VM a balancer proposes is searchable
    hung = BalanceOutcome(unit="Drain", ok=False, timed_out=True, error="timed out after 1.0 s")
    record = build("balance", req, balance_decision(H[:3], hung), hung, bus_failed=False,
                             gateway="gw-a", duration=1.0)
    assert record["fallback"] and record["result"] == ["", []]
    assert record["summary"] == "Drain: no migration: Drain timed out, ignored [fallback: nothing ran]"


def test_filters_of_the_api() -> None:
    ok = _filter_record([FilterOutcome(unit="A", ok=True, hosts=H[:2])], hosts=H[:3])
    bad = _filter_record([FilterOutcome(unit="A", ok=False, error="x")], hosts=H[3:5], vm="other")
    assert decisions.matches(ok, vm=VM, host=H[2], op="filter")
    assert not decisions.matches(ok, host=H[4]) and not decisions.matches(ok, op="score")
    assert not decisions.matches(ok, errors_only=True) and decisions.matches(bad, errors_only=True)
    assert not decisions.matches(bad, vm=VM) and decisions.matches(bad, vm="other")


# --- the ring -----------------------------------------------------------------------------------
def _kept_filter(hosts: list[str] = H[:5]) -> bytes:
    req = FilterRequest(units=["A"], hosts=hosts, vm=VM)
    outcomes = [FilterOutcome(unit="A", ok=True, hosts=hosts[:1])]
    return orjson.dumps(decisions.keep("filter", req, filter_decision(hosts, outcomes), outcomes, False, 0.01))


def test_the_ring_never_grows_past_its_size_per_operation() -> None:
    ring = Ring(3, "gw-a")
    ids = [uuid.uuid4().hex for _ in range(10)]
    for i, record_id in enumerate(ids):
        ring.put("filter", record_id, float(i), _kept_filter())
        assert len(ring.recent(op="filter")) <= 3
    score = uuid.uuid4().hex
    sreq = ScoreRequest.model_validate({"units": [], "hosts": H[:2], "vm": VM})
    ring.put("score", score, 0.5, orjson.dumps(decisions.keep("score", sreq, Decision(result=[]), [], False, 0.01)))
    assert [r["id"] for r in ring.recent(op="filter")] == list(reversed(ids[-3:]))
    assert ring.get(ids[0]) is None and ring.get(ids[-1]) == ring.recent(limit=1)[0]
    assert ring.get(score)["id"] == score  # another operation's ring is not evicted by filters
    assert len(ring) == 4
    ring.put("filter", ids[-1], 99.0, _kept_filter())  # the same ID twice (own decision echoed) is kept once
    assert len(ring) == 4
    assert [r["id"] for r in ring.recent(limit=2)] == [ids[-1], ids[-2]]
    assert ring.recent(limit=1)[0]["gateway"] == "gw-a" and ring.recent(limit=1)[0]["time"] == 9.0


def test_gateway_label_is_routing_key_safe() -> None:
    assert gateway_label("gw.1 *#") == "gw-1---"
    assert gateway_label("") and "." not in gateway_label("")


# --- replicas on the bus ------------------------------------------------------------------------
def test_the_embedded_bus_shares_nothing() -> None:
    """memory:// lives in one process, which runs one gateway: nobody to ask."""
    log = DecisionLog(10, "gw-a", bus=InProcessTransport())
    assert log.peers is None


def test_stdout_lines_are_written_in_batches_and_their_backlog_is_bounded(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("vmsched.gateway.decisions.log.MAX_PENDING", 3)
    log = DecisionLog(10, "gw-a", stdout=True)
    log.start()
    req = FilterRequest(units=["A"], hosts=H[:2], vm=VM)

    async def engine_calls() -> None:
        for _ in range(5):
            log.submit("filter", req, Decision(result=H[:2]), [], False, 0.01)
        assert log.skipped == 2 and len(log.ring) == 5  # every decision is in the ring; 2 lines are not written
        assert capsys.readouterr().out == ""  # no line written on the request path
        await asyncio.sleep(decision_log.PAUSE + 0.3)
        assert len(capsys.readouterr().out.splitlines()) == 3  # the output thread wrote them without being asked

    asyncio.run(engine_calls())
    log.submit("filter", req, Decision(result=H[:2]), [], False, 0.01)
    log.flush()
    log.stop()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["event"] for line in lines] == ["vmsched.decision"]  # --decisions-log: one JSON line each
    assert lines[0]["id"] == log.ring.recent(limit=1)[0]["id"] and lines[0] == {
        "event": "vmsched.decision", **log.ring.recent(limit=1)[0]}


def _slots(log: DecisionLog, op: str) -> list[bytes]:
    """What the ring keeps of each decision of ``op`` (nothing public shows it)."""
    return [data for data in log.ring._ops[op].data if data is not None]


def test_the_ring_keeps_one_bytes_object_per_decision_without_stderr_and_builds_records_when_read() -> None:
    log = DecisionLog(10, "gw-a")  # no stdout, no bus: nothing needs the record before a reader
    outcomes = [FilterOutcome(unit="A", ok=True, hosts=H[:1], stderr="x" * 100_000)]
    req = FilterRequest(units=["A"], hosts=H[:2], vm=VM)
    log.submit("filter", req, filter_decision(H[:2], outcomes), outcomes, False, 0.01)
    (slot,) = _slots(log, "filter")
    assert isinstance(slot, bytes) and not gc.is_tracked(slot) and b"x" * 100 not in slot  # no stderr kept
    (record,) = log.ring.recent()
    assert log.ring.recent() == [record] and log.ring.get(record["id"]) == record  # built again, the same
    assert record["units"][0]["dropped"] == [H[1]] and "stderr" not in record["units"][0]


def _plain(value: Any) -> bool:
    """Strings, numbers, None and containers of them: no object of the request."""
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return value is None or isinstance(value, (str, bytes, int, float, bool))


def _through_the_ring(op: str, req: Any, decision: Decision, outcomes: Any, **args: Any) -> dict[str, Any]:
    """The record of a decision kept in a ring (serialised, read back), with ``args`` as for build."""
    kept = decisions.keep(op, req, decision, outcomes, args["bus_failed"], args["duration"], args.get("facts_age"))
    assert all(_plain(kept[name]) for name in ("hosts", "units", "result", "plugin_errors", "errors"))
    return record_of(orjson.loads(orjson.dumps(kept)), args["record_id"], args["at"], args["gateway"])


def test_a_kept_decision_reads_back_as_its_record() -> None:
    outcomes = [FilterOutcome(unit="A", ok=True, hosts=H[:3], reasons={H[3]: "why"}, error=None),
                FilterOutcome(unit="B", ok=False, error="boom", timed_out=True)]
    req = FilterRequest(units=["A", "B"], hosts=H[:4], vm=VM)
    decision = filter_decision(H[:4], outcomes)
    args: dict[str, Any] = dict(bus_failed=False, gateway="gw-a", duration=0.01, at=1.0, record_id="1" * 32)
    again = _through_the_ring("filter", req, decision, outcomes, **args)
    assert again == build("filter", req, decision, outcomes, **args)
    assert again["plugin_errors"]["B"] and again["units"][0]["reasons"] == {H[3]: "why"}
    assert again["units"][0]["dropped"] == [H[3]] and again["result"] == H[:3]
    scores = [ScoreOutcome(unit="S", ok=True, factor=2, scores=[(H[0], 1.5), (H[1], 0.5)], reasons={H[0]: "r"})]
    sreq = ScoreRequest.model_validate({"units": [{"name": "S", "factor": 2}], "hosts": H[:2], "vm": VM})
    sdec = score_decision(H[:2], scores)
    record = _through_the_ring("score", sreq, sdec, scores, **args)
    assert record == build("score", sreq, sdec, scores, **args)
    assert record["units"][0]["scores"] == {H[0]: 1.5, H[1]: 0.5} and record["result"] == sdec.result
    balance = BalanceOutcome(unit="Bal", ok=True, vm=VM, hosts=H[:2], reason="busy")
    breq = BalanceRequest.model_validate({"unit": "Bal", "hosts": H[:3]})
    bdec = balance_decision(H[:3], balance)
    record = _through_the_ring("balance", breq, bdec, balance, **args)
    assert record == build("balance", breq, bdec, balance, **args)
    assert record["unit"] == "Bal" and record["units"][0]["hosts"] == H[:2] and record["result"] == [VM, H[:2]]


def test_a_filter_keeps_only_what_it_dropped_and_its_record_is_the_same() -> None:
    outcomes = [FilterOutcome(unit="A", ok=True, hosts=[H[0], "not-offered"]),  # a unit returning a stranger
                FilterOutcome(unit="B", ok=False, error="boom")]  # a failing one drops nothing
    req = FilterRequest(units=["A", "B"], hosts=H[:3], vm=VM)
    decision = filter_decision(req.hosts, outcomes)
    unit_a = decisions.keep("filter", req, decision, outcomes, False, 0.0)["units"][0]
    assert set(unit_a["dropped"]) == {H[1], H[2]} and "not-offered" not in repr(unit_a)  # (the errors name it)
    args: dict[str, Any] = dict(bus_failed=False, gateway="g", duration=0.0, at=1.0, record_id="4" * 32)
    assert _through_the_ring("filter", req, decision, outcomes, **args) == build(
        "filter", req, decision, outcomes, **args)


def _filter_rule(hosts: list[str], outcomes: list[FilterOutcome]) -> tuple[list[str], set[str]]:
    """The engine protocol's filter rule, spelled out: the requested hosts every working unit kept, in input order
    (every host when none works); the units that returned a host not requested."""
    working = [set(o.hosts) for o in outcomes if o.ok]
    common = set.intersection(*working) if working else set(hosts)
    return [h for h in hosts if h in common], {o.unit for o in outcomes if o.ok and set(o.hosts) - set(hosts)}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(H), max_size=8),
       st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from([*H, "stranger"]), max_size=9)), max_size=4))
def test_a_filter_decision_reads_back_from_the_ring(hosts: list[str], units: list[tuple[bool, list[str]]]) -> None:
    """Read back, a filter decision is the rule's result and each unit's dropped hosts, for hosts asked twice,
    returned twice, not requested, failing units and no working unit."""
    outcomes = [FilterOutcome(unit=f"u{i}", ok=ok, hosts=kept, error=None if ok else "boom")
                for i, (ok, kept) in enumerate(units)]
    req = FilterRequest(units=[o.unit for o in outcomes], hosts=hosts, vm=VM)
    decision = filter_decision(hosts, outcomes)
    result, foreign = _filter_rule(hosts, outcomes)
    assert decision.result == result
    assert {u for u, texts in decision.plugin_errors.items() if "not in the request" in texts[0]} == foreign
    args: dict[str, Any] = {"bus_failed": False, "gateway": "g", "duration": 0.0, "at": 1.0, "record_id": "5" * 32}
    record = _through_the_ring("filter", req, decision, outcomes, **args)
    assert record == build("filter", req, decision, outcomes, **args) and record["result"] == result
    for unit, o in zip(record["units"], outcomes):
        assert unit["dropped"] == ([h for h in hosts if h not in set(o.hosts)] if o.ok else [])


def test_facts_age_of_the_hosts_with_facts() -> None:
    cache = FactsCache("decisions-test")
    collected = time.time() - 7.0
    cache.ingest(FactsMessage(host_id=H[0], instance="i1", seq=1, time=collected, interval=5.0,
                              host=HostFacts(), guests=None).model_dump_json().encode())
    log = DecisionLog(10, "gw-a", facts=cache)
    req = FilterRequest(units=["A"], hosts=H[:2], vm=VM)
    log.submit("filter", req, Decision(result=H[:2]), [], False, 0.01)  # no event loop: recorded at once
    (record,) = log.ring.recent()
    assert set(record["facts_age"]) == {H[0]} and 6.5 <= record["facts_age"][H[0]] <= 60  # H[1]: no facts, absent


def _linked(options: BusOptions, *names: str) -> list[DecisionLog]:
    logs = [DecisionLog(10, name, bus=open_transport(options)) for name in names]
    for log in logs:
        log.start()
    for log in logs:
        assert log.peers is not None
        wait_until(lambda: len(log.peers.peers()) == len(names) - 1, 20, 0.05, f"{log.gateway} to know its peers")
    return logs


@pytest.mark.rabbitmq
def test_a_reader_gets_every_replicas_decisions_by_asking_them(rabbit_vhost: str) -> None:
    a, b, c = _linked(BusOptions(url=rabbit_vhost, connect_timeout=2.0), "gw-a", "gw-b", "gw-c")
    try:
        req = FilterRequest(units=["A"], hosts=H[:2], vm=VM)
        outcomes = [FilterOutcome(unit="A", ok=True, hosts=H[:1])]
        a.submit("filter", req, filter_decision(H[:2], outcomes), outcomes, False, 0.01)
        b.submit("filter", req, Decision(result=H[:2], errors=["BusTimeout"]), [], True, 0.02)
        for log in (a, b, c):
            found = asyncio.run(log.search(10, vm=VM))
            labels = {r["gateway"]: r for r in found.records}
            assert set(labels) == {"gw-a", "gw-b"} and not found.missing, found
            assert labels["gw-b"]["fallback"] and not labels["gw-a"]["fallback"]
            assert sorted(found.replicas(log.gateway)["answered"]) == ["gw-a", "gw-b", "gw-c"]
        assert asyncio.run(c.search(10, vm=VM, errors_only=True)).records[0]["gateway"] == "gw-b"  # filters go along
        assert asyncio.run(c.search(10, vm="another")).records == []
        a_id = a.ring.recent()[0]["id"]
        assert asyncio.run(c.find(a_id)).records[0]["gateway"] == "gw-a"
        assert asyncio.run(c.find("0" * 32)).records == []

        assert c.peers is not None and a.peers is not None
        a.peers.subscription.stop(5)  # gw-a's link stops without a goodbye: it stays in the directory, silent
        found = asyncio.run(c.search(10, vm=VM))
        assert [r["gateway"] for r in found.records] == ["gw-b"]
        assert found.missing == [{"gateway": "gw-a", "error": "no answer within 0.5 s"}]
        b.stop()  # a goodbye: gw-b leaves the directory at once, and is not named as missing
        wait_until(lambda: "gw-b" not in c.peers.peers().values(), 20, 0.05, "gw-b's goodbye")
    finally:
        for log in (a, b, c):
            log.stop()


def test_a_forged_or_late_answer_is_not_taken() -> None:
    log = DecisionLog(10, "gw-a", bus=open_transport(BusOptions(url="amqp://127.0.0.1:1/", connect_timeout=0.1)))
    link = log.peers
    assert link is not None
    record = _filter_record([FilterOutcome(unit="A", ok=True, hosts=H[:1])])  # labelled gw-a
    key = decision_peers.ANSWER_PREFIX + link.token

    async def answers() -> decision_peers.Gathered:
        state = decision_peers._Question(asyncio.get_running_loop(), {"cccccccccccc", "dddddddddddd"},
                                         first_found=False)
        link._questions["1" * 16] = state
        for body in ({"qid": "1" * 16, "token": "cccccccccccc", "gateway": "gw-c", "decisions": [record]},  # forged
                     {"qid": "2" * 16, "token": "cccccccccccc", "gateway": "gw-a", "decisions": [record]},  # unasked
                     {"qid": "1" * 16, "token": "dddddddddddd", "gateway": "gw-d",
                      "decisions": [{"id": "x", "gateway": "gw-d"}]}):  # not a record
            link._handle(json.dumps(body).encode(), key)
        link._handle(b"not json", key)
        await asyncio.sleep(0.05)
        return state.gathered

    gathered = asyncio.run(answers())
    assert gathered.records == [] and gathered.answered == ["gw-c", "gw-d"]  # they answered, nothing acceptable


def test_a_question_is_answered_from_the_ring_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    log = DecisionLog(10, "gw-a")
    for vm in ("v1", "v2", "v2"):
        req = FilterRequest(units=["A"], hosts=H[:2], vm=vm)
        log.submit("filter", req, Decision(result=H[:2]), [], False, 0.01)
    records, cut = log.answer({"filters": {"vm": "v2", "op": ["not", "a", "string"]}, "limit": "many"})
    assert [r["vm"] for r in records] == ["v2", "v2"] and not cut
    (one,), _ = log.answer({"id": records[0]["id"]})
    assert one == records[0]
    monkeypatch.setattr("vmsched.gateway.decisions.log.MAX_ANSWER", 100)
    records, cut = log.answer({"filters": {}, "limit": 10})
    assert records == [] and cut  # an answer never grows past its bound


# --- the JSON API on the all-in-one process -----------------------------------------------------
def _decisions(stack: Stack, **params: str) -> list[dict[str, Any]]:
    r = stack.get("/v1/decisions", params=params)
    assert r.status_code == 200, r.text
    return r.json()["decisions"]


def test_api_lists_and_details_engine_decisions(stack: Stack) -> None:
    vm = str(uuid.uuid4())
    reply = stack.xmlrpc("runFilters", ["KeepEven", "KeepAllButLast", "Hangs"], H[:5], vm, {})
    assert reply["result"] == [H[0], H[2]]
    wait_until(lambda: len(_decisions(stack, vm=vm)) == 1, 10, 0.05, "the decision in the log")
    (found,) = _decisions(stack, vm=vm, op="filter", host=H[3])
    assert found["summary"].startswith("kept 2 of 5 hosts: KeepEven dropped 2")
    assert "Hangs timed out" in found["summary"] and found["gateway"]
    assert _decisions(stack, vm=vm, op="score") == [] and _decisions(stack, vm=vm, host=H[5]) == []
    assert [d["id"] for d in _decisions(stack, vm=vm, errors="only")] == [found["id"]]
    detail = stack.get(f"/v1/decisions/{found['id']}").json()
    units = {u["unit"]: u for u in detail["units"]}
    assert units["KeepEven"]["dropped"] == [H[1], H[3]] and units["KeepAllButLast"]["dropped"] == [H[4]]
    assert units["Hangs"]["timed_out"] and detail["result"] == [H[0], H[2]] and not detail["fallback"]
    assert units["KeepEven"]["kept"] == [H[0], H[2], H[4]]  # spelled out for readers
    assert detail["facts_age"] == {}  # no agent has sent facts: no host has an age

    stack.xmlrpc("runCostFunctions", [["FloatScore", 2]], H[:2], vm, {})
    wait_until(lambda: len(_decisions(stack, vm=vm)) == 2, 10, 0.05, "the score decision")
    (score,) = _decisions(stack, vm=vm, op="score")
    assert score["units"][0]["factor"] == 2 and len(score["units"][0]["scores"]) == 2
    assert _decisions(stack, vm=vm, errors="only") == [found]


def test_api_refuses_bad_queries(stack: Stack) -> None:
    assert stack.get("/v1/decisions/" + "0" * 32).status_code == 404
    assert stack.get("/v1/decisions/not-an-id").status_code == 400
    assert stack.get("/v1/decisions", params={"op": "nope"}).status_code == 400
    assert stack.get("/v1/decisions", params={"errors": "all"}).status_code == 400


def test_a_score_decision_is_one_untracked_bytes_object_and_reads_back_the_same() -> None:
    """A collection that finds objects kept per decision promotes them to the old generation, and full collections
    then walk the gateway's whole heap (docs/performance.md): the ring keeps one bytes object per decision."""
    many = [f"host-{i:03d}" for i in range(100)]
    scores = [ScoreOutcome(unit=u, ok=True, factor=f, scores=[(h, i * f + 0.1) for i, h in enumerate(many)],
                           reasons={many[0]: "why"}) for u, f in (("S", 1), ("T", 3))]
    req = ScoreRequest.model_validate({"units": [{"name": "S"}, {"name": "T", "factor": 3}], "hosts": many, "vm": VM})
    dec = score_decision(many, scores)
    log = DecisionLog(10, "gw-a")
    log.submit("score", req, dec, scores, False, 0.01)
    (slot,) = _slots(log, "score")
    assert isinstance(slot, bytes) and not gc.is_tracked(slot)
    (record,) = log.ring.recent()
    args: dict[str, Any] = dict(bus_failed=False, gateway="gw-a", duration=0.01, at=record["time"],
                                record_id=record["id"])
    assert record == build("score", req, dec, scores, **args)
    for per_unit in (True, False):  # result rows [host, weight, unit] or [host, weight]
        dec = score_decision(many, scores, per_unit)
        assert _through_the_ring("score", req, dec, scores, **args) == build("score", req, dec, scores,
                                                                                       **args)


def test_aligned_scores_and_odd_hosts_read_back_the_same() -> None:
    many = [f"host-{i:03d}" for i in range(100)]
    req = ScoreRequest.model_validate({"units": [{"name": "S"}, {"name": "T", "factor": 3}], "hosts": many, "vm": VM})
    reply = ScoreReply(outcomes=[
        ScoreOutcomeOnBus(unit="S", ok=True, values=[i + 0.25 for i in range(100)]),
        ScoreOutcomeOnBus(unit="T", ok=True, factor=3, values=[float(100 - i) for i in range(100)]),
        ScoreOutcomeOnBus(unit="U", ok=True, values=[1.0, 2.0]),  # not one per host: fails, keeps no values
        ScoreOutcomeOnBus(unit="V", ok=True, scores=[(many[1], 2.0), (many[0], 1.0)])])  # pairs, as an older service
    outcomes = paired_scores(req, reply).outcomes
    assert outcomes[2].values is None and not outcomes[2].ok and outcomes[0].values is not None
    args: dict[str, Any] = dict(bus_failed=False, gateway="gw-a", duration=0.01, at=1.0, record_id="6" * 32)
    for per_unit in (False, True):
        dec = score_decision(many, outcomes, per_unit)
        record = _through_the_ring("score", req, dec, outcomes, **args)
        assert record == build("score", req, dec, outcomes, **args)
        assert record["units"][0]["scores"] == {h: i + 0.25 for i, h in enumerate(many)}
    dup = ScoreRequest.model_validate({"units": [{"name": "S"}], "hosts": many[:3] + many[:1], "vm": VM})
    alone = paired_scores(dup, ScoreReply(outcomes=[ScoreOutcomeOnBus(unit="S", ok=True, values=[1.0] * 4)]))
    dec = score_decision(dup.hosts, alone.outcomes)  # a repeated host: three rows for four hosts
    assert _through_the_ring("score", dup, dec, alone.outcomes, **args) == build(
        "score", dup, dec, alone.outcomes, **args)
    odd = FilterRequest(units=["A"], hosts=["a\0b", "c"], vm=VM)  # a host holding a NUL
    record = _through_the_ring("filter", odd, Decision(result=list(odd.hosts)), [], **args)
    assert record["hosts"] == ["a\0b", "c"] and record["result"] == ["a\0b", "c"]


def test_a_decision_that_cannot_be_kept_is_counted_not_raised() -> None:
    log = DecisionLog(10, "gw-a")
    req = FilterRequest(units=["A"], hosts=H[:2], vm=VM)
    log.submit("filter", req, Decision(result=object()), [], False, 0.01)  # a value JSON cannot carry (a bug)
    log.submit("filter", req, Decision(result=H[:2]), [], False, 0.01)
    assert log.skipped == 1 and len(log.ring) == 1
