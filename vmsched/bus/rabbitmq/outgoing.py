"""What the gateway's bus client keeps of a request until it is answered: enough to send it again."""

from __future__ import annotations

from dataclasses import dataclass

from kombu import Exchange


@dataclass
class Outgoing:
    queue: str
    exchange: Exchange
    key: str
    payload: bytes
    deadline: float  # time.time()
    resend: bool  # a scheduling request (no side effects) may be sent again
    sent: int = 0
    failed: int = 0  # publishes that broke the connection
    why: str = "reconnect"  # why it goes out again after the next reconnection
