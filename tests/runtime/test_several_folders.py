"""One pool and one catalog over several plugin folders (--plugins DIR --stock-plugins): sibling imports
resolve through the folders in order, and a module name in two folders is a load error, logged, never a
silent shadowing."""

from __future__ import annotations

import logging
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsched.messages import Kind
from vmsched.runtime import Call, Catalog, PluginPool
from vmsched.runtime.types import Confinement, Limits

UNIT = '''
import {helper}


class {name}:
    def do_filter(self, hosts, vm, args):
        """Keeps what {helper}.keep keeps."""
        return [h for h in hosts if {helper}.keep(h)]
'''


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    mine, stock = tmp_path / "mine", tmp_path / "stock"
    mine.mkdir()
    stock.mkdir()
    (mine / "mine.py").write_text(textwrap.dedent(UNIT.format(name="Mine", helper="_mine_util")))
    (mine / "_mine_util.py").write_text("def keep(host):\n    return host != 'b'\n")
    (stock / "theirs.py").write_text(textwrap.dedent(UNIT.format(name="Theirs", helper="_their_util")))
    (stock / "_their_util.py").write_text("def keep(host):\n    return host != 'a'\n")
    return mine, stock


@pytest.fixture
def pool(folders: tuple[Path, Path]) -> Iterator[PluginPool]:
    pool = PluginPool(list(folders), size=1, limits=Limits(memory_mb=512), name=f"two-{uuid.uuid4().hex[:8]}",
                      confinement=Confinement(allow_root=True))
    pool.start()
    yield pool
    pool.close()


def run(pool: PluginPool, plugin: str, unit: str) -> object:
    (result,) = pool.run([Call(plugin, unit, "do_filter", (["a", "b", "c"], "vm", {}), 10.0)])
    assert result.ok, result.error
    return result.value


def test_the_units_of_both_folders_run_with_their_own_helpers(folders: tuple[Path, Path], pool: PluginPool):
    catalog = Catalog(list(folders), pool)
    catalog.refresh()
    assert [(u.name, u.plugin) for u in catalog.units(Kind.FILTER)] == [("Mine", "mine"), ("Theirs", "theirs")]
    assert catalog.load_errors() == []
    assert run(pool, "mine", "Mine") == ["a", "c"]
    assert run(pool, "theirs", "Theirs") == ["b", "c"]


def test_a_helper_in_both_folders_is_a_logged_load_error(folders: tuple[Path, Path], pool: PluginPool,
                                                         caplog: pytest.LogCaptureFixture):
    mine, stock = folders
    (mine / "_their_util.py").write_text("def keep(host):\n    return True\n")  # shadows the stock helper
    catalog = Catalog(list(folders), pool)
    with caplog.at_level(logging.ERROR, logger="vmsched.plugins"):
        catalog.refresh()
    (error,) = catalog.load_errors()
    assert error.plugin == "_their_util"
    assert error.error == (f"_their_util is in {mine} and in {stock}: `import _their_util` finds the one in {mine} "
                           "for the plugins of both folders; rename one")
    assert f"plugin _their_util: {error.error}" in caplog.text
    assert run(pool, "theirs", "Theirs") == ["a", "b", "c"]  # what the error warns of: the first folder's helper


def test_a_plugin_file_in_both_folders_loads_from_the_first_only(folders: tuple[Path, Path], pool: PluginPool,
                                                                 caplog: pytest.LogCaptureFixture):
    mine, stock = folders
    (stock / "mine.py").write_text(textwrap.dedent(UNIT.format(name="Shadowed", helper="_their_util")))
    catalog = Catalog(list(folders), pool)
    with caplog.at_level(logging.ERROR, logger="vmsched.plugins"):
        catalog.refresh()
    assert [u.name for u in catalog.units()] == ["Mine", "Theirs"]  # not Shadowed
    (error,) = catalog.load_errors()
    assert error.plugin == "mine" and error.error.startswith(f"mine.py is in {stock} and in {mine}, which comes first")
    assert "plugin mine: mine.py is in" in caplog.text
    (stock / "mine.py").unlink()  # the clash resolved: the error goes
    assert catalog.refresh() is True and catalog.load_errors() == []
