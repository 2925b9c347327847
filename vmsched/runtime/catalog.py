"""The catalog of plugin units: what the plugins folder offers right now.

Files are analysed in the pool's workers (user code never runs in the
service process), only when they are added or change; a file whose import
failed is analysed again when its environment changes: the plugins folder
(a helper added) or the installed packages (a ``pip install`` of its
dependency), seen as directory mtimes. Duplicate unit names
are resolved deterministically: the first file in sorted order wins and the
later one gets a load error.
"""

from __future__ import annotations

import logging
import os
import re
import site
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from vmsched.messages import Kind, PluginLoadError, UnitInfo
from vmsched.metrics import PLUGIN_LOAD_ERRORS, PLUGIN_UNITS, init_units
from vmsched.runtime.pool.pool import PluginPool, PoolUnavailable
from vmsched.runtime.types import Analysis
from vmsched.runtime.validation import translate_validation

log = logging.getLogger("vmsched.plugins")
#: What a plugin file without units lacks (ovirt-scheduler-proxy too loads classes only).
NO_UNITS = ("defines no unit: define a class with do_filter, do_score or do_balance (module-level functions are "
            "not units); a helper module's file name starts with '_'")
MAX_SOURCE = 1 << 20  # characters of a failed plugin file searched for a unit's class

Stamp = tuple[int, int, int, int]  # st_mtime_ns, st_size, st_ino, st_ctime_ns


def environment_stamp(plugins_dir: Path) -> tuple[int, ...]:
    """mtimes of the plugins folder and of the site-packages folders (a package added or removed changes them)."""
    stamp = []
    for folder in (str(plugins_dir), *site.getsitepackages(), site.getusersitepackages()):
        try:
            stamp.append(os.stat(folder).st_mtime_ns)
        except OSError:
            stamp.append(-1)
    return tuple(stamp)


@dataclass(frozen=True)
class _PluginFile:
    stamp: Stamp
    analysis: Analysis


class Catalog:
    """Units of the plugins folder, refreshed on demand or by a watcher thread."""

    def __init__(self, plugins_dir: Path, pool: PluginPool, analyze_timeout: float = 10.0,
                 log_changes: bool = True) -> None:
        """``log_changes``: log what loads, fails or is removed (off for all but one catalog of a folder
        in one process, so each change is logged once)."""
        self.plugins_dir = Path(plugins_dir).absolute()
        self.log_changes = log_changes
        self._pool = pool
        self._analyze_timeout = analyze_timeout
        self._refresh_lock = threading.Lock()
        self._files: dict[str, _PluginFile] = {}
        # Published snapshots: replaced whole, never mutated, so readers need no lock.
        self._units: dict[tuple[Kind, str], UnitInfo] = {}
        self._errors: list[PluginLoadError] = []
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
        """The plugin files that loaded but define no unit, each with :data:`NO_UNITS`."""
        return [PluginLoadError(plugin=name, error=NO_UNITS) for name, known in sorted(self._files.items())
                if not known.analysis.error and not known.analysis.units]

    def load_error_of(self, unit: str) -> PluginLoadError | None:
        """The load error of a file that failed to load and holds a ``class <unit>`` line (its text is read,
        never run), for a caller that names a unit the catalog does not have."""
        pattern = re.compile(rf"^[ \t]*class[ \t]+{re.escape(unit)}\b", re.MULTILINE)
        for error in self._errors:
            try:
                with open(self.plugins_dir / f"{error.plugin}.py", encoding="utf-8", errors="replace") as f:
                    text = f.read(MAX_SOURCE)
            except OSError:
                continue
            if pattern.search(text):
                return error
        return None

    # -- refresh
    def refresh(self) -> bool:
        """Rescan the folder; analyse added or changed files. True if anything changed."""
        with self._refresh_lock:
            scan = self._scan()
            changed = sorted(name for name, stamp in scan.items() if self._stamp_of(name) != stamp)
            environment = environment_stamp(self.plugins_dir)
            if environment != self._environment:  # retry failed imports: a helper or a package may have appeared
                self._environment = environment
                changed = sorted({*changed, *(name for name, known in self._files.items()
                                              if known.analysis.error and name in scan)})
            removed = sorted(name for name in self._files if name not in scan)
            if not changed and not removed:
                return False
            for name in removed:
                if self.log_changes:
                    log.info("plugin %s removed", name)
                del self._files[name]
            analysed = self._analyze(changed)
            for name, analysis in analysed.items():
                self._files[name] = _PluginFile(scan[name], analysis)
                if self.log_changes:
                    self._log_analysis(analysis)
            if not removed and not analysed:
                return False
            self._publish()
            return True

    def _stamp_of(self, name: str) -> Stamp | None:
        known = self._files.get(name)
        return None if known is None else known.stamp

    def _scan(self) -> dict[str, Stamp]:
        """Top-level ``*.py`` files (not ``_*`` or ``.*``) by module name."""
        found: dict[str, Stamp] = {}
        try:
            with os.scandir(self.plugins_dir) as entries:
                for entry in entries:
                    name = entry.name
                    if not name.endswith(".py") or name.startswith(("_", ".")):
                        continue
                    try:
                        if not entry.is_file():
                            continue
                        st = entry.stat()
                    except OSError:
                        continue  # vanished while scanning
                    found[name[:-3]] = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)
        except OSError as exc:
            if self._folder_error != str(exc) and self.log_changes:
                log.error("cannot read the plugins folder %s: %s", self.plugins_dir, exc)
            self._folder_error = str(exc)
            return {}
        self._folder_error = None
        return found

    def _analyze(self, names: list[str]) -> dict[str, Analysis]:
        """Analyses of ``names`` (in parallel); files the pool could not take are left out."""
        if not names:
            return {}
        parallel = min(len(names), max(1, self._pool.size // 2))  # leave workers for calls
        if parallel == 1:
            results = [self._analyze_one(name) for name in names]
        else:
            with ThreadPoolExecutor(parallel, thread_name_prefix="plugin-analyze") as executor:
                results = list(executor.map(self._analyze_one, names))
        return {name: analysis for name, analysis in zip(names, results) if analysis is not None}

    def _analyze_one(self, name: str) -> Analysis | None:
        if not name.isidentifier():
            return Analysis(plugin=name, error=f"{name}.py: the file name is not a valid Python module name")
        try:
            return self._pool.analyze(self.plugins_dir / f"{name}.py", timeout=self._analyze_timeout)
        except PoolUnavailable as exc:
            log.warning("plugin %s not analysed yet (%s); will retry", name, exc)
            return None

    @staticmethod
    def _log_analysis(analysis: Analysis) -> None:
        if analysis.error:
            log.error("plugin %s failed to load: %s", analysis.plugin, analysis.error)
        elif not analysis.units:
            log.warning("plugin %s.py %s", analysis.plugin, NO_UNITS)
        else:
            units = ", ".join(f"{unit.name} ({unit.kind})" for unit in analysis.units)
            log.info("plugin %s loaded: %s", analysis.plugin, units)

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
            self._log_news(units, duplicates)
        errors = sorted(errors + duplicates, key=lambda error: error.plugin)
        self._units, self._errors = units, errors
        self._update_metrics()

    def _log_news(self, units: dict[tuple[Kind, str], UnitInfo], duplicates: list[PluginLoadError]) -> None:
        """Log duplicates and validation problems once, when they appear."""
        old_errors = {(error.plugin, error.error) for error in self._errors}
        for error in duplicates:
            if (error.plugin, error.error) not in old_errors:
                log.error("plugin %s: %s", error.plugin, error.error)
        for key, info in units.items():
            old = self._units.get(key)
            if info.validation_error and (old is None or old.validation_error != info.validation_error):
                log.warning("unit %s in plugin %s: %s (sent as \"\")", info.name, info.plugin, info.validation_error)

    def _update_metrics(self) -> None:
        for kind in Kind:
            PLUGIN_UNITS.labels(kind=kind.value).set(sum(1 for key in self._units if key[0] == kind))
        PLUGIN_LOAD_ERRORS.set(len({error.plugin for error in self._errors}))
        init_units(name for _, name in self._units)  # each unit's plugin series at 0 from its load

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
