"""Plugin ``properties_validation`` strings, made acceptable to the oVirt engine.

The engine accepts "" or ``KEY=REGEX(;KEY=REGEX)*;?`` (KEY in
``[a-zA-Z0-9_]+``, REGEX anything but ``;``) and silently drops a unit whose
string does not match. The old proxy documented ``{key = regex, ...}``, which
the engine rejects, so that form (and a few relatives: ``:`` separators,
quotes, a dict literal, entries split by ``;`` with spaces) is translated.
"""

from __future__ import annotations

import ast
import re

# The engine's check at discovery (ExternalSchedulerDiscoveryResult ->
# SimpleCustomPropertiesUtil.syntaxErrorInProperties, i.e.
# org.ovirt.engine.core.common.utils.customprop.CustomPropertiesUtils.VALIDATION_STR
# at ovirt-engine commit 638be7935506e02816bd889886affcdff6273b2e, matched in
# full): an empty REGEX (``flag=``) is accepted. Older engines (the bll utils
# copy, ``[^;]+``) reject such a string and skip only that unit at discovery.
ENGINE_VALIDATION = re.compile(r"(?:[a-zA-Z0-9_]+=[^;]*(?:;[a-zA-Z0-9_]+=[^;]*)*;?)?")
_KEY = re.compile(r"[a-zA-Z0-9_]+")
# An entry of the old form: optional quotes around the key, then '=' or ':'.
_ENTRY = re.compile(r"""\s*(?P<quote>["']?)(?P<key>[^\s"'=:]*)(?P=quote)\s*[=:](?P<value>.*)""", re.DOTALL)
# A comma that starts a new entry: followed by KEY and '=' or ':' (so the commas
# of ``{2,5}`` or ``[a,b]`` inside a regex stay where they are).
_ENTRY_COMMA = re.compile(r""",(?=\s*["']?[a-zA-Z0-9_]+["']?\s*[=:])""")


class ValidationSyntaxError(ValueError):
    pass


def translate_validation(raw: str) -> tuple[str, str | None]:
    """``(engine_string, None)``, or ``("", reason)`` when ``raw`` cannot be made valid.

    An empty regex (``flag=``) is kept: the engine accepts it (the property's
    value must then be empty).
    """
    if not isinstance(raw, str):
        return "", f"properties_validation must be a string, not {type(raw).__name__}"
    text = raw.strip()
    if not text or re.fullmatch(r"\{\s*\}", text):
        return "", None
    try:
        if ENGINE_VALIDATION.fullmatch(text):
            parts = (part.partition("=") for part in text.rstrip(";").split(";"))
            _check([(key, value) for key, _, value in parts])
            return text, None
        entries = _parse_old_form(text)
        _check(entries)
    except ValidationSyntaxError as exc:
        return "", f"invalid properties_validation {raw!r}: {exc}"
    result = ";".join(f"{key}={value}" for key, value in entries)
    if not ENGINE_VALIDATION.fullmatch(result):  # cannot happen after _check; never send a bad string
        return "", f"invalid properties_validation {raw!r}: translated to {result!r}, still not engine syntax"
    return result, None


def _parse_old_form(text: str) -> list[tuple[str, str]]:
    if text.startswith("{"):
        if not text.endswith("}"):
            raise ValidationSyntaxError("starts with '{' but does not end with '}'")
        literal = _dict_literal(text)
        if literal is not None:
            return literal
        text = text[1:-1].strip().rstrip(",")  # a trailing comma is harmless
    elif text.endswith("}") and "{" not in text:
        raise ValidationSyntaxError("ends with '}' but does not start with '{'")
    parts = text.split(";") if ";" in text else _ENTRY_COMMA.split(text)
    entries = [_parse_entry(part) for part in parts if part.strip()]
    if not entries:
        raise ValidationSyntaxError("no KEY=REGEX entry")
    return entries


def _dict_literal(text: str) -> list[tuple[str, str]] | None:
    """Entries of a Python dict literal such as ``{"key": "regex"}``, else None."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    entries = []
    for key, regex in value.items():
        if not isinstance(key, str) or not isinstance(regex, (str, int, float)):
            raise ValidationSyntaxError(f"entry {key!r}: {regex!r} is not KEY: REGEX")
        entries.append((key, str(regex)))
    return entries


def _parse_entry(part: str) -> tuple[str, str]:
    match = _ENTRY.fullmatch(part)
    if match is None:
        raise ValidationSyntaxError(f"entry {part.strip()!r} is not KEY=REGEX")
    value = match["value"].strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":  # quoted
        value = value[1:-1]
    return match["key"], value


def _check(entries: list[tuple[str, str]]) -> None:
    seen: set[str] = set()
    for key, regex in entries:
        if not _KEY.fullmatch(key):
            raise ValidationSyntaxError(f"key {key!r} may contain only letters, digits and '_'")
        if key in seen:
            raise ValidationSyntaxError(f"key {key!r} appears twice")
        seen.add(key)
        if ";" in regex:
            raise ValidationSyntaxError(f"the regex of {key!r} contains ';', the engine's entry separator")
        try:
            re.compile(regex)
        except re.error as exc:
            raise ValidationSyntaxError(f"the regex of {key!r} does not compile: {exc}") from None
