"""An adaptive PluginPool (min_size < max_size) with real worker processes: it grows when callers
queue, shrinks after an idle period, and a fixed pool (size=N) stays as it was."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runtime.pool.test_pool import call, make_pool, wait_until, write_plugin  # noqa: F401 (fixture)

from vmsched.metrics import REGISTRY
from vmsched.runtime import PluginPool

SLOW = """
    import inspect, os, time
    WARMED = any(frame.function == "warm" for frame in inspect.stack())  # imported by a warm request
    class P:
        def do_filter(self, hosts, vm, args):
            time.sleep(args.get("sleep", 0))
            return [os.getpid(), WARMED]
"""


def test_starts_at_its_minimum_and_grows_when_callers_queue(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "slow", SLOW)
    pool = make_pool(min_size=1, max_size=3, idle_seconds=3600)
    pool.warm(["slow"])
    assert pool.workers == 1 and pool.idle == 1
    results: list[list[object]] = []

    def request() -> None:
        [result] = pool.run([call("slow", args=(["h"], "vm", {"sleep": 0.5}))])
        assert result.ok, result.error
        results.append(result.value)

    _at_once(request, 3)
    assert len(results) == 3  # every request answered ok (an assert in a thread alone fails no test)
    wait_until(lambda: pool.idle == 3)
    assert pool.workers == 3
    again = pool.run([call("slow", args=(["h"], "vm", {"sleep": 0.3})) for _ in range(3)])
    assert len({r.value[0] for r in again}) == 3  # each slow unit on a worker of its own (learnt), all three workers serve
    assert all(warm for _, warm in results)  # grown workers imported the warm plugins before serving


def test_never_grows_past_its_maximum(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "slow", SLOW)
    pool = make_pool(min_size=1, max_size=2, idle_seconds=3600)
    seen: list[int] = []
    lock = threading.Lock()

    def request() -> None:
        [result] = pool.run([call("slow", args=(["h"], "vm", {"sleep": 0.2}))])
        assert result.ok, result.error
        with lock:
            seen.append(pool.workers)

    _at_once(request, 6)
    assert len(seen) == 6  # every request answered ok (an assert in a thread alone fails no test)
    assert max(seen) <= 2 and pool.workers == 2


def test_shrinks_to_its_minimum_after_the_idle_period(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "slow", SLOW)
    pool = make_pool(min_size=1, max_size=3, idle_seconds=0.5)
    _three_slow_calls_at_once(pool)
    assert pool.workers >= 2 and _gauge(pool) == pool.workers  # the pool's size, as Prometheus reads it
    wait_until(lambda: pool.workers == 1, timeout=10)
    assert _gauge(pool) == 1
    [result] = pool.run([call("slow")])  # the one left serves
    assert result.ok


def test_shrink_stops_only_the_longest_idle_above_the_minimum(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "slow", SLOW)
    pool = make_pool(min_size=2, max_size=3, idle_seconds=3600)
    _three_slow_calls_at_once(pool)
    wait_until(lambda: pool.idle == 3)
    assert pool.shrink(time.monotonic()) == 0  # none idle long enough
    assert pool.shrink(time.monotonic() + 3600) == 1  # all are, but two is the minimum
    assert pool.workers == 2 and pool.idle == 2


def test_a_fixed_pool_starts_all_and_never_shrinks(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "slow", SLOW)
    pool = make_pool(size=3, idle_seconds=0.1)
    assert pool.min_size == pool.max_size == pool.workers == 3
    time.sleep(0.3)
    assert pool.shrink(time.monotonic() + 3600) == 0 and pool.workers == 3


def test_bounds_are_checked(plugins: Path) -> None:
    with pytest.raises(ValueError):
        PluginPool(plugins, min_size=3, max_size=2)
    with pytest.raises(ValueError):
        PluginPool(plugins, min_size=0, max_size=2)


def test_the_maximum_holds_while_a_crashed_worker_is_replaced(plugins: Path,
                                                             make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "crash", """
        import os, time
        class P:
            def do_filter(self, hosts, vm, args):
                if args.get("exit"):
                    os._exit(3)
                return [os.getpid()]
    """)
    pool = make_pool(min_size=1, max_size=1, idle_seconds=3600)
    for _ in range(3):
        crash = threading.Thread(target=pool.run, args=([call("crash", args=(["h"], "vm", {"exit": True}))],))
        crash.start()
        time.sleep(0.02)  # the worker died; the next request waits (past GROW_AFTER) while its successor starts
        [result] = pool.run([call("crash")])
        crash.join()
        assert result.ok, result.error
        wait_until(lambda: pool.idle == 1)
        time.sleep(0.3)  # a worker started past the maximum would be idle by now
        assert pool.workers == 1 and pool.idle == 1


def _gauge(pool: PluginPool) -> float | None:
    return REGISTRY.get_sample_value("vmsched_plugin_workers", {"pool": pool.name})


def _at_once(request: Callable[[], object], callers: int) -> None:
    """``callers`` threads call ``request`` at the same time; returns when all are done."""
    threads = [threading.Thread(target=request) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _three_slow_calls_at_once(pool: PluginPool) -> None:
    """Three callers, each holding a worker for 0.3 s: a pool of fewer than three grows (up to its maximum)."""
    _at_once(lambda: pool.run([call("slow", args=(["h"], "vm", {"sleep": 0.3}))]), 3)
