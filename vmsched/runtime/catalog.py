"""The catalog of plugin units: what the plugins folder (or folders) offers right now.

Files are analysed in the pool's workers (user code never runs in the
service process), only when they are added or change; a file whose import
failed is analysed again when its environment changes: the plugins folder
(a helper added) or the installed packages (a ``pip install`` of its
dependency), seen as directory mtimes. Duplicate unit names
are resolved deterministically: the first file in sorted order wins and the
later one gets a load error.

Several folders (``--plugins DIR --stock-plugins``) share the workers'
``sys.path``, in order: a module name (a plugin file, a ``_helper.py``, a
package) in two of them would be found in the first only, so it is a clash,
a load error named after the module; a clashing plugin file of a later folder
is not loaded.
"""

from __future__ import annotations

import logging
import os
import re
import site
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from vmsched.messages import Kind, PluginLoadError, UnitInfo
from vmsched.metrics import PLUGIN_LOAD_ERRORS, PLUGIN_UNITS, init_units
from vmsched.runtime.pool.pool import PluginPool, PoolUnavailable
from vmsched.runtime.types import Analysis
from vmsched.runtime.validation import translate_validation

log = logging.getLogger("vmsched.plugins")
MAX_SOURCE = 1 << 20  # characters of a failed plugin file searched for a unit's class

Stamp = tuple[int, int, int, int]  # st_mtime_ns, st_size, st_ino, st_ctime_ns


def environment_stamp(*plugins_dirs: Path) -> tuple[int, ...]:
    """mtimes of the plugins folders and of the site-packages folders (a package added or removed changes them)."""
    stamp = []
    for folder in (*map(str, plugins_dirs), *site.getsitepackages(), site.getusersitepackages()):
        try:
            stamp.append(os.stat(folder).st_mtime_ns)
        except OSError:
            stamp.append(-1)
    return tuple(stamp)


def no_units(plugin: str) -> str:
    """The load error of plugin file ``plugin``.py that defines no unit (what it lacks: ovirt-scheduler-proxy too
    loads classes only)."""
    return (f"{plugin}.py defines no unit: define a class with do_filter, do_score or do_balance (module-level "
            "functions are not units); a helper module's file name starts with '_'")


def module_name(entry: os.DirEntry[str]) -> str | None:
    """The module ``import NAME`` finds in this folder entry (a ``*.py`` file, a package), else None."""
    try:
        if entry.name.endswith(".py") and entry.is_file():
            return entry.name[:-3]
        if entry.is_dir() and os.path.isfile(os.path.join(entry.path, "__init__.py")):
            return entry.name
    except OSError:
        pass  # vanished while scanning
    return None


def clash(name: str, first: Path, later: Path, plugin: bool) -> PluginLoadError:
    """The load error of module ``name``, in plugin folder ``first`` and again in ``later``."""
    if plugin:
        error = (f"{name}.py is in {later} and in {first}, which comes first: a module name must be unique across "
                 "the plugin folders, so the later one is not loaded; rename one")
    else:
        error = (f"{name} is in {first} and in {later}: `import {name}` finds the one in {first} for the plugins "
                 "of both folders; rename one")
    return PluginLoadError(plugin=name, error=error)


class _PluginFile(NamedTuple):
    path: Path
    stamp: Stamp
    analysis: Analysis


class Catalog:
    """Units of the plugins folder (or folders), refreshed on demand or by a watcher thread."""

    def __init__(self, plugins_dir: Path | Sequence[Path], pool: PluginPool, analyze_timeout: float = 10.0,
                 log_changes: bool = True) -> None:
        """``plugins_dir``: a folder, or several, in the order the pool's workers have them on ``sys.path``.
        ``log_changes``: log what loads, fails or is removed (off for all but one catalog of a folder
        in one process, so each change is logged once)."""
        self.folders = tuple(Path(d).absolute() for d in ([plugins_dir] if isinstance(plugins_dir, (str, Path))
                                                           else plugins_dir))
        self.log_changes = log_changes
        self._pool = pool
        self._analyze_timeout = analyze_timeout
        self._refresh_lock = threading.Lock()
        self._files: dict[str, _PluginFile] = {}
        # Published snapshots: replaced whole, never mutated, so readers need no lock.
        self._units: dict[tuple[Kind, str], UnitInfo] = {}
        self._errors: list[PluginLoadError] = []
        self._clashes: list[PluginLoadError] = []  # module names found in several folders, by the last scan
        self._folder_error: str | None = None
        self._environment: tuple[int, ...] | None = None  # environment_stamp() at the last refresh
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- queries
    def units(self, kind: Kind | None = None) -> list[UnitInfo]:
        """All units (or those of ``kind``), ordered by kind then name."""
        units = self._units
        order = list(Kind)
        keys = sorted(units, key=lambda key: (order.index(key[0]), key[1]))
        return [units[key] for key in keys if kind is None or key[0] == kind]

    def unit(self, name: str, kind: Kind) -> UnitInfo | None:
        return self._units.get((Kind(kind), name))

    def uses_facts(self, plugin: str) -> bool:
        """Whether ``plugin`` reads host facts, so its calls must carry them."""
        found = self._files.get(plugin)
        return found is not None and found.analysis.uses_facts

    def load_errors(self) -> list[PluginLoadError]:
        return list(self._errors)

    def without_units(self) -> list[PluginLoadError]:
        """The plugin files that loaded but define no unit, each with :func:`no_units`."""
        return [PluginLoadError(plugin=name, error=no_units(name)) for name, known in sorted(self._files.items())
                if not known.analysis.error and not known.analysis.units]

    def load_error_of(self, unit: str) -> PluginLoadError | None:
        """The load error of a file that failed to load and holds a ``class <unit>`` line (its text is read,
        never run), for a caller that names a unit the catalog does not have."""
        pattern = re.compile(rf"^[ \t]*class[ \t]+{re.escape(unit)}\b", re.MULTILINE)
        for error in self._errors:
            known = self._files.get(error.plugin)
            if known is None:
                continue
            try:
                with open(known.path, encoding="utf-8", errors="replace") as f:
                    text = f.read(MAX_SOURCE)
            except OSError:
                continue
            if pattern.search(text):
                return error
        return None

    # -- refresh
    def refresh(self) -> bool:
        """Rescan the folders; analyse added or changed files. True if anything changed."""
        with self._refresh_lock:
            clashes = self._clashes
            scan = self._scan()
            # added, or its path or stamp changed (the first two fields of what is known of it)
            changed = sorted(name for name, found in scan.items() if self._files.get(name, ())[:2] != found)
            environment = environment_stamp(*self.folders)
            if environment != self._environment:  # retry failed imports: a helper or a package may have appeared
                self._environment = environment
                changed = sorted({*changed, *(name for name, known in self._files.items()
                                              if known.analysis.error and name in scan)})
            removed = sorted(name for name in self._files if name not in scan)
            for name in removed:
                if self.log_changes:
                    log.info("plugin %s removed", name)
                del self._files[name]
            analysed = self._analyze({name: scan[name][0] for name in changed})
            for name, analysis in analysed.items():
                self._files[name] = _PluginFile(*scan[name], analysis)
                if self.log_changes and analysis.error:
                    log.error("plugin %s failed to load: %s", analysis.plugin, analysis.error)
                elif self.log_changes and not analysis.units:
                    log.warning("plugin %s", no_units(analysis.plugin))
                elif self.log_changes:
                    units = ", ".join(f"{unit.name} ({unit.kind})" for unit in analysis.units)
                    log.info("plugin %s loaded: %s", analysis.plugin, units)
            if not removed and not analysed and self._clashes == clashes:
                return False
            self._publish()
            return True

    def _scan(self) -> dict[str, tuple[Path, Stamp]]:
        """Top-level plugin files (``*.py``, not ``_*`` or ``.*``) by module name, with the module names found in
        several folders (:func:`clash`) in :attr:`_clashes`."""
        found: dict[str, tuple[Path, Stamp]] = {}
        first: dict[str, Path] = {}  # module name -> the folder that has it first
        clashes: list[PluginLoadError] = []
        problems: list[str] = []
        for folder in self.folders:
            try:
                with os.scandir(folder) as scanned:
                    entries = sorted(scanned, key=lambda entry: entry.name)
            except OSError as exc:
                problems.append(f"cannot read the plugins folder {folder}: {exc}")
                continue
            for entry in entries:
                name = module_name(entry)
                if name is None or name.startswith(".") or name == "__init__":
                    continue
                plugin = not name.startswith("_") and entry.name.endswith(".py")
                if name in first:
                    clashes.append(clash(name, first[name], folder, plugin))
                    continue
                first[name] = folder
                if not plugin:
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue  # vanished while scanning
                found[name] = (Path(entry.path), (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns))
        problem = "; ".join(problems) or None
        if problem is not None and problem != self._folder_error and self.log_changes:
            log.error("%s", problem)
        self._folder_error = problem
        self._clashes = clashes
        return found

    def _analyze(self, paths: dict[str, Path]) -> dict[str, Analysis]:
        """Analyses of the plugin files ``paths`` (by name; in parallel); files the pool could not take are
        left out."""
        parallel = max(1, min(len(paths), self._pool.max_size // 2))  # leave workers for calls
        with ThreadPoolExecutor(parallel, thread_name_prefix="plugin-analyze") as executor:
            results = list(executor.map(self._analyze_one, paths, paths.values()))
        return {name: analysis for name, analysis in zip(paths, results) if analysis is not None}

    def _analyze_one(self, name: str, path: Path) -> Analysis | None:
        if not name.isidentifier():
            return Analysis(plugin=name, error=f"{name}.py: the file name is not a valid Python module name")
        try:
            return self._pool.analyze(path, timeout=self._analyze_timeout)
        except PoolUnavailable as exc:
            log.warning("plugin %s not analysed yet (%s); will retry", name, exc)
            return None

    def _publish(self) -> None:
        units: dict[tuple[Kind, str], UnitInfo] = {}
        errors: list[PluginLoadError] = []
        duplicates: list[PluginLoadError] = []
        for name in sorted(self._files):
            analysis = self._files[name].analysis
            if analysis.error:
                errors.append(PluginLoadError(plugin=name, error=analysis.error))
                continue
            for found in analysis.units:
                key = (Kind(found.kind), found.name)
                if key in units:
                    first = units[key].plugin
                    error = f"{found.kind} unit {found.name} is already defined in {first}.py; ignored here"
                    duplicates.append(PluginLoadError(plugin=name, error=error))
                    continue
                validation, problem = translate_validation(found.validation)
                units[key] = UnitInfo(
                    name=found.name,
                    kind=key[0],
                    description=found.description,
                    validation=validation,
                    plugin=name,
                    validation_error=problem,
                )
        if self.log_changes:
            self._log_news(units, duplicates + self._clashes)
        errors = sorted(errors + duplicates + self._clashes, key=lambda error: error.plugin)
        self._units, self._errors = units, errors
        for kind in Kind:
            PLUGIN_UNITS.labels(kind=kind.value).set(sum(1 for key in units if key[0] == kind))
        PLUGIN_LOAD_ERRORS.set(len({error.plugin for error in errors}))
        init_units(name for _, name in units)  # each unit's plugin series at 0 from its load

    def _log_news(self, units: dict[tuple[Kind, str], UnitInfo], duplicates: list[PluginLoadError]) -> None:
        """Log duplicates (of units and of module names) and validation problems once, when they appear."""
        old_errors = {(error.plugin, error.error) for error in self._errors}
        for error in duplicates:
            if (error.plugin, error.error) not in old_errors:
                log.error("plugin %s: %s", error.plugin, error.error)
        for key, info in units.items():
            old = self._units.get(key)
            if info.validation_error and (old is None or old.validation_error != info.validation_error):
                log.warning("unit %s in plugin %s: %s (sent as \"\")", info.name, info.plugin, info.validation_error)

    # -- watching
    def start_watching(self, interval: float) -> None:
        """Call :meth:`refresh` every ``interval`` seconds in a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, args=(interval,), name="plugin-catalog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._analyze_timeout + 5.0)

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except Exception:
                log.exception("plugin catalog refresh failed")
