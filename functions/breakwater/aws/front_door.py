"""The API's services wired to AWS: the only place the front door's handlers get their clients from."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from breakwater.auth import Authorizer, TenantCache
from breakwater.aws import clients
from breakwater.aws.buckets import LeasedTokenBucket
from breakwater.aws.counters import TenantCounters
from breakwater.aws.fifo_queues import FifoQueues
from breakwater.aws.group_backlogs import DynamoGroupBacklogs, tenant_backlogs
from breakwater.aws.kinesis import StreamWriter
from breakwater.aws.queues import EnqueueError, LiveQueues
from breakwater.aws.request_keys import DynamoClaimStore
from breakwater.aws.shutdown_signal import flush_in_the_background
from breakwater.aws.tenants import TenantTable
from breakwater.events import PartitionKeyMode
from breakwater.events_ingest import EventsService
from breakwater.ingest import IngestService, Router
from breakwater.ordered import BacklogWindow, GroupBound
from breakwater.ordered_ingest import OrderedIngestService, TenantBound
from breakwater.request_keys import RequestKeys
from breakwater.requests import RequestLimits
from breakwater.settings import AuthorizerSettings, EventsSettings, IngestSettings, OrderedIngestSettings

NEGATIVE_CACHE_SECONDS = 5.0  # an unknown key is looked up again after this, not on every request


def build_authorizer(settings: AuthorizerSettings, clock: Callable[[], float] = time.time) -> Authorizer:
    """The REST authorizer's policy over the tenants table; tests pass their own clock."""
    table = TenantTable(settings.tenants_table_name)
    cache = TenantCache(
        table.get,
        clock,
        ttl_seconds=settings.cache_seconds,
        negative_ttl_seconds=NEGATIVE_CACHE_SECONDS,
        recheck_seconds=NEGATIVE_CACHE_SECONDS,
    )
    return Authorizer(cache, settings, clock)


def build_ingest(settings: IngestSettings, clock: Callable[[], float] = time.time) -> IngestService:
    """``POST /v1/messages``; tests and the bench pass their own clock."""
    queues = LiveQueues(settings.live_queue_urls, fair_queues=settings.fair_queues)
    gate = _bucket(settings, "ingest", clock) if settings.throttling_enabled else None
    return IngestService(
        router=Router(
            queues, settings.shard_size, settings.depth_refresh_seconds, clock, send_errors=(EnqueueError,)
        ),
        gate=gate,
        clock=clock,
        max_payload_bytes=settings.max_payload_bytes,
        max_ttl_seconds=settings.max_ttl_seconds,
        counters=TenantCounters(settings.state_table_name),
        counter_flush_seconds=settings.counter_flush_seconds,
        keys=(
            RequestKeys(
                DynamoClaimStore(clients.client("dynamodb"), settings.idempotency_table_name),
                window_seconds=settings.idempotency_window_seconds,
                pending_seconds=settings.idempotency_pending_seconds,
            )
            if settings.idempotency_table_name
            else None
        ),
    )


def flush_tallies_in_the_background(
    service: IngestService, *, install_signal: bool = True
) -> threading.Event:
    """Flush the service's tallies every interval from a daemon thread, and all of them at shutdown
    (:func:`~breakwater.aws.shutdown_signal.flush_in_the_background`). Returns the event that stops
    the thread."""
    return flush_in_the_background(
        lambda force: service.flush_counters(force=force),
        service.counter_flush_seconds,
        name="tally-flush",
        install_signal=install_signal,
    )


def build_ordered(
    settings: OrderedIngestSettings, clock: Callable[[], float] = time.time
) -> OrderedIngestService:
    """``POST /v1/ordered``: spends a token of the same per-tenant bucket as ``/v1/messages``, then a
    slot of the tenant's and of the message group's backlog bounds (in the state table, when set)."""
    gate = _bucket(settings, "ingest", clock)
    bound = (
        GroupBound(settings.max_group_backlog, BacklogWindow(settings.group_backlog_window_seconds * 1000))
        if settings.max_group_backlog is not None and settings.group_backlog_window_seconds is not None
        else None
    )
    backlogs = (
        DynamoGroupBacklogs(clients.client("dynamodb"), settings.state_table_name, bound.window)
        if settings.state_table_name and bound is not None
        else None
    )
    tenant_limit = settings.tenant_backlog_limit
    tenant_bound = (
        TenantBound(
            tenant_limit, tenant_backlogs(clients.client("dynamodb"), settings.state_table_name, bound.window)
        )
        if settings.state_table_name and bound is not None and tenant_limit is not None
        else None
    )
    return OrderedIngestService(
        sender=FifoQueues(clients.client("sqs"), settings.fifo_queue_urls),
        gate=gate,
        clock=clock,
        limits=RequestLimits(
            max_payload_bytes=settings.max_payload_bytes, max_ttl_seconds=settings.max_ttl_seconds
        ),
        backlogs=backlogs,
        bound=bound if backlogs is not None else None,
        tenant_bound=tenant_bound,
    )


def build_events(settings: EventsSettings, clock: Callable[[], float] = time.time) -> EventsService:
    """``POST /v1/events``: a bucket of its own per tenant, so events never spend message tokens."""
    gate = _bucket(settings, "events", clock)
    return EventsService(
        writer=StreamWriter(
            clients.client("kinesis"), settings.stream_arn, max_attempts=settings.put_attempts
        ),
        gate=gate,
        clock=clock,
        limits=RequestLimits(
            max_payload_bytes=settings.max_event_bytes, max_events=settings.max_events_per_request
        ),
        partition_key_mode=PartitionKeyMode(settings.partition_key_mode),
        rate_multiplier=settings.event_rate_multiplier,
    )


class _BucketSettings(Protocol):
    @property
    def state_table_name(self) -> str | None: ...

    @property
    def lease_seconds(self) -> float: ...

    @property
    def lease_max_fraction(self) -> float: ...


def _bucket(settings: _BucketSettings, purpose: str, clock: Callable[[], float]) -> LeasedTokenBucket | None:
    """The tenants' token buckets of one purpose in the state table; None without a table (no admission)."""
    if not settings.state_table_name:
        return None
    return LeasedTokenBucket(
        settings.state_table_name, purpose, clock, settings.lease_seconds, settings.lease_max_fraction
    )
