"""A plugin whose import failed is retried when its environment changes.

Real catalog over a real plugins folder and real plugin workers: the missing
helper module appears in the plugins folder; the missing dependency appears in
site-packages (as ``pip install`` would put it). Before, the plugin stayed
failed until its own file was touched.
"""

from __future__ import annotations

import site
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsched.messages import Kind
from vmsched.runtime import Catalog, PluginPool
from vmsched.runtime.types import Confinement, Limits

PLUGIN = '''
import {module}


class {unit}:
    def do_filter(self, hosts, vm, args):
        """Needs {module}."""
        return {module}.keep(hosts)
'''
DEPENDENCY = "def keep(hosts):\n    return hosts[:1]\n"


@pytest.fixture
def catalog(plugins: Path) -> Iterator[Catalog]:
    pool = PluginPool(plugins, size=1, limits=Limits(memory_mb=512), name=f"retry-{uuid.uuid4().hex[:8]}",
                      confinement=Confinement(allow_root=True))
    pool.start()
    catalog = Catalog(plugins, pool, analyze_timeout=10.0)
    yield catalog
    catalog.stop()
    pool.close()


def test_retried_when_a_helper_appears_in_the_plugins_folder(plugins: Path, catalog: Catalog):
    (plugins / "uses_helper.py").write_text(PLUGIN.format(module="_my_helper", unit="UsesHelper"))
    catalog.refresh()
    assert catalog.unit("UsesHelper", Kind.FILTER) is None
    assert "No module named '_my_helper'" in catalog.load_errors()[0].error
    (plugins / "_my_helper.py").write_text(DEPENDENCY)
    assert catalog.refresh() is True
    assert catalog.unit("UsesHelper", Kind.FILTER) is not None and catalog.load_errors() == []


def test_retried_when_a_package_is_installed(plugins: Path, catalog: Catalog):
    module = f"vmsched_test_dep_{uuid.uuid4().hex[:8]}"
    (plugins / "uses_dep.py").write_text(PLUGIN.format(module=module, unit="UsesDep"))
    catalog.refresh()
    assert f"No module named '{module}'" in catalog.load_errors()[0].error
    assert catalog.refresh() is False  # nothing changed: not analysed again
    installed = Path(site.getsitepackages()[0]) / f"{module}.py"
    try:
        installed.write_text(DEPENDENCY)  # what `pip install` of the dependency does to site-packages
        assert catalog.refresh() is True
        assert catalog.unit("UsesDep", Kind.FILTER) is not None and catalog.load_errors() == []
    finally:
        installed.unlink(missing_ok=True)
