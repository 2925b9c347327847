"""``python -m vmsched.services.policy_agent ...``: the agent's commands without the rest of vmsched's CLI."""

from __future__ import annotations

import argparse
import sys

from .serve import serve
from .surfaces.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vmsched", description="vmsched policy agent commands")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register(sub, serve)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
