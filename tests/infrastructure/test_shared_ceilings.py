"""Shared ceilings hold at synth: the stage throttle, the stream's shards, the health items, item sizes.

Configuration only (no synth): ``load_config`` runs every check a synth does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from app import cdk_json_context, merge_context
from breakwater.concurrency import LEASE_SHARD_PLACES, POOL_SHARD_PLACES, pool_shard_capacities
from breakwater.events import PartitionKeyMode, StreamEvent, to_record
from breakwater.requests import MAX_KEY_LENGTH
from breakwater_cdk import ceilings
from breakwater_cdk.config import MAX_TENANT_CONCURRENCY, BlueprintConfig, TierConfig, load_config
from breakwater_cdk.item_sizes import (
    CONSUMER_BUCKET_NUMBERS,
    CONTAINER_ID_BYTES,
    COUNTERS_FIELDS_BYTES,
    TENANT_ID_BYTES,
    ItemSize,
    counters_item_bytes,
    largest_items,
    lease_shard_item_bytes,
    oversized,
    pool_shard_item_bytes,
)
from local.pricing.usage import item_size

ROOT = Path(__file__).resolve().parents[2]


def config_with(overrides: dict[str, Any]) -> BlueprintConfig:
    return load_config(merge_context(cdk_json_context()["breakwater"], overrides))


# The largest configurations the config model accepts: every tier at the concurrency bound, the most
# live queues, the widest mappings (on demand, and provisioned up to what the health items take), and
# the whole fleet open to bursting.
LARGEST_ON_DEMAND = {
    "tiers": {
        name: {"concurrency": MAX_TENANT_CONCURRENCY, "rate": 500, "burst": 1000}
        for name in ("standard", "premium")
    },
    "queue_set": {"size": 64},
    "worker": {"max_concurrency": 1000, "burst_share": 1.0},
}
LARGEST_PROVISIONED = {
    **LARGEST_ON_DEMAND,
    "worker": {  # None removes cdk.json's max_concurrency, exclusive with the pollers
        "max_concurrency": None,
        "burst_share": 1.0,
        "provisioned_pollers": {"minimum_pollers": 200, "maximum_pollers": 769},
    },
}


def test_the_default_configuration_and_the_examples_hold_every_shared_ceiling() -> None:
    assert ceilings.shared_ceiling_problems(config_with({})) == []
    for example in sorted((ROOT / "examples").glob("*/cdk.json")):
        context = json.loads(example.read_text())["context"]["breakwater"]
        assert ceilings.shared_ceiling_problems(load_config(context)) == [], example


def test_the_stage_carries_the_headroom_of_the_largest_tiers_usage_plan() -> None:
    config = config_with({})
    premium = config.tiers["premium"]
    plan = premium.rate * config.backpressure.max_multiplier
    assert config.api.throttle_rate >= config.api.throttle_headroom * plan
    assert config.api.throttle_burst >= config.api.throttle_headroom * premium.burst
    # exactly at the headroom is enough
    assert config_with({"api": {"throttle_rate": 4 * plan, "throttle_burst": 4 * premium.burst}})


def test_one_tenants_events_fit_the_shards_its_partition_keys_reach() -> None:
    config = config_with({})
    largest = max(tier.rate for tier in config.tiers.values()) * config.streaming.event_rate_multiplier
    record = config.streaming.max_event_bytes + ceilings.EVENT_STAMP_BYTES
    assert ceilings.reachable_shards(config) == 1
    assert largest <= ceilings.SHARD_RECORDS_PER_SECOND
    assert largest * record <= ceilings.SHARD_BYTES_PER_SECOND
    # a hot tenant spread by its events' keys over enough shards may send more
    spread = config_with(
        {
            "streaming": {
                "partition_key": "tenant_and_key",
                "shard_count": 7,
                "event_rate_multiplier": 10,
                "max_event_bytes": 256,
            }
        }
    )
    assert ceilings.reachable_shards(spread) == 7
    # events are not checked where they are not built, or admitted without limits (naive)
    assert config_with({"streaming": {"enabled": False, "event_rate_multiplier": 100}})
    assert config_with({"mode": "naive", "streaming": {"event_rate_multiplier": 100}})


def test_a_record_holds_at_most_the_stamp_allowance_beside_its_payload() -> None:
    """The longest type, key, tenant and trace id ingest writes, keyed by tenant and key."""
    longest = StreamEvent(
        id="0" * 26,
        tenant="t" * TENANT_ID_BYTES,
        type="y" * MAX_KEY_LENGTH,
        key="k" * MAX_KEY_LENGTH,
        value=-1.2345678901234567e-300,
        payload=None,
        occurred_at=10**13 - 1,
        received_at=10**13 - 1,
        request_id="r" * 36,
        trace_id="Root=1-67891233-abcdef012345678912345678;Parent=53995c3f42cd8ad8;Sampled=1",
    )
    record = to_record(longest, PartitionKeyMode.TENANT_AND_KEY)
    assert record.size - len(b"null") <= ceilings.EVENT_STAMP_BYTES


@pytest.mark.parametrize(
    "largest", [LARGEST_ON_DEMAND, LARGEST_PROVISIONED], ids=["on-demand", "provisioned"]
)
def test_every_item_stays_far_below_400_kb_at_the_largest_configuration(largest: dict[str, Any]) -> None:
    config = config_with(largest)  # accepted
    slots = ceilings.burst_slots(config, "live")
    assert slots == ceilings.worker_containers(config, "live")  # burst_share 1: the whole fleet
    assert max(pool_shard_capacities(slots)) <= POOL_SHARD_PLACES
    items = largest_items(config, burst_slots=slots, health_shards=ceilings.health_report_shards(config))
    assert {item.item for item in items} == {
        "tenant#<id>/counters",
        "tenant#<id>/bucket#<purpose>",
        "tenant#<id>/lease#<k>",
        "queue#<role>/health#<n>",
        "pool#concurrency/burst#<n>",
    }
    sizes = {item.item: item.size_bytes for item in items}
    assert max(sizes.values()) == sizes["tenant#<id>/counters"]
    # no item holds more than a shard's leases or places, whatever the tiers' concurrency
    assert sizes["tenant#<id>/counters"] <= counters_item_bytes(LEASE_SHARD_PLACES) < 8 * 1024
    assert sizes["tenant#<id>/lease#<k>"] == lease_shard_item_bytes(LEASE_SHARD_PLACES, 63) < 2 * 1024
    assert sizes["pool#concurrency/burst#<n>"] < 4 * 1024


def test_a_counters_item_holds_at_most_one_lease_shard_s_leases() -> None:
    """A tier of one shard's concurrency keeps its leases on its counters item; one above it, none."""
    config = config_with({"tiers": {"standard": {"concurrency": LEASE_SHARD_PLACES, "concurrency_floor": 1}}})
    sizes = {item.item: item.size_bytes for item in largest_items(config, burst_slots=None, health_shards=1)}
    assert sizes["tenant#<id>/counters"] == counters_item_bytes(LEASE_SHARD_PLACES)
    wide = {name: {"concurrency": LEASE_SHARD_PLACES + 1} for name in config.tiers}
    sizes = {
        item.item: item.size_bytes
        for item in largest_items(config_with({"tiers": wide}), burst_slots=None, health_shards=1)
    }
    assert sizes["tenant#<id>/counters"] == counters_item_bytes(0)
    assert sizes["tenant#<id>/lease#<k>"] == lease_shard_item_bytes(9, 2)  # 17 leases in two shards


def test_a_tier_past_the_concurrency_bound_grows_no_item() -> None:
    """A tier's concurrency is clamped to the bound the design is sized for, its leases in shards."""
    config = config_with({})
    huge = TierConfig.model_construct(**{**config.tiers["premium"].model_dump(), "concurrency": 10_000})
    assert (
        ceilings.item_size_problems(config.model_copy(update={"tiers": {**config.tiers, "premium": huge}}))
        == []
    )


def test_an_item_past_the_limit_is_a_config_error_naming_the_key_it_grows_with() -> None:
    problems = oversized([ItemSize("tenant#<id>/lease#<k>", 500_000, "tiers.premium.concurrency", 10_000)])
    assert problems == [
        "breakwater.tiers.premium.concurrency = 10000: the item tenant#<id>/lease#<k> would reach "
        "500,000 bytes, over DynamoDB's 409,600-byte item limit"
    ]


def test_the_sizes_are_never_below_what_dynamodb_counts_for_the_real_items() -> None:
    """The size rules against the emulator's billing of a full counters item, a full lease shard and a
    full pool shard."""
    tenant = "t" * TENANT_ID_BYTES
    leases = {
        f"{index:0{CONTAINER_ID_BYTES}x}": {"M": {"exp": {"N": "1764325200123"}, "burst": {"BOOL": True}}}
        for index in range(LEASE_SHARD_PLACES)
    }
    counters = {
        "pk": {"S": f"tenant#{tenant}"},
        "sk": {"S": "counters"},
        "leases": {"M": leases},
        "version": {"N": "123456789"},
        **{f"consumer_{name}": {"N": "1764325200.123456"} for name in CONSUMER_BUCKET_NUMBERS},
    }
    real = item_size(counters)
    assert real <= counters_item_bytes(LEASE_SHARD_PLACES) - COUNTERS_FIELDS_BYTES < real * 1.3
    shard = {key: value for key, value in counters.items() if not key.startswith("consumer_")}
    shard = {**shard, "sk": {"S": "lease#62"}}  # the last of a ceiling of 1,000's 63 shards
    assert item_size(shard) <= lease_shard_item_bytes(LEASE_SHARD_PLACES, 63) < item_size(shard) * 1.3
    places = {f"{tenant}#{index:0{CONTAINER_ID_BYTES}x}": {"N": "1764325200123"} for index in range(16)}
    pool = {
        "pk": {"S": "pool#concurrency"},
        "sk": {"S": "burst#9"},
        "leases": {"M": places},
        "version": {"N": "7"},
    }
    assert item_size(pool) <= pool_shard_item_bytes(16, 10)


@pytest.mark.parametrize(
    ("overrides", "shards"),
    [
        ({}, 1),  # 9 mappings x 10: 18 reports/s
        ({"worker": {"max_concurrency": 1000}}, 8),  # 9,000 containers: 1,800/s over 250/s items
        ({"queue_set": {"size": 64}, "worker": {"max_concurrency": 1000}}, 52),
        ({"worker": {"max_concurrency": None, "provisioned_pollers": {"maximum_pollers": 2000}}}, 100),
    ],
)
def test_health_reports_spread_over_items_of_a_quarter_partition(
    overrides: dict[str, Any], shards: int
) -> None:
    config = config_with(overrides)
    assert ceilings.health_report_shards(config) == shards
    writes = ceilings.worker_containers(config, "live") / 5  # one report per container per 5 s
    assert shards == min(100, max(1, math.ceil(writes / 250)))
