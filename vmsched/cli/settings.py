"""A command's :class:`~vmsched.config.Settings`, and what is wrong with them in the user's words.

Every setting is a flag (``--port``) and an environment variable (``VMSCHED_PORT``). A value that
Settings refuses becomes one line naming the option the value came from (the flag, or the variable
when it came from the environment), the value and what is allowed::

    --port 99999: expected a whole number from 0 to 65535
    VMSCHED_PORT=abc: expected a whole number from 0 to 65535

never pydantic's report.
"""

from __future__ import annotations

import os
import shlex
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from vmsched.bus.options import mask
from vmsched.config import Settings

#: Settings whose flag is not ``--<name>``.
FLAGS = {"amqp_url": "--amqp", "plugins_dir": "--plugins"}


class SettingsError(ValueError):
    """Settings refused: one line per option, each saying what is wrong (``str()``: the lines)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def flag(field: str) -> str:
    """The flag of setting ``field`` in the service commands."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def variables(field: str) -> tuple[str, ...]:
    """The environment variables Settings reads for ``field``, first found wins."""
    alias = Settings.model_fields[field].validation_alias
    names = [c for c in getattr(alias, "choices", ()) if isinstance(c, str) and c.isupper()]
    return tuple(names) or (f"VMSCHED_{field.upper()}",)


def origin(field: str, given: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> str | None:
    """Where the value of ``field`` comes from: its flag (given on the command line), else the variable
    set in the environment, else None (the default). ``flags``: the command's own flag names."""
    if given.get(field) is not None:
        return (flags or {}).get(field) or flag(field)
    return next((name for name in variables(field) if name in os.environ), None)


def build(given: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> Settings:
    """Settings from the flags ``given`` (by setting) and the environment; SettingsError in the user's words."""
    values = {k: v for k, v in given.items() if v is not None}
    try:
        return Settings(**values)
    except ValidationError as exc:
        raise SettingsError(describe(exc, values, flags)) from None


def describe(exc: ValidationError, given: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> list[str]:
    """One line per refused option: ``OPTION VALUE: what is allowed`` (a check across options: its message)."""
    lines: dict[str, str] = {}  # the first line of each option (or of each check of several settings)
    for error in exc.errors(include_url=False, include_input=False):
        field = _field(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if field is None:  # a check of several settings together: its message names them
            lines.setdefault(message, message)
        elif field not in lines:
            said = message if error["type"] == "value_error" else f"expected {allowed(field)}"
            lines[field] = f"{_shown(field, given, flags)}: {said}"
    return list(dict.fromkeys(lines.values()))


def allowed(field: str) -> str:
    """What setting ``field`` takes, from its type and bounds: e.g. ``a whole number from 0 to 65535``."""
    info = Settings.model_fields[field]
    kind = _kind(info.annotation)
    if kind in ("a whole number", "a number"):
        bounds = _bounds(info)
        return f"{kind} {bounds}" if bounds else kind
    return kind


def _field(loc: tuple[int | str, ...]) -> str | None:
    if not loc:
        return None
    name = str(loc[0])
    if name in Settings.model_fields:
        return name
    return next((field for field in Settings.model_fields if name in variables(field)), None)


def _shown(field: str, given: Mapping[str, Any], flags: Mapping[str, str] | None) -> str:
    """``--flag VALUE`` or ``VARIABLE=VALUE``, where the value came from (a password masked)."""
    source = origin(field, given, flags)
    if source is None:
        return flag(field)
    if source.startswith("--"):
        value = given[field]
        return source if value is True else f"{source} {shlex.quote(mask(str(value)))}"
    return f"{source}={shlex.quote(mask(os.environ[source]))}"


#: What a setting of each plain type takes, in words (other types: "text").
_KINDS = {bool: "true or false (1/yes/on, 0/no/off)", int: "a whole number", float: "a number", Path: "a path"}


def _kind(annotation: Any) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(annotation)))
    if args and typing.get_origin(annotation) is not dict:  # X | None, Annotated[X, ...]
        return _kind(args[0])
    if typing.get_origin(annotation) is dict:
        return "NAME=SECONDS,..."
    return _KINDS.get(annotation, "text")


def _bounds(info: FieldInfo) -> str:
    """``from 0 to 65535``, ``above 0 and at most 110``, ``of at least 1``: the field's bounds in words."""
    found = {name: getattr(item, name) for item in info.metadata for name in ("ge", "gt", "le", "lt")
             if getattr(item, name, None) is not None}
    if "ge" in found and "le" in found:
        return f"from {_number(found['ge'])} to {_number(found['le'])}"
    words = {"ge": "of at least", "gt": "above", "le": "at most", "lt": "below"}
    return " and ".join(f"{words[name]} {_number(value)}" for name, value in found.items())


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def broker_origin(given: Mapping[str, Any]) -> str:
    """Where the broker URL comes from, for the start's log line: a URL file, a flag, a variable, the default."""
    source = origin("amqp_url_file", given)
    if source is not None:
        named = given.get("amqp_url_file") or os.environ[source]
        return f"the URL file {named} ({source})"
    return origin("amqp_url", given) or (f"the default, as no {flag('amqp_url_file')}, "
                                         f"{variables('amqp_url_file')[0]}, {flag('amqp_url')} or "
                                         f"{variables('amqp_url')[0]} names one")

