"""Correlation IDs from a pooled read of the OS's randomness."""

from __future__ import annotations

import re

from vmsched.bus.rabbitmq.client import Unguessable


def test_tokens_are_8_random_bytes_in_hex_and_the_pool_refills():
    token = Unguessable(batch=4)
    seen = [token() for _ in range(41)]  # ten refills and one more
    assert all(re.fullmatch(r"[0-9a-f]{16}", t) for t in seen)
    assert len(set(seen)) == len(seen)


def test_two_sources_do_not_share_tokens():
    a, b = Unguessable(), Unguessable()
    assert {a() for _ in range(100)}.isdisjoint({b() for _ in range(100)})
