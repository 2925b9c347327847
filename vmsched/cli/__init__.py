"""The ``vmsched`` command line.

Every option of every command has an environment variable, named in its
``--help`` (:mod:`vmsched.cli.env`); flags win over the environment.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from pathlib import Path

from vmsched import __version__, logs
from vmsched.bus.options import url_argument
from vmsched.cli.env import EnvParser
from vmsched.cli.settings import broker_origin, build, flag
from vmsched.config import DEFAULT_AMQP_URL, MEMORY_URL, Settings
from vmsched.services.balancer import BalancerService
from vmsched.services.discovery import DiscoveryService
from vmsched.services.policy_agent.surfaces.cli import register as register_agent_commands
from vmsched.services.scoring import ScoringService
from vmsched.cli.plugin import register as register_plugin_commands
from vmsched.cli.replay import register as register_replay_command
from vmsched.cli.secret import register as register_secret_command
from vmsched.cli.token import register as register_token_commands


#: The settings each group of options sets, in the order of their --help (each option: :func:`_options`).
BUS = ("amqp_url_file", "amqp_ca", "amqp_cert", "amqp_key", "delivery_limit")
COMMON = ("log_level", "log_format", "connect_timeout", "confirm_timeout", "reconnect_max_delay")
PLUGINS = ("plugins_dir", "stock_plugins", "pool_size", "pool_min", "pool_max", "pool_idle", "plugin_bundle_ms",
           "plugin_timeout", "plugin_timeouts", "plugin_memory_mb", "plugin_cpu_seconds", "plugin_max_output",
           "rescan_interval", "plugin_user", "allow_root_plugins", "plugin_network", "plugin_max_procs",
           "plugin_max_files", "plugin_max_file_mb", "plugin_write_dirs", "plugin_env", "consumers", "prefetch",
           "runtime_dir")
GATEWAY = ("host", "port", "request_timeout", "max_body_bytes", "max_hosts", "score_per_unit", "max_units",
           "max_string", "header_timeout", "body_timeout", "tls_cert", "tls_key", "tls_client_ca", "engine_allow",
           "console_secret_file", "decisions_size", "decisions_share", "decisions_log", "gateway_id",
           "console_session_ttl", "whatif_reports")
TOKENS = ("tokens_file",)
FACTS = ("facts", "facts_max_age", "facts_host_map", "engine_link_file", "engine_link_ca", "engine_link_timeout",
         "engine_link_ttl", "engine_link_wait")
RECORD = ("record", "record_max_mb")  # the gateway also takes record_omit (its calls carry the properties)
SHADOW = ("shadow", "shadow_rate", "shadow_factors", "shadow_drop", "shadow_queue", "shadow_workers")
METRICS = ("metrics_host", "metrics_tls_cert", "metrics_tls_key", "metrics_auth")

#: The metavar of a setting's option, by its type; METAVARS: the settings whose metavar says more.
METAVAR_OF = {int: "N", float: "S", Path: "PEM"}
METAVARS = {
    "amqp_url_file": "FILE", "log_level": "LEVEL", "log_format": "text|json", "plugins_dir": "DIR",
    "plugin_bundle_ms": "MS", "plugin_timeouts": "UNIT=S,...", "plugin_memory_mb": "MIB", "plugin_cpu_seconds": "S",
    "plugin_max_output": "BYTES", "plugin_user": "USER", "plugin_max_file_mb": "MIB", "plugin_write_dirs": "DIR,...",
    "plugin_env": "NAME,...", "runtime_dir": "DIR", "host": "ADDR", "port": "PORT", "engine_allow": "CIDR,...",
    "console_secret_file": "FILE", "gateway_id": "NAME", "whatif_reports": "DIR", "tokens_file": "YAML",
    "facts_host_map": "FILE", "engine_link_file": "YAML", "record": "DIR", "record_max_mb": "MIB",
    "record_omit": "KEY,...", "shadow": "DIR", "shadow_rate": "SHARE", "shadow_factors": "UNIT=N,...",
    "shadow_drop": "UNIT,...", "metrics_host": "ADDR",
}


def _options(p: argparse.ArgumentParser, fields: tuple[str, ...]) -> None:
    """An option for each setting of ``fields``: its flag, with the setting's description as its help
    (:class:`~vmsched.config.Settings`); a switch for a boolean, ``--no-FLAG`` too when it is on by default."""
    for field in fields:
        info = Settings.model_fields[field]
        if info.annotation is bool:
            action = argparse.BooleanOptionalAction if info.default else "store_true"
            p.add_argument(flag(field), dest=field, action=action, default=None, help=info.description)
            continue
        types = (info.annotation, *typing.get_args(info.annotation))
        metavar = METAVARS.get(field) or next(METAVAR_OF[t] for t in types if t in METAVAR_OF)
        p.add_argument(flag(field), dest=field, type=Path if Path in types else None, metavar=metavar,
                       help=info.description)


def _bus(p: argparse.ArgumentParser, default_note: str = f"default {DEFAULT_AMQP_URL}") -> None:
    p.add_argument("--amqp", dest="amqp_url", metavar="URL", type=url_argument,
                   help=f"AMQP broker URL without a password, or memory:// for the embedded bus (env VMSCHED_AMQP_URL, "
                        f"which may hold one; {default_note})")
    _options(p, BUS)


def _metrics(p: argparse.ArgumentParser, default: str = "off") -> None:
    p.add_argument("--metrics-port", metavar="PORT",
                   help=f"serve Prometheus /metrics, /healthz, /readyz on this port (env VMSCHED_METRICS_PORT; default {default})")
    _options(p, METRICS)


def settings_from(args: argparse.Namespace) -> Settings:
    """The command's settings: its flags, the environment, the defaults (SettingsError: what is wrong)."""
    return build({k: v for k, v in vars(args).items() if k in Settings.model_fields})


def run_settings(args: argparse.Namespace) -> Settings:
    """The all-in-one's settings: the embedded bus unless a flag or the environment names a broker."""
    settings = settings_from(args)
    if "amqp_url" not in settings.model_fields_set and settings.amqp_url_file is None:
        settings = settings.model_copy(update={"amqp_url": MEMORY_URL})
    return settings


def _start(args: argparse.Namespace) -> int:
    """Start what the command names: ``run`` (the all-in-one), ``gateway`` or a service."""
    from vmsched.cli import runner

    name = args.command
    settings = run_settings(args) if name == "run" else settings_from(args)
    logs.setup(settings.log_level, settings.log_format)
    origin = broker_origin(vars(args))
    if name == "run":
        return runner.run_all_in_one(settings, origin)
    if name == "gateway":
        return runner.run_gateway(settings, origin)
    return runner.run_service(name, settings, origin)


def build_parser() -> argparse.ArgumentParser:
    parser = EnvParser(
        prog="vmsched",
        description="vmsched: VM placement for oVirt (an external-scheduler drop-in) and a libvirt CPU policy agent.",
    )
    parser.add_argument("--version", action="version", version=f"vmsched {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("run", help="all-in-one: gateway + discovery + scoring + balancer in one process",
                       description="Run the gateway and the discovery, scoring and balancer services in one process, "
                                   "on the embedded in-memory bus unless --amqp is given.")
    _bus(p, "default here: memory://, the embedded bus")
    _options(p, GATEWAY + TOKENS + FACTS)
    _metrics(p, "9100")
    _options(p, PLUGINS + RECORD + ("record_omit",) + SHADOW + COMMON)
    p.set_defaults(func=_start)

    p = sub.add_parser("gateway", help="the XML-RPC/JSON gateway (publishes requests to the bus)",
                       description="Serve the engine's XML-RPC at / and /RPC2, the JSON API at /v1, "
                                   "/healthz and /readyz (/metrics on its own listener); requests go to the services over AMQP.")
    _bus(p)
    _options(p, GATEWAY + TOKENS + FACTS)
    _metrics(p, "9100")
    _options(p, RECORD + ("record_omit",) + COMMON)
    p.set_defaults(func=_start)

    for name, service, what in (("discovery", DiscoveryService, "the plugin catalog service"),
                                ("scoring", ScoringService, "the filter and score service"),
                                ("balancer", BalancerService, "the load-balancing service")):
        queues = ", ".join(service.QUEUES)
        text = f"{what} (queue{'s' if len(service.QUEUES) > 1 else ''} {queues})"
        p = sub.add_parser(name, help=text, description=f"Run {text} over AMQP.")
        _bus(p)
        _options(p, PLUGINS)
        _metrics(p)
        _options(p, TOKENS + FACTS + (RECORD + SHADOW if service.runs_units else ()) + COMMON)
        p.set_defaults(func=_start)

    register_agent_commands(sub, _serve_agent)
    register_token_commands(sub)
    register_plugin_commands(sub)
    register_replay_command(sub)
    register_secret_command(sub)
    parser.name_variables()
    return parser


def _serve_agent(args: argparse.Namespace) -> int:
    # deferred: only the agent itself needs libvirt-python (the `agent` extra)
    try:
        from vmsched.services.policy_agent.serve import serve
    except ImportError as exc:
        print(f"vmsched agent: error: {exc} (install vmsched[agent])", file=sys.stderr)
        return 2
    return serve(args)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)  # --help writes too
        return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader went away (`vmsched policy cpus | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        # bad settings or paths: say what is wrong (a line per problem), no traceback
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"vmsched: error: {line}", file=sys.stderr)
        return 2

