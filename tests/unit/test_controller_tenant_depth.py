"""Per-tenant drift: each estimate is capped by what its own queues (its live shard and the shared
queues) hold, so a phantom beside a large real backlog is corrected though the total looks right."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.controller import MemoryStore
from breakwater.backpressure import BackpressurePolicy
from breakwater.controller import ControllerConfig, ControllerReport, ShardRequest, run_controller
from breakwater.routing import shard_for
from breakwater.tenant_depth import ObservedDepths, tenant_depth

LIVE_QUEUES = 8
SHARD_SIZE = 2
CONFIG = ControllerConfig(
    backpressure=BackpressurePolicy(
        backlog_target=100, min_multiplier=0.1, growth_step=0.1, max_multiplier=2
    ),
    healthy_age_s=60,
    shard_size=SHARD_SIZE,
)


class Queues:
    """Each live queue's depth and the shared queues', as ingest routes a tenant's messages."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.live = [0] * LIVE_QUEUES
        self.shared = 0

    def send(self, tenant: str, count: int, *, counted: int | None = None) -> None:
        """``count`` messages on the tenant's live queues, ``counted`` of them counted accepted."""
        own = shard_for(tenant, LIVE_QUEUES, SHARD_SIZE)
        for i in range(count):
            self.live[own[i % len(own)]] += 1
        self.store.write(tenant, {"accepted": count if counted is None else counted})
        self.store.depth = sum(self.live) + self.shared

    def depths(self) -> ObservedDepths:
        return ObservedDepths(live=tuple(self.live), shared=self.shared)


def run(store: MemoryStore, queues: Queues, config: ControllerConfig = CONFIG) -> ControllerReport:
    store.now_ms += 60_000
    ports = replace(store.ports(), queue_depths=queues.depths)
    return run_controller(config, ports, deadline_ms=store.now_ms + 45_000)


def test_a_phantom_beside_a_large_real_backlog_is_corrected_in_one_run() -> None:
    big, small = (set(shard_for(t, LIVE_QUEUES, SHARD_SIZE)) for t in ("big", "small0"))
    assert not big & small  # no live queue in common
    store = MemoryStore()
    queues = Queues(store)
    queues.send("big", 10_000)
    queues.send("small0", 20, counted=520)  # 500 counted that never reached a queue (a lost processed)

    report = run(store, queues)

    # The total is within its tolerance (10,520 against 10,000 + 500): only the tenant's own queues
    # show it.
    assert report.reconciliation is not None and report.reconciliation.scale == 1.0
    assert report.backlogs == {"big": 10_000, "small0": 30}  # its queues' 20, plus the tolerance of 10
    assert store.buckets.get("small0", 1.0) == 1.0  # not throttled for a backlog it does not have
    assert store.buckets["big"] == pytest.approx(0.1)
    assert report.shards.corrections["ceiling"] == 1


def test_messages_moved_to_the_shared_queues_still_count_for_their_tenant() -> None:
    store = MemoryStore()
    queues = Queues(store)
    queues.send("small0", 400)
    queues.live = [0] * LIVE_QUEUES  # spilled and deferred: in the surge and sideline queues now
    queues.shared = 400

    report = run(store, queues)

    assert report.backlogs == {"small0": 400} and not report.shards.corrections
    assert store.buckets["small0"] == pytest.approx(0.25)


def test_without_the_shard_size_or_the_live_depths_the_total_caps_each_estimate() -> None:
    store = MemoryStore()
    queues = Queues(store)
    queues.send("big", 10_000)
    queues.send("small0", 20, counted=520)

    assert run(store, queues, replace(CONFIG, shard_size=None)).backlogs["small0"] == 520
    assert tenant_depth("small0", (), 0, SHARD_SIZE) is None


def test_a_fanned_out_run_gets_the_live_depths_and_an_older_event_the_total() -> None:
    request = ShardRequest(depth=30, scale_log=0.0, now_ms=1, deadline_ms=2, live_depths=(5, 0, 20, 5))
    event = request.as_event([3])
    assert ShardRequest.from_event(event, deadline_ms=2) == request
    del event["live_depths"]
    older = ShardRequest.from_event(event, deadline_ms=2)
    assert older.live_depths == () and older.tenant_depth("any", SHARD_SIZE) == 30


def test_negative_depths_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        ObservedDepths(live=(1, -1), shared=0)
