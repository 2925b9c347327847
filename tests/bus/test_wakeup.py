"""A bus thread's Wakeup: no hand-over waits for the thread's timeout, however the wake-ups interleave."""

from __future__ import annotations

import threading
import time
from collections import deque

from vmsched.bus.rabbitmq.connection import Wakeup


def test_every_hand_over_is_seen_at_once_under_a_storm_of_wake_ups() -> None:
    wakeup, work, latencies = Wakeup(), deque(), []
    done = threading.Event()

    def thread() -> None:  # as a bus thread: wait, then run what it finds
        while not done.is_set() or work:
            wakeup.wait(None, 2.0)
            while work:
                latencies.append(time.monotonic() - work.popleft())

    consumer = threading.Thread(target=thread)
    consumer.start()
    producers = [threading.Thread(target=lambda: [(work.append(time.monotonic()), wakeup.wake(),
                                                   time.sleep(0.0001 * (i % 3))) for i in range(3000)])
                 for _ in range(3)]
    for p in producers:
        p.start()
    for p in producers:
        p.join()
    done.set()
    wakeup.wake()
    consumer.join(10)
    wakeup.close()
    assert len(latencies) == 9000
    assert max(latencies) < 1.0, f"a hand-over waited {max(latencies):.2f} s for the thread's timeout"
