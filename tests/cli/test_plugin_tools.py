"""``vmsched plugin check`` / ``vmsched plugin run`` and ``scripts/run --plugins``, run as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import xmlrpc.client
from pathlib import Path

import pytest

from tests.support.net import free_port
from tests.support.paths import ROOT, TEST_PLUGINS

H1, H2, H3 = (f"aaaaaaaa-0000-0000-0000-00000000000{i}" for i in range(1, 4))

GOOD = '''
from vmsched.plugin import facts


class FewestGuests:
    """Fewer running guests is better (a class docstring, as the old samples have)."""

    properties_validation = "flag=;n=[0-9]+"

    def do_score(self, hosts, vm, args):
        return [(h, facts.host(h).guests_running) for h in hosts if facts.host(h)]


class EnoughMemory:
    def do_filter(self, hosts, vm, args):
        """Hosts with at least min_mib of free memory."""
        need = int(args.get("min_mib", "0"))
        return [h for h in hosts if facts.host(h) and facts.host(h).memory_free_mib >= need]
'''


def vmsched(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", "plugin", *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=120)


def good_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "mine.py").write_text(textwrap.dedent(GOOD))
    return folder


def test_check_lists_units_with_description_and_validation(tmp_path: Path):
    folder = good_folder(tmp_path)
    done = vmsched("check", str(folder))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "score    FewestGuests  (mine.py)" in done.stdout
    assert "Fewer running guests is better (a class docstring" in done.stdout  # class docstring fallback
    assert "Hosts with at least min_mib of free memory." in done.stdout
    assert "'flag=;n=[0-9]+'" in done.stdout  # an empty regex is kept and advertised
    assert done.stdout.rstrip().endswith("2 units, 0 errors")
    as_json = json.loads(vmsched("check", "--json", str(folder / "mine.py")).stdout)
    assert as_json["ok"] is True and {u["name"] for u in as_json["units"]} == {"FewestGuests", "EnoughMemory"}


def test_check_fails_on_any_error(tmp_path: Path):
    done = vmsched("check", str(TEST_PLUGINS))
    assert done.returncode == 1
    assert "ERROR broken_import: cannot import plugin broken_import: ModuleNotFoundError" in done.stdout
    assert "ERROR: invalid properties_validation" in done.stdout  # BadValidation
    (tmp_path / "empty.py").write_text("x = 1\n")
    done = vmsched("check", str(tmp_path / "empty.py"))
    assert done.returncode == 1 and "ERROR empty: empty.py defines no unit: define a class with do_filter" in done.stdout
    (tmp_path / "syntax.py").write_text("class X(:\n")
    done = vmsched("check", str(tmp_path / "syntax.py"))
    assert done.returncode == 1 and "SyntaxError" in done.stdout
    done = vmsched("check", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "no such plugin file or folder" in done.stderr


FUNCTIONS_ONLY = '''
def do_filter(hosts, vm, args):
    """A filter written as a module-level function: not a unit (the old proxy loads classes only)."""
    return hosts
'''


def test_a_plugin_file_without_a_class_is_an_error_beside_valid_units(tmp_path: Path):
    folder = good_folder(tmp_path)
    (folder / "loose.py").write_text(FUNCTIONS_ONLY)
    done = vmsched("check", str(folder))
    assert done.returncode == 1, done.stdout
    assert ("ERROR loose: loose.py defines no unit: define a class with do_filter, do_score or do_balance "
            "(module-level functions are not units)") in done.stdout
    assert "score    FewestGuests  (mine.py)" in done.stdout  # the valid units are still listed
    as_json = json.loads(vmsched("check", "--json", str(folder)).stdout)
    assert as_json["ok"] is False and [e["plugin"] for e in as_json["errors"]] == ["loose"]
    empty = tmp_path / "empty"
    empty.mkdir()
    done = vmsched("check", str(empty))
    assert done.returncode == 1 and f"ERROR {empty}: no plugin file (NAME.py) here" in done.stdout


def test_the_services_warn_of_a_plugin_file_without_a_class(tmp_path: Path):
    folder = good_folder(tmp_path)
    (folder / "loose.py").write_text(FUNCTIONS_ONLY)
    port = free_port()
    log = tmp_path / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "vmsched.cli", "run", "--plugins", str(folder),
                                 "--port", str(port), "--metrics-port", "0", "--pool-size", "1"],
                                cwd=ROOT, stdout=out, stderr=out, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "all-in-one on" not in log.read_text() and proc.poll() is None:
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    text = log.read_text()
    assert "all-in-one on" in text, text
    assert ("WARNING vmsched.plugins: plugin loose.py defines no unit: define a class with do_filter, do_score or "
            "do_balance") in text
    assert "loose loaded" not in text


def test_the_stock_units_pass_and_describe_themselves_in_one_line():
    """The description is what the engine shows: one line, no reference to the source."""
    done = vmsched("check", "--json", str(ROOT / "plugins"))
    assert done.returncode == 0, done.stdout
    units = json.loads(done.stdout)["units"]
    assert len(units) == 20  # every kind of every stock unit
    for unit in units:
        text = unit["description"]
        assert text and "\n" not in text and "module" not in text and len(text) <= 200, (unit["name"], text)


def test_run_one_unit_with_facts_from_yaml_or_json(tmp_path: Path):
    folder = good_folder(tmp_path)
    facts = {"hosts": {H1: {"guests_running": 4, "memory_free_mib": 1000},
                       H2: {"guests_running": 1, "memory_free_mib": 8000}}}
    (tmp_path / "facts.json").write_text(json.dumps(facts))
    (tmp_path / "facts.yaml").write_text(f"hosts:\n  {H1}: {{guests_running: 4, memory_free_mib: 1000}}\n"
                                         f"  {H2}: {{guests_running: 1, memory_free_mib: 8000}}\n")
    for name in ("facts.json", "facts.yaml"):
        done = vmsched("run", "FewestGuests", "--plugins", "plugins", "--facts", name, cwd=tmp_path)  # relative paths
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [[H1, 4], [H2, 1]]
    done = vmsched("run", "EnoughMemory", "--plugins", str(folder), "--facts", str(tmp_path / "facts.yaml"),
                   "--hosts", f"{H1},{H2},{H3}", "--vm", H3, "--prop", "min_mib=2000")
    assert done.returncode == 0 and json.loads(done.stdout) == [H2]


def test_run_gives_a_unit_the_numbers_a_service_gives_it(tmp_path: Path):
    """Lists of floats reach a unit exactly, as in production (tests/facts/test_wire.py): no rounding."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "busy.py").write_text(textwrap.dedent('''
        from vmsched.plugin import facts

        class Busiest:
            def do_score(self, hosts, vm, args):
                return [(h, facts.host(h).pcpu_pct[0] + facts.host(h).cpu_history[-1]) for h in hosts]
    '''))
    (tmp_path / "facts.json").write_text(json.dumps({"hosts": {H1: {"pcpu_pct": [12.345678], "cpu_history": [1 / 3]}}}))
    done = vmsched("run", "Busiest", "--plugins", str(folder), "--facts", str(tmp_path / "facts.json"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[H1, 12.345678 + 1 / 3]]


def test_run_reports_failures_like_the_service():
    done = vmsched("run", "WrongShape", "--plugins", str(TEST_PLUGINS), "--hosts", H1)
    assert done.returncode == 1 and "expected a list of (host, score) pairs" in done.stderr
    done = vmsched("run", "Raises", "--plugins", str(TEST_PLUGINS), "--hosts", H1)
    assert done.returncode == 1 and "ValueError" in done.stderr
    done = vmsched("run", "NoSuchUnit", "--plugins", str(TEST_PLUGINS), "--hosts", H1)
    assert done.returncode == 2 and "not found" in done.stderr and "KeepEven (filter)" in done.stderr
    done = vmsched("run", "KeepEven", "--plugins", str(TEST_PLUGINS), "--hosts", H1, "--prop", "novalue")
    assert done.returncode == 2 and "expected KEY=VALUE" in done.stderr


def test_scripts_run_plugins_file_is_refused(tmp_path: Path):
    (tmp_path / "p.py").write_text(GOOD)
    done = subprocess.run([str(ROOT / "scripts" / "run"), "--plugins", "p.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "is a file; it must be the folder" in done.stderr


def test_scripts_run_relative_plugins_from_the_callers_directory(tmp_path: Path):
    good_folder(tmp_path)
    port = free_port()
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen([str(ROOT / "scripts" / "run"), "--plugins", "plugins", "--port", str(port),
                             "--metrics-port", str(free_port())], cwd=tmp_path, stdout=log, stderr=log,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        proxy = xmlrpc.client.ServerProxy(f"http://127.0.0.1:{port}/")
        found = None
        deadline = time.monotonic() + 180  # scripts/run may first (re)install vmsched into .venv: slow on a busy machine
        while time.monotonic() < deadline:
            try:
                found = proxy.discover()
                if found["scores"]:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "run.log").read_text()
            time.sleep(0.1)
        assert found is not None and set(found["scores"]) == {"FewestGuests"}, (tmp_path / "run.log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_the_ported_samples_in_the_docs_run(tmp_path: Path):
    text = (ROOT / "docs" / "plugins.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    ported = [b for b in blocks if b.startswith("# after\n")]
    assert len(ported) == 2
    folder = tmp_path / "plugins"
    folder.mkdir()
    for i, block in enumerate(ported):
        (folder / f"ported{i}.py").write_text(block)
    check = vmsched("check", str(folder))
    assert check.returncode == 0 and "filter   max_vms" in check.stdout and "score    even_vm_distribution" in check.stdout
    (tmp_path / "facts.yaml").write_text(f"hosts:\n  {H1}: {{guests_running: 100}}\n  {H2}: {{guests_running: 3}}\n")
    done = vmsched("run", "max_vms", "--plugins", str(folder), "--facts", str(tmp_path / "facts.yaml"),
                   "--hosts", f"{H1},{H2},{H3}")
    assert done.returncode == 0 and json.loads(done.stdout) == [H2, H3]
    done = vmsched("run", "even_vm_distribution", "--plugins", str(folder), "--facts", str(tmp_path / "facts.yaml"))
    assert done.returncode == 0 and json.loads(done.stdout) == [[H1, 100], [H2, 3]]


def test_check_as_root_uses_the_services_confinement(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("the switch to the plugin user happens only when vmsched runs as root")
    folder = good_folder(tmp_path)
    folder.chmod(0o755)
    done = subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", "plugin", "check", str(folder)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "VMSCHED_ALLOW_ROOT_PLUGINS": "false"})
    assert "Traceback" not in done.stderr
    if done.returncode == 2:  # nobody cannot read this Python (one under /root): refused as the services refuse
        assert "sandbox: the service runs as root and cannot switch plugin workers to user" in done.stderr
    else:  # the switch worked: the plugins were loaded as the plugin user
        assert done.returncode == 0 and "2 units, 0 errors" in done.stdout, done.stdout + done.stderr


def _hook(values: dict) -> dict | None:
    """The chart's `helm test` pod that checks the plugins folder, or None (rendered by the real Helm engine)."""
    pytest.importorskip("helm_python", reason="helm-python-sdk is installed by scripts/bootstrap --test")
    from tests.deploy.test_chart import CHART, render

    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        docs = render(chart, values)
    pods = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"].endswith("-test-plugins")]
    assert len(pods) <= 1
    return {"pod": pods[0], "configmaps": [d for d in docs if d["kind"] == "ConfigMap"]} if pods else None


@pytest.mark.parametrize("broken", [False, True])
def test_helm_test_hook_runs_plugin_check_on_the_plugins_folder(tmp_path: Path, broken: bool):
    files = {"mine.py": textwrap.dedent(GOOD)}
    if broken:
        files["broken.py"] = "import not_installed_anywhere\n"
    hook = _hook({"plugins": {"files": files, "mountPath": "/srv/plugins"}})
    assert hook is not None
    pod = hook["pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "plugins")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "plugins")
    (configmap,) = hook["configmaps"]
    assert mount == {"name": "plugins", "mountPath": "/srv/plugins", "readOnly": True}
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert container["args"] == ["plugin", "check", "/srv/plugins"]
    # run the hook's command as the image's entrypoint (vmsched) would, on the ConfigMap's files
    folder = tmp_path / "srv-plugins"
    folder.mkdir()
    for name, text in configmap["data"].items():
        (folder / name).write_text(text)
    env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]}}
    args = [folder.as_posix() if a == mount["mountPath"] else a for a in container["args"]]
    done = subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    if broken:
        assert done.returncode != 0 and "broken.py" in done.stdout + done.stderr
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "FewestGuests" in done.stdout


def test_no_plugin_check_hook_without_a_plugins_folder():
    assert _hook({}) is None  # the image's stock plugins are checked by the project's own tests
