"""The plugin runtime: worker processes, the pool that drives them, the catalog.

The names below are imported lazily (PEP 562): the worker process starts as
``python -m vmsched.runtime.worker.main``, which imports this package first, and it
must not pull pydantic and prometheus_client into the plugins' interpreter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vmsched.runtime.catalog import Catalog as Catalog
    from vmsched.runtime.pool.pool import PluginPool as PluginPool
    from vmsched.runtime.types import Call as Call
    from vmsched.runtime.validation import translate_validation as translate_validation

_EXPORTS = {
    "Catalog": "vmsched.runtime.catalog",
    "PluginPool": "vmsched.runtime.pool.pool",
    "Call": "vmsched.runtime.types",
    "translate_validation": "vmsched.runtime.validation",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
