"""The built wheel: no generic top-level packages, and it runs.

The import contracts are checked without a wheel, in the fast tier (tests/deploy/test_import_contracts.py).

The wheel is built into a temporary folder and installed there with
``pip install --no-deps --target``; everything below runs with
``PYTHONPATH=<target>`` from a neutral working directory and ``python -P``, so
the installed copy wins over the source tree and the editable install.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.installed import engine_call, serving
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

HOSTS = [str(uuid.UUID(int=i + 1)) for i in range(3)]


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)])
    assert build.returncode == 0, build.stderr[-3000:]
    (whl,) = out.glob("vmsched-*.whl")
    return whl


@pytest.fixture(scope="module")
def target(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    done = _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder), str(wheel)])
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def neutral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cwd")


def _env(target: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(target), "PYTHONUNBUFFERED": "1"}


def _python(target: Path, cwd: Path, code: str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-P", "-c", code], cwd=cwd, env=_env(target))


def test_wheel_has_no_generic_top_level_packages(wheel: Path, target: Path, neutral: Path) -> None:
    import zipfile

    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.startswith("vmsched")} == set(), tops
    assert not (target / "gateway").exists() and not (target / "services").exists()
    for name in ("gateway", "services"):
        result = _python(target, neutral, f"import {name}")
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, (name, result.stderr)


def test_apps_import_from_the_wheel(target: Path, neutral: Path) -> None:
    code = (
        "import vmsched.gateway.app, vmsched.services.scoring, vmsched.services.policy_agent.agent as a\n"
        "print(vmsched.gateway.app.__file__); print(vmsched.services.scoring.__file__); print(a.__file__)"
    )
    result = _python(target, neutral, code)
    assert result.returncode == 0, result.stderr[-3000:]
    files = result.stdout.split()
    assert len(files) == 3 and all(f.startswith(str(target)) for f in files), files


def test_agent_help_from_the_wheel(target: Path, neutral: Path) -> None:
    result = _run([sys.executable, "-P", "-m", "vmsched.cli", "agent", "--help"], cwd=neutral, env=_env(target))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--host-id" in result.stdout


@pytest.fixture
def wheel_run(target: Path, neutral: Path, tmp_path: Path) -> Iterator[str]:
    with serving([sys.executable, "-P", "-m", "vmsched.cli"], tmp_path, cwd=neutral, env=_env(target)) as url:
        yield url


def test_vmsched_run_from_the_wheel_serves_the_engine(wheel_run: str, target: Path) -> None:
    assert engine_call(wheel_run, "discover")["filters"]["FromInstalled"][0].startswith("Keeps the hosts")
    answer = engine_call(wheel_run, "runFilters", ["FromInstalled"], HOSTS, "", {"target": str(target)})
    assert answer == {"result_code": 0, "result": HOSTS, "plugin_errors": {}, "errors": []}
