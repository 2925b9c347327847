"""What the deployment tests check configuration against: the real CLI and settings."""

from __future__ import annotations

import argparse
import re

import pytest

from tests.support.paths import ROOT
from vmsched.cli import build_parser
from vmsched.config import Settings


#: Environment variables the policy agent's command line reads (not Settings fields).
AGENT_ENV = set(re.findall(r'os\.environ\.get\("(VMSCHED_\w+)"',
                           (ROOT / "services" / "policy_agent" / "surfaces" / "cli.py").read_text()))


def parse_cli(args: list[str]) -> argparse.Namespace:
    """Parse ``args`` with the real ``vmsched`` parser; fail on options it does not know."""
    try:
        return build_parser().parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"`vmsched {' '.join(args)}` is rejected by the CLI (exit {exc.code})")


def settings_env_names() -> set[str]:
    """Every VMSCHED_* variable the Settings object reads."""
    names = set()
    prefix = Settings.model_config.get("env_prefix", "")
    for field_name, info in Settings.model_fields.items():
        choices = getattr(info.validation_alias, "choices", None)
        if choices:
            names |= {c.upper() for c in choices if isinstance(c, str) and c.upper() != field_name.upper()}
        else:
            names.add(f"{prefix}{field_name}".upper())
    return names
