"""Every option of every ``vmsched`` command is also an environment variable.

The names (each option's ``--help`` gives its own):

- the services and the plugin tools (``run``, ``gateway``, ``discovery``,
  ``scoring``, ``balancer``, ``plugin``): the setting's variable,
  ``VMSCHED_<OPTION>`` (``VMSCHED_PORT``, ``VMSCHED_AMQP_URL`` for ``--amqp``,
  ``VMSCHED_PLUGINS``), read by :class:`~vmsched.config.Settings`;
- the other commands: ``VMSCHED_<COMMAND>_<OPTION>`` (``VMSCHED_AGENT_LIBVIRT``,
  ``VMSCHED_POLICY_WEIGHT``, ``VMSCHED_TOKEN_NAME``); the client commands'
  options that say where the agent is share the agent's names
  (``VMSCHED_AGENT_SOCKET``), ``token --file`` is the gateway's
  ``VMSCHED_TOKENS_FILE`` and ``console-secret --file`` its
  ``VMSCHED_CONSOLE_SECRET_FILE``.

A flag wins over its variable; an empty variable is as if unset. A variable
of a list option holds its items separated by spaces (shell quoting applies);
a switch takes 1/true/yes/on or 0/false/no/off.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vmsched.cli.settings import variables
from vmsched.config import Settings

#: Commands whose options are settings (read from the environment by Settings).
SETTINGS_COMMANDS = frozenset({"run", "gateway", "discovery", "scoring", "balancer", "plugin"})
#: Options of the plugin tools that are settings under another name (None: an option that is no setting).
SETTING_OF = {("plugin", "timeout"): "plugin_timeout", ("plugin", "plugins"): "plugins_dir", ("plugin", "facts"): None}
#: Options of the client commands that say where the agent is: the agent's variables.
AGENT_PLACE = frozenset({"socket", "client_host", "timeout"})
#: Broker options of the agent and its clients: read from the environment where the broker is chosen.
BROKER = {  # dest: (variables, the setting it is)
    "agent_amqp": (("VMSCHED_AGENT_AMQP", "VMSCHED_AMQP_URL"), "amqp_url"),
    "agent_amqp_file": (("VMSCHED_AGENT_AMQP_URL_FILE", "VMSCHED_AMQP_URL_FILE"), "amqp_url_file"),
    "client_amqp": (("VMSCHED_AGENT_AMQP", "VMSCHED_AMQP_URL"), "amqp_url"),
    "client_amqp_file": (("VMSCHED_AGENT_AMQP_URL_FILE", "VMSCHED_AMQP_URL_FILE"), "amqp_url_file"),
    "amqp_ca": (("VMSCHED_AMQP_CA",), "amqp_ca"),
    "amqp_cert": (("VMSCHED_AMQP_CERT",), "amqp_cert"),
    "amqp_key": (("VMSCHED_AMQP_KEY",), "amqp_key"),
}
#: The commands whose --file is a setting of the gateway's, read as its variable.
FILE_SETTING = {"token": "tokens_file", "console-secret": "console_secret_file"}
#: The agent's variables of earlier releases, still read after its own.
AGENT_FALLBACK = {"metrics_host": "VMSCHED_METRICS_HOST", "log_level": "VMSCHED_LOG_LEVEL",
                  "metrics_tokens_file": "VMSCHED_METRICS_TOKENS_FILE"}
TRUE, FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Variable:
    """The environment variables of one option, first found wins."""

    names: tuple[str, ...]
    setting: str | None  # the setting it is, if any (the same name means the same thing everywhere)
    reader: str  # who reads it: "settings" (Settings), "broker" (where a client or the agent picks its
    #              broker: the URL may hold a password, which no flag may), "parser" (EnvParser, as a default)


def variable(command: Sequence[str], action: argparse.Action) -> Variable:
    """The variable(s) of ``action``, an option of ``command`` (e.g. ``("policy", "set")``)."""
    top, dest = command[0], action.dest
    field = SETTING_OF.get((top, dest), dest)
    if top in SETTINGS_COMMANDS and field is not None and field in Settings.model_fields:
        return Variable(variables(field)[:1], field, "settings")
    if dest in BROKER and top in ("agent", "policy", "domain"):
        return Variable(*BROKER[dest], "broker")
    if dest == "file" and top in FILE_SETTING:
        return Variable(variables(FILE_SETTING[top])[:1], FILE_SETTING[top], "parser")
    scope = "AGENT" if top == "agent" or (top in ("policy", "domain") and dest in AGENT_PLACE) else top.upper()
    long = [o for o in action.option_strings if o.startswith("--")] or list(action.option_strings)
    option = long[0].lstrip("-").upper().replace("-", "_")  # its long flag
    names = [option if option.startswith(f"{scope}_") else f"{scope}_{option}"]
    if top == "agent" and dest in AGENT_FALLBACK:
        names.append(AGENT_FALLBACK[dest].removeprefix("VMSCHED_"))
    return Variable(tuple(f"VMSCHED_{n}" for n in names), None, "parser")


class EnvParser(argparse.ArgumentParser):
    """An ArgumentParser whose options also come from the environment (see the module's docstring).

    It keeps the options it is given (``options``) and its sub-commands, so the
    root parser can name each option's variable in its help (:meth:`name_variables`)
    and read the chosen command's variables when it parses.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options: list[argparse.Action] = []
        self.lists: set[str] = set()  # dests of options given several times (action append)
        self.subcommands: argparse.Action | None = None
        self.path: tuple[str, ...] = ()  # the command's, set by the root's walk()
        super().__init__(*args, **kwargs)  # adds -h through add_argument

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.keep(action, kwargs)
        return action

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        return _Recording(super().add_argument_group(*args, **kwargs), self)

    def add_mutually_exclusive_group(self, *args: Any, **kwargs: Any) -> Any:
        return _Recording(super().add_mutually_exclusive_group(*args, **kwargs), self)

    def add_subparsers(self, *args: Any, **kwargs: Any) -> Any:
        self.subcommands = super().add_subparsers(*args, **kwargs)  # its children: EnvParsers, of the parent's class
        return self.subcommands

    @property
    def commands(self) -> dict[str, EnvParser]:
        return self.subcommands.choices if self.subcommands is not None else {}  # type: ignore[return-value]

    def keep(self, action: argparse.Action, kwargs: dict[str, Any]) -> None:
        """Remember an option added to this parser or one of its groups (``kwargs``: how it was added)."""
        kind = kwargs.get("action")
        if action.option_strings and kind not in ("help", "version"):
            self.options.append(action)
            if kind in ("append", "extend"):
                self.lists.add(action.dest)

    def walk(self) -> list[tuple[tuple[str, ...], argparse.Action]]:
        """(command path, option) of this parser and every sub-command, depth first; each learns its path."""
        found = [(self.path, action) for action in self.options]
        for name, child in self.commands.items():
            child.path = (*self.path, name)
            found += child.walk()
        return found

    def name_variables(self) -> None:
        """Add '(env NAME)' to the help of every option whose help does not name its variable yet."""
        for path, action in self.walk():
            if not path:
                continue
            names = variable(path, action).names
            if action.help and not any(name in action.help for name in names):
                action.help += f" (env {' or '.join(names)})"

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if not self.path:  # the root: its commands read their own variables
            return super().parse_known_args(args, namespace)
        namespace = namespace if namespace is not None else argparse.Namespace()
        optional, listed = [], {}
        for action in self.options:  # the variables go in first; a flag given overwrites its value
            found = self._from_environment(action)
            if found is not None:
                setattr(namespace, action.dest, found)
                if action.dest in self.lists:
                    listed[action.dest] = list(found)
                if action.required:
                    optional.append(action)
        for action in optional:
            action.required = False
        try:
            parsed, rest = super().parse_known_args(args, namespace)
        finally:
            for action in optional:
                action.required = True
        for action in self.options:  # a list option given as flags replaces its variable's items
            given, items = getattr(parsed, action.dest, None), listed.get(action.dest)
            if items and isinstance(given, list) and len(given) > len(items) and given[:len(items)] == items:
                setattr(parsed, action.dest, given[len(items):])
        return parsed, rest

    def _from_environment(self, action: argparse.Action) -> Any:
        """The option's value from its variable; None when no variable is set (or a switch is off)."""
        var = variable(self.path, action)
        if var.reader != "parser":
            return None
        found = next(((n, os.environ[n]) for n in var.names if n in os.environ), None)
        if found is None:
            return None
        name, text = found
        if not text.strip() and action.nargs != 0:
            return None  # set but empty: as if unset (a switch reads it as off)
        try:
            return self._value(action, text, action.dest in self.lists)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            self.error(f"{name}={text!r} (for {action.option_strings[-1]}): {exc or 'invalid value'}")

    @staticmethod
    def _value(action: argparse.Action, text: str, many: bool) -> Any:
        if action.nargs == 0:  # a switch
            word = text.strip().lower()
            if word not in TRUE | FALSE:
                raise ValueError("expected 1/true/yes/on or 0/false/no/off")
            return action.const if word in TRUE else None

        def one(item: str) -> Any:
            value = action.type(item) if callable(action.type) else item
            if action.choices is not None and value not in action.choices:
                raise ValueError(f"expected one of {', '.join(map(str, action.choices))}")
            return value

        if many:
            return [one(item) for item in shlex.split(text)]
        return one(text)


class _Recording:
    """An argument group of an :class:`EnvParser` that tells the parser of the options added to it."""

    def __init__(self, group: Any, parser: EnvParser) -> None:
        self._group, self._parser = group, parser

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = self._group.add_argument(*args, **kwargs)
        self._parser.keep(action, kwargs)
        return action

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)

