"""--plugins DIR replaces the stock units; --stock-plugins keeps them beside DIR's, end to end through the engine's
XML-RPC; a module name in both folders is an error that plugin check and the load log show."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.stack import Proc, Stack
from vmsched.config import stock_plugins_dir

H = ["aaaaaaaa-0000-0000-0000-000000000001", "aaaaaaaa-0000-0000-0000-000000000002"]
VM = "11111111-2222-3333-4444-555555555555"

MINE = '''
from _mine_util import first_only


class KeepFirst:
    def do_filter(self, hosts, vm, args):
        """Keep the first host only."""
        return first_only(hosts)
'''


def my_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "keep_first.py").write_text(textwrap.dedent(MINE))
    (folder / "_mine_util.py").write_text("def first_only(hosts):\n    return hosts[:1]\n")
    return folder


def started(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[Stack, Proc]:
    port = free_port()
    proc = Proc(["run", "--port", str(port), "--pool-size", "1", *args], tmp_path / f"run-{port}.log",
                env=env or {}).start()
    stack = Stack(port, Path(args[1]), [proc])
    try:
        stack.wait_ready()
    except BaseException:
        stack.stop()
        raise
    return stack, proc


def test_stock_plugins_beside_yours(tmp_path: Path):
    folder = my_folder(tmp_path)
    stack, _ = started(tmp_path, "--plugins", str(folder))
    try:
        assert stack.xmlrpc("discover")["filters"].keys() == {"KeepFirst"}  # a folder replaces the stock units
    finally:
        stack.stop()
    stack, proc = started(tmp_path, "--plugins", str(folder), env={"VMSCHED_STOCK_PLUGINS": "true"})
    try:
        found = stack.xmlrpc("discover")
        assert {"KeepFirst", "HostAllowDeny", "vmsched_Memory"} <= found["filters"].keys()
        assert {"PreferredHosts", "vmsched_CpuEvenDistribution"} <= found["scores"].keys()
        assert "DrainHosts" in found["balance"]
        # each unit imports its own folder's helper: yours _mine_util, the stock ones _vmsched_util
        assert stack.xmlrpc("runFilters", ["KeepFirst"], H, VM, {})["result"] == H[:1]
        assert stack.xmlrpc("runFilters", ["HostAllowDeny"], H, VM, {"denied_hosts": H[0]})["result"] == H[1:]
        assert f"plugins {folder} and {stock_plugins_dir()}" in proc.output()
    finally:
        stack.stop()


def plugin_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", "plugin", "check", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=os.environ)


def test_a_name_in_both_folders_is_an_error_the_admin_sees(tmp_path: Path):
    folder = my_folder(tmp_path)
    for name in ("_vmsched_util.py", "drain_hosts.py"):  # stock files copied in, as to keep them once
        shutil.copy(stock_plugins_dir() / name, folder / name)
    assert plugin_check(str(folder)).returncode == 0  # alone, the folder is fine
    done = plugin_check(str(folder), "--stock-plugins")
    assert done.returncode == 1, done.stdout
    stock = stock_plugins_dir()
    assert (f"ERROR _vmsched_util: _vmsched_util is in {folder} and in {stock}: `import _vmsched_util` finds the "
            f"one in {folder} for the plugins of both folders; rename one") in done.stdout
    assert (f"ERROR drain_hosts: drain_hosts.py is in {stock} and in {folder}, which comes first: a module name "
            "must be unique across the plugin folders, so the later one is not loaded; rename one") in done.stdout
    port = free_port()
    proc = Proc(["run", "--port", str(port), "--pool-size", "1", "--plugins", str(folder), "--stock-plugins"],
                tmp_path / "clash.log").start()
    stack = Stack(port, folder, [proc])
    try:
        stack.wait_ready()
        errors = {e["plugin"]: e["error"] for e in stack.get("/v1/units").json()["load_errors"]}
        assert {"_vmsched_util", "drain_hosts"} <= errors.keys()
    finally:
        stack.stop()
    assert f"ERROR vmsched.plugins: plugin _vmsched_util: _vmsched_util is in {folder} and in {stock}" in proc.output()
