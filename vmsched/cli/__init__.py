"""The ``vmsched`` command line.

Every option of every command has an environment variable, named in its
``--help`` (:mod:`vmsched.cli.env`); flags win over the environment.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from vmsched import __version__, logs
from vmsched.bus.options import url_argument
from vmsched.cli.env import EnvParser
from vmsched.cli.settings import broker_origin, build
from vmsched.config import DEFAULT_AMQP_URL, MEMORY_URL, Settings
from vmsched.services.balancer import BalancerService
from vmsched.services.discovery import DiscoveryService
from vmsched.services.policy_agent.surfaces.cli import register as register_agent_commands
from vmsched.services.scoring import ScoringService
from vmsched.cli.plugin import register as register_plugin_commands
from vmsched.cli.replay import register as register_replay_command
from vmsched.cli.secret import register as register_secret_command
from vmsched.cli.token import register as register_token_commands

Command = Callable[[argparse.Namespace], int]


def _bus(p: argparse.ArgumentParser, default_note: str = f"default {DEFAULT_AMQP_URL}") -> None:
    p.add_argument("--amqp", dest="amqp_url", metavar="URL", type=url_argument,
                   help=f"AMQP broker URL without a password, or memory:// for the embedded bus (env VMSCHED_AMQP_URL, "
                        f"which may hold one; {default_note})")
    p.add_argument("--amqp-url-file", type=Path, metavar="FILE",
                   help="file holding the broker URL with its password (env VMSCHED_AMQP_URL_FILE)")
    p.add_argument("--amqp-ca", type=Path, metavar="PEM", help="amqps: CA of the broker's certificate (default: the system's)")
    p.add_argument("--amqp-cert", type=Path, metavar="PEM", help="amqps: client certificate chain")
    p.add_argument("--amqp-key", type=Path, metavar="PEM", help="amqps: the client certificate's private key")
    p.add_argument("--delivery-limit", metavar="N",
                   help="deliveries of a scheduling request at most before it is dead-lettered and answered with an error; "
                        "the same on the gateway and the services (env VMSCHED_DELIVERY_LIMIT; default 2)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR (env VMSCHED_LOG_LEVEL; default INFO)")
    p.add_argument("--log-format", metavar="text|json",
                   help="every log line, audit lines included, as text or as one JSON object (env VMSCHED_LOG_FORMAT; "
                        "default text)")
    p.add_argument("--connect-timeout", metavar="S", help="broker connect timeout in seconds (default 2)")
    p.add_argument("--confirm-timeout", metavar="S",
                   help="how long a publish waits for the broker's confirm; a broker that answers nothing that "
                        "long is taken as gone and another connection opened, seconds (default 2)")
    p.add_argument("--reconnect-max-delay", metavar="S",
                   help="longest wait between two attempts to reach the broker, seconds (default 2)")


def _plugins(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugins", dest="plugins_dir", type=Path, metavar="DIR",
                   help="plugins folder, top-level *.py files (env VMSCHED_PLUGINS or OSCHEDPROXY_PLUGINS; "
                        "default: the stock plugins shipped with vmsched, which a folder given replaces)")
    p.add_argument("--stock-plugins", action="store_true", default=None,
                   help="keep the stock plugins beside --plugins DIR: both folders are loaded, DIR first; a module "
                        "or unit name in both is a load error (default off)")
    p.add_argument("--pool-size", metavar="N",
                   help="a fixed number of plugin worker processes per service (sets --pool-min and --pool-max)")
    p.add_argument("--pool-min", metavar="N", help="plugin worker processes a service keeps when idle (default 1)")
    p.add_argument("--pool-max", metavar="N",
                   help="most plugin worker processes per service; more start while calls queue (default 4)")
    p.add_argument("--pool-idle", metavar="S",
                   help="seconds a plugin worker above --pool-min may stay idle before it stops (default 60)")
    p.add_argument("--plugin-bundle-ms", metavar="MS",
                   help="the units of a request share one plugin worker while their mean run time together stays "
                        "under this (default 2); 0: each unit on its own worker")
    p.add_argument("--plugin-timeout", metavar="S", help="default timeout of one plugin call in seconds (default 10)")
    p.add_argument("--plugin-timeouts", metavar="UNIT=S,...", help="per-unit timeouts, e.g. 'SlowFilter=30,Quick=2'")
    p.add_argument("--plugin-memory-mb", metavar="MIB", help="address-space limit of a plugin worker (default 1024)")
    p.add_argument("--plugin-cpu-seconds", metavar="S", help="CPU-time limit of one plugin call (default 30)")
    p.add_argument("--plugin-max-output", metavar="BYTES", help="largest stdout a plugin call may print (default 1048576)")
    p.add_argument("--rescan-interval", metavar="S", help="plugins folder rescan period in seconds (default 1)")
    p.add_argument("--plugin-user", metavar="USER", help="user plugin workers run as when the service is root (default vmsched-plugin, else nobody)")
    p.add_argument("--allow-root-plugins", action="store_true", default=None,
                   help="if the switch to --plugin-user is impossible, run plugins as root without capabilities instead of refusing")
    p.add_argument("--plugin-network", action="store_true", default=None, help="let plugins open network sockets (default: off)")
    p.add_argument("--plugin-max-procs", metavar="N", help="RLIMIT_NPROC of a plugin worker (default 256)")
    p.add_argument("--plugin-max-files", metavar="N", help="RLIMIT_NOFILE of a plugin worker (default 256)")
    p.add_argument("--plugin-max-file-mb", metavar="MIB", help="RLIMIT_FSIZE of a plugin worker (default 64)")
    p.add_argument("--plugin-write-dirs", metavar="DIR,...", help="directories plugins may write besides a private temporary one (default: none)")
    p.add_argument("--plugin-env", metavar="NAME,...", help="extra environment variables passed to plugins (default: none beyond PATH, LANG, LC_*, TZ)")
    p.add_argument("--consumers", metavar="N", help="consumer threads per service (default 2)")
    p.add_argument("--prefetch", metavar="N", help="unacknowledged requests per consumer (default 8)")
    p.add_argument("--runtime-dir", type=Path, metavar="DIR",
                   help="runtime directory kept across restarts, for the in-flight journal (env VMSCHED_RUNTIME_DIR; "
                        "default: systemd's $RUNTIME_DIRECTORY, else vmsched-<uid> in the temporary directory)")


def _gateway(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", metavar="ADDR", help="listen address (env VMSCHED_HOST; default 127.0.0.1)")
    p.add_argument("--port", metavar="PORT", help="listen port (env VMSCHED_PORT; default 18781)")
    p.add_argument("--request-timeout", metavar="S",
                   help="deadline of one scheduling request in seconds (default 30; the engine waits 120)")
    p.add_argument("--max-body-bytes", metavar="N", help="largest request body accepted (default 1048576)")
    p.add_argument("--max-hosts", metavar="N", help="most host IDs in one scheduling request (default 10000)")
    p.add_argument("--score-per-unit", action="store_true", default=None,
                   help="score replies as [host, weight, unit] per unit, factored by the engine "
                        "(env VMSCHED_SCORE_PER_UNIT; default off: one total per host; docs/plugins.md)")
    p.add_argument("--max-units", metavar="N", help="most plugin units in one scheduling request (default 200)")
    p.add_argument("--max-string", metavar="N",
                   help="longest string in a scheduling request: ID, unit name, property (default 4096 characters)")
    p.add_argument("--header-timeout", metavar="S",
                   help="close a connection whose request headers take longer (default 10 s; 408 if it sent some)")
    p.add_argument("--body-timeout", metavar="S", help="answer 408 to a request whose body takes longer (default 30 s)")
    p.add_argument("--tls-cert", type=Path, metavar="PEM",
                   help="serve HTTPS with this certificate chain (reloaded when the file changes; env VMSCHED_TLS_CERT)")
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's private key (env VMSCHED_TLS_KEY)")
    p.add_argument("--tls-client-ca", type=Path, metavar="PEM",
                   help="accept client certificates signed by this CA, mapped to roles by the tokens file's clients: list")
    p.add_argument("--engine-allow", metavar="CIDR,...",
                   help="only these networks may call XML-RPC POST / and /RPC2 (env VMSCHED_ENGINE_ALLOW; default: any)")
    p.add_argument("--console-secret-file", type=Path, metavar="FILE",
                   help="the secret that signs console sessions, the same file on every gateway replica "
                        "(`vmsched console-secret` makes one; env VMSCHED_CONSOLE_SECRET_FILE; default: a random "
                        "secret of this process)")
    p.add_argument("--decisions-size", metavar="N",
                   help="scheduling decisions kept per operation for GET /v1/decisions and the console "
                        "(default 200; 0: no decision log)")
    p.add_argument("--decisions-share", action=argparse.BooleanOptionalAction, default=None,
                   help="on RabbitMQ, GET /v1/decisions and the console also ask the other gateway replicas "
                        "(default on; --no-decisions-share: this gateway's decisions only)")
    p.add_argument("--decisions-log", action="store_true", default=None,
                   help="also write each decision as one JSON line to stdout, for Loki or ELK (default off)")
    p.add_argument("--gateway-id", metavar="NAME",
                   help="this gateway's label in decision records (default: the host name)")
    p.add_argument("--console-session-ttl", metavar="S",
                   help="how long a console session lasts (env VMSCHED_CONSOLE_SESSION_TTL; default 28800 s, 8 h)")
    p.add_argument("--whatif-reports", type=Path, metavar="DIR",
                   help="a folder of `vmsched replay --json` reports (*.json) the console's what-if view lists "
                        "(default: none; docs/console.md)")


def _tokens(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens-file", type=Path, metavar="YAML",
                   help="hashed bearer tokens and their roles, re-read when it changes (env VMSCHED_TOKENS_FILE; "
                        "`vmsched token new` makes one; docs/api-auth.md)")


def _facts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--facts", action=argparse.BooleanOptionalAction, default=None,
                   help="keep a host facts cache fed by the policy agents, for the plugins, /v1/facts and the "
                        "decisions (default on; --no-facts: none)")
    p.add_argument("--facts-max-age", metavar="S",
                   help="host facts older than this are stale (env VMSCHED_FACTS_MAX_AGE; default 3 agent intervals)")
    p.add_argument("--facts-host-map", type=Path, metavar="FILE",
                   help="engine host ID = agent host ID lines, for agents not started with the engine's ID (docs/facts.md)")
    p.add_argument("--engine-link-file", type=Path, metavar="YAML",
                   help="the optional, read-only engine link: a file with url, username and password of the engine's "
                        "REST API, to map engine host IDs by hw_id and to learn a starting VM's memory and vCPUs "
                        "(env VMSCHED_ENGINE_LINK_FILE; docs/facts.md)")
    p.add_argument("--engine-link-ca", type=Path, metavar="PEM", help="CA of the engine's HTTPS certificate (default: the system's)")
    p.add_argument("--engine-link-timeout", metavar="S", help="timeout of one engine REST call (default 5)")
    p.add_argument("--engine-link-ttl", metavar="S", help="how long the engine link keeps an answer (default 300)")
    p.add_argument("--engine-link-wait", metavar="S",
                   help="how long a call waits for the link's first answer about a VM (default 0.5; 0: never)")


def _record(p: argparse.ArgumentParser, gateway: bool = True) -> None:
    p.add_argument("--record", type=Path, metavar="DIR",
                   help="record the engine's calls and what their units could read in DIR, for `vmsched replay` "
                        "(default: off; docs/testing-policies.md)")
    p.add_argument("--record-max-mb", metavar="MIB", help="most MiB of recordings in DIR (default 1024)")
    if gateway:
        p.add_argument("--record-omit", metavar="KEY,...", help="property keys left out of the recording (secrets)")


def _shadow(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shadow", type=Path, metavar="DIR",
                   help="run the candidate plugins folder DIR beside the live policy on live calls, after each "
                        "reply, and compare (never answered; default: off; docs/testing-policies.md)")
    p.add_argument("--shadow-rate", metavar="SHARE", help="share of live calls the candidate runs, 0-1 (default 1)")
    p.add_argument("--shadow-factors", metavar="UNIT=N,...", help="score units whose factor the candidate changes")
    p.add_argument("--shadow-drop", metavar="UNIT,...", help="units the candidate leaves out")
    p.add_argument("--shadow-queue", metavar="N", help="calls waiting for the candidate at most; more are shed "
                                                       "(default 16)")
    p.add_argument("--shadow-workers", metavar="N", help="the candidate's plugin workers (default 1)")


def _metrics(p: argparse.ArgumentParser, default: str = "off") -> None:
    p.add_argument("--metrics-port", metavar="PORT",
                   help=f"serve Prometheus /metrics, /healthz, /readyz on this port (env VMSCHED_METRICS_PORT; default {default})")
    p.add_argument("--metrics-host", metavar="ADDR", help="metrics listen address (env VMSCHED_METRICS_HOST; default 127.0.0.1)")
    p.add_argument("--metrics-tls-cert", type=Path, metavar="PEM", help="serve metrics over HTTPS with this certificate")
    p.add_argument("--metrics-tls-key", type=Path, metavar="PEM", help="the metrics certificate's private key")
    p.add_argument("--metrics-auth", action="store_true", default=None,
                   help="/metrics requires a bearer token with the read role (needs --tokens-file; env VMSCHED_METRICS_AUTH)")


def settings_from(args: argparse.Namespace) -> Settings:
    """The command's settings: its flags, the environment, the defaults (SettingsError: what is wrong)."""
    return build({k: v for k, v in vars(args).items() if k in Settings.model_fields})


def run_settings(args: argparse.Namespace) -> Settings:
    """The all-in-one's settings: the embedded bus unless a flag or the environment names a broker."""
    settings = settings_from(args)
    if "amqp_url" not in settings.model_fields_set and settings.amqp_url_file is None:
        settings = settings.model_copy(update={"amqp_url": MEMORY_URL})
    return settings


def _command(name: str) -> Command:
    """The command that starts ``name``: ``run`` (the all-in-one), ``gateway`` or a service."""

    def command(args: argparse.Namespace) -> int:
        from vmsched.cli import runner

        settings = run_settings(args) if name == "run" else settings_from(args)
        logs.setup(settings.log_level, settings.log_format)
        origin = broker_origin(vars(args))
        if name == "run":
            return runner.run_all_in_one(settings, origin)
        if name == "gateway":
            return runner.run_gateway(settings, origin)
        return runner.run_service(name, settings, origin)

    return command


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
    _gateway(p)
    _tokens(p)
    _facts(p)
    _metrics(p, "9100")
    _plugins(p)
    _record(p)
    _shadow(p)
    _common(p)
    p.set_defaults(func=_command("run"))

    p = sub.add_parser("gateway", help="the XML-RPC/JSON gateway (publishes requests to the bus)",
                       description="Serve the engine's XML-RPC at / and /RPC2, the JSON API at /v1, "
                                   "/healthz and /readyz (/metrics on its own listener); requests go to the services over AMQP.")
    _bus(p)
    _gateway(p)
    _tokens(p)
    _facts(p)
    _metrics(p, "9100")
    _record(p)
    _common(p)
    p.set_defaults(func=_command("gateway"))

    for name, service, what in (("discovery", DiscoveryService, "the plugin catalog service"),
                                ("scoring", ScoringService, "the filter and score service"),
                                ("balancer", BalancerService, "the load-balancing service")):
        queues = ", ".join(service.QUEUES)
        text = f"{what} (queue{'s' if len(service.QUEUES) > 1 else ''} {queues})"
        p = sub.add_parser(name, help=text, description=f"Run {text} over AMQP.")
        _bus(p)
        _plugins(p)
        _metrics(p)
        _tokens(p)
        _facts(p)
        if service.runs_units:
            _record(p, gateway=False)
            _shadow(p)
        _common(p)
        p.set_defaults(func=_command(name))

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

