"""The plugin worker's plugin modules: imported by name, re-imported when changed, listed as units.

Standard library only (the plugin worker process imports it).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from vmsched.runtime.contract import KINDS
from vmsched.runtime.worker.errors import PluginError


class Modules:
    """Plugin modules by name, re-imported when their file changes.

    With several plugin folders, a name is the first folder's that has ``name.py`` (the catalog refuses a
    name found in two folders: a module name is unique across them, as on ``sys.path``).
    """

    def __init__(self, plugins_dirs: Sequence[str]) -> None:
        self.dirs = list(plugins_dirs)
        self._prefixes = tuple(d.rstrip(os.sep) + os.sep for d in self.dirs)
        self._cache: dict[str, tuple[ModuleType, tuple[int, int, int]]] = {}

    def get(self, name: str) -> ModuleType:
        """The module of ``name.py`` (one stat per folder until found; imported again if changed)."""
        if not name.isidentifier():
            raise PluginError(f"invalid plugin name {name!r}")
        for folder in self.dirs:
            path = os.path.join(folder, name + ".py")
            try:
                st = os.stat(path)
                break
            except FileNotFoundError:
                continue
        else:
            self.forget(name)
            raise PluginError(f"plugin file {name}.py not found in {' or '.join(self.dirs)} (removed?)") from None
        cached = self._cache.get(name)
        if cached is not None and cached[1] == (st.st_mtime_ns, st.st_size, st.st_ino):
            return cached[0]
        return self.load(name, path)

    def load(self, name: str, path: str) -> ModuleType:
        """Import ``path`` fresh as module ``name`` (exceptions propagate)."""
        if name in self._cache:
            self._evict_helpers()
        self.forget(name)
        st = os.stat(path)
        with open(path, "rb") as source:
            code = compile(source.read(), path, "exec", dont_inherit=True)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None:
            raise PluginError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            exec(code, vars(module))
        except BaseException:
            sys.modules.pop(name, None)
            raise
        if os.path.dirname(path) in self.dirs:
            self._cache[name] = (module, (st.st_mtime_ns, st.st_size, st.st_ino))
        return module

    def forget(self, name: str) -> None:
        if self._cache.pop(name, None) is not None:
            sys.modules.pop(name, None)

    def _evict_helpers(self) -> None:
        """Drop helper modules of the plugins folder so a re-import sees their changes."""
        for key, module in list(sys.modules.items()):
            path = getattr(module, "__file__", None)
            if key not in self._cache and isinstance(path, str) and path.startswith(self._prefixes):
                del sys.modules[key]


def reads_facts(module: ModuleType, path: str) -> bool:
    """Whether the plugin file uses the facts API (``vmsched.plugin``): its calls then carry the facts.

    The module's names are checked (``from vmsched.plugin import facts`` and friends), and its source
    text as a fallback; a helper module that reads facts on the plugin's behalf must be imported by a
    plugin file that names ``vmsched.plugin`` itself (docs/plugins.md).
    """
    for value in list(vars(module).values()):
        owner = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(owner, str) and (owner == "vmsched.plugin" or owner.startswith("vmsched.plugin.")):
            return True
    try:
        with open(path, encoding="utf-8", errors="replace") as source:
            return "vmsched.plugin" in source.read(1 << 20)
    except OSError:
        return False


def list_units(module: ModuleType) -> list[dict[str, str]]:
    """One entry per (class defined in ``module``, do_* method it has)."""
    units = []
    for attr, obj in list(vars(module).items()):
        if not isinstance(obj, type) or obj.__module__ != module.__name__ or obj.__name__ != attr:
            continue
        validation = getattr(obj, "properties_validation", "")
        if isinstance(validation, dict):  # written as a dict instead of a string: keep it parseable
            validation = repr(validation)
        for unit_kind in KINDS:
            func = getattr(obj, unit_kind.method, None)
            if callable(func):
                units.append(
                    {
                        "name": attr,
                        "kind": unit_kind.kind,
                        "description": inspect.getdoc(func) or inspect.getdoc(obj) or "",  # old samples: class docstrings
                        "validation": validation if isinstance(validation, str) else "",
                    }
                )
    return units
