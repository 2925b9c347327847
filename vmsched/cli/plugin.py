"""``vmsched plugin check`` and ``vmsched plugin run``: a plugin author's test loop without a cluster.

Both load the plugins exactly as the services do: in plugin worker processes,
in the sandbox, with the same limits and confinement rules (the same
``VMSCHED_PLUGIN_*`` settings; as root, the plugin user).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from vmsched.cli.settings import build
from vmsched.config import Settings
from vmsched.messages import Kind, PluginLoadError, UnitInfo
from vmsched.runtime import Call, Catalog, PluginPool, translate_validation
from vmsched.runtime.catalog import no_units
from vmsched.runtime.contract import KIND, BadResult
from vmsched.service import plugin_sandbox
from vmsched.words import counted


#: Options of the plugin tools named otherwise than the services' flag of their setting.
FLAGS = {"plugin_timeout": "--timeout"}


def folders(folder: Path, settings: Settings) -> list[Path]:
    """The plugins folders a service given ``--plugins folder`` would load, in order (--stock-plugins: two)."""
    return settings.model_copy(update={"plugins_dir": folder}).plugin_folders


@contextmanager
def _pool(folder: Path, settings: Settings) -> Iterator[PluginPool]:
    limits, confinement = plugin_sandbox(settings)
    pool = PluginPool(folders(folder, settings), size=1, limits=limits, name="plugin-cli", confinement=confinement)
    try:
        pool.start()
    except RuntimeError as exc:  # the sandbox refused, as it would in the service: say why, no traceback
        raise ValueError(str(exc)) from None
    try:
        yield pool
    finally:
        pool.close()


def load(path: Path, settings: Settings) -> tuple[list[UnitInfo], list[PluginLoadError]]:
    """The units of a plugin file or folder and every load error, as the services would see them."""
    path = path.absolute()
    if path.is_dir():
        with _pool(path, settings) as pool:
            catalog = Catalog(folders(path, settings), pool, analyze_timeout=settings.plugin_timeout)
            catalog.refresh()
            return catalog.units(), catalog.load_errors() + catalog.without_units()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such plugin file or folder")
    if path.suffix != ".py":
        return [], [PluginLoadError(plugin=path.name, error="a plugin is a *.py file")]
    if settings.stock_plugins:
        raise ValueError(f"--stock-plugins checks a folder beside the stock plugins: give {path.parent}, not a file")
    errors = []
    if path.name.startswith(("_", ".")):
        errors.append(PluginLoadError(plugin=path.stem, error="files starting with '_' or '.' are not scanned as "
                                                              "plugins (helpers only)"))
    with _pool(path.parent, settings) as pool:
        analysis = pool.analyze(path, timeout=settings.plugin_timeout)
    if analysis.error:
        return [], errors + [PluginLoadError(plugin=path.stem, error=analysis.error)]
    if not analysis.units:
        errors.append(PluginLoadError(plugin=path.stem, error=no_units(path.stem)))
    units = []
    for found in analysis.units:
        validation, problem = translate_validation(found.validation)
        units.append(UnitInfo(name=found.name, kind=Kind(found.kind), description=found.description,
                              validation=validation, plugin=path.stem, validation_error=problem))
    return units, errors


def cmd_check(args: argparse.Namespace) -> int:
    units, errors = load(args.path, settings_of(args))
    if not units and not errors:  # a folder without plugin files
        errors = [PluginLoadError(plugin=str(args.path), error="no plugin file (NAME.py) here")]
    problems = len(errors) + sum(1 for u in units if u.validation_error)
    if args.json:
        print(json.dumps({"ok": not problems, "units": [u.model_dump(mode="json") for u in units],
                          "errors": [e.model_dump() for e in errors]}, indent=2))
        return 1 if problems else 0
    for u in units:
        print(f"{u.kind.value:8} {u.name}  ({u.plugin}.py)")
        print(f"  description: {u.description or '(none: add a docstring to the method or the class)'}")
        print(f"  validation:  {u.validation!r}")
        if u.validation_error:
            print(f"  ERROR: {u.validation_error} (the unit would be left out of discover)")
    for e in errors:
        print(f"ERROR {e.plugin}: {e.error}")
    print(f"{counted(len(units), 'unit')}, {counted(problems, 'error')}")
    return 1 if problems else 0


def _props(items: list[str]) -> dict[str, str]:
    props = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--prop {item!r}: expected KEY=VALUE")
        props[key] = value
    return props


def read_facts(path: Path | None) -> dict[str, Any] | None:
    """A facts file (YAML or JSON) in the shape the services send: ``hosts``, ``vm``, ``missing``."""
    if path is None:
        return None
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("hosts", {}), dict):
        raise ValueError(f"{path}: expected a mapping with 'hosts: {{HOST_ID: {{field: value, ...}}}}' "
                         "(and optionally 'vm' and 'missing'; docs/plugins.md)")
    data = {"hosts": {}, "missing": {}, "vm": None, **data}
    return {"vm_problem": None if data["vm"] else "no VM in the facts file", **data}


def cmd_run(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    facts = read_facts(args.facts)
    hosts = [h.strip() for h in (args.hosts or "").split(",") if h.strip()] or list((facts or {}).get("hosts", {}))
    folder = args.plugins.absolute() if args.plugins else settings.plugins_dir
    if folder.is_file():
        folder = folder.parent
    units, errors = load(folder, settings)
    found = [u for u in units if u.name == args.unit and (args.kind is None or u.kind.value == args.kind)]
    if len(found) != 1:
        known = ", ".join(f"{u.name} ({u.kind.value})" for u in units) or "none"
        why = "is defined as several kinds: pick one with --kind" if found else f"not found in {folder}"
        for e in errors:
            print(f"ERROR {e.plugin}: {e.error}", file=sys.stderr)
        print(f"vmsched plugin run: unit {args.unit!r} {why} (units: {known})", file=sys.stderr)
        return 2
    unit = found[0]
    kind = KIND[unit.kind.value]
    call = Call(unit.plugin, unit.name, kind.method, kind.args(hosts, args.vm, _props(args.prop)),
                settings.plugin_timeout, facts)
    with _pool(folder, settings) as pool:
        (result,) = pool.run([call])
    if result.stderr:
        sys.stderr.write(result.stderr if result.stderr.endswith("\n") else result.stderr + "\n")
    if not result.ok:
        print(f"vmsched plugin run: {unit.name} failed: {result.error}", file=sys.stderr)
        return 1
    print(json.dumps(result.value))
    try:
        kind.check(result.value, hosts)
    except BadResult as exc:
        print(f"vmsched plugin run: {unit.name}: {exc} (the service would report this as an error)", file=sys.stderr)
        return 1
    print(f"{unit.kind.value} {unit.name}: ok in {result.duration * 1000:.1f} ms", file=sys.stderr)
    return 0


def sandbox_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin-user", metavar="USER", help="as root: the user plugins run as (as the services)")
    p.add_argument("--allow-root-plugins", action="store_true", default=None,
                   help="as root: if the switch to --plugin-user is impossible, run plugins as root without "
                        "capabilities (as the services)")
    p.add_argument("--timeout", metavar="S", help="import and call timeout (default: --plugin-timeout, 10)")
    p.add_argument("--stock-plugins", action="store_true", default=None,
                   help="load the stock plugins too, after the folder, as a service given --stock-plugins does: "
                        "a module or unit name in both is an error (default off)")


def settings_of(args: argparse.Namespace) -> Settings:
    logging.disable(logging.ERROR)  # what the services would log is printed here as the result
    return build({"plugin_timeout": args.timeout, "plugin_user": args.plugin_user,
                  "allow_root_plugins": args.allow_root_plugins, "stock_plugins": args.stock_plugins}, FLAGS)


def register(sub: Any) -> None:  # sub: what argparse's add_subparsers() returned
    p = sub.add_parser("plugin", help="check or run plugins locally (a test loop without a cluster)",
                       description="Load plugins in the sandbox, as the services do, to check or run them "
                                   "(docs/plugins.md, 'Testing a plugin').")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    c = verbs.add_parser("check", help="list the units of a plugin file or folder; exit 1 on any error",
                         description="Load the plugins of PATH (a file or a folder) in the sandbox and list every "
                                     "unit with its kind, description, translated validation string and errors. "
                                     "Exits 1 on any error (load error, bad validation, duplicate unit, no units), "
                                     "so it can run in CI or as a Helm test hook.")
    c.add_argument("path", type=Path, metavar="PATH", help="a plugin *.py file or a plugins folder")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    sandbox_options(c)
    c.set_defaults(func=cmd_check)
    r = verbs.add_parser("run", help="run one unit locally with the given hosts, VM, properties and facts",
                         description="Run one unit in the sandbox, as a service would, and print what it returned "
                                     "as JSON on stdout (its stderr goes to stderr). Exits 1 if the call failed or "
                                     "returned something the service would refuse.")
    r.add_argument("unit", metavar="UNIT", help="the unit (class) name")
    r.add_argument("--plugins", type=Path, metavar="DIR", help="plugins folder (default: the stock plugins)")
    r.add_argument("--kind", choices=[k.value for k in Kind], help="when UNIT has several kinds")
    r.add_argument("--hosts", metavar="ID,...", help="host IDs (default: the hosts of --facts)")
    r.add_argument("--vm", default="", metavar="ID", help="the VM ID (filter and score units)")
    r.add_argument("--prop", action="append", default=[], metavar="K=V", help="a cluster policy property; repeat")
    r.add_argument("--facts", type=Path, metavar="FILE",
                   help="host facts, YAML or JSON: {hosts: {ID: {memory_free_mib: ..., ...}}, vm: {...}}")
    sandbox_options(r)
    r.set_defaults(func=cmd_run)
