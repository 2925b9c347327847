"""Every option of every command is also an environment variable, named in its --help; flags win."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from services.policy_agent.surfaces.cli import bus_options
from vmsched.cli import build_parser, run_settings, settings_from
from vmsched.cli.env import EnvParser, Variable, variable
from vmsched.config import MEMORY_URL

#: What each command needs on its command line besides options (None: nothing).
POSITIONALS = {("policy", "pool"): ["none"], ("policy", "list"): [], ("policy", "cpus"): [],
               ("policy", "reconcile"): [], ("plugin", "check"): ["p.py"], ("plugin", "run"): ["Unit"], ("replay",): ["rec"],
               ("token", "revoke"): ["me"]}
#: Variables a command needs to parse at all (its required options), when they are not the one under test.
BASE_ENV = {("token", "new"): {"VMSCHED_TOKEN_NAME": "me", "VMSCHED_TOKEN_ROLE": "read"},
            ("console-secret",): {"VMSCHED_CONSOLE_SECRET_FILE": "console.secret"}}


PARSER = build_parser()  # parsing leaves it as it was: one for every test here


def every_option() -> list[tuple[tuple[str, ...], argparse.Action]]:
    return [(path, action) for path, action in PARSER.walk() if path]


def argv(path: tuple[str, ...]) -> list[str]:
    positionals = POSITIONALS.get(path, ["guest"] if path[0] in ("policy", "domain") else [])
    return [*path, *positionals]


def candidates(tmp_path: Path) -> list[str]:
    url_file = tmp_path / "amqp.url"
    url_file.write_text("amqp://someone:secret@broker.example:5672/vh\n")
    return ["7", "2", "0.5", "100", "4096", "json", "true", "false", "filter", "read", "schedule", "0.0.0.0", "DEBUG", "A=2", "amqp://broker.example//",
            "10.0.0.0/8", "0=1", str(url_file), str(tmp_path)]


def effect(path: tuple[str, ...], action: argparse.Action, var: Variable) -> Any:
    """The value the option ends with when only the environment speaks."""
    args = PARSER.parse_args(argv(path))
    if var.reader == "parser":
        return getattr(args, action.dest)
    if var.reader == "settings":
        return getattr(settings_from(args), var.setting)
    options = bus_options(args, "agent_amqp" if path[0] == "agent" else "client_amqp")
    if var.setting in ("amqp_ca", "amqp_cert", "amqp_key"):
        return getattr(options, var.setting.removeprefix("amqp_"))
    return options.url if options else None


@pytest.mark.parametrize("path,action", every_option(),
                         ids=[f"{' '.join(p)} {a.option_strings[-1]}" for p, a in every_option()])
def test_every_option_is_an_environment_variable(path, action, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    var = variable(path, action)
    assert var.names and all(n.startswith("VMSCHED_") for n in var.names)
    assert any(n in (action.help or "") for n in var.names), f"--help of {action.option_strings} names no variable"
    base = dict(BASE_ENV.get(path, {}))
    if var.reader == "broker" and var.setting in ("amqp_ca", "amqp_cert", "amqp_key"):
        for name in ("cert", "key"):  # a broker's certificate options need an amqps:// broker and each other
            (tmp_path / f"{name}.pem").write_text("")
            base[f"VMSCHED_AMQP_{name.upper()}"] = str(tmp_path / f"{name}.pem")
        base["VMSCHED_AGENT_AMQP"] = "amqps://broker.example//"
    for name in var.names:
        monkeypatch.delenv(name, raising=False)
    for name, value in base.items():  # a required option keeps its base value as the one to change
        monkeypatch.setenv(name, value)
    before = effect(path, action, var)
    for name in var.names:  # each name, the agent's earlier ones included
        for text in [*candidates(tmp_path), *(action.choices or ())]:
            monkeypatch.setenv(name, text)
            try:
                after = effect(path, action, var)
            except (SystemExit, ValueError):
                continue
            if after != before:
                break
        else:
            pytest.fail(f"{name} does not change {' '.join(path)} {action.option_strings[-1]}")
        if name in base:
            monkeypatch.setenv(name, base[name])
        else:
            monkeypatch.delenv(name)


def test_no_variable_means_two_things():
    meaning: dict[str, set[str]] = {}
    for path, action in every_option():
        var = variable(path, action)
        for name in var.names:
            meaning.setdefault(name, set()).add(var.setting or action.dest)
    assert {name: m for name, m in meaning.items() if len(m) > 1} == {}


def test_flags_win_and_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    monkeypatch.setenv("VMSCHED_POLICY_WEIGHT", "512")
    monkeypatch.setenv("VMSCHED_AGENT_SOCKET", "/tmp/a.sock")
    monkeypatch.setenv("VMSCHED_POLICY_REQUIRES", "db 'cache one'")
    args = build_parser().parse_args(["policy", "set", "web", "--weight", "1024"])
    assert (args.weight, args.socket, args.requires) == (1024, "/tmp/a.sock", ["db", "cache one"])
    args = build_parser().parse_args(["policy", "set", "web", "--requires", "api"])
    assert args.requires == ["api"]  # a list given as flags replaces the variable's items
    monkeypatch.setenv("VMSCHED_POLICY_WEIGHT", "heavy")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["policy", "set", "web"])
    assert "VMSCHED_POLICY_WEIGHT='heavy' (for --weight)" in capsys.readouterr().err
    build_parser().parse_args(["policy", "get", "web"])  # another command does not read it


def test_vmsched_run_takes_the_broker_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    for name in ("VMSCHED_AMQP_URL", "VMSCHED_AMQP_URL_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert run_settings(build_parser().parse_args(["run"])).amqp_url == MEMORY_URL
    monkeypatch.setenv("VMSCHED_AMQP_URL", "amqp://u:p@broker.example:5672/v")
    assert run_settings(build_parser().parse_args(["run"])).amqp_url == "amqp://u:p@broker.example:5672/v"
    monkeypatch.delenv("VMSCHED_AMQP_URL")
    url_file = tmp_path / "url"
    url_file.write_text("amqp://u:p@broker.example:5672/w\n")
    monkeypatch.setenv("VMSCHED_AMQP_URL_FILE", str(url_file))  # the image's default command
    assert run_settings(build_parser().parse_args(["run"])).amqp_url == "amqp://u:p@broker.example:5672/w"
    monkeypatch.delenv("VMSCHED_AMQP_URL_FILE")
    assert run_settings(build_parser().parse_args(["run", "--amqp", "memory://"])).amqp_url == MEMORY_URL


def test_sub_commands_are_env_parsers():
    parser = build_parser()
    assert isinstance(parser, EnvParser)
    assert {"run", "agent", "policy", "domain", "token", "plugin"} <= set(parser.commands)
    assert set(parser.commands["policy"].commands) >= {"set", "get", "list", "cpus", "pool"}
