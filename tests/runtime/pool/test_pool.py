"""PluginPool with real worker processes and real plugin files."""

from __future__ import annotations

import os
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.waiting import wait_until
from vmsched.metrics import REGISTRY
from vmsched.runtime import Call, PluginPool
from vmsched.runtime.types import CallResult, Confinement, Limits

HOSTS = ["h1", "h2", "h3"]
#: These tests are about the pool, not the switch to the plugin user (tests/runtime/worker/test_sandbox.py):
#: as root they keep root (without capabilities, under Landlock and seccomp).
AS_ROOT = Confinement(allow_root=True)


def write_plugin(folder: Path, name: str, source: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


def rewrite_plugin(folder: Path, name: str, source: str) -> None:
    """Replace a plugin and make sure its stat changes even on a coarse clock."""
    path = write_plugin(folder, name, source)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def call(plugin: str, cls: str = "P", method: str = "do_filter", args: tuple[object, ...] = (HOSTS, "vm", {}), timeout: float = 5.0) -> Call:
    return Call(plugin=plugin, cls=cls, method=method, args=args, timeout=timeout)


def restarts(pool: PluginPool, reason: str) -> float:
    value = REGISTRY.get_sample_value("vmsched_plugin_worker_restarts_total", {"pool": pool.name, "reason": reason})
    return value or 0.0


def full(pool: PluginPool) -> bool:
    return pool.idle == pool.max_size


@pytest.fixture
def make_pool(plugins: Path) -> Iterator[Callable[..., PluginPool]]:
    pools: list[PluginPool] = []

    def make(size: int = 2, limits: Limits = Limits(memory_mb=512, cpu_seconds=10, max_output=64 * 1024), **kw: object) -> PluginPool:
        kw.setdefault("confinement", AS_ROOT)
        pool = PluginPool(plugins, size=size, limits=limits, name=f"test-{uuid.uuid4().hex[:8]}", **kw)  # type: ignore[arg-type]
        pool.start()
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def run_one(pool: PluginPool, c: Call) -> CallResult:
    [result] = pool.run([c])
    return result


# --- contracts ------------------------------------------------------------------


def test_old_plugin_prints_its_result(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "old", """
        class P:
            def do_filter(self, hosts, vm, args):
                print([h for h in hosts if h != "h2"])
    """)
    result = run_one(make_pool(), call("old"))
    assert result.ok, result.error
    assert result.value == ["h1", "h3"]
    assert result.error is None and result.duration > 0


def test_new_plugin_returns_its_result_tuples_become_lists(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "new", """
        class P:
            def do_score(self, hosts, vm, args):
                return [(h, i * 1.5) for i, h in enumerate(hosts)]
            def do_balance(self, hosts, args):
                return ("vm-1", tuple(hosts[:1]))
    """)
    pool = make_pool()
    score, balance = pool.run([call("new", method="do_score"), call("new", method="do_balance", args=(HOSTS, {}))])
    assert score.value == [["h1", 0.0], ["h2", 1.5], ["h3", 3.0]]
    assert balance.value == ["vm-1", ["h1"]]


def test_printed_debug_lines_then_result_uses_last_line(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "chatty", """
        class P:
            def do_score(self, hosts, vm, args):
                print("computing scores for", vm)
                print([(h, 0.25) for h in hosts])
    """)
    result = run_one(make_pool(), call("chatty", method="do_score"))
    assert result.ok, result.error
    assert result.value == [[h, 0.25] for h in HOSTS]


def test_arguments_reach_the_plugin(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "echo", """
        class P:
            def do_filter(self, hosts, vm, args):
                return {"hosts": hosts, "vm": vm, "args": args}
    """)
    result = run_one(make_pool(), call("echo", args=(["a"], "vm-7", {"k": "v"})))
    assert result.value == {"hosts": ["a"], "vm": "vm-7", "args": {"k": "v"}}


def test_sibling_module_import(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "_helpers", "def keep(host):\n    return host.endswith('3')\n")
    write_plugin(plugins, "uses_helper", """
        import _helpers
        class P:
            def do_filter(self, hosts, vm, args):
                print([h for h in hosts if _helpers.keep(h)])
    """)
    result = run_one(make_pool(), call("uses_helper"))
    assert result.value == ["h3"]


def test_stderr_is_captured_and_not_an_error(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "noisy", """
        import sys
        class P:
            def do_filter(self, hosts, vm, args):
                sys.stderr.write("warning: host list is short\\n")
                return hosts
    """)
    result = run_one(make_pool(), call("noisy"))
    assert result.ok and result.value == HOSTS
    assert "warning: host list is short" in result.stderr


def test_writing_to_fd_1_cannot_corrupt_the_protocol(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "rawfd", """
        import os
        class P:
            def do_filter(self, hosts, vm, args):
                os.write(1, b"\\x00\\x00\\x00\\x05garbage that is not a frame\\n")
                return hosts[:1]
    """)
    pool = make_pool(size=1)
    assert run_one(pool, call("rawfd")).value == ["h1"]
    assert run_one(pool, call("rawfd")).value == ["h1"]


def test_plugin_changing_directory_does_not_break_later_calls(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "_data", "VALUE = 'from sibling'\n")
    write_plugin(plugins, "wanderer", """
        import os
        class P:
            def do_filter(self, hosts, vm, args):
                os.chdir("/")
                return hosts
        class Reader:
            def do_filter(self, hosts, vm, args):
                import _data
                return [os.getcwd() == os.path.dirname(os.path.abspath(__file__)), _data.VALUE]
    """)
    pool = make_pool(size=1)
    assert run_one(pool, call("wanderer")).ok
    assert run_one(pool, call("wanderer", "Reader")).value == [True, "from sibling"]


# --- failures -----------------------------------------------------------------


def test_exception_reports_type_message_and_plugin_line(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "raiser", """
        class P:
            def do_filter(self, hosts, vm, args):
                x = 1
                raise ValueError("no suitable host")
    """)
    result = run_one(make_pool(), call("raiser"))
    assert not result.ok and not result.timed_out
    assert result.error == "ValueError: no suitable host (raiser.py, line 5, in do_filter)"
    assert "Traceback" in result.stderr


def test_failure_affects_only_its_own_call(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "mixed", """
        class Good:
            def do_filter(self, hosts, vm, args):
                return hosts
        class Bad:
            def do_filter(self, hosts, vm, args):
                return 1 / 0
    """)
    good, bad, good2 = make_pool(size=3).run([call("mixed", "Good"), call("mixed", "Bad"), call("mixed", "Good")])
    assert good.value == HOSTS and good2.value == HOSTS
    assert bad.error is not None and bad.error.startswith("ZeroDivisionError: division by zero")


def test_hanging_plugin_times_out_and_its_worker_is_replaced(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "slow", """
        import os, time
        class P:
            def do_filter(self, hosts, vm, args):
                if args.get("hang"):
                    time.sleep(60)
                return [os.getpid()]
    """)
    pool = make_pool(size=2)
    before = restarts(pool, "timeout")
    hung, fine = pool.run([call("slow", args=(HOSTS, "vm", {"hang": True}), timeout=1.0), call("slow")])
    assert hung.timed_out and not hung.ok
    assert hung.error == "timed out after 1.0 s"
    assert fine.ok
    assert restarts(pool, "timeout") == before + 1
    wait_until(lambda: full(pool))
    pool.bundle_seconds = 0  # each unit on a worker of its own: both workers serve
    pids = {result.value[0] for result in pool.run([call("slow"), call("slow")])}
    assert len(pids) == 2


def test_request_deadline_bounds_the_calls(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "sleepy", """
        import time
        class P:
            def do_filter(self, hosts, vm, args):
                time.sleep(30)
    """)
    result = make_pool().run([call("sleepy", timeout=30)], deadline=time.time() + 0.5)[0]
    assert result.timed_out
    assert result.error is not None and "(request deadline)" in result.error


def test_deadline_already_passed(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "any", "class P:\n    def do_filter(self, h, v, a):\n        return h\n")
    result = make_pool().run([call("any")], deadline=time.time() - 1)[0]
    assert result.timed_out and result.error is not None and "deadline passed" in result.error


def test_os_exit_is_reported_and_the_worker_replaced(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "quitter", """
        import os
        class P:
            def do_filter(self, hosts, vm, args):
                os._exit(3)
    """)
    write_plugin(plugins, "ok", "class P:\n    def do_filter(self, h, v, a):\n        return h\n")
    pool = make_pool(size=1)
    before = restarts(pool, "crash")
    result = run_one(pool, call("quitter"))
    assert not result.ok and not result.timed_out
    assert result.error is not None and "exited with code 3" in result.error
    assert restarts(pool, "crash") == before + 1
    assert run_one(pool, call("ok")).value == HOSTS


def test_segfault_is_reported(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "segv", """
        import ctypes
        class P:
            def do_filter(self, hosts, vm, args):
                ctypes.string_at(0)
    """)
    write_plugin(plugins, "ok", "class P:\n    def do_filter(self, h, v, a):\n        return h\n")
    pool = make_pool(size=1)
    result = run_one(pool, call("segv"))
    assert not result.ok
    assert result.error is not None and "SIGSEGV" in result.error
    assert run_one(pool, call("ok")).ok


def test_sys_exit_is_an_error_unless_a_result_was_printed(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "exits", """
        import sys
        class Fails:
            def do_filter(self, hosts, vm, args):
                sys.exit(2)
        class PrintsThenExits:
            def do_filter(self, hosts, vm, args):
                print(hosts[:2])
                sys.exit(0)
    """)
    fails, prints = make_pool().run([call("exits", "Fails"), call("exits", "PrintsThenExits")])
    assert fails.error == "plugin called sys.exit(2)"
    assert prints.ok and prints.value == ["h1", "h2"]


def test_garbage_output(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "garbage", """
        class P:
            def do_filter(self, hosts, vm, args):
                print("these are not the hosts you are looking for")
        class Silent:
            def do_filter(self, hosts, vm, args):
                pass
    """)
    garbage, silent = make_pool().run([call("garbage"), call("garbage", "Silent")])
    assert garbage.error is not None
    assert garbage.error.startswith("could not parse output as a Python literal: 'these are not")
    assert silent.error == "no result: the method returned None and printed nothing"


def test_result_that_is_not_json(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "setty", """
        class P:
            def do_filter(self, hosts, vm, args):
                return set(hosts)
    """)
    result = run_one(make_pool(), call("setty"))
    assert result.error is not None and result.error.startswith("result is not JSON-serializable")


def test_stdout_flood_fails_the_call(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "flood", """
        class P:
            def do_filter(self, hosts, vm, args):
                while True:
                    print("x" * 1000)
        class Sneaky:
            def do_filter(self, hosts, vm, args):
                for _ in range(1000):
                    try:
                        print("y" * 1000)
                    except BaseException:
                        pass
                return hosts
    """)
    pool = make_pool()
    flood, sneaky = pool.run([call("flood"), call("flood", "Sneaky")])
    assert flood.error == f"stdout exceeded {64 * 1024} bytes"
    assert sneaky.error == f"stdout exceeded {64 * 1024} bytes"
    assert run_one(pool, call("flood", "Sneaky")).error == flood.error  # the workers survived


def test_unknown_class_or_method(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "small", "class P:\n    def do_filter(self, h, v, a):\n        return h\n")
    no_class, no_method, no_file = make_pool(size=3).run(
        [call("small", "Nope"), call("small", method="do_score"), call("missing")]
    )
    assert no_class.error == "plugin small has no class Nope"
    assert no_method.error == "class P in plugin small has no method do_score"
    assert no_file.error is not None and "missing.py not found" in no_file.error


def test_import_errors(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "needs", "import no_such_module_anywhere\n")
    write_plugin(plugins, "syntax", "class P(:\n    pass\n")
    needs, syntax = make_pool().run([call("needs"), call("syntax")])
    assert needs.error is not None
    assert needs.error.startswith("cannot import plugin needs: ModuleNotFoundError: No module named 'no_such_module_anywhere'")
    assert syntax.error is not None and syntax.error.startswith("cannot import plugin syntax: SyntaxError")


def test_memory_error_is_an_exception_of_the_call(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "hog", """
        class P:
            def do_filter(self, hosts, vm, args):
                block = bytearray(1 << 30)
                return hosts
    """)
    pool = make_pool(size=1, limits=Limits(memory_mb=256, cpu_seconds=10, max_output=65536))
    result = run_one(pool, call("hog"))
    assert result.error is not None and result.error.startswith("MemoryError")
    assert run_one(pool, call("hog")).error == result.error  # same worker, still alive


def test_cpu_limit_kills_the_worker(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "spin", """
        class P:
            def do_filter(self, hosts, vm, args):
                while True:
                    pass
    """)
    write_plugin(plugins, "ok", "class P:\n    def do_filter(self, h, v, a):\n        return h\n")
    pool = make_pool(size=1, limits=Limits(memory_mb=512, cpu_seconds=1, max_output=65536))
    result = run_one(pool, call("spin", timeout=20))
    assert result.error == "CPU time limit exceeded (1 s)"
    assert not result.timed_out
    assert run_one(pool, call("ok")).ok


# --- module cache ------------------------------------------------------------------


def test_changed_file_is_imported_again(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "evolving", "class P:\n    def do_filter(self, h, v, a):\n        return ['v1']\n")
    pool = make_pool(size=1)
    assert run_one(pool, call("evolving")).value == ["v1"]
    rewrite_plugin(plugins, "evolving", "class P:\n    def do_filter(self, h, v, a):\n        return ['v2']\n")
    assert run_one(pool, call("evolving")).value == ["v2"]


def test_module_is_imported_once(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "counter", """
        imports = []
        imports.append(1)
        class P:
            def do_filter(self, hosts, vm, args):
                return [len(imports)]
    """)
    pool = make_pool(size=1)
    assert [run_one(pool, call("counter")).value for _ in range(3)] == [[1], [1], [1]]


def test_removed_file(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    path = write_plugin(plugins, "gone", "class P:\n    def do_filter(self, h, v, a):\n        return h\n")
    pool = make_pool(size=1)
    assert run_one(pool, call("gone")).ok
    path.unlink()
    result = run_one(pool, call("gone"))
    assert result.error is not None and result.error.startswith("plugin file gone.py not found")


def test_import_time_output_goes_to_stderr(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "loud", "print('loading loud')\nclass P:\n    def do_filter(self, h, v, a):\n        print(h)\n")
    result = run_one(make_pool(size=1), call("loud"))
    assert result.value == HOSTS
    assert "loading loud" in result.stderr


# --- concurrency and lifecycle -------------------------------------------------------


ECHO = """
    import time
    class P:
        def do_filter(self, hosts, vm, args):
            time.sleep(args.get("sleep", 0))
            return [vm]
"""


def test_more_calls_than_workers(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "echo", ECHO)
    calls = [call("echo", args=(HOSTS, f"vm{i}", {"sleep": 0.05})) for i in range(7)]
    results = make_pool(size=2).run(calls)
    assert [r.value for r in results] == [[f"vm{i}"] for i in range(7)]


def test_concurrent_run_from_threads(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "echo", ECHO)
    pool = make_pool(size=2)
    outcomes: dict[int, list[list[object]]] = {}

    def client(n: int) -> None:
        values = []
        for round_ in range(5):
            calls = [call("echo", args=(HOSTS, f"{n}-{round_}-{i}", {"sleep": 0.005})) for i in range(3)]
            values += [r.value for r in pool.run(calls)]
        outcomes[n] = values

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for n in range(4):
        assert outcomes[n] == [[f"{n}-{r}-{i}"] for r in range(5) for i in range(3)]


def test_waiting_for_a_worker_is_bounded_by_the_deadline(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "echo", ECHO)
    pool = make_pool(size=1)
    busy = threading.Thread(target=pool.run, args=([call("echo", args=(HOSTS, "v", {"sleep": 1}), timeout=5)],))
    busy.start()
    wait_until(lambda: pool.idle == 0)
    result = pool.run([call("echo")], deadline=time.time() + 0.3)[0]
    busy.join()
    assert result.timed_out
    assert result.error is not None and "waiting for a free plugin worker" in result.error


def test_worker_recycled_after_max_calls(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "pid", "import os\nclass P:\n    def do_filter(self, h, v, a):\n        return [os.getpid()]\n")
    pool = make_pool(size=1, max_calls=2)
    before = restarts(pool, "recycle")
    first = [run_one(pool, call("pid")).value[0] for _ in range(2)]
    third = run_one(pool, call("pid")).value[0]
    assert first[0] == first[1] != third
    assert restarts(pool, "recycle") == before + 1


def test_close_is_idempotent_and_fails_later_calls(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "echo", ECHO)
    pool = make_pool()
    pool.close()
    pool.close()
    result = run_one(pool, call("echo"))
    assert result.error == "plugin pool is closed"


def test_run_before_start_raises(plugins: Path) -> None:
    with pytest.raises(RuntimeError):
        PluginPool(plugins).run([call("x")])


def test_warm_then_call(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "echo", ECHO)
    write_plugin(plugins, "broken", "raise RuntimeError('nope')\n")
    pool = make_pool(size=2)
    pool.warm(["echo", "broken", "absent"])
    assert full(pool)
    assert run_one(pool, call("echo")).value == ["vm"]


# --- analysis ---------------------------------------------------------------------------


def test_analyze_lists_units(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    write_plugin(plugins, "other", "class Imported:\n    def do_filter(self, h, v, a):\n        pass\n")
    path = write_plugin(plugins, "multi", '''
        from other import Imported

        class Both:
            properties_validation = "{mem = [0-9]+}"
            def do_filter(self, hosts, vm, args):
                """Keeps hosts with memory.

                More text."""
            def do_score(self, hosts, vm, args):
                pass

        class Balancer:
            def do_balance(self, hosts, args):
                """Moves one VM."""

        class Helper:
            pass
    ''')
    analysis = make_pool().analyze(path)
    assert analysis.error is None
    assert analysis.plugin == "multi"
    got = [(u.name, u.kind, u.description, u.validation) for u in analysis.units]
    assert got == [
        ("Both", "filter", "Keeps hosts with memory.\n\nMore text.", "{mem = [0-9]+}"),
        ("Both", "score", "", "{mem = [0-9]+}"),
        ("Balancer", "balance", "Moves one VM.", ""),
    ]


def test_analyze_broken_module(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    path = write_plugin(plugins, "broken", "import os\nraise RuntimeError('bad config')\n")
    analysis = make_pool().analyze(path)
    assert analysis.units == []
    assert analysis.error == "cannot import plugin broken: RuntimeError: bad config (broken.py, line 2, in <module>)"


def test_analyze_hanging_module(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    path = write_plugin(plugins, "stuck", "import time\ntime.sleep(60)\n")
    write_plugin(plugins, "echo", ECHO)
    pool = make_pool(size=1)
    analysis = pool.analyze(path, timeout=1.0)
    assert analysis.error == "timed out after 1.0 s while importing the module"
    assert run_one(pool, call("echo")).value == ["vm"]


def test_analyze_does_not_import_into_the_caller(plugins: Path, make_pool: Callable[..., PluginPool]) -> None:
    path = write_plugin(plugins, "sideeffect_mod_xyz", "class P:\n    def do_filter(self, h, v, a):\n        pass\n")
    import sys

    assert make_pool().analyze(path).units
    assert "sideeffect_mod_xyz" not in sys.modules


def test_a_pool_with_a_niceness_runs_its_workers_that_much_nicer(plugins: Path, make_pool: Callable[..., PluginPool]):
    write_plugin(plugins, "niceness", """
        import os

        class P:
            def do_filter(self, hosts, vm, args):
                return hosts[:os.nice(0) + 1]
    """)
    hosts = [f"h{i}" for i in range(30)]
    (plain,) = make_pool(size=1).run([call("niceness", args=(hosts, "vm", {}))])
    (nicer,) = make_pool(size=1, limits=Limits(memory_mb=512, cpu_seconds=10, nice=7)).run(
        [call("niceness", args=(hosts, "vm", {}))])
    assert plain.ok and nicer.ok, (plain.error, nicer.error)
    assert len(nicer.value) - len(plain.value) == 7  # type: ignore[arg-type]


def test_a_source_checkout_on_the_path_reaches_the_workers_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a checkout that is not installed, the workers import the same vmsched."""
    import sys

    from tests.support.paths import ROOT
    from vmsched.runtime.pool.process import environment

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or os.curdir) != str(ROOT)])
    assert environment(Confinement())["PYTHONPATH"] == "/elsewhere"
    monkeypatch.setattr(sys, "path", [str(ROOT), *sys.path])
    assert environment(Confinement())["PYTHONPATH"] == f"{ROOT}{os.pathsep}/elsewhere"
