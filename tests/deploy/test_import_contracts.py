"""The import contracts of pyproject.toml's [tool.importlinter], checked on the source tree without a wheel.

The contracts name ``vmsched.gateway`` and ``vmsched.services``, which exist only through setuptools'
``package-dir``. A staged tree in a temporary folder gives import-linter the package as installed: real folders,
one link per source file (``vmsched/...``, ``gateway/...`` as ``vmsched/gateway/...``, and so on, as
``[tool.setuptools.package-dir]`` says). What only a wheel shows is in tests/deploy/test_wheel.py (slow tier).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def source_folders() -> dict[str, Path]:
    """Installed package name -> its folder in the source tree (the top package and each package-dir entry)."""
    folders = {"vmsched": ROOT / "vmsched"}
    folders.update({name: ROOT / path for name, path in SETUPTOOLS["package-dir"].items()})
    return folders


def stage(into: Path) -> Path:
    """The package as installed, as links to the source files under ``into``; returns ``into``."""
    for name, folder in source_folders().items():
        for source in folder.rglob("*.py"):
            link = into / name.replace(".", "/") / source.relative_to(folder)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source)
    return into


def lint_imports(staged: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(staged)}  # before the editable install's finder
    return subprocess.run([str(lint), "--no-cache", str(ROOT / "pyproject.toml")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_import_contracts_hold(tmp_path: Path) -> None:
    staged = stage(tmp_path / "staged")
    result = lint_imports(staged, tmp_path)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    summary = result.stdout.split("Contracts:")[-1]
    assert " 0 broken" in summary and "kept" in summary, result.stdout[-2000:]


@pytest.mark.parametrize(("module", "source", "contract"), [
    ("vmsched/gateway/_probe.py", "import vmsched.services.scoring\n",  # the apps are seen
     "the gateway and the scheduling services are independent of each other"),
    ("vmsched/plugin/_probe.py", "def later():\n    import pydantic\n",  # a lazy import counts too
     "the plugin API is standard library only (the plugin worker imports it)"),
    ("vmsched/runtime/_probe.py", "def later():\n    import vmsched.cli\n",
     "library below the apps: the shared library imports no gateway, service, CLI or runner"),
    ("vmsched/plugin/_probe.py", "def later():\n    import vmsched.facts.held\n",  # a lazy cycle
     "no import cycles anywhere"),
])
def test_the_staged_check_sees_a_broken_contract(tmp_path: Path, module: str, source: str, contract: str) -> None:
    staged = stage(tmp_path / "staged")
    (staged / module).write_text(source)
    result = lint_imports(staged, tmp_path)
    assert result.returncode != 0 and f"{contract} BROKEN" in " ".join(result.stdout.split()), result.stdout[-3000:]


def test_every_package_of_the_tree_is_in_the_wheel() -> None:
    """Each folder with an __init__.py is listed in [tool.setuptools] packages (else the wheel lacks it); the
    other listed ones are folders of data files only (package-data)."""
    found, folders = set(), source_folders()
    for name, folder in folders.items():
        found |= {".".join([name, *init.parent.relative_to(folder).parts]) for init in folder.rglob("__init__.py")}
    listed = set(SETUPTOOLS["packages"])
    assert found <= listed, found - listed
    for data in listed - found:
        top = max((name for name in folders if data.startswith(name + ".")), key=len)
        folder = folders[top].joinpath(*data[len(top) + 1:].split("."))
        assert folder.is_dir() and not list(folder.glob("*.py")), data
        assert data in SETUPTOOLS["package-data"], data
