"""Request bodies exactly as the oVirt engine (Apache XML-RPC 3.1, extensions on) sends them."""

from __future__ import annotations

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
