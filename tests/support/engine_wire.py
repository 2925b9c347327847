"""Request bodies exactly as the oVirt engine (Apache XML-RPC 3.1, extensions on) sends them."""

from __future__ import annotations

import re
import uuid
import xmlrpc.client
from typing import Any

NS = 'xmlns:ex="http://ws.apache.org/xmlrpc/namespaces/extensions"'


def value(v: Any) -> str:
    """Apache style: bare strings, <i4>, <ex:nil/>, arrays and structs."""
    if v is None:
        return "<value><ex:nil/></value>"
    if isinstance(v, bool):
        return f"<value><boolean>{int(v)}</boolean></value>"
    if isinstance(v, int):
        return f"<value><i4>{v}</i4></value>"
    if isinstance(v, str):
        return f"<value>{v}</value>"
    if isinstance(v, (list, tuple)):
        return "<value><array><data>" + "".join(value(x) for x in v) + "</data></array></value>"
    if isinstance(v, dict):
        members = "".join(f"<member><name>{k}</name>{value(x)}</member>" for k, x in v.items())
        return f"<value><struct>{members}</struct></value>"
    raise TypeError(type(v))


def call(method: str, *params: Any) -> bytes:
    ps = "".join(f"<param>{value(p)}</param>" for p in params)
    return (f'<?xml version="1.0" encoding="UTF-8"?><methodCall {NS}><methodName>{method}</methodName>'
            f"<params>{ps}</params></methodCall>").encode()


def read_score_result(reply: bytes, hosts: list[str]) -> dict[str, list[tuple[int, str | None]]]:
    """A score reply read as the engine reads it: per host, its (weight, unit or None) entries.

    Like ExternalSchedulerBrokerObjectBuilder: every entry is an array of 2 or 3
    elements, a UUID, an XML-RPC integer (``<int>``/``<i4>``, never a double,
    in signed 32 bits) and optionally the unit name; a host missing from the
    reply counts as weight 0 (the best).
    """
    assert b"<double>" not in reply and b"<nil" not in reply and b"<i8>" not in reply
    (envelope,), _ = xmlrpc.client.loads(reply)
    out: dict[str, list[tuple[int, str | None]]] = {h: [] for h in hosts}
    for entry in envelope["result"]:
        assert isinstance(entry, list) and len(entry) in (2, 3), entry
        uuid.UUID(entry[0])
        assert type(entry[1]) is int and -(2**31) <= entry[1] < 2**31
        out.setdefault(entry[0], []).append((entry[1], entry[2] if len(entry) == 3 else None))
    for h in hosts:
        if not out[h]:
            out[h].append((0, None))  # the engine's default for a missing host
    assert not re.search(rb"<int>-", reply), "weights are never negative"
    return out
