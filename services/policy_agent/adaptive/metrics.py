"""Prometheus metrics of the agent's tuners (names are part of the interface)."""

from __future__ import annotations

import itertools

from prometheus_client import Counter, Histogram

from vmsched.metrics import REGISTRY

from ..tuners.engine import BUILTIN
from ..tuners.types import FIELDS

OUTCOMES = ("applied", "dry_run", "refused", "deferred", "error")

CHANGES = Counter(
    "vmsched_agent_tuner_changes_total",
    "Tuner decisions, by tuner, field (cpu_shares, vcpu_quota, vcpus) and outcome (applied, dry_run, refused, deferred by a rate limit, error)",
    ["tuner", "field", "outcome"],
    registry=REGISTRY,
)
ROUND_SECONDS = Histogram(
    "vmsched_agent_tuner_round_seconds", "Duration of one tuner round (sampling, tuners, applying)",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=REGISTRY,
)

for _labels in itertools.product(BUILTIN, FIELDS, OUTCOMES):
    CHANGES.labels(*_labels)
