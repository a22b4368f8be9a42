"""The environment of each function: the contract with ``functions/breakwater/settings.py``.

A field ``foo_bar`` of a settings model is the variable ``FOO_BAR``; lists are comma-separated,
maps are JSON, booleans are ``true``/``false``. A test keeps these names equal to the models' fields.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from aws_cdk import Fn
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_sqs as sqs

from stacks.config import BlueprintConfig


def flag(value: bool) -> str:
    return "true" if value else "false"


def queue_urls(queues: Sequence[sqs.IQueue]) -> str:
    return Fn.join(",", [queue.queue_url for queue in queues])


def tier_environment(config: BlueprintConfig) -> dict[str, str]:
    """TIERS and DEFAULT_TIER (TierSettings), shared by every handler that applies limits."""
    tiers = {name: tier.model_dump() for name, tier in sorted(config.tiers.items())}
    return {"TIERS": json.dumps(tiers, sort_keys=True), "DEFAULT_TIER": config.default_tier}


def authorizer_environment(config: BlueprintConfig, *, tenants: dynamodb.ITable) -> dict[str, str]:
    return {**tier_environment(config), "TENANTS_TABLE_NAME": tenants.table_name}


def ingest_environment(
    config: BlueprintConfig, *, state: dynamodb.ITable, live_queues: Sequence[sqs.IQueue]
) -> dict[str, str]:
    ingest = config.ingest
    return {
        **tier_environment(config),
        "STATE_TABLE_NAME": state.table_name,
        "LIVE_QUEUE_URLS": queue_urls(live_queues),
        "SHARD_SIZE": str(min(config.queue_set.shard_size, len(live_queues))),
        "FAIR_QUEUES": flag(config.queue_set.fair_queues),
        "MAX_PAYLOAD_BYTES": str(ingest.max_payload_bytes),
        "MAX_TTL_SECONDS": str(ingest.max_ttl_seconds),
        "LEASE_SECONDS": str(ingest.lease_seconds),
        "LEASE_MAX_FRACTION": str(ingest.lease_max_fraction),
        "DEPTH_REFRESH_SECONDS": str(ingest.depth_refresh_seconds),
        # The naive baseline accepts everything: the comparison the demo draws.
        "THROTTLING_ENABLED": flag(config.mode != "naive"),
    }
