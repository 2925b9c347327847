"""The release: an sdist and a wheel that `twine check` accepts, the same wheel from either, and that wheel
installed into a fresh virtualenv with constraints.txt, answering the engine.

Both are built with ``python -m build`` from a copy of the repository's files (those git lists: tracked and
new, not ignored), so a build here never races another build in the source tree and sees no local build
output. The builds fetch setuptools and the virtualenv vmsched's dependencies from the package sources pip is
configured with, as scripts/bootstrap does: slow tier.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import uuid
import zipfile
from pathlib import Path
from typing import Iterator

import pytest
from packaging.utils import canonicalize_name

from tests.support.installed import engine_call, serving
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]
HOSTS = [str(uuid.UUID(int=i + 1)) for i in range(3)]
#: Source folders and where the wheel puts their files (pyproject.toml: package-dir, data-files).
INSTALLED_AS = {"vmsched/": "vmsched/", "gateway/": "vmsched/gateway/", "services/": "vmsched/services/",
                "plugins/": f"vmsched-{VERSION}.data/data/share/vmsched/plugins/"}
#: What the sdist holds besides the source folders (MANIFEST.in; setuptools adds README.md and pyproject.toml).
SDIST_EXTRAS = {"LICENSE", "README.md", "pyproject.toml", "MANIFEST.in", "CHANGELOG.md", "constraints.txt"}


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # scripts/test-wheel sets it
    return subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)  # type: ignore[call-overload]


def _repository_files() -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: git lists the repository's files to build from")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    return sorted(f for f in listed if f and (ROOT / f).is_file())  # a deleted file stays listed until staged


def _copy(files: list[str], to: Path) -> Path:
    for name in files:
        (to / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, to / name)
    return to


def _build(source: Path, out: Path, *args: str) -> None:
    done = _run([sys.executable, "-m", "build", "--outdir", str(out), *args, str(source)])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _wheel_contents(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {name: z.read(name) for name in z.namelist()}


@pytest.fixture(scope="module")
def files() -> list[str]:
    return _repository_files()


@pytest.fixture(scope="module")
def release(files: list[str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist, and the wheel built from it: what `python -m build` gives."""
    out = tmp_path_factory.mktemp("dist")
    _build(_copy(files, tmp_path_factory.mktemp("src")), out)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def test_both_are_named_for_the_version(release: tuple[Path, Path]) -> None:
    sdist, wheel = release
    assert sdist.name == f"vmsched-{VERSION}.tar.gz"
    assert wheel.name == f"vmsched-{VERSION}-py3-none-any.whl"


def test_twine_accepts_the_sdist_and_the_wheel(release: tuple[Path, Path]) -> None:
    done = _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, release)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_sdist_builds_the_wheel_the_sources_build(
        release: tuple[Path, Path], files: list[str], tmp_path: Path) -> None:
    out = tmp_path / "dist"
    _build(_copy(files, tmp_path / "src"), out, "--wheel")
    (direct,) = out.glob("*.whl")
    from_sdist, from_sources = _wheel_contents(release[1]), _wheel_contents(direct)
    assert sorted(from_sdist) == sorted(from_sources)
    assert [n for n in from_sdist if from_sdist[n] != from_sources[n]] == []


def _sources(files: list[str]) -> list[str]:
    return [f for f in files if f.startswith(tuple(INSTALLED_AS))]


def test_the_wheel_holds_every_source_file_and_nothing_else(release: tuple[Path, Path], files: list[str]) -> None:
    expected = set()
    for name in _sources(files):
        folder = next(f for f in INSTALLED_AS if name.startswith(f))
        expected.add(INSTALLED_AS[folder] + name.removeprefix(folder))
    names = set(_wheel_contents(release[1]))
    metadata = {n for n in names if n.startswith(f"vmsched-{VERSION}.dist-info/")}
    assert sorted(expected - names) == [], "in the repository, not in the wheel"
    assert sorted(names - expected - metadata) == [], "in the wheel, not in the repository"


def test_the_sdist_holds_the_sources_the_changelog_and_the_pins(
        release: tuple[Path, Path], files: list[str]) -> None:
    top = f"vmsched-{VERSION}/"
    with tarfile.open(release[0]) as t:
        names = {m.name.removeprefix(top) for m in t.getmembers() if m.isfile()}
    generated = {n for n in names if n in {"PKG-INFO", "setup.cfg"} or n.startswith("vmsched.egg-info/")}
    assert "PKG-INFO" in generated
    assert sorted(names - generated) == sorted({*_sources(files), *SDIST_EXTRAS})


# --- the wheel in a fresh virtualenv ---------------------------------------------------------
@pytest.fixture(scope="module")
def venv(release: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("venv")
    made = _run([sys.executable, "-m", "venv", str(folder)])
    assert made.returncode == 0, made.stderr[-3000:]
    done = _run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q",
                 "-c", str(ROOT / "constraints.txt"), str(release[1])])
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def test_the_venv_holds_the_pinned_versions(venv: Path) -> None:
    frozen = _run([str(venv / "bin" / "python"), "-m", "pip", "freeze"]).stdout.splitlines()
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if name:
            pins[canonicalize_name(name)] = version
    installed = {}
    for line in frozen:
        if line.startswith("vmsched @ "):  # the wheel itself
            assert line.endswith(f"/vmsched-{VERSION}-py3-none-any.whl"), line
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line)
        assert m, line
        installed[canonicalize_name(m.group(1))] = m.group(2)
    assert {n: v for n, v in installed.items() if pins.get(n) != v} == {}, "installed, not as constraints.txt pins"
    direct = {canonicalize_name(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in PROJECT["dependencies"]}
    assert sorted(direct - set(installed)) == []


def test_the_venv_command_runs(venv: Path, tmp_path: Path) -> None:
    version = _run([str(venv / "bin" / "vmsched"), "--version"], cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"vmsched {VERSION}", version
    usage = _run([str(venv / "bin" / "vmsched"), "--help"], cwd=tmp_path)
    assert usage.returncode == 0, usage.stderr[-3000:]
    for command in ("run", "gateway", "scoring", "agent", "replay", "token"):
        assert re.search(rf"^\s+{command}\b", usage.stdout, re.M), (command, usage.stdout)


@pytest.fixture
def venv_run(venv: Path, tmp_path: Path) -> Iterator[str]:
    neutral = tmp_path / "cwd"
    neutral.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with serving([str(venv / "bin" / "vmsched")], tmp_path, cwd=neutral, env=env,
                 options=("--stock-plugins",)) as url:
        yield url


def test_vmsched_run_from_the_venv_serves_the_engine(venv_run: str, venv: Path) -> None:
    filters = engine_call(venv_run, "discover")["filters"]
    assert filters["FromInstalled"][0].startswith("Keeps the hosts")
    assert "vmsched_Memory" in filters, "the stock plugins the wheel installs under share/vmsched/plugins"
    answer = engine_call(venv_run, "runFilters", ["FromInstalled"], HOSTS, "", {"target": str(venv)})
    assert answer == {"result_code": 0, "result": HOSTS, "plugin_errors": {}, "errors": []}
