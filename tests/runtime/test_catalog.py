"""Catalog over a real plugins folder and a real PluginPool."""

from __future__ import annotations

import os
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsched.messages import Kind, PluginLoadError, UnitInfo
from vmsched.metrics import REGISTRY
from vmsched.runtime.types import Confinement, Limits
from vmsched.runtime import Catalog, PluginPool

FILTER = '''
class {name}:
    """Class docstring is not the description."""
    properties_validation = "{validation}"
    def do_filter(self, hosts, vm, args):
        """{doc}"""
        return hosts
'''


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    st = path.stat()  # a distinct mtime even where the clock is coarse
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + time.monotonic_ns() % 1_000_000_000))
    return path


@pytest.fixture
def pool(plugins: Path) -> Iterator[PluginPool]:
    pool = PluginPool(plugins, size=2, limits=Limits(memory_mb=512), name=f"cat-{uuid.uuid4().hex[:8]}",
                      confinement=Confinement(allow_root=True))
    pool.start()
    yield pool
    pool.close()


@pytest.fixture
def catalog(plugins: Path, pool: PluginPool) -> Iterator[Catalog]:
    catalog = Catalog(plugins, pool, analyze_timeout=1.0)
    yield catalog
    catalog.stop()


def names(catalog: Catalog) -> list[tuple[str, str, str]]:
    return [(u.kind.value, u.name, u.plugin) for u in catalog.units()]


def test_empty_folder(catalog: Catalog) -> None:
    assert catalog.refresh() is False
    assert catalog.units() == []
    assert catalog.load_errors() == []


def test_units_of_a_plugin(plugins: Path, catalog: Catalog) -> None:
    write(plugins, "mem", FILTER.format(name="MemFilter", validation="{mem = [0-9]+, cpu: [0-9]{1,3}}", doc="Memory."))
    write(plugins, "multi", """
        class Both:
            def do_filter(self, hosts, vm, args):
                return hosts
            def do_score(self, hosts, vm, args):
                "Scores."
                return []
    """)
    assert catalog.refresh() is True
    assert names(catalog) == [("filter", "Both", "multi"), ("filter", "MemFilter", "mem"), ("score", "Both", "multi")]
    assert catalog.unit("MemFilter", Kind.FILTER) == UnitInfo(
        name="MemFilter",
        kind=Kind.FILTER,
        description="Memory.",
        validation="mem=[0-9]+;cpu=[0-9]{1,3}",
        plugin="mem",
        validation_error=None,
    )
    assert catalog.unit("MemFilter", Kind.SCORE) is None
    assert catalog.unit("Both", Kind.SCORE).description == "Scores."  # type: ignore[union-attr]
    assert [u.name for u in catalog.units(Kind.SCORE)] == ["Both"]
    assert catalog.refresh() is False  # nothing changed


def test_hidden_and_non_python_files_are_skipped(plugins: Path, catalog: Catalog) -> None:
    write(plugins, "_private", FILTER.format(name="Private", validation="", doc=""))
    write(plugins, ".hidden", FILTER.format(name="Hidden", validation="", doc=""))
    (plugins / "notes.txt").write_text("class X: pass\n")
    (plugins / "sub").mkdir()
    write(plugins / "sub", "nested", FILTER.format(name="Nested", validation="", doc=""))
    assert catalog.refresh() is False
    assert catalog.units() == []


def test_change_and_removal(plugins: Path, catalog: Catalog) -> None:
    write(plugins, "evolving", FILTER.format(name="First", validation="", doc="v1"))
    catalog.refresh()
    assert names(catalog) == [("filter", "First", "evolving")]
    write(plugins, "evolving", FILTER.format(name="Second", validation="", doc="v2"))
    assert catalog.refresh() is True
    assert names(catalog) == [("filter", "Second", "evolving")]
    assert catalog.unit("Second", Kind.FILTER).description == "v2"  # type: ignore[union-attr]
    (plugins / "evolving.py").unlink()
    assert catalog.refresh() is True
    assert catalog.units() == []


def test_broken_plugin_is_a_load_error_and_others_still_load(plugins: Path, catalog: Catalog) -> None:
    write(plugins, "good", FILTER.format(name="Good", validation="", doc=""))
    write(plugins, "broken", "import no_such_dependency_here\n")
    write(plugins, "hangs", "import time\ntime.sleep(60)\n")
    assert catalog.refresh() is True
    assert names(catalog) == [("filter", "Good", "good")]
    errors = {error.plugin: error.error for error in catalog.load_errors()}
    assert sorted(errors) == ["broken", "hangs"]
    assert errors["broken"].startswith("cannot import plugin broken: ModuleNotFoundError")
    assert errors["hangs"] == "timed out after 1.0 s while importing the module"
    assert REGISTRY.get_sample_value("vmsched_plugin_load_errors") == 2
    assert REGISTRY.get_sample_value("vmsched_plugin_units", {"kind": "filter"}) == 1
    # fixing the file clears the error
    write(plugins, "broken", FILTER.format(name="Fixed", validation="", doc=""))
    assert catalog.refresh() is True
    assert [e.plugin for e in catalog.load_errors()] == ["hangs"]
    assert catalog.unit("Fixed", Kind.FILTER) is not None
    assert REGISTRY.get_sample_value("vmsched_plugin_load_errors") == 1


def test_duplicate_unit_names_first_file_wins(plugins: Path, catalog: Catalog) -> None:
    write(plugins, "b_second", FILTER.format(name="Same", validation="", doc="from b"))
    write(plugins, "a_first", FILTER.format(name="Same", validation="", doc="from a"))
    write(plugins, "c_score", "class Same:\n    def do_score(self, h, v, a):\n        return []\n")
    catalog.refresh()
    assert catalog.unit("Same", Kind.FILTER).plugin == "a_first"  # type: ignore[union-attr]
    assert catalog.unit("Same", Kind.SCORE).plugin == "c_score"  # type: ignore[union-attr]  # other kind: no clash
    assert catalog.load_errors() == [
        PluginLoadError(plugin="b_second", error="filter unit Same is already defined in a_first.py; ignored here")
    ]


def test_bad_validation_is_reported_on_the_unit(plugins: Path, catalog: Catalog) -> None:
    write(plugins, "badval", FILTER.format(name="BadVal", validation="{mem = [0-9+}", doc=""))
    catalog.refresh()
    unit = catalog.unit("BadVal", Kind.FILTER)
    assert unit is not None
    assert unit.validation == ""
    assert unit.validation_error is not None and "does not compile" in unit.validation_error


def test_validation_written_as_a_dict(plugins: Path, catalog: Catalog) -> None:
    write(plugins, "dictval", """
        class DictVal:
            properties_validation = {"mem": "[0-9]+", "mode": "(strict|loose)"}
            def do_score(self, hosts, vm, args):
                return []
    """)
    catalog.refresh()
    unit = catalog.unit("DictVal", Kind.SCORE)
    assert unit is not None and unit.validation_error is None
    assert unit.validation == "mem=[0-9]+;mode=(strict|loose)"


def test_invalid_module_file_name(plugins: Path, catalog: Catalog) -> None:
    write(plugins, "my-plugin", FILTER.format(name="Dashed", validation="", doc=""))
    catalog.refresh()
    assert catalog.units() == []
    assert catalog.load_errors() == [
        PluginLoadError(plugin="my-plugin", error="my-plugin.py: the file name is not a valid Python module name")
    ]


def test_missing_folder_is_empty_not_an_exception(tmp_path: Path, pool: PluginPool) -> None:
    catalog = Catalog(tmp_path / "nowhere", pool)
    assert catalog.refresh() is False
    assert catalog.units() == []


def test_watcher_picks_up_new_files(plugins: Path, catalog: Catalog) -> None:
    catalog.start_watching(0.05)
    write(plugins, "late", FILTER.format(name="Late", validation="", doc=""))
    end = time.monotonic() + 10
    while catalog.unit("Late", Kind.FILTER) is None:
        assert time.monotonic() < end, "the watcher did not pick the file up"
        time.sleep(0.02)
    catalog.stop()
    write(plugins, "later", FILTER.format(name="Later", validation="", doc=""))
    time.sleep(0.2)
    assert catalog.unit("Later", Kind.FILTER) is None  # stopped: no more refreshes
