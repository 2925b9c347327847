"""The units of one request on one worker, one frame each way (vmsched.runtime.pool.planning), with real workers."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.runtime.pool.test_pool import HOSTS, call, make_pool, restarts, write_plugin  # noqa: F401 (fixture)

from vmsched.runtime import PluginPool

UNITS = """
    import os, sys, time
    class Pid:
        def do_filter(self, hosts, vm, args):
            return [os.getpid()]
    class Printer:
        def do_filter(self, hosts, vm, args):
            sys.stderr.write("note from Printer\\n")
            print(hosts[:1])
    class Hang:
        def do_filter(self, hosts, vm, args):
            time.sleep(60)
    class Exit:
        def do_filter(self, hosts, vm, args):
            os._exit(3)
    class Mutate:
        def do_filter(self, hosts, vm, args):
            hosts.append("added")
            return hosts
    class Bad:
        def do_filter(self, hosts, vm, args):
            return {1, 2}
"""


def test_cheap_units_of_a_request_share_one_worker(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "u", UNITS)
    pool = make_pool(size=3)
    results = pool.run([call("u", "Pid"), call("u", "Pid"), call("u", "Pid")])
    assert len({r.value[0] for r in results}) == 1
    pool.bundle_seconds = 0
    results = pool.run([call("u", "Pid"), call("u", "Pid"), call("u", "Pid")])
    assert len({r.value[0] for r in results}) == 3


def test_each_unit_keeps_its_outcome_and_output(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "u", UNITS)
    shared = (HOSTS, "vm", {})
    mutate, printer, bad, mutate2 = make_pool(size=1).run(
        [call("u", "Mutate", args=shared), call("u", "Printer", args=shared), call("u", "Bad", args=shared),
         call("u", "Mutate", args=shared)])
    assert mutate.value == HOSTS + ["added"] and mutate2.value == HOSTS + ["added"]  # each unit its own arguments
    assert printer.ok and printer.value == HOSTS[:1] and printer.stderr == "note from Printer\n"
    assert not bad.ok and bad.error is not None and "not JSON-serializable" in bad.error
    assert mutate.stderr == ""


def test_a_hanging_unit_times_out_alone(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "u", UNITS)
    pool = make_pool(size=2)
    before = restarts(pool, "timeout")
    first, hung, last = pool.run([call("u", "Pid"), call("u", "Hang", timeout=0.5), call("u", "Pid", timeout=2.0)])
    assert hung.timed_out and hung.error == "timed out after 0.5 s"
    assert first.ok and last.ok  # the first one ran again, the last one had not run: both elsewhere
    assert restarts(pool, "timeout") == before + 1


def test_the_unit_budget_counts_from_its_own_start(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "w", """
        import time
        class Slow:
            def do_filter(self, hosts, vm, args):
                time.sleep(0.4)
                return hosts
    """)
    pool = make_pool(size=1)
    started = time.monotonic()
    results = pool.run([call("w", "Slow", timeout=0.7), call("w", "Slow", timeout=0.7)])
    assert all(r.ok for r in results), results  # 0.8 s together on one worker, each within its 0.7 s
    assert time.monotonic() - started >= 0.8


def test_a_crash_is_the_error_of_the_unit_that_crashed(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "u", UNITS)
    pool = make_pool(size=2)
    before = restarts(pool, "crash")
    first, crashed, last = pool.run([call("u", "Pid"), call("u", "Exit"), call("u", "Pid")])
    assert not crashed.ok and crashed.error is not None and "exited with code 3" in crashed.error
    assert first.ok and last.ok
    assert restarts(pool, "crash") == before + 1


def test_request_deadline_fails_the_units_not_run(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "u", UNITS)
    pool = make_pool(size=1)
    hung, after = pool.run([call("u", "Hang", timeout=30), call("u", "Pid", timeout=30)], deadline=time.time() + 0.5)
    assert hung.timed_out and hung.error is not None and "(request deadline)" in hung.error
    assert after.timed_out and after.error is not None and "request deadline has passed" in after.error


def test_units_of_a_bundle_all_see_the_host_facts(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    from tests.facts.test_wire import PROBE, expected, fill
    from vmsched.facts.cache import FactsCache
    from vmsched.runtime import Call

    (plugins / "probe.py").write_text(PROBE)
    pool = make_pool(size=1)
    cache = FactsCache("bundle-facts")
    hosts = [f"hv{i}" for i in range(4)]
    fill(cache, 1, hosts, memory_free_mib=100)
    for seq in range(2, 5):  # the first frame carries every host, the later ones what changed
        facts = cache.prepared(hosts + ["nope"])
        args = (hosts, "", {})
        results = pool.run([Call("probe", "Probe", "do_filter", args, 10.0, facts) for _ in range(3)])
        for result in results:
            assert result.ok, result.error
            assert result.value["seen"] == expected(cache, hosts) and "nope" in result.value["missing"], seq
        assert len({r.value["pid"] for r in results}) == 1
        fill(cache, seq, hosts[:2], memory_free_mib=100 + seq)


def test_answers_decode_as_the_standard_library_wrote_them(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    """The service reads replies with orjson; what orjson reads otherwise (integers past 64 bits, NaN,
    Infinity, lone surrogates) still arrives exactly as the plugin returned it."""
    import math

    write_plugin(plugins, "n", """
        class Big:
            def do_score(self, hosts, vm, args):
                return [(hosts[0], 10 ** 30), (hosts[1], -(2 ** 63) - 1), (hosts[2], 2 ** 64 - 1)]
        class Odd:
            def do_score(self, hosts, vm, args):
                return [(hosts[0], float("nan")), (hosts[1], float("inf")), (hosts[2], "\\ud800")]
    """)
    big, odd = make_pool(size=1).run([call("n", "Big", "do_score"), call("n", "Odd", "do_score")])
    assert big.value == [["h1", 10 ** 30], ["h2", -(2 ** 63) - 1], ["h3", 2 ** 64 - 1]]
    assert all(type(v) is int for _, v in big.value)
    assert math.isnan(odd.value[0][1]) and odd.value[1][1] == math.inf and odd.value[2][1] == "\ud800"


def test_units_with_and_without_facts_share_a_frame(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    from tests.facts.test_wire import PROBE, expected, fill
    from vmsched.facts.cache import FactsCache
    from vmsched.runtime import Call

    (plugins / "probe.py").write_text(PROBE)
    write_plugin(plugins, "u", UNITS)
    pool = make_pool(size=1)
    cache = FactsCache("bundle-mixed")
    hosts = [f"hv{i}" for i in range(3)]
    fill(cache, 1, hosts, memory_free_mib=100)
    for seq in range(2, 4):
        facts = cache.prepared(hosts)
        args = (hosts, "", {})
        first, plain, last = pool.run([Call("probe", "Probe", "do_filter", args, 10.0, facts),
                                       Call("u", "Pid", "do_filter", args, 10.0),
                                       Call("probe", "Probe", "do_filter", args, 10.0, facts)])
        assert plain.ok and plain.value == [first.value["pid"]]  # one frame, one worker
        for result in (first, last):
            assert result.ok, result.error
            assert result.value["seen"] == expected(cache, hosts), seq
        fill(cache, seq, hosts[:1], memory_free_mib=100 + seq)


def test_a_run_time_leaves_the_frame_to_the_fast_reader(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A unit's run time of 0.1-1 ms is written as 0.000123456789000..., a run of 19 digits or more after the
    point: it is no long integer, and the frame goes to the pool's fast reader."""
    import itertools
    import json

    from vmsched.runtime.protocol import HEADER, LONG_NUMBERS, Progress
    from vmsched.runtime.worker import main as worker_main

    (tmp_path / "quick_unit.py").write_text("class Quick:\n    def do_filter(self, hosts, vm, args):\n        return hosts\n")
    ticks = itertools.count()
    monkeypatch.setattr(worker_main.time, "monotonic", lambda: 100.0 + next(ticks) * 0.000123456789)  # each read
    monkeypatch.setattr(worker_main.children, "kill_all", lambda: None)  # not this test process's children
    monkeypatch.setattr(worker_main.Runner, "_arm_cpu_limit", lambda self: None)  # nor its CPU limit
    runner = worker_main.Runner(str(tmp_path), 30, 1 << 20, Progress(Progress.create()))
    call = {"plugin": "quick_unit", "cls": "Quick", "method": "do_filter", "args": [["h1", "h2"], "vm", {}]}
    body = runner.handle({"op": "batch", "calls": [call, call]})[HEADER.size:]
    assert not body.endswith(LONG_NUMBERS), body
    replies = json.loads(body)["replies"]
    assert [r["value"] for r in replies] == [["h1", "h2"]] * 2
    assert all(len(repr(r["t"]).split(".")[1]) >= 19 for r in replies), replies  # the long fractions above


def test_only_integers_of_19_digits_or_more_mark_a_frame() -> None:
    """The stdlib reader is for integers orjson would read as floats; a float's long fraction is not one."""
    from vmsched.runtime.protocol import HEADER, LONG_NUMBERS, reply_frame

    def marked(body: bytes) -> bool:
        return reply_frame(body)[HEADER.size:].endswith(LONG_NUMBERS)

    for big in (b"1000000000000000000", b"-9223372036854775809", b"18446744073709551615", b"10" * 20):
        assert marked(b'{"value":' + big + b"}") and marked(b'{"value":[1,' + big + b"]}"), big
    for plain in (b"0.00012345678901234567", b"[0.000123456789012345678,2.5e-07]", b"999999999999999999",
                  b"9999999999999998.0", b"1e+19", b'"abc.1234567890123456789"'):
        assert not marked(b'{"value":' + plain + b"}"), plain
