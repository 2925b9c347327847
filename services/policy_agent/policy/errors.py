"""Errors of the policy agent, with the code the RPC layers report."""

from __future__ import annotations


class AgentError(Exception):
    """Base class; ``code`` is what the socket/bus reply carries."""

    code = "internal"


class PolicyError(AgentError, ValueError):
    """A policy (or pool change) refused whole; ``errors`` lists every reason."""

    code = "invalid"

    def __init__(self, errors: list[str] | str):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("; ".join(self.errors))


class GuestNotFound(AgentError, LookupError):
    code = "not_found"

    def __init__(self, guest: str, message: str | None = None):
        self.guest = guest
        super().__init__(message or f"no guest named or with UUID {guest!r} on this host")


class AgentUnavailable(AgentError):
    """The agent (socket) or libvirt cannot be reached."""

    code = "unavailable"


class ApplyError(AgentError):
    """libvirt refused to apply a valid policy."""

    code = "internal"


CODES = ("invalid", "not_found", "unavailable", "internal")


def encode(exc: AgentError) -> str:
    """``"code: message"``, the text of a bus error reply (the bus carries no code field)."""
    return f"{exc.code}: {exc}"


def decode(text: str) -> tuple[str, str]:
    """``"code: message"`` -> (code, message); unknown prefixes are ``internal``."""
    code, sep, message = text.partition(": ")
    if sep and code in CODES:
        return code, message
    return "internal", text


def from_reply(code: str | None, message: str) -> AgentError:
    """Rebuild the exception a remote agent raised."""
    if code == "invalid":
        return PolicyError(message)
    if code == "not_found":
        return GuestNotFound("", message)
    if code == "unavailable":
        return AgentUnavailable(message)
    return AgentError(message)
