"""A service acknowledges a request only once what it published for it is confirmed by the broker.

A reply published without a confirm can be lost on its way when a broker node dies (the node routed it, or
was about to, when it was killed) while the request's ack, sent after it, is already replicated: the request
would be gone and its reply too. And the broker's own dead-lettering from a quorum queue is *at most once*
(RabbitMQ 3.10): a request sent to its second chance while its dead-letter queue elects a new leader can be
dropped. So the service's channel is in confirm mode, the service puts a request's second chance on its
dead-letter queue itself, and a request is acknowledged once its reply or its copy is confirmed. A refused one
(a nack) leaves its request unacknowledged; the worker then takes a new connection and the broker delivers the
request again.
"""

from __future__ import annotations

from collections import OrderedDict

from kombu.message import Message


class AcksAfterConfirm:
    """The publishes of one channel (:meth:`watch` it first), in order, and the delivery each one acknowledges
    once it is confirmed. On the thread that owns the channel."""

    def __init__(self) -> None:
        self._tag = 0  # last publish's delivery tag on the channel
        self._waiting: OrderedDict[int, Message] = OrderedDict()  # publish tag -> the delivery it acknowledges
        self.refused = False  # the broker refused a publish: take a new connection

    def __len__(self) -> int:
        return len(self._waiting)

    def watch(self, channel: object) -> None:
        channel.confirm_select()  # type: ignore[attr-defined]
        channel.events["basic_ack"].add(self._ack)  # type: ignore[attr-defined]
        channel.events["basic_nack"].add(self._nack)  # type: ignore[attr-defined]

    def published(self, then_ack: Message | None) -> None:
        """One message was published on the channel; once the broker confirms it, ``then_ack`` is acknowledged
        (None: nothing waits for it)."""
        self._tag += 1
        if then_ack is not None:
            self._waiting[self._tag] = then_ack

    def _ack(self, tag: int, multiple: bool) -> None:
        for message in self._settle(tag, multiple):
            message.ack()

    def _nack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)  # not acknowledged: delivered again on the next connection
        self.refused = True

    def _settle(self, tag: int, multiple: bool) -> list[Message]:
        if not multiple:
            message = self._waiting.pop(tag, None)
            return [message] if message is not None else []
        settled = []
        while self._waiting:
            first = next(iter(self._waiting))
            if first > tag:
                break
            settled.append(self._waiting.pop(first))
        return settled
