"""XML-RPC as the oVirt engine speaks it (Apache XML-RPC 3.1, extensions on).

Requests may carry bare ``<value>`` strings, ``<i4>`` and ``<ex:nil/>``; every
body is read by one parser, defusedxml's expat parser (no entity expansion, no
external references) whose events one reader (:class:`_Reader`) checks against
XML-RPC's grammar and turns into values as the stdlib's unmarshaller would, with
arrays and structs nested at most :data:`MAX_DEPTH` deep. Nothing is patched process-wide. Replies never
contain nil, doubles or integers outside int32: :func:`dump_response` enforces
that on every reply, whatever a bug upstream did.

Every check of a request raises :class:`Fault` with a sentence of ours saying
what is wrong (values shown shortened), never an exception's text: XML that
is not well formed is :data:`PARSE_ERROR`, well-formed XML that is not an
XML-RPC call (an element where none belongs, a struct member with two values,
``<int>12x</int>``) :data:`INVALID_REQUEST`, a call whose parameters are wrong
:data:`INVALID_PARAMS`.
"""

from __future__ import annotations

import base64
import logging
import math
import re
import reprlib
import xmlrpc.client
from datetime import datetime
from decimal import Decimal
from typing import Any, Callable
from xml.parsers.expat import ExpatError

from defusedxml import DefusedXmlException
from defusedxml.xmlrpc import DefusedExpatParser

from vmsched.decide.rules import INT32_MAX, INT32_MIN, clamp_int32

log = logging.getLogger("vmsched.gateway")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32500

#: Deepest nesting of arrays and structs accepted in a request (the engine sends 2).
MAX_DEPTH = 32


#: What every check raises and the engine gets: the stdlib's fault (``faultCode``, ``faultString``).
Fault = xmlrpc.client.Fault


_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxdict, _repr.maxstring, _repr.maxother = 2, 4, 4, 60, 60


def shown(value: Any) -> str:
    """``value`` for an error message: bounded in size and depth (never recursion or a megabyte)."""
    return _repr.repr(value)


def _boolean(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


#: The value types read (Apache's extensions included): how the text of each becomes its value (as the stdlib's
#: unmarshaller reads it, builtin types on), and what that text must be.
_SCALARS: dict[str, tuple[Callable[[str], Any], str]] = {
    "string": (str, "text"), "nil": (lambda text: None, "nothing"), "boolean": (_boolean, "0 or 1"),
    "base64": (lambda text: base64.decodebytes(text.encode("ascii")), "base64 data"),
    "dateTime.iso8601": (lambda text: datetime.strptime(text, "%Y%m%dT%H:%M:%S"), "a time as YYYYMMDDTHH:MM:SS"),
    "double": (float, "a number"), "float": (float, "a number"), "bigdecimal": (Decimal, "a decimal number"),
    **dict.fromkeys(("int", "i1", "i2", "i4", "i8", "biginteger"), (int, "an integer of at most 4300 digits")),
}
_TYPES = frozenset(_SCALARS) | {"array", "struct"}
#: The elements each element holds (None: the document), those it holds at most once, those it must hold.
_HOLDS: dict[str | None, frozenset[str]] = {
    None: frozenset({"methodCall"}), "methodCall": frozenset({"methodName", "params"}),
    "params": frozenset({"param"}), "param": frozenset({"value"}), "value": _TYPES, "array": frozenset({"data"}),
    "data": frozenset({"value"}), "struct": frozenset({"member"}), "member": frozenset({"name", "value"}),
}
_ONCE = {"methodCall": {"methodName", "params"}, "param": {"value"}, "array": {"data"}, "member": {"name", "value"}}
_NEEDS = {"methodCall": ("methodName",), "param": ("value",), "array": ("data",), "member": ("name", "value")}
#: The elements whose text is read; between the others only blanks may stand.
_TEXT = frozenset(_SCALARS) | {"value", "methodName", "name"}
_TYPE_NAMES = ", ".join(sorted(_SCALARS, key=str.lower)) + ", array, struct"


#: An open element: its name, the names of its children so far, its text so far.
_Open = tuple[str, list[str], list[str]]


class _Reader:
    """Expat's events read into the call's values, checked against XML-RPC's grammar: what breaks the grammar,
    or a value whose text is not of its type, is an :data:`INVALID_REQUEST` fault with a sentence naming the
    element."""

    def __init__(self) -> None:
        self.method: str | None = None
        self._open: list[_Open] = []
        self._values: list[Any] = []  # the values read, the open arrays' and structs' items at the end
        self._marks: list[int] = []  # where each open array's or struct's items begin in _values

    def xml(self, encoding: str | None, standalone: Any) -> None:
        """The XML declaration (the parser reports it): nothing to do."""

    def start(self, tag: str, attrs: Any) -> None:
        name = tag.rpartition(":")[2]  # Apache's ex:nil, ex:i8, ...
        parent = self._open[-1] if self._open else None
        self._check_child(parent, name)
        if parent is not None:
            parent[1].append(name)
        if name == "array" or name == "struct":
            if len(self._marks) == MAX_DEPTH:
                raise Fault(INVALID_PARAMS, f"a parameter nests arrays or structs deeper than {MAX_DEPTH} levels")
            self._marks.append(len(self._values))
        self._open.append((name, [], []))

    def _check_child(self, parent: _Open | None, name: str) -> None:
        if parent is None:
            if name != "methodCall":
                raise _invalid(f"the document is a <{shown_tag(name)}>, not a <methodCall>")
            return
        holder, children, text = parent
        if holder not in _HOLDS:
            raise _invalid(f"<{holder}> holds text only, not a <{shown_tag(name)}> element")
        if name not in _HOLDS[holder]:
            if holder == "value":
                raise _invalid(f"<{shown_tag(name)}> is not a value type (value types: {_TYPE_NAMES})")
            raise _invalid(f"<{shown_tag(name)}> does not belong in <{holder}>, which holds "
                           + " and ".join(f"<{child}>" for child in sorted(_HOLDS[holder])))
        if holder == "value" and (children or "".join(text).strip()):
            raise _invalid("a <value> holds one typed element or text, not more")
        if name in _ONCE.get(holder, ()) and name in children:
            raise _invalid(f"<{holder}> holds one <{name}>, not more")
        if holder == "member" and name == "value" and "name" not in children:
            raise _invalid("a struct <member> holds its <name> first, then its <value>")

    def data(self, text: str) -> None:
        name, children, held = self._open[-1]
        if name in _TEXT:
            if children and name == "value" and text.strip():
                raise _invalid("a <value> holds one typed element or text, not more")
            held.append(text)
        elif text.strip():
            raise _invalid(f"text {shown(text.strip())} in <{name}>, which holds elements only")

    def end(self, tag: str) -> None:
        name, children, text = self._open.pop()
        for needed in _NEEDS.get(name, ()):
            if needed not in children:
                raise _invalid(f"<{name}> has no <{needed}>")
        scalar = _SCALARS.get(name)
        if scalar is not None:
            try:
                self._values.append(scalar[0]("".join(text)))
            except Exception:  # noqa: BLE001 - the text is not of the element's type
                raise _invalid(f"<{name}> must hold {scalar[1]}, got {shown(''.join(text))}") from None
        elif name == "name" or (name == "value" and not children):  # a member's name, or a bare value: a string
            self._values.append("".join(text))
        elif name == "array" or name == "struct":
            mark = self._marks.pop()
            items = self._values[mark:]
            self._values[mark:] = [items if name == "array" else dict(zip(items[::2], items[1::2]))]
        elif name == "methodName":
            self.method = "".join(text)

    def close(self) -> tuple[str, tuple[Any, ...]]:
        if not self.method:
            raise _invalid("the call's <methodName> is empty")
        return self.method, tuple(self._values)


def shown_tag(name: str) -> str:
    """An element's name in a fault: bounded, without markup."""
    return shown(name)[1:-1] if len(name) > 40 else name


def _invalid(reason: str) -> Fault:
    return Fault(INVALID_REQUEST, f"invalid XML-RPC request: {reason}")


def parse_call(body: bytes) -> tuple[str, tuple[Any, ...]]:
    """Return ``(method, params)`` or raise :class:`Fault` with a precise reason."""
    if not body.strip():
        raise Fault(PARSE_ERROR, "empty request body: expected an XML-RPC methodCall")
    reader = _Reader()
    try:
        parser = DefusedExpatParser(reader)
        parser.feed(body)
        parser.close()
        return reader.close()
    except Fault:
        raise
    except ExpatError as exc:
        raise Fault(PARSE_ERROR, f"malformed XML: {exc}") from None
    except DefusedXmlException:
        raise Fault(PARSE_ERROR, "malformed XML: entity declarations and external entities are not accepted") \
            from None
    except Exception as exc:  # noqa: BLE001 - whatever else, the engine gets a sentence, not the exception
        log.warning("XML-RPC request refused: %s: %s", type(exc).__name__, shown(str(exc)))
        raise _invalid("the body could not be read as a methodCall") from None


#: What character data cannot hold as it is: markup, a CR (the reader would get LF: XML end-of-line handling),
#: and characters XML 1.0 cannot carry (control characters, lone surrogates; a plugin's error message may contain
#: them, and the engine's parser would reject the reply), which become U+FFFD.
_SPECIAL = re.compile("[&<>\r\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"}


def _text(value: str) -> str:
    """Escaped character data, in one pass that leaves a plain host ID or unit name as it is."""
    return _SPECIAL.sub(_escaped, value)


def _escaped(match: re.Match[str]) -> str:
    return _ESCAPES.get(match.group(), "\ufffd")


def _marshal(value: Any, out: list[str]) -> None:
    """Append ``value`` as an XML-RPC <value>: None as "", numbers as clamped int32, tuples as arrays."""
    if isinstance(value, str):
        out.append("<value><string>" + _text(value) + "</string></value>")
    elif isinstance(value, bool):
        out.append("<value><boolean>1</boolean></value>" if value else "<value><boolean>0</boolean></value>")
    elif isinstance(value, (int, float)):
        out.append("<value><int>%d</int></value>" % clamp_int32(value))
    elif isinstance(value, (list, tuple)):
        out.append("<value><array><data>")
        for item in value:
            _marshal(item, out)
        out.append("</data></array></value>")
    elif isinstance(value, dict):
        out.append("<value><struct>")
        for key, item in value.items():
            out.append("<member><name>" + _text(str(key)) + "</name>")
            _marshal(item, out)
            out.append("</member>")
        out.append("</struct></value>")
    else:
        out.append("<value><string>" + _text("" if value is None else str(value)) + "</string></value>")


def dump_response(value: Any) -> bytes:
    """A methodResponse the engine accepts, written in one pass (faster than the stdlib's marshaller)."""
    out = ["<?xml version='1.0'?>\n<methodResponse>\n<params>\n<param>\n"]
    _marshal(value, out)
    out.append("\n</param>\n</params>\n</methodResponse>\n")
    return "".join(out).encode("utf-8")


def dump_fault(fault: Fault) -> bytes:
    return xmlrpc.client.dumps(fault, methodresponse=True).encode()


# --- argument checks ---------------------------------------------------------


def str_list(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise Fault(INVALID_PARAMS, f"{name} must be an array of strings, got {shown(value)}")
    return list(value)


def text(value: Any, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Fault(INVALID_PARAMS, f"{name} must be a string, got {shown(value)}")
    return value


def _property(key: str, value: Any) -> str:
    """A property value as the plugins get it: a string (the engine sends strings; numbers are written out)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise Fault(INVALID_PARAMS, f"property {shown(key)} is the double {value}: expected a string")
    if isinstance(value, (bool, int, float)):
        return str(value)
    raise Fault(INVALID_PARAMS, f"property {shown(key)} must be a string, got {type(value).__name__} {shown(value)}")


def properties(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Fault(INVALID_PARAMS, f"properties must be a struct, got {shown(value)}")
    return {str(k): _property(k, v) for k, v in value.items()}


def factor(value: Any, unit: str) -> int:
    """A cost function's factor: an integer within int32 (a finite double or a numeric string is truncated)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise Fault(INVALID_PARAMS, f"bad factor {shown(value)} for {shown(unit)}: expected an integer")
    if isinstance(value, float) and not math.isfinite(value):
        raise Fault(INVALID_PARAMS, f"bad factor {value} for {shown(unit)}: expected a finite integer")
    try:
        number = int(value)
    except ValueError:
        raise Fault(INVALID_PARAMS, f"bad factor {shown(value)} for {shown(unit)}: expected an integer") from None
    if not INT32_MIN <= number <= INT32_MAX:
        raise Fault(INVALID_PARAMS, f"bad factor {shown(number)} for {shown(unit)}: "
                                    f"outside the engine's int32 range [{INT32_MIN}, {INT32_MAX}]")
    return number


def score_units(value: Any) -> list[dict[str, Any]]:
    """``[[name, factor], ...]`` (a bare name means factor 1)."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise Fault(INVALID_PARAMS, f"functions must be an array of [name, factor], got {shown(value)}")
    units = []
    for entry in value:
        if isinstance(entry, str):
            units.append({"name": entry, "factor": 1})
            continue
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str)):
            raise Fault(INVALID_PARAMS, f"bad cost function entry {shown(entry)}: expected [name, factor]")
        units.append({"name": entry[0], "factor": factor(entry[1], entry[0])})
    return units


def arity(params: tuple[Any, ...], method: str, expected: int) -> None:
    if len(params) != expected:
        raise Fault(INVALID_PARAMS, f"{method} takes {expected} parameters, got {len(params)}")
