"""Handler settings: the environment CDK sets, validated once at cold start.

Policy code never reads ``os.environ``; handlers build one of these models and pass plain values
down. The names here are the contract between ``breakwater_cdk/`` (which sets them) and the handlers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class SettingsError(RuntimeError):
    """A handler's environment is incomplete or invalid (a deployment bug: fail the cold start loudly)."""


class TierLimits(BaseModel):
    """Per-tenant limits of a tier (mirrors ``breakwater_cdk.config.TierConfig``; a test keeps them equal)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: float = Field(gt=0)
    burst: int = Field(ge=1)
    consumer_rate: float = Field(gt=0)
    concurrency: int = Field(ge=1)
    concurrency_floor: int = Field(ge=1)


def _split_csv(value: Any) -> Any:
    if isinstance(value, str):
        return [item for item in value.split(",") if item]
    return value


def _json(value: Any) -> Any:
    if isinstance(value, str):
        return json.loads(value)
    return value


class _EnvModel(BaseModel):
    """Fields map to upper-case environment variables of the same name.

    ``defer_build``: pydantic builds a model's validator when it first validates, not when the
    class is defined. Every function imports this module and validates one of its settings
    classes, so the others are never built in that function's cold start.
    """

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        env = os.environ if environ is None else environ
        values = {name: env[name.upper()] for name in cls.model_fields if name.upper() in env}
        try:
            return cls.model_validate(values)
        except (ValidationError, json.JSONDecodeError) as exc:
            raise SettingsError(f"{cls.__name__}: invalid or missing environment: {exc}") from exc


class TierSettings(_EnvModel):
    """Tiers and the default, as JSON in ``TIERS``; ``DEFAULT_TIER`` names one of them."""

    tiers: dict[str, TierLimits]
    default_tier: str

    _parse_tiers = field_validator("tiers", mode="before")(_json)

    def limits_for(self, tier: str | None) -> TierLimits:
        return self.tiers.get(tier or self.default_tier) or self.tiers[self.default_tier]


class AuthorizerSettings(TierSettings):
    tenants_table_name: str
    cache_seconds: float = Field(default=60, ge=0, description="in-process cache of tenant records")


class IngestSettings(TierSettings):
    state_table_name: str
    live_queue_urls: list[str] = Field(min_length=1)
    shard_size: int = Field(ge=1)
    fair_queues: bool = True
    max_payload_bytes: int = Field(ge=1)
    max_ttl_seconds: int = Field(ge=1)
    lease_seconds: float = Field(gt=0)
    lease_max_fraction: float = Field(gt=0, le=1)
    depth_refresh_seconds: float = Field(gt=0)
    throttling_enabled: bool = True
    counter_flush_seconds: float = Field(default=10.0, ge=0, description="seconds between tally flushes")
    idempotency_table_name: str | None = Field(
        default=None, description="where idempotency keys are claimed (None: keys only dedup processing)"
    )
    idempotency_window_seconds: int = Field(default=86_400, ge=60, description="how long a key is held")
    idempotency_pending_seconds: int = Field(
        default=10,
        ge=1,
        description="how long a claim waits for its message to be stored before a retry takes it",
    )

    _parse_urls = field_validator("live_queue_urls", mode="before")(_split_csv)


class WorkerSettings(TierSettings):
    """One handler, two functions: WORKER_MODE=live (live queues + surge) or sideline (spillover, backlog)."""

    worker_mode: Literal["live", "sideline"]
    state_table_name: str
    idempotency_table_name: str
    spillover_queue_url: str
    backlog_queue_url: str
    surge_queue_url: str
    sideline_age_seconds: int = Field(ge=1)
    max_defer_seconds: int = Field(ge=1, le=900)
    defer_base_seconds: int = Field(ge=1)
    heartbeat_seconds: int = Field(ge=1)
    visibility_timeout_seconds: int = Field(ge=1)
    lease_seconds: float = Field(gt=0)
    lease_max_fraction: float = Field(gt=0, le=1)
    processor_handler: str | None = Field(default=None, description="the processor, module.function")
    sidelining_enabled: bool = True
    tenants_table_name: str | None = Field(
        default=None, description="per-tenant limit overrides; tiers only if unset"
    )
    fair_queues: bool = Field(default=True, description="moved messages keep MessageGroupId = tenant")
    concurrency_burst_slots: int | None = Field(
        default=None,
        ge=0,
        description="leases above the floors, over all tenants (None: only the ceilings apply)",
    )
    worker_containers: int = Field(
        default=1,
        ge=1,
        description="worker invocations this worker's mappings allow at once: each may count any tenant",
    )
    consumer_bucket_containers: int | None = Field(
        default=None,
        ge=1,
        description="worker invocations of every worker that may ask one tenant's consumer bucket at once "
        "(None: this worker's)",
    )
    idempotency_ttl_seconds: int = Field(
        default=86_400, ge=60, description="how long a processed id is remembered"
    )
    processing_guarantee: Literal["exactly_once", "at_least_once"] = Field(
        default="exactly_once",
        description="lock each message's record before it runs, or only record it after",
    )
    max_receive_count: int | None = Field(
        default=None,
        ge=1,
        description="receives before SQS dead-letters a message (None: dead letters are not counted)",
    )
    outage_backoff_seconds: float = Field(
        default=5, gt=0, description="the circuit breaker's first open window on a dependency outage"
    )
    outage_backoff_max_seconds: float = Field(
        default=60, gt=0, description="its longest open window (it doubles while the outage lasts)"
    )
    health_report_shards: int = Field(
        default=1, ge=1, le=100, description="items the workers' oldest-age reports are spread over"
    )


class ControllerSettings(TierSettings):
    state_table_name: str
    live_queue_urls: list[str] = Field(min_length=1)
    sideline_queue_urls: list[str] = Field(default_factory=list)
    sideline_mapping_uuids: list[str] = Field(default_factory=list)
    backlog_target: int = Field(ge=1)
    min_multiplier: float = Field(gt=0, le=1)
    growth_step: float = Field(ge=0, le=1)
    max_multiplier: float = Field(ge=1)
    healthy_age_seconds: int = Field(ge=1)
    tenants_table_name: str | None = Field(
        default=None, description="tenant list and limits; else scan the counters"
    )
    sideline_queue_roles: list[str] = Field(
        default_factory=list, description="role of each SIDELINE_QUEUE_URLS entry (its workers' age reports)"
    )
    archiver_function_name: str | None = Field(default=None, description="started past the archive budget")
    archive_age_seconds: int = Field(default=3600, ge=1, description="oldest sideline age that archives")
    archive_depth: int = Field(default=100_000, ge=1, description="sideline depth that archives")
    surge_queue_url: str | None = Field(default=None, description="its depth counts in the reconciliation")
    dirty_index_name: str = Field(description="the state table's index of tenants whose counters changed")
    drift_tolerance: float = Field(default=10, ge=0, description="estimates may exceed the depth by this")
    drift_tolerance_fraction: float = Field(default=0.05, ge=0, le=1, description="... or this share of it")
    controller_invocations: int = Field(
        default=1, ge=1, le=32, description="invocations the tenants' shards are split over in one run"
    )
    parallel_shards: int = Field(default=4, ge=1, le=32, description="shards one invocation works at once")
    shard_size: int | None = Field(
        default=None,
        ge=1,
        description="ingest's SHARD_SIZE: estimates capped by each tenant's own queues (None: the total)",
    )
    health_report_shards: int = Field(
        default=1, ge=1, le=100, description="items the workers' oldest-age reports are spread over"
    )

    _parse_urls = field_validator(
        "live_queue_urls",
        "sideline_queue_urls",
        "sideline_mapping_uuids",
        "sideline_queue_roles",
        mode="before",
    )(_split_csv)


class RedriveSettings(_EnvModel):
    """DLQ URL -> source queue URL, as JSON in ``REDRIVE_PAIRS``.

    The standard queues' pairs and, with the ordered workload on, its FIFO pairs (``.fifo`` URLs).
    """

    redrive_pairs: dict[str, str]
    state_table_name: str | None = Field(default=None, description="dedup markers of the fallback move")

    _parse_pairs = field_validator("redrive_pairs", mode="before")(_json)

    @field_validator("redrive_pairs")
    @classmethod
    def _same_queue_types(cls, pairs: dict[str, str]) -> dict[str, str]:
        # SQS moves a FIFO DLQ's messages only to a FIFO queue, and a standard DLQ's only to a standard one.
        mixed = [dlq for dlq, source in pairs.items() if dlq.endswith(".fifo") != source.endswith(".fifo")]
        if mixed:
            raise ValueError(f"each DLQ must pair with a source of its own type (FIFO or standard): {mixed}")
        return pairs


class OrderedIngestSettings(_EnvModel):
    """POST /v1/ordered: the FIFO queue set (a group always hashes to the same queue).

    With ``STATE_TABLE_NAME`` set, an ordered message spends a token of the tenant's ingest bucket,
    the same one ``POST /v1/messages`` spends, and, with the two ``GROUP`` settings too, a slot of its
    message group's backlog bound.
    """

    fifo_queue_urls: list[str] = Field(min_length=1)
    max_payload_bytes: int = Field(ge=1)
    max_ttl_seconds: int = Field(ge=1)
    state_table_name: str | None = None
    lease_seconds: float = Field(default=1.0, gt=0)
    lease_max_fraction: float = Field(default=0.25, gt=0, le=1)
    max_group_backlog: int | None = Field(
        default=None, ge=1, description="messages per group accepted and not yet processed"
    )
    group_backlog_window_seconds: int | None = Field(
        default=None,
        ge=1,
        validate_default=True,
        description="one generation of the group counters (the FIFO worker's too)",
    )
    max_tenant_backlog: int | None = Field(
        default=None,
        ge=1,
        description="messages per tenant over all its groups accepted and not yet processed; "
        "unset with the group bound on, it equals MAX_GROUP_BACKLOG (many keys hold no more than one)",
    )

    _parse_urls = field_validator("fifo_queue_urls", mode="before")(_split_csv)

    @field_validator("group_backlog_window_seconds")
    @classmethod
    def _group_bound_whole(cls, window: int | None, info: Any) -> int | None:
        if (info.data.get("max_group_backlog") is None) != (window is None):
            raise ValueError("MAX_GROUP_BACKLOG and GROUP_BACKLOG_WINDOW_SECONDS are set together")
        return window

    @property
    def tenant_backlog_limit(self) -> int | None:
        """The tenant bound in force: its own setting, else the group bound's (None: no bound)."""
        if self.max_group_backlog is None:
            return None
        return self.max_tenant_backlog if self.max_tenant_backlog is not None else self.max_group_backlog


class FifoWorkerSettings(_EnvModel):
    """The ordered workload's consumer: write-ahead table, claim lease and how long done records are kept.

    With ``STATE_TABLE_NAME`` and ``GROUP_BACKLOG_WINDOW_SECONDS`` set, it releases each message's
    slot of its group's backlog bound (the window must equal the ordered ingest's).
    """

    write_ahead_table_name: str
    write_ahead_lease_seconds: int = Field(ge=1)
    write_ahead_retention_seconds: int = Field(ge=1)
    processor_handler: str | None = Field(default=None, description="the processor, module.function")
    state_table_name: str | None = Field(default=None, description="the group backlog counters")
    group_backlog_window_seconds: int | None = Field(default=None, ge=1)
    outage_backoff_seconds: float = Field(
        default=5, gt=0, description="the circuit breaker's first open window on a dependency outage"
    )
    outage_backoff_max_seconds: float = Field(
        default=60, gt=0, description="its longest open window (it doubles while the outage lasts)"
    )
    max_receive_count: int | None = Field(
        default=None, ge=1, description="the FIFO queues' maxReceiveCount, so a hold spares the last receives"
    )
    outage_last_hold_seconds: int = Field(
        default=900,
        ge=1,
        le=42_300,
        description="how long an outage holds a message with at most one receive to spare",
    )

    @field_validator("outage_backoff_max_seconds")
    @classmethod
    def _backoff_ordered(cls, longest: float, info: Any) -> float:
        first = info.data.get("outage_backoff_seconds")
        if first is not None and longest < first:
            raise ValueError(
                f"OUTAGE_BACKOFF_MAX_SECONDS {longest:g} is below OUTAGE_BACKOFF_SECONDS {first:g}"
            )
        return longest


class EventsSettings(_EnvModel):
    """POST /v1/events: the stream and the request limits."""

    stream_arn: str
    partition_key_mode: Literal["tenant", "tenant_and_key"] = "tenant"
    max_events_per_request: int = Field(default=500, ge=1, le=500)
    max_event_bytes: int = Field(ge=1)
    put_attempts: int = Field(default=3, ge=1)
    state_table_name: str | None = Field(default=None, description="per-tenant admission; unset: none")
    event_rate_multiplier: float = Field(default=10.0, gt=0, description="events/s per message/s of the tier")
    lease_seconds: float = Field(default=1.0, gt=0)
    lease_max_fraction: float = Field(default=0.25, gt=0, le=1)


class StreamConsumerSettings(_EnvModel):
    """The Kinesis consumer: where aggregates go, and how many compare-and-swap attempts one key gets."""

    aggregates_table_name: str
    max_cas_attempts: int = Field(default=3, ge=1)


class ArchiverSettings(_EnvModel):
    """The archiver: moves sideline queues' messages into the S3 archive (``breakwater.archive``)."""

    archive_bucket_name: str
    state_table_name: str = Field(description="the tenants' counters: it ADDs what it archived")
    archive_prefix: str = Field(default="archive/", description="key prefix of the tenant=/dt=/hour= tree")
    source_queue_urls: list[str] = Field(min_length=1, description="the sideline queues it may drain")
    max_messages_per_object: int = Field(default=1000, ge=10, le=100_000)
    max_messages_per_run: int = Field(default=50_000, ge=1)
    receive_visibility_seconds: int = Field(default=300, ge=30, le=43_200)
    safety_margin_seconds: float = Field(
        default=10, ge=0, description="stop receiving this long before timeout"
    )
    wait_for_delayed_seconds: float = Field(
        default=0,
        ge=0,
        le=900,
        description="with the queue empty but messages still delayed (deferrals), keep receiving this long",
    )

    _parse_urls = field_validator("source_queue_urls", mode="before")(_split_csv)
