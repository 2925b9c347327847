"""Every setting is a flag of the commands that use it, named with its environment variable in their --help."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from vmsched.cli.settings import flag, variables
from vmsched.config import Settings

GATEWAY = frozenset({"run", "gateway"})
SERVICES = frozenset({"run", "discovery", "scoring", "balancer"})
#: Settings only the gateway reads.
GATEWAY_ONLY = {"host", "port", "request_timeout", "max_body_bytes", "decisions_size", "decisions_share",
                "decisions_log", "gateway_id", "score_per_unit", "max_hosts", "max_units", "max_string",
                "header_timeout", "body_timeout", "tls_cert", "tls_key", "tls_client_ca", "engine_allow",
                "console_secret_file", "console_session_ttl", "record_omit", "whatif_reports"}
#: Settings only the plugin services read (their consumers, their plugin workers).
SERVICES_ONLY = {"prefetch", "consumers", "runtime_dir", "plugins_dir", "stock_plugins", "rescan_interval",
                 "allow_root_plugins"}
#: Settings of the processes that record (the gateway's and those of services running units: not discovery).
RECORDING = {"record", "record_max_mb"}
#: Settings of the services running units (and the all-in-one): the shadow candidate.
SHADOW = {"shadow", "shadow_rate", "shadow_factors", "shadow_drop", "shadow_queue", "shadow_workers"}


def commands_of(field: str) -> frozenset[str]:
    """The commands that use ``field``: the gateway's, the services', or both (bus, facts, metrics, logs)."""
    if field in GATEWAY_ONLY:
        return GATEWAY
    if field in RECORDING:
        return (GATEWAY | SERVICES) - {"discovery"}
    if field in SHADOW:
        return SERVICES - {"discovery"}
    if field in SERVICES_ONLY or field.startswith(("pool_", "plugin_")):
        return SERVICES
    return GATEWAY | SERVICES


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    out = {}
    for command in sorted(GATEWAY | SERVICES):
        done = subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", command, "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, env=os.environ)
        assert done.returncode == 0, done.stderr
        out[command] = done.stdout
    return out


def options(help_text: str) -> dict[str, str]:
    """Each option of a --help (``--x`` and ``--no-x`` alike) -> its help, on one line."""
    found: dict[str, str] = {}
    body = help_text.split("options:", 1)[1]
    for block in re.split(r"\n(?=  -)", body):
        names = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", block.split("  ", 2)[1] if "  " in block else block)
        text = " ".join(block.split())
        for name in names:
            found[name] = text
    return found


@pytest.mark.parametrize("field", list(Settings.model_fields))
def test_every_setting_is_a_flag_of_its_commands_and_names_its_variable(field: str, helps: dict[str, str]):
    having = {command for command, text in helps.items() if flag(field) in options(text)}
    assert having == commands_of(field), f"{flag(field)} is in the --help of {sorted(having)}"
    for command in having:
        text = options(helps[command])[flag(field)]
        assert variables(field)[0] in text, f"vmsched {command} --help: {flag(field)} does not name its variable"


def test_the_help_reading_finds_what_it_should(helps: dict[str, str]):
    run = options(helps["run"])
    assert "--decisions-share" in run and "--no-decisions-share" in run and "--confirm-timeout" in run
    assert "VMSCHED_PORT" in run["--port"] and "--plugins" not in options(helps["gateway"])
