"""Errors of the policy agent, with the code the RPC layers report (:class:`vmsched.messages.ErrorCode`)."""

from __future__ import annotations

from vmsched.messages import ErrorCode


class AgentError(Exception):
    """Base class; ``code`` is what the socket/bus reply carries."""

    code: str = ErrorCode.INTERNAL.value


class PolicyError(AgentError, ValueError):
    """A policy (or pool change) refused whole; ``errors`` lists every reason."""

    code = ErrorCode.INVALID.value

    def __init__(self, errors: list[str] | str):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("; ".join(self.errors))


class GuestNotFound(AgentError, LookupError):
    code = ErrorCode.NOT_FOUND.value


class AgentUnavailable(AgentError):
    """The agent (socket) or libvirt cannot be reached."""

    code = ErrorCode.UNAVAILABLE.value


class ApplyError(AgentError):
    """libvirt refused to apply a valid policy (code internal, as every AgentError)."""


class DefinitionChanged(ApplyError):
    """A guest's persistent definition changed between the read a repair was decided from and its writes
    (another writer: an admin's define, the guest's manager): the repair is decided again from a new read,
    never written over the newer definition."""


def from_reply(code: str | None, message: str, details: list[str] | None = None) -> AgentError:
    """Rebuild the exception a remote agent raised, from its reply's code (an ErrorCode value)."""
    if code == ErrorCode.INVALID:
        return PolicyError(details or message)
    if code == ErrorCode.NOT_FOUND:
        return GuestNotFound(message)
    if code == ErrorCode.UNAVAILABLE:
        return AgentUnavailable(message)
    error = AgentError(message)
    if code == ErrorCode.UNSUPPORTED_VERSION:
        error.code = code
    return error
