"""The environment of each function: the contract with ``functions/breakwater/settings.py``.

A field ``foo_bar`` of a settings model is the variable ``FOO_BAR``; lists are comma-separated,
maps are JSON, booleans are ``true``/``false``. A test keeps these names equal to the models' fields.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from aws_cdk import Fn, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import IConstruct

from breakwater_cdk import ceilings
from breakwater_cdk.config import BlueprintConfig
from breakwater_cdk.queue_set import QueueSet
from breakwater_cdk.tables import Tables


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
    config: BlueprintConfig,
    *,
    state: dynamodb.ITable,
    live_queues: Sequence[sqs.IQueue],
    keys: dynamodb.ITable | None = None,
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
        # Idempotency keys are claimed in the idempotency table, for the window the workers keep theirs.
        **(
            {
                "IDEMPOTENCY_TABLE_NAME": keys.table_name,
                "IDEMPOTENCY_WINDOW_SECONDS": str(ingest.idempotency_window_seconds),
                "IDEMPOTENCY_PENDING_SECONDS": str(ingest.idempotency_pending_seconds),
            }
            if keys is not None
            else {}
        ),
    }


def health_report_environment(config: BlueprintConfig) -> dict[str, str]:
    """The items each queue role's oldest-age reports are spread over: the live workers' figure for
    every worker and the controller, so the controller reads exactly the keys the workers write."""
    return {"HEALTH_REPORT_SHARDS": str(ceilings.health_report_shards(config))}


def worker_environment(
    config: BlueprintConfig,
    *,
    mode: ceilings.WorkerMode,
    tables: Tables,
    queues: QueueSet,
) -> dict[str, str]:
    worker, sideline, ingest = config.worker, config.sideline, config.ingest
    burst = {}
    # Leases above the tenants' floors, over all tenants: the rest of the worker's concurrency stays
    # free for floors, so a crowd of bursting tenants cannot take a quiet tenant's floor. The worker's
    # concurrency is what its mappings allow: their maximum concurrency, or in provisioned mode what
    # their maximum pollers run.
    slots = ceilings.burst_slots(config, mode)
    if slots is not None:
        burst["CONCURRENCY_BURST_SLOTS"] = str(slots)
    return {
        **burst,
        **tier_environment(config),
        **health_report_environment(config),
        "WORKER_MODE": mode,
        # how many containers may count a tenant at once: they pace its counters' writes together
        "WORKER_CONTAINERS": str(ceilings.worker_containers(config, mode)),
        # and how many may ask a tenant's consumer bucket, the live and the sideline workers' together:
        # they pace their asks of a contended bucket together
        "CONSUMER_BUCKET_CONTAINERS": str(ceilings.consumer_bucket_containers(config)),
        "STATE_TABLE_NAME": tables.state.table_name,
        "IDEMPOTENCY_TABLE_NAME": tables.idempotency.table_name,
        "IDEMPOTENCY_TTL_SECONDS": str(ingest.idempotency_window_seconds),
        "PROCESSING_GUARANTEE": config.processing.guarantee,
        "TENANTS_TABLE_NAME": tables.tenants.table_name,
        "SPILLOVER_QUEUE_URL": queues.spillover.queue.queue_url,
        "BACKLOG_QUEUE_URL": queues.backlog.queue.queue_url,
        "SURGE_QUEUE_URL": queues.surge.queue.queue_url,
        "SIDELINE_AGE_SECONDS": str(sideline.sideline_age_seconds),
        "MAX_DEFER_SECONDS": str(sideline.max_defer_seconds),
        "DEFER_BASE_SECONDS": str(sideline.defer_base_seconds),
        "HEARTBEAT_SECONDS": str(worker.heartbeat_seconds),
        "VISIBILITY_TIMEOUT_SECONDS": str(worker.visibility_timeout_seconds),
        "LEASE_SECONDS": str(ingest.lease_seconds),
        "LEASE_MAX_FRACTION": str(ingest.lease_max_fraction),
        "OUTAGE_BACKOFF_SECONDS": f"{worker.outage_backoff_seconds:g}",
        "OUTAGE_BACKOFF_MAX_SECONDS": f"{worker.outage_backoff_max_seconds:g}",
        "FAIR_QUEUES": flag(config.queue_set.fair_queues),
        # Every queue a worker reads dead-letters after this many receives: a message that fails on
        # its last one is counted dead_lettered, so it leaves the tenant's backlog estimate.
        "MAX_RECEIVE_COUNT": str(config.queue_set.max_receive_count),
        # The naive baseline processes everything in arrival order: no sidelining, no per-tenant gates.
        "SIDELINING_ENABLED": flag(config.mode != "naive"),
    }


def controller_environment(
    config: BlueprintConfig, *, tables: Tables, queues: QueueSet, sideline_mapping_ids: Sequence[str]
) -> dict[str, str]:
    backpressure = config.backpressure
    return {
        **tier_environment(config),
        **health_report_environment(config),
        "STATE_TABLE_NAME": tables.state.table_name,
        "TENANTS_TABLE_NAME": tables.tenants.table_name,
        "LIVE_QUEUE_URLS": queue_urls([pair.queue for pair in queues.live]),
        # a tenant's messages wait only in its own live queues (ingest's order): each estimate is capped
        # by their depth, so a phantom backlog beside a large real one is corrected too
        "SHARD_SIZE": str(min(config.queue_set.shard_size, len(queues.live))),
        "SIDELINE_QUEUE_URLS": queue_urls([pair.queue for pair in queues.sideline]),
        "SIDELINE_QUEUE_ROLES": ",".join(pair.role for pair in queues.sideline),  # their workers' age reports
        # Past either budget a sideline queue is parked in S3 (ARCHIVER_FUNCTION_NAME: archive.py).
        "ARCHIVE_AGE_SECONDS": str(config.sideline.archive_age_seconds),
        "ARCHIVE_DEPTH": str(config.sideline.archive_depth),
        "SIDELINE_MAPPING_UUIDS": Fn.join(",", list(sideline_mapping_ids)),
        "BACKLOG_TARGET": str(backpressure.backlog_target),
        "MIN_MULTIPLIER": str(backpressure.min_multiplier),
        "GROWTH_STEP": str(backpressure.growth_step),
        "MAX_MULTIPLIER": str(backpressure.max_multiplier),
        # Healthy = the live queues' oldest message is younger than the age that would alarm.
        "HEALTHY_AGE_SECONDS": str(config.alarms.oldest_message_age_seconds),
        # The estimates are reconciled with every queue a message can wait in, the surge queue too.
        "SURGE_QUEUE_URL": queues.surge.queue.queue_url,
        "DIRTY_INDEX_NAME": tables.dirty_index_name,
        "DRIFT_TOLERANCE": str(backpressure.drift_tolerance),
        "DRIFT_TOLERANCE_FRACTION": str(backpressure.drift_tolerance_fraction),
        "CONTROLLER_INVOCATIONS": str(backpressure.controller_invocations),
    }


def redrive_environment(
    scope: IConstruct,
    *,
    tables: Tables,
    queues: QueueSet,
    extra_pairs: Sequence[tuple[sqs.IQueue, sqs.IQueue]] = (),
) -> dict[str, str]:
    """``extra_pairs``: (DLQ, source) of queues outside the queue set, such as the ordered FIFO queues."""
    pairs = {pair.dlq.queue_url: pair.queue.queue_url for pair in queues.all}
    pairs.update({dlq.queue_url: source.queue_url for dlq, source in extra_pairs})
    return {
        "REDRIVE_PAIRS": Stack.of(scope).to_json_string(pairs),
        "STATE_TABLE_NAME": tables.state.table_name,
    }


def ordered_ingest_environment(
    config: BlueprintConfig, *, fifo_queues: Sequence[sqs.IQueue], state: dynamodb.ITable | None
) -> dict[str, str]:
    ingest = config.ingest
    values = {
        "FIFO_QUEUE_URLS": queue_urls(fifo_queues),
        "MAX_PAYLOAD_BYTES": str(ingest.max_payload_bytes),
        "MAX_TTL_SECONDS": str(ingest.max_ttl_seconds),
        "LEASE_SECONDS": str(ingest.lease_seconds),
        "LEASE_MAX_FRACTION": str(ingest.lease_max_fraction),
    }
    if state is not None:  # an ordered message spends the tenant's ingest tokens and a slot of its group
        values["STATE_TABLE_NAME"] = state.table_name
        values["MAX_GROUP_BACKLOG"] = str(config.ordered.max_group_backlog)
        values["GROUP_BACKLOG_WINDOW_SECONDS"] = str(config.ordered.group_backlog_window_seconds)
    return values


def fifo_worker_environment(
    config: BlueprintConfig, *, write_ahead: dynamodb.ITable, state: dynamodb.ITable | None = None
) -> dict[str, str]:
    ordered = config.ordered
    values = {
        "WRITE_AHEAD_TABLE_NAME": write_ahead.table_name,
        "WRITE_AHEAD_LEASE_SECONDS": str(ordered.lease_seconds),
        "WRITE_AHEAD_RETENTION_SECONDS": str(ordered.write_ahead_retention_days * 86_400),
        # a group held for an outage waits longest on its last spare receives (the FIFO DLQ's count)
        "MAX_RECEIVE_COUNT": str(ordered.max_receive_count),
    }
    if state is not None:  # it gives each message's group slot back (the same window as the ingest's)
        values["STATE_TABLE_NAME"] = state.table_name
        values["GROUP_BACKLOG_WINDOW_SECONDS"] = str(ordered.group_backlog_window_seconds)
    return values


def events_environment(
    config: BlueprintConfig, *, stream_arn: str, state: dynamodb.ITable | None
) -> dict[str, str]:
    streaming = config.streaming
    values = {
        "STREAM_ARN": stream_arn,
        "PARTITION_KEY_MODE": streaming.partition_key,
        "MAX_EVENTS_PER_REQUEST": str(streaming.max_events_per_request),
        "MAX_EVENT_BYTES": str(streaming.max_event_bytes),
        "PUT_ATTEMPTS": str(streaming.put_attempts),
        "EVENT_RATE_MULTIPLIER": str(streaming.event_rate_multiplier),
        "LEASE_SECONDS": str(config.ingest.lease_seconds),
        "LEASE_MAX_FRACTION": str(config.ingest.lease_max_fraction),
    }
    if state is not None:  # per-tenant admission of events
        values["STATE_TABLE_NAME"] = state.table_name
    return values


def stream_consumer_environment(*, aggregates: dynamodb.ITable) -> dict[str, str]:
    return {"AGGREGATES_TABLE_NAME": aggregates.table_name, "MAX_CAS_ATTEMPTS": "3"}


def archiver_environment(
    config: BlueprintConfig,
    *,
    bucket: s3.IBucket,
    prefix: str,
    state: dynamodb.ITable,
    sideline_queues: Sequence[sqs.IQueue],
) -> dict[str, str]:
    archive = config.archive
    return {
        "ARCHIVE_BUCKET_NAME": bucket.bucket_name,
        "STATE_TABLE_NAME": state.table_name,
        "ARCHIVE_PREFIX": prefix,
        "SOURCE_QUEUE_URLS": queue_urls(sideline_queues),
        "MAX_MESSAGES_PER_OBJECT": str(archive.max_messages_per_object),
        # Received messages stay invisible until the run is over: none is archived twice by a
        # concurrent drainer while this run still holds it.
        "RECEIVE_VISIBILITY_SECONDS": str(archive.archiver_timeout_seconds + 60),
        # A drainer's deferrals wait in the queue delayed, at most max_defer_seconds: the
        # archiver waits for them to come due instead of leaving them behind.
        "WAIT_FOR_DELAYED_SECONDS": str(config.sideline.max_defer_seconds),
    }
