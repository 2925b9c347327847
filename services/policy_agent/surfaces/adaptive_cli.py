"""The command-line parts of adaptive policy: a guest's ``adaptive`` bounds on ``vmsched policy set`` and the
host's tuner on ``vmsched agent`` (docs/policy-agent.md, "Adaptive policy")."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import PolicyError


def add_policy_options(s: argparse.ArgumentParser) -> None:
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


def _range(text: str, option: str, kind: type) -> list[Any]:
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return [kind(lo), kind(hi)]
    except ValueError:
        raise PolicyError(f"{option} {text!r}: expected MIN:MAX, e.g. {'512:4096' if kind is int else '20:80'}") \
            from None


def merge_adaptive(args: argparse.Namespace, data: dict[str, Any]) -> None:
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


def add_agent_options(p: argparse.ArgumentParser) -> None:
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
