"""``vmsched agent``: start the policy agent and its metrics listener, run until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from vmsched import metrics as service_metrics
from vmsched.bus.transport import open_transport
from vmsched.tls import server_context
from vmsched.tokens import Role, TokenStore, bearer_authorizer

from .agent import Agent
from .errors import AgentError
from .surfaces.cli import EXIT
from .tuners.config import TunerConfig


def serve(args: argparse.Namespace) -> int:
    """``vmsched agent``: run the agent until SIGTERM or SIGINT."""
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    transport = open_transport(args.agent_amqp) if args.agent_amqp is not None else None  # the bus is optional
    agent = Agent(args.libvirt, args.host_id, args.state_dir, transport, dedicated_pool=args.dedicated_pool,
                  socket_path=args.socket, reconcile_interval=args.reconcile_interval,
                  release_on_stop=args.release_on_stop, connect_timeout=args.connect_timeout,
                  lock_dir=args.lock_dir, facts_interval=args.facts_interval,
                  tuner=config_from_args(args))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        agent.start()
    except AgentError as exc:
        print(f"vmsched agent: error: {exc}", file=sys.stderr)
        return EXIT.get(exc.code, 1)
    try:
        tls = server_context(args.metrics_tls_cert, args.metrics_tls_key, what="metrics TLS")
        authorize = (bearer_authorizer(TokenStore(args.metrics_tokens_file).watch(), Role.READ)
                     if args.metrics_tokens_file else None)
        service_metrics.serve(args.metrics_port, args.metrics_host, tls=tls, authorize=authorize)
    except (OSError, ValueError) as exc:
        agent.stop()
        print(f"vmsched agent: error: metrics listener: {exc}", file=sys.stderr)
        return 2
    stop.wait()
    agent.stop()
    return 0

def config_from_args(args: Any) -> TunerConfig:
    config = TunerConfig(interval=args.tune_interval, hysteresis=args.tune_hysteresis, max_changes=args.tune_max_changes,
                         max_guest_changes=args.tune_max_guest_changes, dry_run=args.tune_dry_run,
                         plugins_dir=args.tuner_plugins or None)
    problems = config.problems()
    if config.plugins_dir and not Path(config.plugins_dir).is_dir():
        problems.append(f"--tuner-plugins {config.plugins_dir}: not a folder")
    if problems:
        raise SystemExit(f"vmsched agent: error: {'; '.join(problems)}")
    return config
