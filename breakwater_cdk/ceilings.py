"""Ceilings the tenants share, checked at synth; each error names the key and its value.

- **The stage throttle** is shared by every tenant and by every request, refused ones included: a
  request the authorizer turns away has already spent its place. It must carry several tenants of the
  largest tier at their usage plan's ceiling at once (``api.throttle_headroom``), or one such tenant
  would take the whole stage from everyone else. It remains a deliberately shared cap: its alarm fires
  when the stage's requests near it (``Monitoring.watch_stage``).
- **A Kinesis shard** takes 1,000 records and 1 MiB per second. A tenant's events, admitted at its
  tier's rate times ``streaming.event_rate_multiplier``, go to the shards its partition keys reach:
  one with ``partition_key: tenant``. Admitting more than they take only moves the refusal to the
  stream, after the tokens are spent. All tenants together share the stream, whose throttling alarms.
- **The queues' health reports** are spread over enough items that none takes more than a quarter
  of a partition's write units, at what the live worker's mappings allow.
- **Items** stay under DynamoDB's 400 KB (:mod:`breakwater_cdk.item_sizes`).
- **A tenant's ordered backlog item** (``ordered-tenant#<id>``) takes a write per admitted ordered
  message, one per FIFO batch that gives slots back, and the ingest containers' refusals: at the
  largest tier's rate it must stay within a partition's write units.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from breakwater.age_reports import REPORT_INTERVAL_MS
from breakwater_cdk.item_sizes import largest_items, oversized

if TYPE_CHECKING:
    from breakwater_cdk.config import BlueprintConfig

SHARD_RECORDS_PER_SECOND = 1000
SHARD_BYTES_PER_SECOND = 1024 * 1024
# An on-demand stream starts with the write capacity of this many shards and grows from there.
ON_DEMAND_START_SHARDS = 4
# What a record holds beside the event's payload, at its longest: the fields ingest stamps (id, tenant,
# type, key, value, times, request and trace ids) and the partition key.
EVENT_STAMP_BYTES = 1024
PARTITION_WRITE_UNITS = 1000  # a DynamoDB partition's write units per second
HEALTH_SHARD_WRITE_UNITS = PARTITION_WRITE_UNITS // 4
MAX_HEALTH_REPORT_SHARDS = 100  # the controller reads every shard of a role in one BatchGetItem

WorkerMode = Literal["live", "sideline"]


def worker_containers(config: BlueprintConfig, mode: WorkerMode) -> int:
    """Worker invocations the mode's mappings allow at once: the live worker reads the live queues and
    the surge queue, the sideline worker the spillover and backlog queues."""
    mapped = config.effective_queue_count + 1 if mode == "live" else 2
    return mapped * config.worker.mapping_concurrency


def consumer_bucket_containers(config: BlueprintConfig) -> int:
    """Worker invocations that may ask one tenant's consumer bucket at once: the live worker's and the
    sideline worker's (a naive stack's workers ask no bucket, and leave the figure unused)."""
    return worker_containers(config, "live") + worker_containers(config, "sideline")


def burst_slots(config: BlueprintConfig, mode: WorkerMode) -> int | None:
    """The burst pool: leases above the tenants' floors over all tenants (None: no pool)."""
    share = config.worker.burst_share
    return None if share is None else max(1, int(share * worker_containers(config, mode)))


def health_report_writes(config: BlueprintConfig) -> float:
    """Health report writes per second at most: each container reports at most once per interval."""
    return worker_containers(config, "live") * 1000 / REPORT_INTERVAL_MS


def health_report_shards(config: BlueprintConfig) -> int:
    """Items each role's health reports are spread over (the live workers' figure, so the controller
    reads the keys every worker writes)."""
    shards = math.ceil(health_report_writes(config) / HEALTH_SHARD_WRITE_UNITS)
    return min(MAX_HEALTH_REPORT_SHARDS, max(1, shards))


def _scaling_key(config: BlueprintConfig) -> str:
    pollers = config.worker.provisioned_pollers
    if pollers is not None:
        return f"breakwater.worker.provisioned_pollers.maximum_pollers = {pollers.maximum_pollers}"
    return f"breakwater.worker.max_concurrency = {config.worker.max_concurrency}"


def stage_throttle_problems(config: BlueprintConfig) -> list[str]:
    api, ceiling = config.api, config.backpressure.max_multiplier
    rate_tier, rate_limits = max(config.tiers.items(), key=lambda named: named[1].rate)
    burst_tier, burst_limits = max(config.tiers.items(), key=lambda named: named[1].burst)
    plan_rate = rate_limits.rate * ceiling
    problems = []
    if api.throttle_rate < api.throttle_headroom * plan_rate:
        problems.append(
            f"breakwater.api.throttle_rate = {api.throttle_rate:g}: below api.throttle_headroom "
            f"({api.throttle_headroom:g}) x the {rate_tier!r} tier's usage plan ({rate_limits.rate:g}/s x "
            f"backpressure.max_multiplier {ceiling:g} = {plan_rate:g}/s) = "
            f"{api.throttle_headroom * plan_rate:g}/s; every tenant and every unauthenticated request "
            "share the stage, so one such tenant would take most of it"
        )
    if api.throttle_burst < api.throttle_headroom * burst_limits.burst:
        problems.append(
            f"breakwater.api.throttle_burst = {api.throttle_burst}: below api.throttle_headroom "
            f"({api.throttle_headroom:g}) x the {burst_tier!r} tier's burst ({burst_limits.burst}) = "
            f"{api.throttle_headroom * burst_limits.burst:g}"
        )
    return problems


def reachable_shards(config: BlueprintConfig) -> int:
    """The shards one tenant's events can reach: one partition key is one shard."""
    streaming = config.streaming
    if streaming.partition_key == "tenant":
        return 1
    return streaming.shard_count if streaming.capacity_mode == "provisioned" else ON_DEMAND_START_SHARDS


def events_problems(config: BlueprintConfig) -> list[str]:
    streaming = config.streaming
    if not streaming.enabled or config.mode == "naive":  # naive admits every event: no tenant bound
        return []
    tier, limits = max(config.tiers.items(), key=lambda named: named[1].rate)
    events = limits.rate * streaming.event_rate_multiplier
    shards = reachable_shards(config)
    reach = (
        f"{shards} shard{'s' if shards > 1 else ''} with streaming.partition_key {streaming.partition_key!r}"
        + ("" if streaming.partition_key == "tenant" else f" in {streaming.capacity_mode} mode")
    )
    problems = []
    if events > shards * SHARD_RECORDS_PER_SECOND:
        problems.append(
            f"breakwater.streaming.event_rate_multiplier = {streaming.event_rate_multiplier:g}: the {tier!r} "
            f"tier's events ({limits.rate:g}/s x {streaming.event_rate_multiplier:g} = {events:g} records/s) "
            f"exceed what one tenant's partition keys reach ({reach}: "
            f"{shards * SHARD_RECORDS_PER_SECOND:,} records/s)"
        )
    record_bytes = streaming.max_event_bytes + EVENT_STAMP_BYTES
    if events * record_bytes > shards * SHARD_BYTES_PER_SECOND:
        problems.append(
            f"breakwater.streaming.max_event_bytes = {streaming.max_event_bytes}: the {tier!r} tier's "
            f"events at their largest ({events:g}/s x ({streaming.max_event_bytes} + {EVENT_STAMP_BYTES} "
            f"stamped) bytes = {events * record_bytes:,.0f} B/s) exceed what one tenant's partition keys "
            f"reach ({reach}: {shards * SHARD_BYTES_PER_SECOND:,} B/s)"
        )
    return problems


def health_report_problems(config: BlueprintConfig) -> list[str]:
    per_shard = health_report_writes(config) / MAX_HEALTH_REPORT_SHARDS
    if per_shard <= PARTITION_WRITE_UNITS:
        return []
    return [
        f"{_scaling_key(config)} (with breakwater.queue_set.size = {config.queue_set.size}): "
        f"{worker_containers(config, 'live'):,} live worker containers report queue health at "
        f"{health_report_writes(config):,.0f} writes/s, over {MAX_HEALTH_REPORT_SHARDS} items' "
        f"{PARTITION_WRITE_UNITS:,} write units/s each"
    ]


def item_size_problems(config: BlueprintConfig) -> list[str]:
    items = largest_items(
        config, burst_slots=burst_slots(config, "live"), health_shards=health_report_shards(config)
    )
    return oversized(items)


# ingest containers' writes on a full tenant's item: each refuses from memory until its Retry-After, so
# about one write per container every few seconds (a hundred containers, one every five seconds)
ORDERED_REFUSAL_WRITES = 20


def ordered_tenant_writes(config: BlueprintConfig, rate: float) -> float:
    """Write units per second on one tenant's ordered backlog item at ``rate`` ordered messages/s."""
    return rate * (1 + 1 / config.ordered.batch_size) + ORDERED_REFUSAL_WRITES


def ordered_tenant_problems(config: BlueprintConfig) -> list[str]:
    if not config.ordered.enabled:
        return []
    return [
        f"breakwater.tiers.{name}.rate = {tier.rate:g}: with breakwater.ordered.enabled its ordered "
        f"backlog item takes {ordered_tenant_writes(config, tier.rate):,.0f} writes/s (batch_size "
        f"{config.ordered.batch_size}), over a partition's {PARTITION_WRITE_UNITS:,} write units/s"
        for name, tier in sorted(config.tiers.items())
        if ordered_tenant_writes(config, tier.rate) > PARTITION_WRITE_UNITS
    ]


def shared_ceiling_problems(config: BlueprintConfig) -> list[str]:
    """Every shared ceiling ``config`` breaks, each naming its key and value (none: it holds)."""
    return [
        *stage_throttle_problems(config),
        *events_problems(config),
        *health_report_problems(config),
        *item_size_problems(config),
        *ordered_tenant_problems(config),
    ]
