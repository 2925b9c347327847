"""Which tests need a broker or libvirtd, judged from their code, not from their markers.

A pytest plugin (``-p tests.support.tiers``): at collection it writes, for every test, whether
it was selected, whether it is heavy, and its tier markers, to the JSON file named by
``VMSCHED_TIERS_OUT``.
tests/test_tiers.py runs it with the fast tier's marker expression.

A test is heavy when it is under tests/e2e/, is the ``rabbitmq`` case of a parametrized
fixture, or when its own code, a fixture it uses, or a helper of the test tree they call,
names a broker or libvirtd entry point (:data:`HEAVY_NAMES`).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

FAST_TIER = "not rabbitmq and not libvirt and not slow"
#: The entry points to the shared broker, private vhosts and nodes, and the real libvirtd.
HEAVY_NAMES = frozenset({
    "rabbit_vhost", "private_vhost", "RABBIT_URL", "rabbit_up",  # the shared broker
    "PrivateRabbit", "PrivateCluster",  # private RabbitMQ nodes
    "e2e_env", "run_setup",  # the real libvirtd: its session fixture, the setup script that starts it
})


def _names(source: str) -> tuple[set[str], set[str]]:
    """Every identifier, attribute and string constant in ``source``, and the names it calls."""
    names: set[str] = set()
    called: set[str] = set()
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            called.add(node.func.id)
    return names, called


class Judge:
    """Decides whether code names a heavy entry point, itself or in a helper of the test tree it calls."""

    def __init__(self) -> None:
        self._heavy: dict[int, bool] = {}

    def heavy(self, obj: Any) -> bool:
        obj = inspect.unwrap(obj) if callable(obj) else obj
        key = id(obj)
        if key not in self._heavy:
            self._heavy[key] = False  # a cycle of helpers adds nothing
            self._heavy[key] = self._judge(obj)
        return self._heavy[key]

    def _judge(self, obj: Any) -> bool:
        try:
            names, called = _names(inspect.getsource(obj))
        except (OSError, TypeError, SyntaxError):
            return False
        if names & HEAVY_NAMES:
            return True
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        scope = vars(module) if module else {}
        return any(self.heavy(scope[n]) for n in called if n in scope and _ours(scope[n]))


def _ours(obj: Any) -> bool:
    """A function or class of the test tree (not of vmsched, pytest or the standard library)."""
    target = inspect.unwrap(obj) if callable(obj) else obj
    return (inspect.isfunction(target) or inspect.isclass(target)) and \
        (getattr(target, "__module__", "") or "").startswith("tests.")


def _fixture(item: pytest.Function, name: str) -> Any:
    """The fixture function ``name`` as ``item`` sees it: its module's, else the nearest conftest's."""
    owners = [item.module]
    package = item.module.__name__.rsplit(".", 1)[0]
    while package:
        owners.append(sys.modules.get(package + ".conftest"))
        package = package.rpartition(".")[0]
    for owner in owners:
        if owner is not None and name in vars(owner):
            return vars(owner)[name]
    return None


def is_heavy(item: pytest.Item, judge: Judge) -> bool:
    if "e2e" in Path(str(item.path)).relative_to(item.config.rootpath).parts:
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "rabbitmq" in [v for v in params.values() if isinstance(v, str)]:
        return True
    if not isinstance(item, pytest.Function):
        return False
    if judge.heavy(item.function):
        return True
    # a parametrized fixture is as heavy as its parameter: the ``memory`` case of ``stack`` needs no broker
    fixtures = (_fixture(item, name) for name in item.fixturenames if name not in params)
    return any(f is not None and _ours(f) and judge.heavy(f) for f in fixtures)


class Recorder:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.deselected: list[pytest.Item] = []

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected.extend(items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        judge = Judge()
        rows = [{"id": i.nodeid, "selected": selected, "heavy": is_heavy(i, judge),
                 "marks": sorted({m.name for m in i.iter_markers()} & {"rabbitmq", "libvirt", "slow", "alone"})}
                for selected, items in ((True, session.items), (False, self.deselected)) for i in items]
        self.out.write_text(json.dumps(rows))


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get("VMSCHED_TIERS_OUT")
    if out:
        config.pluginmanager.register(Recorder(Path(out)), "vmsched-tiers")
