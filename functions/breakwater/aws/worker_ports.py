"""The worker's real ports: boto3 clients, the state table, the consumer bucket, leases, idempotency."""

from __future__ import annotations

import platform
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import boto3
import botocore
from botocore.config import Config

from breakwater.aws.bucket_items import BucketItem
from breakwater.aws.buckets import LeasedTokenBucket
from breakwater.aws.concurrency import ConcurrencyLeases
from breakwater.aws.counters import (
    COUNTERS_SK,
    counters_update,
    merged_update,
    plain,
    tenant_pk,
    write_updates,
)
from breakwater.aws.health import record_dependency_down, throttled_age_reports
from breakwater.aws.idempotency import IdempotentProcessor
from breakwater.aws.moves import send_moves
from breakwater.aws.tenant_limits import TenantLimitsCache
from breakwater.aws.tenants import TenantTable
from breakwater.concurrency import ConcurrencyLimits, Grant
from breakwater.envelope import Envelope
from breakwater.fairness import BucketLimits, contended_ask_interval_s
from breakwater.observability import logger
from breakwater.processor import WorkContext
from breakwater.settings import WorkerSettings
from breakwater.worker.ports import WorkerPorts

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

SWEEP_SK = "sweep"
# botocore's legacy User-Agent layout; without the per-request SDK feature ids of its default header
USER_AGENT = (
    f"Boto3/{boto3.__version__} md/Botocore#{botocore.__version__}"
    f" lang/python#{platform.python_version()} app/breakwater-worker"
)
CONTAINER_ID = uuid.uuid4().hex  # the concurrency lease holder: one lease per tenant per container


SWEEP_CACHE_SECONDS = 30.0
CONSUMER_BUCKET_ATTEMPTS = 6  # lost races on a consumer bucket retried before a tenant is refused
# A tenant whose leases are on its counters item keeps its consumer bucket there too, so the bucket's
# lease write can take the floor lease with it
CONSUMER_ON_COUNTERS = BucketItem(COUNTERS_SK, prefix="consumer_")


class SweepCache:
    """The tenant's anti-entropy cutoff (``tenant#<id>``/``sweep``), re-read at most every ``ttl_s``.

    A sweep is an operator's (or a job's) coarse action on a tenant's stale work, and most tenants
    have none: re-reading every 30 s (not 5) costs a container one GetItem per tenant per half
    minute, and a new cutoff reaches every worker within that time (docs/operations.md).
    """

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        ttl_s: float = SWEEP_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._table = table_name
        self._ttl = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, int | None]] = {}

    def __call__(self, tenant: str) -> int | None:
        now = self._clock()
        hit = self._cache.get(tenant)
        if hit is not None and hit[0] > now:
            return hit[1]
        response = self._client.get_item(
            TableName=self._table, Key={"pk": {"S": tenant_pk(tenant)}, "sk": {"S": SWEEP_SK}}
        )
        item = plain(response.get("Item") or {})
        swept = int(item["swept_at"]) if "swept_at" in item else None
        self._cache[tenant] = (now + self._ttl, swept)
        return swept


def client_config() -> Config:
    """The worker's botocore clients: standard retries, no client-side validation, a fixed User-Agent.

    Every call the worker makes is built by this code from typed values, and DynamoDB and SQS
    validate requests themselves; botocore's validation walked every parameter of every call, a
    large share of the CPU of a batch's calls (docs/performance.md). botocore also assembles its
    User-Agent header anew for every request (twice on the wire), again a large share of a small
    call's CPU; a User-Agent set in the config is used as it is.
    """
    return Config(
        retries={"mode": "standard", "max_attempts": 3},
        parameter_validation=False,
        user_agent=USER_AGENT,
    )


def build_worker_ports(
    settings: WorkerSettings,
    process: Callable[[Envelope, WorkContext], dict[str, Any]],
    *,
    dynamodb: DynamoDBClient | None = None,
    sqs: SQSClient | None = None,
    container_id: str = CONTAINER_ID,
) -> WorkerPorts:
    config = client_config()
    ddb: DynamoDBClient = dynamodb or boto3.client("dynamodb", config=config)
    queues: SQSClient = sqs or boto3.client("sqs", config=config)
    table = settings.state_table_name
    tenants = TenantTable(settings.tenants_table_name, client=ddb) if settings.tenants_table_name else None
    idempotent = IdempotentProcessor(
        process,
        settings.idempotency_table_name,
        settings.idempotency_ttl_seconds,
        client=ddb,
        locking=settings.processing_guarantee == "exactly_once",
    )
    leases = (
        ConcurrencyLeases(ddb, table, container_id, burst_capacity=settings.concurrency_burst_slots)
        if settings.sidelining_enabled
        else None
    )

    def release(
        grants: Mapping[str, Grant], counters: Mapping[str, Mapping[str, int]]
    ) -> dict[str, dict[str, int]]:
        """One UpdateItem per tenant that gives its lease back and adds its counters where both live on
        the tenant's counters item; for a tenant whose leases are sharded, the release on its lease
        shard and the counters (when the worker sends any) each on their own. And one for the batch's
        places in the burst pool.

        No transaction: an item in one costs two write units, in a batch write or a plain update
        one, and none of these needs the others to land with it.
        Returns the tenants' counters that were not written, for the worker to add to its next
        write (a lease not given back expires on its own).
        """
        failed = []
        for tenant in dict.fromkeys([*counters, *grants]):
            update = counters_update(table, tenant, counters.get(tenant, {}))
            grant = grants.get(tenant)
            lease = None if leases is None or grant is None else leases.release_update(tenant, grant)
            # the lease on the counters item goes back in the counters' write; one on a lease shard alone
            merged = False
            lease_errors: list[Exception] = []
            if update is not None and lease is not None and lease["Key"] == update["Key"]:
                update, merged = merged_update(update, lease), True
            elif lease is not None:
                lease_errors = write_updates(ddb, [lease])
                for error in lease_errors:  # the lease expires on its own
                    logger.warning("lease release failed", extra={"tenant": tenant, "error": str(error)})
            counter_errors = write_updates(ddb, [update] if update is not None else [])
            for error in counter_errors:
                logger.warning("counter flush failed", extra={"tenant": tenant, "error": str(error)})
                if tenant in counters:
                    failed.append(tenant)
            if leases is not None and lease is not None and not (counter_errors if merged else lease_errors):
                leases.released(tenant)
        pool = leases.pool_release_update(grants) if leases is not None else None
        for error in write_updates(ddb, [pool] if pool else []):  # a place expires on its own
            logger.warning("lease release failed", extra={"error": str(error)})
        return {tenant: dict(counters[tenant]) for tenant in failed}

    def settle(
        grants: Mapping[str, Grant], counters: Mapping[str, Mapping[str, int]]
    ) -> dict[str, dict[str, int]]:
        """The batch's last writes: its COMPLETED records (BatchWriteItem), then :func:`release`."""
        idempotent.write_completed(idempotent.take_completed())
        return release(grants, counters)

    def extend(queue_url: str, receipt_handle: str, seconds: int) -> None:
        queues.change_message_visibility(
            QueueUrl=queue_url, ReceiptHandle=receipt_handle, VisibilityTimeout=seconds
        )

    ports = WorkerPorts(
        tenant_limits=TenantLimitsCache(settings, tenants).get,
        swept_at_ms=SweepCache(ddb, table),
        send_moves=lambda moves: send_moves(queues, moves),
        settle=settle,
        release=release,
        record_oldest_age=throttled_age_reports(
            ddb, table, holder=container_id, shards=settings.health_report_shards
        ),
        extend_visibility=extend,
        process=idempotent,
        register_context=idempotent.register_context,
        lock=idempotent.lock,
        flush_processed=idempotent.flush,
        unlock=idempotent.unlock,
    )
    if settings.sidelining_enabled:
        # More attempts than ingest's: a batch has its invocation's time, and every container polling a
        # tenant's queues may ask its bucket at one instant (each retry after a jittered pause)
        rate = ports.rate = LeasedTokenBucket(
            table,
            "consumer",
            time.time,
            settings.lease_seconds,
            settings.lease_max_fraction,
            client=ddb,
            max_attempts=CONSUMER_BUCKET_ATTEMPTS,
            contended_interval_s=contended_ask_interval_s(
                settings.consumer_bucket_containers or settings.worker_containers
            ),
            shared_item=CONSUMER_ON_COUNTERS,
        )
        ports.leases = leases
        assert leases is not None  # made with the same setting

        def tokens_and_floor(
            tenant: str,
            bucket: BucketLimits,
            count: int,
            limits: ConcurrencyLimits,
            expires_at_ms: int,
            floor_until: int | None,
        ) -> tuple[int, Grant | None]:
            """The tokens of a tenant whose leases are on its counters item, from its bucket there, and
            its floor lease in the bucket's write if the bucket writes (FLOOR; None: not taken)."""
            rider = leases.floor_rider(tenant, limits, expires_at_ms, floor_until)
            taken, _ = rate.try_acquire_up_to(tenant, bucket, count, on_counters=True, rider=rider)
            return taken, Grant.FLOOR if rider is not None and rider.landed else None

        ports.tokens_and_floor = tokens_and_floor
        ports.report_outage = lambda until_ms: record_dependency_down(ddb, table, until_ms)
    return ports
