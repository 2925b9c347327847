"""Command line of the policy agent: ``vmsched agent``, ``vmsched policy ...``, ``vmsched domain ...``.

``register(subparsers)`` adds the commands to the main ``vmsched`` parser.
Client commands print what a person reads (a table, a drawing or a few lines:
:mod:`tables`), the reply as JSON with ``--json``; exit codes: 0 ok,
1 refused or invalid, 2 usage, 3 agent or bus unreachable, 4 guest not found.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from vmsched import cpuset
from vmsched.agent_contract import AgentOp
from vmsched.bus.options import BusOptions, read_url_file, url_argument
from vmsched.messages import ErrorCode

from ..errors import AgentError, PolicyError
from ..policy.model import GuestPolicy, parse_policy, policy_document
from . import tables
from .client import SocketClient, call_bus

DEFAULT_SOCKET = "/run/vmsched/agent.sock"
SOCKET_HINT = "is 'vmsched agent' running? Give its socket with --socket PATH or env VMSCHED_AGENT_SOCKET"
EXIT = {"ok": 0, ErrorCode.INVALID.value: 1, ErrorCode.INTERNAL.value: 1, ErrorCode.UNSUPPORTED_VERSION.value: 1,
        "usage": 2, ErrorCode.UNAVAILABLE.value: 3, ErrorCode.NOT_FOUND.value: 4}

CPUSET_HELP = "CPU sets use libvirt's syntax: '0-3,^2,6' (ranges, exclusions with ^, commas)."


def show_defaults(parser: Any) -> None:
    """Add '(default: ...)' to the help of every option of ``parser`` and its sub-commands that has a meaningful
    default (the root ``vmsched`` parser keeps the options and sub-commands it is given: vmsched.cli.env)."""
    for action in getattr(parser, "options", ()):
        if action.default not in (None, False, [], argparse.SUPPRESS) and action.help \
                and "%(default)" not in action.help:
            action.help += " (default: %(default)s)"
    for child in getattr(parser, "commands", {}).values():
        show_defaults(child)


def register(subparsers: Any, serve: Callable[[argparse.Namespace], int]) -> None:
    """Add ``agent``, ``policy`` and ``domain`` to the ``vmsched`` command line.

    ``serve`` runs the agent (``vmsched agent``); the entry layer passes it in, so
    the client commands never load the agent or libvirt.
    """
    for parser in (_agent_parser(subparsers, serve), _policy_parser(subparsers), _domain_parser(subparsers)):
        show_defaults(parser)


# --- vmsched agent -----------------------------------------------------------------
def _agent_parser(sub: Any, serve: Callable[[argparse.Namespace], int]) -> Any:
    p = sub.add_parser(
        "agent", help="the per-hypervisor CPU policy agent (libvirt events, pinning, pools, dependencies)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the policy agent of this hypervisor. It follows libvirt domain events, applies each "
                    "guest's CPU policy (stored in the guest's own metadata) to its persistent config and live, "
                    "repairs drift, keeps every other guest off dedicated CPUs, and answers policy requests on a "
                    "local UNIX socket and, with --amqp, on the bus queue vmsched.agent.<host-id>.\n\n" + CPUSET_HELP,
    )
    p.add_argument("--libvirt", metavar="URI", default=os.environ.get("VMSCHED_AGENT_LIBVIRT", "qemu:///system"),
                   help="libvirt connection URI (env VMSCHED_AGENT_LIBVIRT)")
    p.add_argument("--host-id", metavar="ID", default=os.environ.get("VMSCHED_AGENT_HOST_ID"),
                   help="this host's ID on the bus (env VMSCHED_AGENT_HOST_ID; default: libvirt's host UUID, "
                        "else its hostname)")
    _bus_options(p.add_argument_group("the bus (default: none, local socket only)"), "agent_amqp",
                 "serve policy requests and publish events on the bus")
    p.add_argument("--state-dir", metavar="DIR", type=Path, default=Path("/var/lib/vmsched/agent"),
                   help="folder of the agent's checkpoint (dedicated-pool allocations)")
    p.add_argument("--lock-dir", metavar="DIR", type=Path,
                   default=Path(os.environ.get("VMSCHED_AGENT_LOCK_DIR", "/run/libvirt/vmsched")),
                   help="host folder of the one-agent-per-libvirtd lock (agent-<host UUID>.lock); every agent on"
                        " a host must see the same folder (env VMSCHED_AGENT_LOCK_DIR)")
    p.add_argument("--socket", metavar="PATH", type=Path, default=Path(DEFAULT_SOCKET),
                   help="local UNIX socket for the CLI and the QEMU hook")
    p.add_argument("--dedicated-pool", metavar="CPUSET",
                   help="host CPUs reserved for guests with dedicated CPUs ('none' for no pool); every other "
                        "guest is kept on the remaining (shared) CPUs. Default: the pool in the checkpoint")
    p.add_argument("--reconcile-interval", metavar="S", type=float, default=10.0,
                   help="seconds between reconcile sweeps over all guests (covers missed events)")
    p.add_argument("--facts-interval", metavar="S", type=float,
                   default=float(os.environ.get("VMSCHED_AGENT_FACTS_INTERVAL", "5")),
                   help="publish host facts on the bus every S seconds and on guest lifecycle events; 0: off "
                        "(docs/facts.md)")
    p.add_argument("--release-on-stop", action="store_true",
                   help="release a guest's dedicated CPUs when it stops, not only when it is undefined")
    p.add_argument("--connect-timeout", metavar="S", type=float, default=300.0,
                   help="how long to keep retrying the first libvirt connection before giving up")
    p.add_argument("--metrics-port", metavar="PORT", type=int,
                   help="serve Prometheus metrics on this port (default: off)")
    p.add_argument("--metrics-host", metavar="ADDR", default=os.environ.get("VMSCHED_METRICS_HOST", "127.0.0.1"),
                   help="metrics listen address (env VMSCHED_METRICS_HOST; default 127.0.0.1)")
    p.add_argument("--metrics-tls-cert", metavar="PEM", type=Path, help="serve metrics over HTTPS with this certificate")
    p.add_argument("--metrics-tls-key", metavar="PEM", type=Path, help="the metrics certificate's private key")
    p.add_argument("--metrics-tokens-file", metavar="FILE", type=Path,
                   default=os.environ.get("VMSCHED_METRICS_TOKENS_FILE") or None,
                   help="require on /metrics a bearer token with the read role from this tokens file (the "
                        "gateway's format, docs/api-auth.md; re-read when it changes; env "
                        "VMSCHED_METRICS_TOKENS_FILE; default: /metrics open, /healthz and /readyz always open)")
    p.add_argument("--log-level", metavar="LEVEL", default=os.environ.get("VMSCHED_LOG_LEVEL", "INFO"),
                   help="DEBUG, INFO, WARNING or ERROR")
    g = p.add_argument_group("adaptive policy: the tuners (docs/policy-agent.md)")
    env = os.environ.get
    g.add_argument("--tune-interval", metavar="S", type=float, default=float(env("VMSCHED_AGENT_TUNE_INTERVAL", "10")),
                   help="seconds between tuner runs over the guests with an adaptive block; 0: off")
    g.add_argument("--tune-hysteresis", metavar="K", type=int, default=3,
                   help="a condition must hold for K intervals in a row before a tuner acts on it")
    g.add_argument("--tune-max-changes", metavar="N", type=int, default=4,
                   help="at most N changes per interval on the host")
    g.add_argument("--tune-max-guest-changes", metavar="N", type=int, default=1,
                   help="at most N changes per guest per interval")
    g.add_argument("--tune-dry-run", action="store_true",
                   help="report what the tuners would change (log, metric, event, explain) and change nothing")
    g.add_argument("--tuner-plugins", metavar="DIR", default=env("VMSCHED_AGENT_TUNER_PLUGINS"),
                   help="folder of tuner plugins (NAME.py with class Tuner, do_tune(self, facts)), run in the plugin"
                        " sandbox like scheduling plugins (env VMSCHED_AGENT_TUNER_PLUGINS; default: none)")
    p.set_defaults(func=lambda args: _serve_with_bus(serve, args))
    return p


def _bus_options(g: Any, dest: str, what: str) -> None:
    g.add_argument("--amqp", dest=dest, metavar="URL", type=url_argument, default=None,
                   help=f"AMQP broker URL without a password: {what} (env VMSCHED_AGENT_AMQP, else VMSCHED_AMQP_URL, "
                        "which may hold one)")
    g.add_argument("--amqp-url-file", dest=f"{dest}_file", metavar="FILE", type=Path, default=None,
                   help="file holding the broker URL with its password (env VMSCHED_AGENT_AMQP_URL_FILE, else "
                        "VMSCHED_AMQP_URL_FILE)")
    g.add_argument("--amqp-ca", dest="amqp_ca", metavar="PEM", type=Path, default=None,
                   help="amqps: CA of the broker's certificate (env VMSCHED_AMQP_CA; default: the system's)")
    g.add_argument("--amqp-cert", dest="amqp_cert", metavar="PEM", type=Path, default=None,
                   help="amqps: client certificate chain (env VMSCHED_AMQP_CERT)")
    g.add_argument("--amqp-key", dest="amqp_key", metavar="PEM", type=Path, default=None,
                   help="amqps: the client certificate's private key (env VMSCHED_AMQP_KEY)")


def bus_options(args: argparse.Namespace, dest: str) -> BusOptions | None:
    """The broker of a command: its flags, else the environment; None for no bus.

    A URL with a password comes from a file or the environment only (``--amqp`` refuses one).
    """
    url, url_file = getattr(args, dest), getattr(args, f"{dest}_file")
    if url and url_file:
        raise ValueError("give the broker URL once: --amqp or --amqp-url-file")
    if not url and not url_file:
        url_file = os.environ.get("VMSCHED_AGENT_AMQP_URL_FILE") or os.environ.get("VMSCHED_AMQP_URL_FILE") or None
        url = None if url_file else (os.environ.get("VMSCHED_AGENT_AMQP") or os.environ.get("VMSCHED_AMQP_URL") or None)
    if url_file:
        url = read_url_file(url_file)
    if not url:
        return None
    ca = args.amqp_ca or os.environ.get("VMSCHED_AMQP_CA")
    cert = args.amqp_cert or os.environ.get("VMSCHED_AMQP_CERT")
    key = args.amqp_key or os.environ.get("VMSCHED_AMQP_KEY")
    return BusOptions(url=url, ca=Path(ca) if ca else None, cert=Path(cert) if cert else None,
                      key=Path(key) if key else None)


def _serve_with_bus(serve: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        args.agent_amqp = bus_options(args, "agent_amqp")
    except ValueError as exc:
        print(f"vmsched agent: error: {exc}", file=sys.stderr)
        return EXIT["usage"]
    return serve(args)


# --- client commands -------------------------------------------------------------------
def _client_options(p: argparse.ArgumentParser, timeout: float = 10.0) -> None:
    p.add_argument("--json", action="store_true", help="print the agent's reply as JSON instead of text for people")
    g = p.add_argument_group("where the agent is")
    g.add_argument("--socket", metavar="PATH", default=os.environ.get("VMSCHED_AGENT_SOCKET", DEFAULT_SOCKET),
                   help="UNIX socket of the local agent (env VMSCHED_AGENT_SOCKET)")
    g.add_argument("--host", dest="client_host", metavar="ID",
                   help="ask this host's agent over the bus instead of the local socket (broker: the options below, "
                        "else env VMSCHED_AMQP_URL_FILE or VMSCHED_AMQP_URL)")
    _bus_options(g, "client_amqp", "go through the bus instead of the local socket (needs --host)")
    g.add_argument("--timeout", metavar="S", type=float, default=timeout,
                   help="seconds to wait for the agent's answer")


def _policy_parser(sub: Any) -> Any:
    p = sub.add_parser("policy", help="set, show or delete guests' CPU policies and the host's pools",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Manage the CPU policy of guests through the policy agent of their host.\n\n"
                                   + CPUSET_HELP)
    ps = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)

    s = ps.add_parser("set", help="set (replace) a guest's policy", formatter_class=argparse.RawDescriptionHelpFormatter,
                      description="Validate and apply a guest's CPU policy. The policy built from --file and the "
                                  "options replaces the stored one (use --merge to start from the stored one). "
                                  "An invalid policy is refused whole with every reason; nothing is applied.\n\n"
                                  + CPUSET_HELP + "\n\nExample:\n  vmsched policy set db --dedicated 2 "
                                  "--weight 2048\n  vmsched policy set web --pin 0=0-1 --pin 1=2-3 --cap 50 "
                                  "--requires db")
    s.add_argument("guest", metavar="GUEST", help="guest name or UUID")
    s.add_argument("--pin", metavar="VCPU=CPUSET", action="append", default=[],
                   help="pin one vCPU to a pCPU set (repeat for several vCPUs), e.g. --pin 0=2-3")
    s.add_argument("--emulator-pin", metavar="CPUSET", help="pCPU set of the guest's emulator threads")
    s.add_argument("--dedicated", metavar="N|CPUSET",
                   help="dedicated pCPUs: a bare number N is a count the agent allocates from the host's "
                        "dedicated pool; anything else is an explicit CPU set (write 5-5 for the single CPU 5). "
                        "vCPUs are pinned 1:1 to them, emulator threads to the shared set")
    s.add_argument("--thread-policy", choices=("prefer", "require", "isolate"),
                   help="with --dedicated: prefer whole cores (default); require whole cores only; isolate: one "
                        "thread per core, its sibling threads held for this guest and given to nobody")
    s.add_argument("--numa", choices=("any", "strict"),
                   help="with --dedicated: any NUMA node, one where it fits (default); strict: every vCPU and the "
                        "memory in one node, refused otherwise")
    s.add_argument("--emulator", choices=("share", "isolate"),
                   help="with --dedicated: emulator threads on the shared set (default), or on one more dedicated CPU")
    s.add_argument("--weight", metavar="SHARES", type=int, help="CPU weight (libvirt cpu_shares, 2-262144)")
    cap = s.add_mutually_exclusive_group()
    cap.add_argument("--cap", metavar="PERCENT", type=float,
                     help="cap each vCPU at PERCENT of one CPU (0-100], with a 100000 us period unless --period")
    cap.add_argument("--quota", metavar="US", type=int,
                     help="vcpu_quota in microseconds per period (1000-17592186044415, or -1 for no cap)")
    s.add_argument("--period", metavar="US", type=int, help="vcpu_period in microseconds (1000-1000000)")
    s.add_argument("--requires", metavar="GUEST", action="append", default=[],
                   help="a guest that must be running before this one starts (repeat for several)")
    s.add_argument("--file", metavar="POLICY.yaml", type=Path,
                   help="read the policy from a YAML or JSON file (options given here override its fields)")
    s.add_argument("--merge", action="store_true", help="start from the guest's stored policy instead of an empty one")
    g = s.add_argument_group("adaptive bounds (the agent's tuners change the guest live within them)")
    g.add_argument("--adaptive-weight", metavar="MIN:MAX", help="weight range the tuners may set, e.g. 512:4096")
    g.add_argument("--adaptive-cap", metavar="MIN:MAX", help="cap range in percent the tuners may set, e.g. 20:80")
    g.add_argument("--may-move", action="store_true", default=None,
                   help="the tuners may move the guest's vCPUs within the shared CPU set (not with --dedicated)")
    g.add_argument("--target-wait", metavar="PERCENT", type=float,
                   help="keep the vCPUs' wait for a CPU below PERCENT of the interval (default 10)")
    g.add_argument("--keep-tuned", action="store_true", default=None,
                   help="tuned values also go to the persistent definition (default: live only, reset at restart)")
    g.add_argument("--no-adaptive", action="store_true", help="remove the adaptive block (with --merge)")
    _client_options(s)
    s.set_defaults(func=functools.partial(_run, op=AgentOp.SET_POLICY, body=_set_body))

    for name, op, text in (("get", AgentOp.GET_POLICY, "show a guest's policy, allocation, desired pins and status"),
                           ("delete", AgentOp.DELETE_POLICY, "remove a guest's policy, release its CPUs, unpin it"),
                           ("check-start", AgentOp.CHECK_START, "ask whether a guest may start now (what the QEMU "
                                                          "hook asks); exit 1 when it may not"),
                           ("explain", AgentOp.EXPLAIN_POLICY, "show a guest's static policy, the values the tuners "
                                                               "set and their last decisions with reasons"),
                           ("list", AgentOp.LIST_POLICIES, "list the guests that have a policy on the host"),
                           ("cpus", AgentOp.CPUS, "draw the host's sockets, NUMA nodes, cores and threads, and who "
                                                  "holds each CPU (the dedicated pool, shared set and allocations)"),
                           ("reconcile", AgentOp.RECONCILE, "run one reconcile sweep now and show what it repaired")):
        c = ps.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".", formatter_class=argparse.RawDescriptionHelpFormatter)
        if name not in ("list", "cpus", "reconcile"):
            c.add_argument("guest", metavar="GUEST", help="guest name or UUID")
        _client_options(c)
        c.set_defaults(func=functools.partial(_run, op=op))

    c = ps.add_parser("pool", help="set the host's dedicated pool (re-pins affected guests)",
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      description="Set the host's dedicated CPU pool. Count allocations move into the new pool; "
                                  "the change is refused whole when a guest's explicit dedicated set no longer fits. "
                                  "Running guests are re-pinned.\n\n" + CPUSET_HELP)
    c.add_argument("pool", metavar="CPUSET|none", help="the new dedicated pool, or 'none'")
    _client_options(c, timeout=60.0)
    c.set_defaults(func=functools.partial(_run, op=AgentOp.SET_POOL, body=_pool_body))
    return p


def _domain_parser(sub: Any) -> Any:
    p = sub.add_parser("domain", help="start or stop a guest together with its start dependencies",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Start a guest after the guests it requires, or stop it after the guests that "
                                   "require it (through the policy agent).")
    ds = p.add_subparsers(dest="domain_command", metavar="ACTION", required=True)
    s = ds.add_parser("start", help="start a guest's requirements (transitively, in order), then the guest",
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      description="Start every guest GUEST requires, transitively, in dependency order, waiting "
                                  "until each one runs, then GUEST itself.")
    s.add_argument("guest", metavar="GUEST", help="guest name or UUID")
    s.add_argument("--wait", metavar="S", type=float, default=60.0, help="seconds to wait for the guests to run")
    _client_options(s)
    s.set_defaults(func=lambda args: _run(args, AgentOp.START_DOMAIN, _domain_body, timeout=args.timeout + args.wait))
    t = ds.add_parser("stop", help="stop the guests that require a guest (dependents first), then the guest",
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      description="Shut down every guest that requires GUEST, transitively (dependents first), "
                                  "then GUEST itself.")
    t.add_argument("guest", metavar="GUEST", help="guest name or UUID")
    t.add_argument("--wait", metavar="S", type=float, default=60.0, help="seconds to wait for each shutdown")
    t.add_argument("--force", action="store_true", help="destroy a guest that has not shut down within --wait")
    _client_options(t)
    t.set_defaults(func=lambda args: _run(args, AgentOp.STOP_DOMAIN, _domain_body,
                                          timeout=args.timeout + 2 * args.wait + 30))
    return p


# --- running client commands --------------------------------------------------------------
def call(args: argparse.Namespace, op: AgentOp, body: dict, timeout: float | None = None) -> dict:
    timeout = args.timeout if timeout is None else timeout
    if args.client_amqp or args.client_amqp_file or args.client_host:
        if not args.client_host:
            raise _Usage("--amqp needs --host ID (the host whose agent to ask)")
        try:
            options = bus_options(args, "client_amqp")
        except ValueError as exc:
            raise _Usage(str(exc)) from None
        if options is None:
            raise _Usage("--host needs a broker: --amqp-url-file FILE, or env VMSCHED_AMQP_URL_FILE or VMSCHED_AMQP_URL")
        return call_bus(options, args.client_host, op, body, timeout)
    return SocketClient(args.socket, timeout=timeout, hint=SOCKET_HINT).call(op, body)


#: How a reply is shown to a person (without --json).
SHOW = {AgentOp.LIST_POLICIES: tables.policies, AgentOp.GET_POLICY: tables.policy, AgentOp.SET_POLICY: tables.policy,
        AgentOp.CPUS: tables.cpus, AgentOp.SET_POOL: tables.cpus, AgentOp.DELETE_POLICY: tables.deleted,
        AgentOp.RECONCILE: tables.reconciled, AgentOp.START_DOMAIN: tables.domains,
        AgentOp.STOP_DOMAIN: tables.domains, AgentOp.CHECK_START: tables.check_start,
        AgentOp.EXPLAIN_POLICY: tables.explain}


class _Usage(AgentError):
    code = "usage"


def _guest(args: argparse.Namespace) -> dict:
    return {"guest": args.guest} if "guest" in args else {}


def _run(args: argparse.Namespace, op: AgentOp, body: Callable[[argparse.Namespace], dict] = _guest,
         timeout: float | None = None) -> int:
    """Ask the agent (the request: ``body(args)``) and show its reply; the exit code."""
    try:
        result = call(args, op, body(args), timeout)
    except AgentError as exc:
        print(f"vmsched: error: {exc}", file=sys.stderr)
        return EXIT.get(exc.code, 1)
    if args.json:
        json.dump(result, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(SHOW[op](result))
    if op is AgentOp.CHECK_START and not result.get("allowed", True):
        print(f"vmsched: {result.get('message')}", file=sys.stderr)
        return 1
    return 0


def build_policy(args: argparse.Namespace, stored: dict | None = None) -> dict:
    """The policy document from --merge's stored policy, --file, then the options (later wins)."""
    data: dict[str, Any] = dict(stored or {})
    if args.file is not None:
        file_guest, file_policy = load_policy_file(args.file)
        if file_guest and file_guest != args.guest:
            raise PolicyError(f"{args.file} holds the policy of {file_guest!r}, not {args.guest!r}")
        data.update(file_policy.to_dict())
    if args.pin:
        pins = dict(data.get("vcpu_pins") or {})
        for item in args.pin:
            vcpu, sep, cpus = item.partition("=")
            if not sep or not vcpu.strip().isdigit():
                raise PolicyError(f"--pin {item!r}: expected VCPU=CPUSET, e.g. 0=2-3")
            pins[str(int(vcpu))] = cpus
        data["vcpu_pins"] = pins
    if args.dedicated is not None:
        d = args.dedicated.strip()
        data["dedicated"] = int(d) if d.isdigit() else d
    for key in ("emulator_pin", "thread_policy", "numa", "emulator", "weight", "period"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.cap is not None:
        data.pop("quota", None)
        data["cap_percent"] = args.cap
    if args.quota is not None:
        data.pop("cap_percent", None)
        data["quota"] = args.quota
    if args.requires:
        data["requires"] = list(dict.fromkeys([*data.get("requires", []), *args.requires]))
    _merge_adaptive(args, data)
    return policy_document(data)  # an invalid one goes to the agent, which reports every problem at once


def _range(text: str, option: str, kind: type) -> list[Any]:
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return [kind(lo), kind(hi)]
    except ValueError:
        raise PolicyError(f"{option} {text!r}: expected MIN:MAX, e.g. {'512:4096' if kind is int else '20:80'}") \
            from None


def _merge_adaptive(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """Apply the adaptive options to the policy document ``data`` (in place)."""
    if args.no_adaptive:
        data.pop("adaptive", None)
        return
    given = {"weight": _range(args.adaptive_weight, "--adaptive-weight", int) if args.adaptive_weight else None,
             "cap_percent": _range(args.adaptive_cap, "--adaptive-cap", float) if args.adaptive_cap else None,
             "may_move": args.may_move, "target_wait_percent": args.target_wait, "keep_on_restart": args.keep_tuned}
    given = {key: value for key, value in given.items() if value is not None}  # flags: True or not given
    if given:
        data["adaptive"] = {**(data.get("adaptive") or {}), **given}


def load_policy_file(path: str | Path) -> tuple[str | None, GuestPolicy]:
    """Read a YAML or JSON policy file: either the policy mapping itself, or
    ``{"guest": NAME, "policy": {...}}``. Returns (guest or None, policy)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {p}: {exc.strerror}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise PolicyError(f"policy file {p} is not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}") from None
    guest = None
    if isinstance(data, dict) and "policy" in data:
        if extra := set(data) - {"guest", "policy"}:
            raise PolicyError(f"policy file {p}: unknown top-level keys {sorted(extra)}")
        guest = data.get("guest")
        data = data["policy"]
    try:
        return (str(guest) if guest else None), parse_policy(data)
    except PolicyError as exc:
        raise PolicyError([f"{p}: {e}" for e in exc.errors]) from None


def _set_body(args: argparse.Namespace) -> dict:
    stored = call(args, AgentOp.GET_POLICY, {"guest": args.guest}).get("policy") or {} if args.merge else None
    return {"guest": args.guest, "policy": build_policy(args, stored)}


def _pool_body(args: argparse.Namespace) -> dict:
    if args.pool.strip().lower() == "none":
        return {"dedicated_pool": ""}
    try:
        return {"dedicated_pool": cpuset.normalize(args.pool)}
    except cpuset.CpuSetError as exc:
        raise PolicyError(f"dedicated pool: {exc}") from None


def _domain_body(args: argparse.Namespace) -> dict:
    return {"guest": args.guest, "wait": args.wait, **({"force": args.force} if "force" in args else {})}
