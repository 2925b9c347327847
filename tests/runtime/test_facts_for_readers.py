"""Host facts travel only with calls to plugins that read them (the others pay nothing for them)."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsched.runtime import Call, Catalog, PluginPool
from vmsched.runtime.types import Confinement, Limits

READER = '''
from vmsched.plugin import facts

class Roomiest:
    def do_filter(self, hosts, vm, args):
        return [h for h in hosts if facts.host(h) is not None]
'''
QUALIFIED = '''
import vmsched.plugin.facts

class Qualified:
    def do_score(self, hosts, vm, args):
        return [(h, 0) for h in hosts]
'''
BLIND = '''
class Blind:
    """Does not read facts: its calls carry none."""
    def do_filter(self, hosts, vm, args):
        return hosts
'''


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[PluginPool]:
    for name, source in (("reader", READER), ("qualified", QUALIFIED), ("blind", BLIND)):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    pool = PluginPool(tmp_path, size=1, limits=Limits(memory_mb=512), name=f"facts-{uuid.uuid4().hex[:8]}",
                      confinement=Confinement(allow_root=True))
    pool.start()
    yield pool
    pool.close()


@pytest.fixture
def catalog(tmp_path: Path, pool: PluginPool) -> Iterator[Catalog]:
    catalog = Catalog(tmp_path, pool, analyze_timeout=5.0)
    catalog.refresh()
    yield catalog
    catalog.stop()


def test_the_analysis_tells_which_plugins_read_facts(catalog: Catalog) -> None:
    assert catalog.uses_facts("reader") and catalog.uses_facts("qualified")
    assert not catalog.uses_facts("blind") and not catalog.uses_facts("missing")


def test_a_reader_sees_the_facts_it_is_given(pool: PluginPool) -> None:
    facts = {"hosts": {"h1": {"host_id": "h1"}}, "missing": {"h2": "no agent"}}
    (with_facts,) = pool.run([Call("reader", "Roomiest", "do_filter", (["h1", "h2"], "vm", {}), 5.0, facts)])
    (without,) = pool.run([Call("reader", "Roomiest", "do_filter", (["h1", "h2"], "vm", {}), 5.0, None)])
    assert with_facts.ok and with_facts.value == ["h1"], with_facts
    assert without.ok and without.value == [], without
