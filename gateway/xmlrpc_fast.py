"""A fast reader for the common shape of an engine call; anything else goes to the full parser.

The stdlib unmarshaller (behind defusedxml's expat parser) calls Python for every start tag,
end tag and piece of text: most of the gateway's parsing time for a list of 100 host IDs.
:func:`read_call` reads, with regular expressions running in C, only the plainest XML-RPC: an
optional ``<?xml version="1.0"?>`` declaration (UTF-8), ``methodCall`` (with namespace
declarations only: Apache's ``xmlns:ex``), ``methodName``,
``params``, values that are strings (typed or bare), ``int``/``i4`` written as plain digits,
arrays and structs at most :data:`DEPTH` deep; no attributes, namespaces, comments, DTDs,
entity or character references, CDATA, carriage returns or characters XML forbids. It returns
what the full parser would return for such a body, or None for any other body (then the full
parser, with its checks and precise errors, reads it): ``tests/test_xmlrpc_fast.py`` compares both.
"""

from __future__ import annotations

import re
from typing import Any

#: Deepest nesting of arrays and structs read here (the engine sends 2; deeper goes to the full parser).
DEPTH = 4

_W = r"[ \t\n]*"
_TEXT = r"[^<]*"
#: Bytes that make XML text differ from the characters written (a reference, a carriage return), or that
#: XML refuses (control characters); and sequences it refuses (U+FFFE, U+FFFF, "]]>" in text).
_UNPLAIN_BYTES = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20)]) + b"\r&"
_UNPLAIN_SEQUENCES = (b"]]>", "\ufffe".encode(), "\uffff".encode())
_HEAD = re.compile(
    rf"""(?:<\?xml version=(?:"1\.0"|'1\.0')(?: encoding=(?:"(?i:utf-8)"|'(?i:utf-8)'))?{_W}\?>)?{_W}"""
    rf"""<methodCall(?: xmlns(?::[A-Za-z_][A-Za-z0-9_.-]*)?=(?:"[^"<]*"|'[^'<]*'))*{_W}>"""
    rf"{_W}<methodName>({_TEXT})</methodName>{_W}(?:<params>|(<params/>))")
_PARAM = re.compile(rf"{_W}<param>{_W}")
_PARAM_END = re.compile(rf"{_W}</param>")
_TAIL = re.compile(rf"{_W}</params>{_W}</methodCall>{_W}\Z")
_TAIL_EMPTY = re.compile(rf"{_W}</methodCall>{_W}\Z")
#: A value up to its type: group 1 is a bare string (the value ends there), group 2 the type's name.
_VALUE = re.compile(rf"<value>(?:({_TEXT})</value>|{_W}<(string|int|i4|array|struct)>)|<value/>|<value>{_W}<string/>{_W}</value>")
_STRING = re.compile(rf"({_TEXT})</string>{_W}</value>")
_INT = re.compile(rf"(-?[0-9]+)</int>{_W}</value>")
_I4 = re.compile(rf"(-?[0-9]+)</i4>{_W}</value>")
#: An array of nothing but strings, all read at once (the host IDs and unit names of every call).
_STRINGS = re.compile(
    rf"{_W}<data>((?:{_W}<value>(?:<string>{_TEXT}</string>|{_TEXT})</value>)*){_W}</data>{_W}</array>{_W}</value>")
_ITEM = re.compile(rf"<value>(?:<string>({_TEXT})</string>|({_TEXT}))</value>")
_DATA = re.compile(rf"{_W}<data>{_W}")
_DATA_END = re.compile(rf"{_W}</data>{_W}</array>{_W}</value>")
_MEMBER = re.compile(rf"{_W}<member>{_W}<name>({_TEXT})</name>{_W}")
_MEMBER_END = re.compile(rf"{_W}</member>")
_STRUCT_END = re.compile(rf"{_W}</struct>{_W}</value>")
_SPACE = re.compile(_W)


class _Other(Exception):
    """Not the plain shape: the full parser reads it."""


def read_call(body: bytes) -> tuple[str, tuple[Any, ...]] | None:
    """``(method, params)`` of a plain call, as the stdlib parser reads it; None for any other body."""
    if len(body.translate(None, _UNPLAIN_BYTES)) != len(body) or any(s in body for s in _UNPLAIN_SEQUENCES):
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    head = _HEAD.match(text)
    if head is None:
        return None
    method, at = head.group(1), head.end()
    if head.group(2):  # <params/>
        return (method, ()) if _TAIL_EMPTY.match(text, at) else None
    params: list[Any] = []
    try:
        while (m := _PARAM.match(text, at)) is not None:
            value, at = _value(text, m.end(), 0)
            end = _PARAM_END.match(text, at)
            if end is None:
                return None
            params.append(value)
            at = end.end()
    except _Other:
        return None
    return (method, tuple(params)) if _TAIL.match(text, at) else None


def _value(text: str, at: int, depth: int) -> tuple[Any, int]:
    """The value starting at ``at`` and the position after its ``</value>``."""
    m = _VALUE.match(text, at)
    if m is None:
        raise _Other
    if m.group(1) is not None:
        return m.group(1), m.end()
    kind = m.group(2)
    if kind is None:
        return "", m.end()  # <value/>, <string/>
    at = m.end()
    if kind == "string":
        s = _STRING.match(text, at)
        if s is None:
            raise _Other
        return s.group(1), s.end()
    if kind == "int" or kind == "i4":
        n = (_INT if kind == "int" else _I4).match(text, at)
        if n is None:
            raise _Other
        return int(n.group(1)), n.end()
    if depth >= DEPTH:
        raise _Other
    if kind == "array":
        return _array(text, at, depth + 1)
    return _struct(text, at, depth + 1)


#: A compact array of strings, all bare or all typed (the engine's): its items' tags and what separates them.
_BARE = ("<value>", "</value>", "</value><value>", 2)  # opening, closing, separator, '<' per item
_TYPED = ("<value><string>", "</string></value>", "</string></value><value><string>", 4)
_COMPACT_END = "</data></array></value>"


def _compact_strings(text: str, at: int) -> tuple[list[str], int] | None:
    """An array of strings written with no space between tags, read by splitting (C speed, no match per item):
    the items hold no ``<`` when the text holds exactly the tags' ``<`` of that many items. None for any other
    array (the regular expressions read it, or find it is not plain)."""
    if not text.startswith("<data>", at):
        return None
    end = text.find(_COMPACT_END, at)
    if end < 0:
        return None
    items = text[at + 6:end]
    if not items:
        return [], end + len(_COMPACT_END)
    opening, closing, separator, tags = _TYPED if items.startswith(_TYPED[0]) else _BARE
    if not (items.startswith(opening) and items.endswith(closing)):
        return None
    values = items[len(opening):-len(closing)].split(separator)
    if items.count("<") != tags * len(values):  # another tag inside: a typed value among bare ones, a nested array
        return None
    return values, end + len(_COMPACT_END)


def _array(text: str, at: int, depth: int) -> tuple[list[Any], int]:
    compact = _compact_strings(text, at)
    if compact is not None:
        return compact
    strings = _STRINGS.match(text, at)
    if strings is not None:
        return [a + b for a, b in _ITEM.findall(strings.group(1))], strings.end()
    data = _DATA.match(text, at)
    if data is None:
        raise _Other
    at, items = data.end(), []
    while True:
        end = _DATA_END.match(text, at)
        if end is not None:
            return items, end.end()
        item, at = _value(text, at, depth)
        items.append(item)
        at = _SPACE.match(text, at).end()  # type: ignore[union-attr]  # always matches (maybe nothing)


def _struct(text: str, at: int, depth: int) -> tuple[dict[str, Any], int]:
    members: dict[str, Any] = {}
    while True:
        end = _STRUCT_END.match(text, at)
        if end is not None:
            return members, end.end()
        member = _MEMBER.match(text, at)
        if member is None:
            raise _Other
        value, at = _value(text, member.end(), depth)
        close = _MEMBER_END.match(text, at)
        if close is None:
            raise _Other
        members[member.group(1)] = value
        at = close.end()
