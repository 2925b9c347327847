"""Aligned scores on the worker pipe (PluginPool.aligned_scores, contract.aligned_scores), with real workers.

A score unit's result that is exactly one finite number per requested host, in order, comes back as the bare
numbers; anything else takes the usual way. Either way the scoring service's reply is the same, byte for byte.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.pool.test_pool import make_pool, write_plugin  # noqa: F401 (fixture)

from vmsched.bus.replies import _ok
from vmsched.messages import Envelope, Kind, ScoreRequest
from vmsched.runtime import PluginPool
from vmsched.runtime.contract import BadResult, aligned_scores, checked_aligned
from vmsched.runtime.pool.planning import Planner, Unit
from vmsched.runtime.protocol import Progress
from vmsched.runtime.types import Call, CallResult
from vmsched.runtime.worker.main import Runner
from vmsched.service import UnitRun
from vmsched.services.scoring import ScoringService

HOSTS = ["h0", "h1", "h2"]

#: unit -> the expression its do_score returns (``hosts`` is the requested hosts)
RESULTS = {
    # aligned: numbers alone
    "Floats": "[[h, i * 1.5] for i, h in enumerate(hosts)]",
    "Ints": "[[h, i - 1] for i, h in enumerate(hosts)]",
    "Tuples": "tuple((h, 2.5) for h in hosts)",
    "Mixed": "[(hosts[0], -0.0), (hosts[1], 7), (hosts[2], 1e300)]",
    "BigInts": "[[h, 10 ** 20 + i] for i, h in enumerate(hosts)]",
    "Past64Bits": "[[h, 2 ** 70 + 1] for h in hosts]",
    "Printed": "print([[h, 1] for h in hosts]) or None",
    # anything else: the usual way, the same outcome as before
    "NaN": "[[h, float('nan')] for h in hosts]",
    "Inf": "[[h, float('inf')] for h in hosts]",
    "MinusInf": "[[hosts[0], 1.0], [hosts[1], -float('inf')], [hosts[2], 2.0]]",
    "Bool": "[[h, True] for h in hosts]",
    "Str": "[[h, '1'] for h in hosts]",
    "Foreign": "[[hosts[0], 1.0], ['elsewhere', 2.0], [hosts[2], 3.0]]",
    "Duplicate": "[[hosts[0], 1.0], [hosts[0], 2.0], [hosts[2], 3.0]]",
    "Reordered": "[[hosts[1], 1.0], [hosts[0], 2.0], [hosts[2], 3.0]]",
    "Short": "[[h, 1.0] for h in hosts[:2]]",
    "Long": "[[h, 1.0] for h in hosts] + [[hosts[0], 1.0]]",
    "Reason": "[[h, 1.0, 'why ' + h] for h in hosts]",
    "Triple": "[[h, 1.0, None] for h in hosts]",
    "Single": "[[h] for h in hosts]",
    "NotAList": "{h: 1.0 for h in hosts}",
    "Nothing": "[]",
    "HugeInt": "[[h, 10 ** 400] for h in hosts]",
    "TooManyDigits": "[[h, 10 ** 5000] for h in hosts]",
    "Raises": "1 / 0",
    # a plugin that changes the list of hosts it was given: compared with the hosts as requested
    "Reverses": "hosts.reverse() or [[h, float(i)] for i, h in enumerate(hosts)]",
    "Appends": "hosts.append('extra') or [[h, 1.0] for h in hosts]",
    "Pops": "hosts.pop() and [[h, 1.0] for h in hosts]",
    "Renames": "hosts.__setitem__(0, 'other') or [[h, 1.0] for h in hosts]",
    "SameAfterChange": "hosts.append('x') or hosts.pop() and [[h, 1.0] for h in hosts]",
}
ALIGNED = {"Floats", "Ints", "Tuples", "Mixed", "BigInts", "Past64Bits", "Printed", "SameAfterChange"}


def _plugin() -> str:
    lines: list[str] = []
    for name, expr in RESULTS.items():
        lines += [f"class {name}:", "    def do_score(self, hosts, vm, args):", f"        return {expr}", ""]
    return "\n".join(lines)


class _Service:
    """Just what ScoringService.score uses, with a real pool under run_units."""

    facts = None
    pending = None

    def __init__(self, pool: PluginPool) -> None:
        self.pool = pool

    def _call_facts(self, hosts: list[str], vm: str) -> None:
        return None

    def call_facts(self, env: Envelope, facts: Any) -> tuple[Any, bool]:
        return facts, False  # neither recorded nor shadowed

    def run_units(self, kind: Kind, names: list[str], args: tuple[Any, ...], *rest: Any) -> list[UnitRun]:
        calls = [Call("s", n, "do_score", args, 10.0) for n in names]
        return [UnitRun(n, r) for n, r in zip(names, self.pool.run(calls, deadline=time.time() + 20))]


def _reply(pool: PluginPool, unit: str, hosts: list[str] = HOSTS) -> Any:
    req = ScoreRequest.model_validate({"units": [{"name": unit, "factor": 2}], "hosts": hosts, "vm": "vm"})
    env = Envelope(op="score", deadline=time.time() + 30, body=req.model_dump())
    try:
        reply = _ok(ScoringService.score(_Service(pool), env))  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - what the old path raises, the new one must raise too
        return f"raised {type(exc).__name__}: {exc}"
    parsed = json.loads(reply)
    for outcome in parsed["body"]["outcomes"]:
        assert outcome.pop("duration") > 0
    return reply.count(b'"duration":'), parsed


@pytest.fixture
def pools(plugins: Path, make_pool: Callable[..., PluginPool]) -> tuple[PluginPool, PluginPool]:
    write_plugin(plugins, "s", _plugin())
    old, new = make_pool(size=1), make_pool(size=1)
    new.aligned_scores = True
    return old, new


@pytest.mark.parametrize("unit", sorted(RESULTS))
def test_the_reply_is_the_same_with_and_without_aligned_scores(unit: str, pools: tuple[PluginPool, PluginPool]) -> None:
    old, new = pools
    assert _reply(new, unit) == _reply(old, unit), unit


@pytest.mark.parametrize("unit", sorted(RESULTS))
def test_only_exactly_aligned_results_travel_as_numbers(unit: str, pools: tuple[PluginPool, PluginPool]) -> None:
    old, new = pools
    call = Call("s", unit, "do_score", (HOSTS, "vm", {}), 10.0)
    plain, short = old.run([call])[0], new.run([call])[0]
    assert plain.scores is None
    if unit in ALIGNED:
        assert short.ok and short.value is None and short.scores is not None
        assert [(h, float(s)) for h, s, *_ in plain.value] == list(zip(HOSTS, short.scores))
        assert all(type(s) is float for s in short.scores)
    else:
        assert short.scores is None
        assert (short.ok, short.value, short.error) == (plain.ok, plain.value, plain.error)


def test_several_units_in_one_bundle_each_take_their_own_way(pools: tuple[PluginPool, PluginPool]) -> None:
    _, new = pools
    names = ["Floats", "Reason", "Ints", "NaN", "Printed"]
    results = new.run([Call("s", n, "do_score", (HOSTS, "vm", {}), 10.0) for n in names])
    assert [r.scores is not None for r in results] == [n in ALIGNED for n in names]
    assert results[2].scores == [-1.0, 0.0, 1.0]


def test_filters_and_an_aligned_pool_without_the_flag_are_untouched(pools: tuple[PluginPool, PluginPool],
                                                                     plugins: Path) -> None:
    _, new = pools
    write_plugin(plugins, "f", "class F:\n    def do_filter(self, hosts, vm, args):\n        return hosts\n")
    result = new.run([Call("f", "F", "do_filter", (HOSTS, "vm", {}), 10.0)])[0]
    assert result.ok and result.value == HOSTS and result.scores is None
    new.aligned_scores = False
    result = new.run([Call("s", "Floats", "do_score", (HOSTS, "vm", {}), 10.0)])[0]
    assert result.scores is None and result.value == [[h, i * 1.5] for i, h in enumerate(HOSTS)]


def test_many_hosts_and_odd_host_ids(pools: tuple[PluginPool, PluginPool]) -> None:
    old, new = pools
    hosts = [f"host-{i}-\u00e9\"\\" for i in range(500)]
    assert _reply(new, "Floats", hosts) == _reply(old, "Floats", hosts)
    assert new.run([Call("s", "Floats", "do_score", (hosts, "vm", {}), 10.0)])[0].scores is not None


def test_aligned_scores_mirrors_score_result() -> None:
    assert aligned_scores([["a", 1], ("b", 2.5)], ["a", "b"]) == [1.0, 2.5]
    assert aligned_scores([], []) == []
    for value in ([["a", 1]], [["a", 1], ["a", 2]], [["a", True], ["b", 1]], [["a", 1, "x"], ["b", 1]],
                  [["a", float("nan")], ["b", 1]], [["a", float("inf")], ["b", 1]], [["a", 10 ** 400], ["b", 1]],
                  {"a": 1, "b": 2}, "ab", None, [["b", 1], ["a", 2]]):
        assert aligned_scores(value, ["a", "b"]) is None, value
    assert aligned_scores([["a", 1]], ("a",)) is None  # the hosts as the worker decodes them: a list


def test_the_service_checks_a_worker_s_numbers_again() -> None:
    assert checked_aligned([1.0, -2.5], ["a", "b"]) == [1.0, -2.5]
    for numbers in ([1.0], [1.0, 2], [1.0, True], [1.0, "2"], [1.0, float("nan")], [1.0, float("inf")], {"a": 1.0},
                    None):
        with pytest.raises(BadResult):
            checked_aligned(numbers, ["a", "b"])


class _Forged(_Service):
    def run_units(self, kind: Kind, names: list[str], *rest: Any) -> list[UnitRun]:
        return [UnitRun(names[0], CallResult(ok=True, scores=[1.0, float("nan"), 2.0]))]


def test_forged_numbers_from_a_worker_fail_the_unit() -> None:
    req = ScoreRequest.model_validate({"units": [{"name": "x"}], "hosts": HOSTS})
    env = Envelope(op="score", deadline=time.time() + 30, body=req.model_dump())
    outcome = ScoringService.score(_Forged(None), env).outcomes[0]  # type: ignore[arg-type]
    assert not outcome.ok and "bad aligned score" in (outcome.error or "") and outcome.values is None


def test_the_pool_passes_a_workers_numbers_on_unchecked_for_the_service_to_check() -> None:
    planner = Planner(wire=None, frame_size=1 << 20)

    def read(reply: dict[str, Any]) -> CallResult:
        unit = Unit("", "s.S.do_score", 10.0, math.inf, math.inf, None)
        unit.reply, unit.duration = reply, 0.01
        return planner.result(unit)

    assert read({"ok": True, "scores": [1.0, 2.5], "stderr": ""}).scores == [1.0, 2.5]
    assert read({"ok": True, "value": [["h", 1]], "stderr": ""}).scores is None  # the pairs: read the usual way
    forged = read({"ok": True, "scores": "AAAA", "stderr": "x"})  # test_forged_numbers_from_a_worker_fail_the_unit
    assert forged.ok and forged.scores == "AAAA" and forged.stderr == "x"


def test_a_pool_asks_for_aligned_numbers_and_its_worker_sends_them(pools: tuple[PluginPool, PluginPool]) -> None:
    _, new = pools
    calls = [Call("s", "Floats", "do_score", (HOSTS, "vm", {}), 10.0)]
    unit = new._plan.units(calls, time.monotonic(), math.inf, new.aligned_scores)[0]
    assert unit.head.endswith(',"aligned":true')
    runner = Runner(".", 30, 1 << 20, Progress(Progress.create()))
    value = [[h, i * 0.1] for i, h in enumerate(HOSTS)]
    frame = runner._encode_aligned(list(HOSTS), {"ok": True, "value": value, "stderr": "", "t": 0.0})
    sent = json.loads(frame)
    assert "value" not in sent and sent["scores"] == [s for _, s in value]