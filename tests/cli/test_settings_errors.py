"""A value a setting refuses is one line naming the option it came from (the flag, or the environment
variable), the value and what is allowed: never pydantic's report, never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import vmsched.cli.runner as runner
from tests.support.net import free_port
from tests.support.paths import ROOT
from vmsched.cli import build_parser, main
from vmsched.cli.settings import flag, variables
from vmsched.config import Settings

PYDANTIC = ("pydantic", "errors.pydantic.dev", "validation error", "Traceback", "[type=")
SERVICES = ("run", "gateway", "discovery", "scoring", "balancer")


def bounds(field: str) -> dict[str, float]:
    info = Settings.model_fields[field]
    return {name: getattr(item, name) for item in info.metadata for name in ("ge", "gt", "le", "lt")
            if getattr(item, name, None) is not None}


def numeric(field: str) -> bool:
    annotation = Settings.model_fields[field].annotation
    return annotation in (int, float, int | None, float | None)


NUMERIC = [field for field in Settings.model_fields if numeric(field)]


def out_of_range(field: str) -> str:
    """A value just outside the field's bounds (a word where it has none)."""
    found = bounds(field)
    if "ge" in found:
        return str(found["ge"] - 1)
    if "gt" in found:
        return str(found["gt"])
    if "le" in found:
        return str(found["le"] + 1)
    return "abc"


def command_of(field: str) -> str:
    """A service command with the setting's flag."""
    parser = build_parser()
    for command in SERVICES:
        if any(action.dest == field for path, action in parser.walk() if path == (command,)):
            return command
    raise AssertionError(f"no command has --{field}")


def one_line(err: str) -> str:
    assert not any(mark in err for mark in PYDANTIC), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vmsched: error: "), err
    return lines[0].removeprefix("vmsched: error: ")


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(*_: object) -> int:
        raise AssertionError("a refused setting must stop the command before it starts anything")

    for name in ("run_all_in_one", "run_gateway", "run_service"):
        monkeypatch.setattr(runner, name, started)


def test_every_numeric_setting_is_covered():
    assert {"port", "plugin_timeout", "metrics_port", "pool_size", "decisions_size", "confirm_timeout"} <= set(NUMERIC)


@pytest.mark.parametrize("field", NUMERIC)
@pytest.mark.parametrize("where", ["flag", "variable"])
def test_an_out_of_range_value_is_one_line(field: str, where: str, nothing_starts: None,
                                           monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    value, command = out_of_range(field), command_of(field)
    if where == "flag":
        code = main([command, flag(field), value])
        named = f"{flag(field)} {value}: "
    else:
        monkeypatch.setenv(variables(field)[0], value)
        code = main([command])
        named = f"{variables(field)[0]}={value}: "
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(named + "expected a "), line
    for bound in bounds(field).values():  # what is allowed, in numbers
        assert str(int(bound) if bound == int(bound) else bound) in line.removeprefix(named), line


@pytest.mark.parametrize("field", NUMERIC)
def test_a_word_for_a_number_is_one_line(field: str, nothing_starts: None, capsys: pytest.CaptureFixture[str]):
    assert main([command_of(field), flag(field), "many"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"{flag(field)} many: expected a "), line
    assert re.search(r"expected a (whole )?number", line), line


def test_switches_and_choices_say_what_they_take(nothing_starts: None, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("VMSCHED_DECISIONS_SHARE", "maybe")
    assert main(["gateway"]) == 2
    assert one_line(capsys.readouterr().err) == "VMSCHED_DECISIONS_SHARE=maybe: expected true or false (1/yes/on, 0/no/off)"
    monkeypatch.delenv("VMSCHED_DECISIONS_SHARE")
    assert main(["run", "--log-format", "xml"]) == 2
    assert one_line(capsys.readouterr().err) == "--log-format xml: expected one of text, json"


def vmsched(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "vmsched.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,env,expected", [
    (["run", "--port", "99999"], {}, "--port 99999: expected a whole number from 0 to 65535"),
    (["run", "--plugin-timeout", "-1"], {}, "--plugin-timeout -1: expected a number above 0 and at most 110"),
    (["run"], {"VMSCHED_PORT": "abc"}, "VMSCHED_PORT=abc: expected a whole number from 0 to 65535"),
    (["gateway", "--amqp-url-file", "/missing"], {},
     "--amqp-url-file /missing: cannot read the broker URL file /missing: No such file or directory"),
], ids=["port", "plugin-timeout", "env-port", "url-file"])
def test_the_reported_cases(args: list[str], env: dict[str, str], expected: str):
    out = vmsched(*args, env=env)
    assert out.returncode == 2
    assert one_line(out.stderr) == expected


def test_every_refused_option_gets_its_line():
    """All numeric options out of range at once: one line each, in one run of the real command."""
    args = ["run", "--port", str(free_port())]
    for field in NUMERIC:
        if field != "port":
            args += [flag(field), out_of_range(field)]
    out = vmsched(*args)
    assert out.returncode == 2 and not any(mark in out.stderr for mark in PYDANTIC), out.stderr
    lines = out.stderr.strip().splitlines()
    named = {line.removeprefix("vmsched: error: ").split(" ", 1)[0] for line in lines}
    assert named == {flag(field) for field in NUMERIC if field != "port"}, out.stderr
    assert len(lines) == len(named)
