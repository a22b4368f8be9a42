"""BlueprintConfig: the typed, validated form of the ``breakwater`` context in ``cdk.json``.

This is the configuration a fork edits. It is validated once, at synth; an invalid value stops
the synth with an error naming the key and the value. Constructs receive this object and never
read context themselves.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# the bound the item sizes and write rates are checked at (re-exported: the config model's limit)
from breakwater.concurrency import MAX_TENANT_CONCURRENCY as MAX_TENANT_CONCURRENCY
from breakwater_cdk.ceilings import shared_ceiling_problems

CONTEXT_KEY = "breakwater"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TierConfig(_Strict):
    """Per-tenant limits of a tier; a tenant record may override each of them."""

    rate: float = Field(gt=0, description="accepted messages per second at ingest (token refill rate)")
    burst: int = Field(ge=1, description="token bucket capacity at ingest")
    consumer_rate: float = Field(gt=0, description="messages per second the workers process for the tenant")
    concurrency: int = Field(
        ge=1, description="burst ceiling of in-flight messages per tenant in the workers"
    )
    concurrency_floor: int = Field(ge=1, description="in-flight messages a tenant is always guaranteed")

    @model_validator(mode="after")
    def _floor_below_ceiling(self) -> TierConfig:
        if self.concurrency > MAX_TENANT_CONCURRENCY:
            raise ValueError(
                f"concurrency ({self.concurrency}) must be at most {MAX_TENANT_CONCURRENCY}: the state "
                "table's item sizes and write rates are checked at that bound"
            )
        if self.concurrency_floor > self.concurrency:
            raise ValueError(
                f"concurrency_floor ({self.concurrency_floor}) "
                f"must not exceed concurrency ({self.concurrency})"
            )
        return self


class QueueSetConfig(_Strict):
    size: int = Field(default=8, ge=1, le=64, description="N: live queues in the shuffle-sharded set")
    shard_size: int = Field(default=2, ge=1, description="k: queues each tenant is hashed to")
    max_receive_count: int = Field(
        default=5, ge=1, le=1000, description="receives before a message goes to its DLQ"
    )
    retention_days: int = Field(default=14, ge=1, le=14)
    fair_queues: bool = Field(default=True, description="set MessageGroupId=tenant so SQS fair queues apply")

    @model_validator(mode="after")
    def _shard_fits(self) -> QueueSetConfig:
        if self.shard_size > self.size:
            raise ValueError(f"shard_size ({self.shard_size}) must not exceed size ({self.size})")
        return self

    def probability_full_overlap(self) -> float:
        """Chance that two given tenants are hashed to exactly the same k queues: 1 / C(N, k)."""
        return 1.0 / math.comb(self.size, self.shard_size)


class IngestConfig(_Strict):
    max_payload_bytes: int = Field(default=64 * 1024, ge=256, le=256 * 1024 - 2048)
    max_ttl_seconds: int = Field(default=86_400, ge=1, le=14 * 86_400)
    lease_seconds: float = Field(
        default=1.0, gt=0, le=60, description="tokens leased per DynamoDB call, in seconds of rate"
    )
    lease_max_fraction: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="at most this share of a bucket's burst in one container's lease",
    )
    depth_refresh_seconds: float = Field(default=5.0, gt=0, le=300)
    idempotency_window_seconds: int = Field(
        default=86_400,
        ge=60,
        le=30 * 86_400,
        description="how long an Idempotency-Key (and a keyed message's processing record) is held",
    )
    idempotency_pending_seconds: int = Field(
        default=10,
        ge=1,
        le=900,
        description="how long a key's claim waits for its message to be stored before a retry takes it over",
    )
    timeout_seconds: int = Field(default=10, ge=1, le=29)
    memory_mb: int = Field(default=512, ge=128, le=10_240)


class ApiConfig(_Strict):
    throttle_rate: float = Field(default=5000, gt=0, description="stage-wide steady requests per second")
    throttle_burst: int = Field(default=5000, ge=1)
    throttle_headroom: float = Field(
        default=4, ge=1, description="the stage carries this many of the largest tier's usage plans at once"
    )
    authorizer_cache_seconds: int = Field(default=300, ge=0, le=3600)


# Lambda documents what one provisioned event poller of an SQS mapping handles: up to 10 concurrent
# invocations (and about 1 MB/s). With provisioned mode the mapping has no MaximumConcurrency, so its
# pollers are what bounds the invocations it runs at once.
INVOCATIONS_PER_POLLER = 10


class ProvisionedPollersConfig(_Strict):
    """Provisioned mode of a consumer's SQS mappings: dedicated event pollers, between these bounds.

    The ranges are CloudFormation's for an SQS mapping (``ProvisionedPollerConfig``); the defaults are
    the ones Lambda applies when a bound is left out, written into the template all the same.
    """

    minimum_pollers: int = Field(
        default=2, ge=2, le=200, description="pollers kept running, and billed, even when the queue is empty"
    )
    maximum_pollers: int = Field(
        default=200,
        ge=2,
        le=2000,
        description=f"pollers the mapping may scale to; each runs up to {INVOCATIONS_PER_POLLER} invocations",
    )

    @model_validator(mode="after")
    def _minimum_below_maximum(self) -> Self:
        if self.minimum_pollers > self.maximum_pollers:
            raise ValueError(
                f"minimum_pollers ({self.minimum_pollers}) must not exceed "
                f"maximum_pollers ({self.maximum_pollers})"
            )
        return self


class _QueueConsumer(_Strict):
    """A function consuming SQS queues: their visibility timeout follows its timeout (AWS guidance: 6x).

    Its mappings scale either on demand up to ``max_concurrency`` (``ScalingConfig``) or with
    ``provisioned_pollers`` (``ProvisionedPollerConfig``); Lambda takes one or the other on an SQS mapping.
    """

    timeout_seconds: int
    visibility_timeout_multiplier: int
    max_concurrency: int
    provisioned_pollers: ProvisionedPollersConfig | None = Field(
        default=None,
        description="provisioned mode for every mapping of this consumer (replaces max_concurrency); "
        "null: on demand",
    )

    @model_validator(mode="after")
    def _visibility_fits(self) -> Self:
        if self.visibility_timeout_seconds > 43_200:
            raise ValueError(
                f"timeout_seconds x visibility_timeout_multiplier = {self.visibility_timeout_seconds} "
                "exceeds the SQS maximum visibility timeout (43200)"
            )
        return self

    @model_validator(mode="after")
    def _one_scaling_mode(self) -> Self:
        # max_concurrency has a default, so only a value the configuration sets conflicts: the default
        # simply gives way to the pollers.
        if self.provisioned_pollers is not None and "max_concurrency" in self.model_fields_set:
            raise ValueError(
                f"max_concurrency ({self.max_concurrency}) and provisioned_pollers are exclusive: an SQS "
                "mapping takes either ScalingConfig.MaximumConcurrency or ProvisionedPollerConfig; remove "
                "max_concurrency to use provisioned mode"
            )
        return self

    @property
    def visibility_timeout_seconds(self) -> int:
        return self.timeout_seconds * self.visibility_timeout_multiplier

    @property
    def scaling_max_concurrency(self) -> int | None:
        """The mappings' ``ScalingConfig.MaximumConcurrency``: none in provisioned mode."""
        return None if self.provisioned_pollers is not None else self.max_concurrency

    @property
    def mapping_concurrency(self) -> int:
        """Invocations one of this consumer's mappings may run at once: its maximum concurrency, or in
        provisioned mode what its largest set of pollers runs."""
        if self.provisioned_pollers is None:
            return self.max_concurrency
        return self.provisioned_pollers.maximum_pollers * INVOCATIONS_PER_POLLER


class WorkerConfig(_QueueConsumer):
    batch_size: int = Field(default=10, ge=1, le=10_000)
    batching_window_seconds: int = Field(default=0, ge=0, le=300)
    max_concurrency: int = Field(default=10, ge=2, le=1000, description="ESM maximum concurrency per queue")
    timeout_seconds: int = Field(default=60, ge=3, le=900)
    memory_mb: int = Field(default=1024, ge=128, le=10_240)
    visibility_timeout_multiplier: int = Field(
        default=6, ge=1, le=12, description="queue visibility = multiplier x worker timeout (AWS guidance: 6)"
    )
    heartbeat_seconds: int = Field(default=30, ge=1, le=43_200)
    outage_backoff_seconds: float = Field(
        default=5,
        gt=0,
        le=900,
        description="circuit breaker: how long the worker stops calling the processor after its dependency "
        "failed (DependencyUnavailableError); doubles while the outage lasts",
    )
    outage_backoff_max_seconds: float = Field(
        default=60, gt=0, le=900, description="circuit breaker: its longest open window"
    )
    burst_share: float | None = Field(
        default=0.75,
        gt=0,
        le=1,
        description="share of the live worker's concurrency that tenants may hold above their floors "
        "(the rest is kept for floors); null: only each tenant's ceiling applies",
    )

    @model_validator(mode="after")
    def _backoff_window_order(self) -> Self:
        if self.outage_backoff_max_seconds < self.outage_backoff_seconds:
            raise ValueError(
                f"outage_backoff_max_seconds {self.outage_backoff_max_seconds:g} is below "
                f"outage_backoff_seconds {self.outage_backoff_seconds:g}"
            )
        return self

    @model_validator(mode="after")
    def _batch_fits_the_mapping(self) -> Self:
        # Lambda takes more than 10 messages per SQS batch only with a batching window.
        if self.batch_size > 10 and self.batching_window_seconds < 1:
            raise ValueError(
                f"batch_size {self.batch_size} needs batching_window_seconds >= 1 "
                "(an SQS event source takes at most 10 messages per batch without a batching window)"
            )
        return self


class SidelineConfig(_Strict):
    sideline_age_seconds: int = Field(
        default=300, ge=1, description="older live messages go to the backlog queue"
    )
    max_defer_seconds: int = Field(default=900, ge=1, le=900, description="largest surge queue DelaySeconds")
    defer_base_seconds: int = Field(default=2, ge=1, le=900)
    archive_age_seconds: int = Field(
        default=3600, ge=60, description="sideline messages older than this are archived"
    )
    archive_depth: int = Field(
        default=100_000, ge=1, description="sideline depth past which archiving starts"
    )


class ArchiveConfig(_Strict):
    """The S3 archive of sidelined backlogs and the Glue job that replays it (breakwater_cdk/archive.py)."""

    expire_after_days: int = Field(default=90, ge=1, description="archived objects are deleted after this")
    infrequent_access_after_days: int | None = Field(
        default=30, ge=30, description="move objects to STANDARD_IA after this (None: never)"
    )
    noncurrent_versions_days: int = Field(default=7, ge=1, description="old versions are kept this long")
    access_log_days: int = Field(default=90, ge=1, description="retention of the bucket's access logs")
    archiver_timeout_seconds: int = Field(default=300, ge=30, le=900)
    archiver_memory_mb: int = Field(default=512, ge=128, le=10_240)
    max_messages_per_object: int = Field(default=1000, ge=10, le=100_000)
    replay_target_rate: float = Field(default=100, gt=0, description="messages/s the replay sends by default")
    replay_worker_type: Literal["G.1X", "G.2X"] = "G.1X"
    replay_workers: int = Field(default=2, ge=2, le=100)
    replay_timeout_minutes: int = Field(default=240, ge=1, le=2880)
    replay_schedule: str | None = Field(
        default=None,
        pattern=r"^cron\(.+\)$",
        description="optional Glue cron, e.g. cron(0 3 * * ? *); the job is always startable on demand",
    )

    @model_validator(mode="after")
    def _transition_before_expiry(self) -> ArchiveConfig:
        ia_days = self.infrequent_access_after_days
        if ia_days is not None and ia_days >= self.expire_after_days:
            raise ValueError(
                f"infrequent_access_after_days ({ia_days}) must be below expire_after_days "
                f"({self.expire_after_days})"
            )
        return self


class BackpressureConfig(_Strict):
    backlog_target: int = Field(
        default=500, ge=1, description="a tenant's backlog at which its rate starts to fall"
    )
    min_multiplier: float = Field(default=0.1, gt=0, le=1)
    growth_step: float = Field(default=0.1, ge=0, le=1, description="organic growth per controller run")
    max_multiplier: float = Field(
        default=2.0, ge=1, le=10, description="organic ceiling as a multiple of the tier"
    )
    drift_tolerance: float = Field(
        default=10, ge=0, description="messages the estimates may exceed the queues' depth by"
    )
    drift_tolerance_fraction: float = Field(
        default=0.05, ge=0, le=1, description="... or this share of the depth, whichever is larger"
    )
    controller_invocations: int = Field(
        default=1,
        ge=1,
        le=32,
        description="invocations one controller run splits the changed tenants over (8 for 100,000 tenants)",
    )


class AlarmConfig(_Strict):
    oldest_message_age_seconds: int = Field(default=300, ge=60)
    quiet_groups_oldest_age_seconds: int | None = Field(
        default=None,
        ge=60,
        description="fair queues: alarm when a live queue's oldest message outside its noisy message groups "
        "(tenants) is older than this; null: oldest_message_age_seconds",
    )
    sideline_oldest_message_age_seconds: int = Field(default=3600, ge=60)
    age_of_first_attempt_p99_ms: int = Field(default=30_000, ge=1)
    age_of_attempt_p99_ms: int = Field(
        default=600_000,
        ge=1,
        description="p99 age of retried live messages (a retry storm or a stuck tenant)",
    )
    empty_receive_ratio_min: float = Field(default=0.1, ge=0, le=1)
    throttled_requests: int = Field(default=100, ge=1, description="429s per 5 minutes before alarming")
    email: str | None = Field(default=None, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")

    @model_validator(mode="after")
    def _quiet_groups_alarm_fires_first(self) -> Self:
        # The quiet groups' messages are some of the queue's: their oldest is never older than the
        # queue's oldest, so a higher threshold could only fire after OldestAge already had.
        quiet = self.quiet_groups_oldest_age_seconds
        if quiet is not None and quiet > self.oldest_message_age_seconds:
            raise ValueError(
                f"quiet_groups_oldest_age_seconds ({quiet}) must not exceed oldest_message_age_seconds "
                f"({self.oldest_message_age_seconds}): the quiet groups' oldest message is never older "
                "than the queue's, so its alarm would only fire after the queue's"
            )
        return self

    @property
    def quiet_groups_threshold_seconds(self) -> int:
        """The quiet groups' oldest-age threshold: its own key, else the live queues' one."""
        quiet = self.quiet_groups_oldest_age_seconds
        return self.oldest_message_age_seconds if quiet is None else quiet


class OrderedConfig(_QueueConsumer):
    """The ordered workload (SQS FIFO, POST /v1/ordered): off unless a fork needs per-key order."""

    enabled: bool = Field(default=False, description="build the FIFO queues, their worker, POST /v1/ordered")
    queue_count: int = Field(default=1, ge=1, le=16, description="FIFO queues; a group always hashes to one")
    batch_size: int = Field(default=10, ge=1, le=10, description="FIFO mappings take at most 10")
    max_concurrency: int = Field(default=10, ge=2, le=1000, description="ESM maximum concurrency per queue")
    timeout_seconds: int = Field(default=60, ge=3, le=900)
    memory_mb: int = Field(default=512, ge=128, le=10_240)
    visibility_timeout_multiplier: int = Field(default=6, ge=1, le=12)
    max_receive_count: int = Field(default=5, ge=1, le=1000)
    retention_days: int = Field(default=4, ge=1, le=14)
    write_ahead_retention_days: int = Field(
        default=14, ge=1, le=365, description="how long a processed dedup id is remembered (exactly-once)"
    )
    max_group_backlog: int = Field(
        default=1000,
        ge=1,
        description="messages of one group (tenant:ordering_key) accepted and not yet processed; past it "
        "POST /v1/ordered answers 429, so no group fills a FIFO queue's scan window",
    )

    @model_validator(mode="after")
    def _group_backlog_fits_the_scan_window(self) -> Self:
        # SQS looks for deliverable groups only among the oldest messages of a FIFO queue, as many as
        # its in-flight quota. A group bound that lets a handful of groups fill that window would let
        # them hide every group behind them, so it must leave room for at least this many full groups.
        scan_window, full_groups = 120_000, 10
        if self.max_group_backlog * full_groups > scan_window:
            raise ValueError(
                f"max_group_backlog ({self.max_group_backlog}) must be at most {scan_window // full_groups}: "
                f"a FIFO queue scans its oldest {scan_window:,} messages for groups to deliver, and that "
                f"window must hold at least {full_groups} groups at their bound"
            )
        return self

    @property
    def lease_seconds(self) -> int:
        """A write-ahead claim outlives the attempt that holds it (Lambda stops it at the timeout)."""
        return self.timeout_seconds + 30

    @property
    def group_backlog_window_seconds(self) -> int:
        """One generation of the group counters: the longest a message can stay in its FIFO queue after
        ingest stamped it, i.e. the queue's retention period plus a minute for the ingest request that
        stamps and sends it (API Gateway ends every request well before)."""
        return self.retention_days * 86_400 + 60


class StreamingConfig(_Strict):
    """The streaming workload (Kinesis, POST /v1/events): aggregatable, high-volume events."""

    enabled: bool = Field(default=True, description="build the stream, POST /v1/events and the consumer")
    capacity_mode: Literal["on_demand", "provisioned"] = "provisioned"
    shard_count: int = Field(default=1, ge=1, le=500, description="provisioned mode only")
    retention_hours: int = Field(default=24, ge=24, le=8760)
    partition_key: Literal["tenant", "tenant_and_key"] = Field(
        default="tenant", description="tenant_and_key spreads a hot tenant over shards by the event's key"
    )
    max_events_per_request: int = Field(default=500, ge=1, le=500)
    max_event_bytes: int = Field(default=1024, ge=256, le=1_000_000, description="an event's payload")
    put_attempts: int = Field(default=3, ge=1, le=10, description="PutRecords attempts for the failed subset")
    event_rate_multiplier: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="a tenant's events per second per message per second of its tier's rate (and burst)",
    )
    events_timeout_seconds: int = Field(default=10, ge=1, le=29)
    events_memory_mb: int = Field(default=512, ge=128, le=10_240)
    batch_size: int = Field(default=100, ge=1, le=10_000)
    batching_window_seconds: int = Field(default=1, ge=0, le=300)
    parallelization_factor: int = Field(default=1, ge=1, le=10)
    retry_attempts: int = Field(default=3, ge=0, le=10_000)
    max_record_age_seconds: int = Field(default=3600, ge=60, le=604_800)
    consumer_timeout_seconds: int = Field(default=60, ge=3, le=900)
    consumer_memory_mb: int = Field(default=512, ge=128, le=10_240)
    iterator_age_alarm_ms: int = Field(default=60_000, ge=1_000)
    throughput_exceeded_alarm: int = Field(default=1, ge=1, description="throttled reads or writes in 5 min")


class ProcessingConfig(_Strict):
    """How the processor's effects are made (the contract: ``functions/breakwater/processor.py``).

    What the processor may touch is its own grants (``breakwater_cdk.Processor(grants=...)``).
    """

    guarantee: Literal["exactly_once", "at_least_once"] = Field(
        default="exactly_once",
        description="exactly_once: each message's idempotency record is locked before it runs, so two "
        "copies never run at once and a completed one never again; at_least_once: no lock, the "
        "record is read before and written after (cheaper; copies racing each other, or a run its "
        "worker died in, may run twice). Effects given to work.add_effect are exactly once in both",
    )


class LambdaConfig(_Strict):
    runtime: Literal["python3.11", "python3.12", "python3.13"] = "python3.13"
    architecture: Literal["arm64", "x86_64"] = "arm64"
    powertools_layer_version: int = Field(default=27, ge=1)
    log_retention_days: Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1827, 3653] = (
        30
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    tracing: bool = True


class BlueprintConfig(_Strict):
    """Everything a fork configures, with defaults that suit a small production service."""

    service_name: str = Field(default="breakwater", pattern=r"^[a-z][a-z0-9-]{1,30}$")
    metrics_namespace: str = Field(default="Breakwater", pattern=r"^[A-Za-z][A-Za-z0-9/_-]{0,254}$")
    mode: Literal["breakwater", "naive"] = Field(
        default="breakwater",
        description="naive = one queue, no throttling, no sidelining: the baseline the demo compares against",
    )
    queue_set: QueueSetConfig = QueueSetConfig()
    tiers: dict[str, TierConfig] = Field(min_length=1)
    default_tier: str
    ingest: IngestConfig = IngestConfig()
    api: ApiConfig = ApiConfig()
    worker: WorkerConfig = WorkerConfig()
    sideline: SidelineConfig = SidelineConfig()
    backpressure: BackpressureConfig = BackpressureConfig()
    archive: ArchiveConfig = ArchiveConfig()
    alarms: AlarmConfig = AlarmConfig()
    functions: LambdaConfig = LambdaConfig()
    ordered: OrderedConfig = OrderedConfig()
    streaming: StreamingConfig = StreamingConfig()
    processing: ProcessingConfig = ProcessingConfig()

    @model_validator(mode="after")
    def _default_tier_exists(self) -> BlueprintConfig:
        if self.default_tier not in self.tiers:
            raise ValueError(
                f"default_tier {self.default_tier!r} is not one of the tiers "
                f"({', '.join(sorted(self.tiers))})"
            )
        for name in self.tiers:
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"tier name {name!r} must be letters, digits, '-' or '_'")
        return self

    @model_validator(mode="after")
    def _shared_ceilings_hold(self) -> Self:
        problems = shared_ceiling_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def effective_queue_count(self) -> int:
        """Live queues actually built: the naive baseline has exactly one."""
        return 1 if self.mode == "naive" else self.queue_set.size


class ConfigError(ValueError):
    """Raised at synth for an invalid ``breakwater`` context; the message names each key and value."""


# Keys earlier versions read, and what replaced them (CHANGELOG.md).
REMOVED_KEYS = {
    "processing.effect_tables": "give the processor its grants instead: "
    "Processor(grants=[table.grant_write_data])",
    "worker.simulated_work_ms": "the demo's work is the emulator's: breakwater_local.work_ms in the context "
    "of python -m local (local/README.md); nothing of it is deployed",
}


def _describe(errors: list[Any], raw: dict[str, Any]) -> str:
    lines: list[str] = []
    for error in errors:
        path = ".".join(str(p) for p in error["loc"]) or "(root)"
        key = f"{CONTEXT_KEY}.{path}" if error["loc"] else CONTEXT_KEY
        if not error["loc"] and error["type"] == "value_error":  # the whole config: the message names keys
            problems = str(error["ctx"]["error"]).splitlines()
            lines.extend(
                line if line.startswith(f"{CONTEXT_KEY}.") else f"{key}: {line}" for line in problems
            )
        elif error["type"] in {"missing"}:
            lines.append(f"{key}: required key is missing")
        elif error["type"] == "extra_forbidden" and path in REMOVED_KEYS:
            lines.append(f"{key}: no longer a setting (value {error['input']!r}); {REMOVED_KEYS[path]}")
        elif error["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key (value {error['input']!r}); check the spelling")
        else:
            lines.append(f"{key} = {error['input']!r}: {error['msg']}")
    return "invalid Breakwater configuration in cdk.json context:\n  " + "\n  ".join(lines)


def load_config(context: dict[str, Any] | None) -> BlueprintConfig:
    """Validate the raw ``breakwater`` context; raise :class:`ConfigError` naming each bad key and value."""
    if not isinstance(context, dict):
        raise ConfigError(
            f"cdk.json context key {CONTEXT_KEY!r} must be an object, "
            f"got {type(context).__name__}: {context!r}"
        )
    try:
        return BlueprintConfig.model_validate(context)
    except ValidationError as exc:
        raise ConfigError(_describe(exc.errors(), context)) from None
