"""Output capture for plugin calls: size-capped stand-ins for sys.stdout/stderr.

This module imports only the standard library: the worker process imports it.
"""

from __future__ import annotations

import io
from typing import Any


class OutputLimitExceeded(BaseException):
    """Raised into the plugin when it writes more stdout than allowed.

    A BaseException so that a plugin's ``except Exception`` does not hide it.
    """


class Capture(io.TextIOBase):
    """A size-capped in-memory text stream standing in for sys.stdout/stderr.

    With ``strict`` the first write past ``limit`` bytes raises
    :class:`OutputLimitExceeded`; otherwise the text is silently truncated.
    """

    def __init__(self, limit: int, strict: bool) -> None:
        super().__init__()
        self.limit = limit
        self.strict = strict
        self.exceeded = False
        self._parts: list[str] = []
        self._size = 0

    @property
    def buffer(self) -> _BinaryCapture:
        return _BinaryCapture(self)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        self.add(text, size)
        return len(text)

    def add(self, text: str, size: int) -> None:
        if not self.exceeded and self._size + size <= self.limit:
            self._size += size
            self._parts.append(text)
            return
        if not self.exceeded and not self.strict:
            self._parts.append(text[: self.limit - self._size])
        self.exceeded = True
        if self.strict:
            raise OutputLimitExceeded(f"stdout exceeded {self.limit} bytes")

    def getvalue(self) -> str:
        text = "".join(self._parts)
        if self.exceeded and not self.strict:
            text += f"\n[output truncated at {self.limit} bytes]\n"
        return text


class _BinaryCapture(io.RawIOBase):
    """``sys.stdout.buffer`` of a :class:`Capture`."""

    def __init__(self, text: Capture) -> None:
        super().__init__()
        self._text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        raw = bytes(data)
        self._text.add(raw.decode("utf-8", "replace"), len(raw))
        return len(raw)

