"""The plugin sandbox in GET /v1/units: what the discovery reply says, as the pool's metric says it."""

from __future__ import annotations

import httpx

from tests.support.stack import Stack
from vmsched.messages import DiscoverReply
from vmsched.runtime.worker.sandbox import FEATURES


def _gauge(stack: Stack, pool: str) -> dict[str, float]:
    assert stack.metrics_url is not None
    text = httpx.get(stack.metrics_url + "/metrics", timeout=10).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vmsched_plugin_confinement{") and f'pool="{pool}"' in line:
            feature = line.split('feature="', 1)[1].split('"', 1)[0]
            values[feature] = float(line.rsplit(" ", 1)[1])
    return values


def test_units_show_every_confinement_feature_as_the_metric_does(stack: Stack):
    body = stack.get("/v1/units").json()
    shown = body["confinement"]
    assert set(shown) == set(FEATURES)
    for feature, state in shown.items():
        assert state.startswith("on") or state.startswith("off: "), (feature, state)
    gauge = _gauge(stack, "discovery")
    assert gauge == {f: (1.0 if shown[f].startswith("on") else 0.0) for f in FEATURES}
    assert shown["limits"].startswith("on")  # resource limits need no privilege: always on


def test_a_discovery_reply_without_confinement_still_reads():
    old = DiscoverReply.model_validate_json('{"units": [], "load_errors": []}')
    assert old.confinement is None
    assert "confinement" in DiscoverReply.model_validate({"confinement": {"seccomp": "on"}}).model_dump()
