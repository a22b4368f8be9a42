"""The controller's real ports: tenants and state tables, queues, sideline mappings, the archiver.

The controller's own items in the state table:

- ``controller``/``scale``: ``scale_log``, the running logarithm of every reconciliation's scale, and
  the ``excess`` the last run saw, and the shard the next run starts from;
- ``controller#shard#<nn>``/``ledger``: a shard's ledger (``total`` as of ``mark``), its ``version``
  (every commit and every claim adds to it, so a run that lost the shard cannot write it), the lease
  (``lease_until``), the ``cursor`` where the last run stopped, and while a page is being written its
  ``intent``;
- on each ``tenant#<id>``/``counters`` item, next to the writers' ADD counters: the utilisation
  bookmarks (``seen_*``), the estimate as the ledger counts it (``estimate``, ``estimate_mark``),
  ``backlog_offset``, the ledger version of the page that wrote it (``ledger_version``), and
  ``multiplier`` (a copy of what ingest's bucket holds, so the bucket is read only for a tenant the
  controller never wrote).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from breakwater.archive_budget import ArchiveDue, SidelineObservation
from breakwater.auth import effective_limits, record_from_item
from breakwater.aws.counters import COUNTERS_SK, batch_get, plain, retrying_conflicts, tenant_pk
from breakwater.aws.health import (
    observed_depth,
    queue_depth,
    read_dependency_down_until,
    read_oldest_age,
    waiting_messages,
)
from breakwater.aws.mappings import set_mappings_enabled
from breakwater.backlog import Ledger, RunState, shard_key
from breakwater.controller import (
    ControllerPorts,
    ShardReport,
    ShardRequest,
    ShardState,
    TenantSnapshot,
    TenantWrite,
)
from breakwater.observability import logger
from breakwater.settings import ControllerSettings, TierLimits
from breakwater.tenant_depth import ObservedDepths

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_sqs import SQSClient

INGEST_BUCKET_SK = "bucket#ingest"
CONTROLLER_PK = "controller"
SCALE_SK = "scale"
LEDGER_SK = "ledger"
WRITE_THREADS = 8  # a page's tenant writes at once: each is one round trip, independent of the others


def ledger_pk(shard: int) -> str:
    return f"controller#shard#{shard_key(shard)}"


def _n(value: float) -> dict[str, str]:
    return {"N": str(Decimal(repr(float(value))).normalize()) if value else "0"}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def set_multiplier(client: DynamoDBClient, table_name: str, tenant: str, multiplier: float) -> None:
    """SET only ``multiplier`` on the tenant's ingest bucket; ingest owns every other attribute."""
    client.update_item(
        TableName=table_name,
        Key={"pk": {"S": tenant_pk(tenant)}, "sk": {"S": INGEST_BUCKET_SK}},
        UpdateExpression="SET multiplier = :m",
        ExpressionAttributeValues={":m": {"N": str(Decimal(str(multiplier)))}},
    )


def sideline_observations(
    ddb: DynamoDBClient, sqs: SQSClient, settings: ControllerSettings, now_ms: int | None = None
) -> list[SidelineObservation]:
    """Each sideline queue's depth and, when its role is known, the oldest age its workers reported."""
    roles = dict(zip(settings.sideline_queue_urls, settings.sideline_queue_roles, strict=False))
    observations = []
    for url in settings.sideline_queue_urls:
        role = roles.get(url)
        age_ms, observed_at = (
            read_oldest_age(
                ddb, settings.state_table_name, role, shards=settings.health_report_shards, now_ms=now_ms
            )
            if role is not None
            else (None, None)
        )
        depth = waiting_messages(sqs, url)
        observations.append(SidelineObservation(role or url, url, depth, age_ms, observed_at))
    return observations


def observed_depths(
    client: SQSClient, live_urls: Sequence[str], shared_urls: Sequence[str]
) -> ObservedDepths:
    """What :func:`observed_depth` counts, each live queue apart (the same one call per queue)."""
    live = tuple(observed_depth(client, [url]) for url in live_urls)
    return ObservedDepths(live=live, shared=observed_depth(client, shared_urls))


def start_archiver(client: LambdaClient, function_name: str, due: ArchiveDue) -> None:
    """Invoke the archiver asynchronously (InvocationType=Event) for one queue: the run outlives ours."""
    client.invoke(
        FunctionName=function_name,
        InvocationType="Event",
        Payload=json.dumps({"queue_url": due.queue_url, "reason": due.reason.value}).encode(),
    )


def _archiver_starter(client: LambdaClient, function_name: str | None) -> Callable[[ArchiveDue], None] | None:
    if function_name is None:
        return None
    return lambda due: start_archiver(client, function_name, due)


class ControllerState:
    """The controller's items in the state table (see the module docstring) and the tenants it reads."""

    def __init__(self, ddb: DynamoDBClient, settings: ControllerSettings) -> None:
        self._ddb = ddb
        self._settings = settings
        self._table = settings.state_table_name

    # -- the reconciliations' running scale

    def read_run_state(self) -> RunState:
        response = self._ddb.get_item(
            TableName=self._table,
            Key={"pk": {"S": CONTROLLER_PK}, "sk": {"S": SCALE_SK}},
            ConsistentRead=True,
        )
        item = plain(response.get("Item") or {})
        return RunState(
            float(item.get("scale_log", 0)), float(item.get("excess", 0)), int(item.get("resume_shard", 0))
        )

    def write_run_state(self, state: RunState) -> None:
        self._ddb.update_item(
            TableName=self._table,
            Key={"pk": {"S": CONTROLLER_PK}, "sk": {"S": SCALE_SK}},
            UpdateExpression="SET scale_log = :s, excess = :e, resume_shard = :r",
            ExpressionAttributeValues={
                ":s": _n(state.scale_log),
                ":e": _n(state.excess),
                ":r": {"N": str(state.resume_shard)},
            },
        )

    # -- shards

    def claim_shard(self, shard: int, now_ms: int, until_ms: int) -> ShardState | None:
        """Hold the shard until ``until_ms`` unless another run holds it; a claim bumps the version.

        A page left half-written by a run that died (its intent still on the ledger) is settled first.
        """
        try:
            response = self._ddb.update_item(
                TableName=self._table,
                Key={"pk": {"S": ledger_pk(shard)}, "sk": {"S": LEDGER_SK}},
                UpdateExpression="SET lease_until = :until ADD version :one",
                ConditionExpression="attribute_not_exists(lease_until) OR lease_until <= :now",
                ExpressionAttributeValues={":until": _n(until_ms), ":now": _n(now_ms), ":one": {"N": "1"}},
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if _code(exc) == "ConditionalCheckFailedException":
                return None
            raise
        item = plain(response.get("Attributes") or {})
        state = ShardState(
            shard=shard,
            ledger=Ledger(total=float(item.get("total", 0)), mark=float(item.get("mark", 0))),
            version=int(item["version"]),
            cursor=str(item["cursor"]) if item.get("cursor") else None,
        )
        if item.get("intent"):
            return self._settle_intent(state, json.loads(str(item["intent"])))
        return state

    def _settle_intent(self, state: ShardState, intent: Mapping[str, Any]) -> ShardState | None:
        """The ledger gets the deltas of the intent's tenants whose write landed (they carry its version)."""
        deltas: Mapping[str, float] = intent["deltas"]
        items = batch_get(
            self._ddb, self._table, [(tenant_pk(t), COUNTERS_SK) for t in deltas], consistent=True
        )
        landed = sum(
            delta
            for tenant, delta in deltas.items()
            if items.get((tenant_pk(tenant), COUNTERS_SK), {}).get("ledger_version") == intent["version"]
        )
        ledger = Ledger(float(intent["base"]) + landed, float(intent["mark"]))
        if not self._finish(state, ledger):
            return None
        return replace(state, ledger=ledger, version=state.version + 1)

    def _finish(self, state: ShardState, ledger: Ledger) -> bool:
        """SET the ledger and drop the intent, if the shard is still at ``state.version``."""
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key={"pk": {"S": ledger_pk(state.shard)}, "sk": {"S": LEDGER_SK}},
                UpdateExpression="SET #total = :total, #mark = :mark REMOVE intent ADD version :one",
                ConditionExpression="version = :version",
                ExpressionAttributeNames={"#total": "total", "#mark": "mark"},
                ExpressionAttributeValues={
                    ":total": _n(ledger.total),
                    ":mark": _n(ledger.mark),
                    ":one": {"N": "1"},
                    ":version": {"N": str(state.version)},
                },
            )
        except ClientError as exc:
            if _code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def release_shard(self, state: ShardState, cursor: str | None) -> None:
        update = "SET lease_until = :zero" + (", #cursor = :cursor" if cursor else " REMOVE #cursor")
        values: dict[str, Any] = {":zero": {"N": "0"}, ":version": {"N": str(state.version)}}
        if cursor:
            values[":cursor"] = {"S": cursor}
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key={"pk": {"S": ledger_pk(state.shard)}, "sk": {"S": LEDGER_SK}},
                UpdateExpression=update,
                ConditionExpression="version = :version",
                ExpressionAttributeNames={"#cursor": "cursor"},
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if _code(exc) != "ConditionalCheckFailedException":
                raise  # else: another run holds the shard now and keeps its own cursor

    def read_ledgers(self, shards: Sequence[int]) -> dict[int, Ledger]:
        items = batch_get(self._ddb, self._table, [(ledger_pk(shard), LEDGER_SK) for shard in shards])
        ledgers = {}
        for shard in shards:
            item = items.get((ledger_pk(shard), LEDGER_SK), {})
            ledgers[shard] = Ledger(total=float(item.get("total", 0)), mark=float(item.get("mark", 0)))
        return ledgers

    # -- changed tenants

    def dirty_tenants(self, shard: int, cursor: str | None, limit: int) -> tuple[list[str], str | None]:
        request: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": self._settings.dirty_index_name,
            "KeyConditionExpression": "dirty_shard = :shard",
            "ExpressionAttributeValues": {":shard": {"S": shard_key(shard)}},
            "Limit": limit,
        }
        if cursor:
            request["ExclusiveStartKey"] = json.loads(cursor)
        response = self._ddb.query(**request)
        tenants = [
            str(item["pk"]["S"]).removeprefix("tenant#")
            for item in response.get("Items", [])
            if item.get("sk", {}).get("S") == COUNTERS_SK
        ]
        last = response.get("LastEvaluatedKey")
        return tenants, json.dumps(last, sort_keys=True) if last else None

    def read_tenants(self, tenants: Sequence[str]) -> list[TenantSnapshot]:
        """Counters (strongly consistent), limits and current multiplier of each still-marked tenant."""
        items = batch_get(
            self._ddb, self._table, [(tenant_pk(t), COUNTERS_SK) for t in tenants], consistent=True
        )
        counters = {
            t: items[(tenant_pk(t), COUNTERS_SK)] for t in tenants if (tenant_pk(t), COUNTERS_SK) in items
        }
        # The index lags the table: a tenant cleared a moment ago may still be listed.
        marked = [t for t, item in counters.items() if "dirty_shard" in item]
        unknown = [t for t in marked if "multiplier" not in counters[t]]
        buckets = batch_get(self._ddb, self._table, [(tenant_pk(t), INGEST_BUCKET_SK) for t in unknown])
        limits = self._limits(marked)
        snapshots = []
        for tenant in marked:
            item = counters[tenant]
            if "multiplier" in item:
                multiplier = float(item["multiplier"])
            else:
                multiplier = float(
                    buckets.get((tenant_pk(tenant), INGEST_BUCKET_SK), {}).get("multiplier", 1)
                )
            snapshots.append(TenantSnapshot(tenant, limits.get(tenant), item, multiplier))
        return snapshots

    def _limits(self, tenants: Sequence[str]) -> dict[str, TierLimits]:
        """Active tenants' limits from their records; every tenant gets the default tier without a table."""
        settings = self._settings
        if not settings.tenants_table_name:
            return {tenant: settings.limits_for(None) for tenant in tenants}
        limits = {}
        for item in _batch_get_tenants(self._ddb, settings.tenants_table_name, tenants):
            record = record_from_item(item)
            if record.status.value == "active":
                limits[record.tenant_id] = effective_limits(settings, record)
        return limits

    def commit(self, state: ShardState, writes: Sequence[TenantWrite]) -> ShardState | None:
        """The page's tenant writes, with the shard's ledger before and after them.

        No transaction: a writer's plain UpdateItem on an item inside a transaction is refused, and
        the counters' writers must never be refused for the controller's sake. Instead the ledger
        records the page first (its intent: base, deltas, version), each tenant write carries that
        version, and the ledger takes the deltas and drops the intent last. A run that dies between
        leaves the intent for the next claim to settle (:meth:`_settle_intent`).
        """
        version = state.version + 1
        intent = {
            "version": version,
            "base": state.ledger.total,
            "mark": state.ledger.mark,
            "deltas": {write.tenant: write.ledger_delta for write in writes},
        }
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key={"pk": {"S": ledger_pk(state.shard)}, "sk": {"S": LEDGER_SK}},
                UpdateExpression="SET intent = :intent ADD version :one",
                ConditionExpression="version = :version",
                ExpressionAttributeValues={
                    ":intent": {"S": json.dumps(intent)},
                    ":one": {"N": "1"},
                    ":version": {"N": str(state.version)},
                },
            )
        except ClientError as exc:
            if _code(exc) == "ConditionalCheckFailedException":
                return None
            raise
        # Any failure here leaves the intent: the next claim finds out which writes landed.
        with ThreadPoolExecutor(max_workers=WRITE_THREADS) as pool:
            list(pool.map(lambda write: self._write_tenant(write, version), writes))
        total = state.ledger.total + sum(write.ledger_delta for write in writes)
        ledger = Ledger(total, state.ledger.mark)
        written = replace(state, version=version)
        if not self._finish(written, ledger):
            return None
        return replace(written, ledger=ledger, version=version + 1)

    def _write_tenant(self, write: TenantWrite, version: int) -> None:
        """Ingest's bucket first (when the multiplier changed), then the counters item in one UpdateItem."""
        if write.multiplier_changed:
            retrying_conflicts(lambda: set_multiplier(self._ddb, self._table, write.tenant, write.multiplier))
        try:
            retrying_conflicts(
                lambda: self._ddb.update_item(
                    **self._tenant_update(write, version, clear=not write.keep_dirty)
                )
            )
        except ClientError as exc:
            if _code(exc) != "ConditionalCheckFailedException":
                raise
            # Written to since the read: the tenant keeps its mark and is looked at again next run.
            retrying_conflicts(
                lambda: self._ddb.update_item(**self._tenant_update(write, version, clear=False))
            )

    def _tenant_update(self, write: TenantWrite, version: int, *, clear: bool) -> dict[str, Any]:
        values: dict[str, Any] = {
            ":accepted": _n(write.seen["accepted"]),
            ":throttled": _n(write.seen["throttled"]),
            ":at": _n(write.seen["at"]),
            ":estimate": _n(write.stored.estimate),
            ":mark": _n(write.stored.mark),
            ":offset": _n(write.stored.offset),
            ":multiplier": _n(write.multiplier),
            ":version": {"N": str(version)},
        }
        update: dict[str, Any] = {
            "TableName": self._table,
            "Key": {"pk": {"S": tenant_pk(write.tenant)}, "sk": {"S": COUNTERS_SK}},
            "UpdateExpression": (
                "SET seen_accepted = :accepted, seen_throttled = :throttled, seen_at = :at, "
                "estimate = :estimate, estimate_mark = :mark, backlog_offset = :offset, "
                "multiplier = :multiplier, ledger_version = :version"
            ),
        }
        if clear:
            update["UpdateExpression"] += " REMOVE dirty_shard"
            if write.writes is None:
                update["ConditionExpression"] = "attribute_not_exists(writes)"
            else:
                update["ConditionExpression"] = "writes = :writes"
                values[":writes"] = _n(write.writes)
        update["ExpressionAttributeValues"] = values
        return update


def _batch_get_tenants(
    client: DynamoDBClient, table_name: str, tenants: Sequence[str]
) -> list[dict[str, Any]]:
    """Tenant records by id, 100 keys per BatchGetItem, retrying unprocessed keys."""
    pending: list[Any] = [{"tenant_id": {"S": tenant}} for tenant in dict.fromkeys(tenants)]
    found: list[dict[str, Any]] = []
    for _ in range(10):
        if not pending:
            return found
        chunk, pending = pending[:100], pending[100:]
        response = client.batch_get_item(RequestItems={table_name: {"Keys": chunk}})
        found.extend(plain(item) for item in response.get("Responses", {}).get(table_name, []))
        unprocessed: dict[str, Any] = dict(response.get("UnprocessedKeys") or {})
        pending.extend((unprocessed.get(table_name) or {}).get("Keys", []))
    raise RuntimeError(f"BatchGetItem left {len(pending)} tenant records unprocessed")


def _shard_runner(
    functions: LambdaClient, function_name: str
) -> Callable[[Sequence[Sequence[int]], ShardRequest], list[ShardReport]]:
    """Each group of shards in an invocation of this same function, all at once; waits for their reports."""

    def invoke(shards: Sequence[int], request: ShardRequest) -> ShardReport:
        try:
            response = functions.invoke(
                FunctionName=function_name,
                InvocationType="RequestResponse",
                Payload=json.dumps(request.as_event(shards)).encode(),
            )
            payload = json.loads(response["Payload"].read() or b"{}")
            if response.get("FunctionError"):
                raise RuntimeError(str(payload)[:500])
            return ShardReport.from_summary(payload)
        except Exception as exc:  # the shards keep their marks and cursors: the next run goes on
            logger.error("shard invocation failed", extra={"shards": list(shards), "error": str(exc)})
            return ShardReport(failed=list(shards))

    def run(groups: Sequence[Sequence[int]], request: ShardRequest) -> list[ShardReport]:
        if not groups:
            return []
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            return list(pool.map(lambda group: invoke(group, request), groups))

    return run


def build_controller_ports(
    settings: ControllerSettings,
    *,
    dynamodb: DynamoDBClient | None = None,
    sqs: SQSClient | None = None,
    lambda_client: LambdaClient | None = None,
    function_name: str | None = None,
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> ControllerPorts:
    config = Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=50)
    ddb: DynamoDBClient = dynamodb or boto3.client("dynamodb", config=config)
    queues: SQSClient = sqs or boto3.client("sqs", config=config)
    functions: LambdaClient = lambda_client or boto3.client("lambda", config=config)
    table = settings.state_table_name
    state = ControllerState(ddb, settings)
    shared_queues = [
        *([settings.surge_queue_url] if settings.surge_queue_url else []),
        *settings.sideline_queue_urls,
    ]
    every_queue = [*settings.live_queue_urls, *shared_queues]
    # Lambda sets AWS_LAMBDA_FUNCTION_NAME: the shards of a split run go to this same function.
    own_name = function_name or os.environ.get("AWS_LAMBDA_FUNCTION_NAME")
    return ControllerPorts(
        live_depth=lambda: queue_depth(queues, settings.live_queue_urls),
        live_oldest=lambda: read_oldest_age(
            ddb, table, "live", shards=settings.health_report_shards, now_ms=clock_ms()
        ),
        dependency_down_until=lambda: read_dependency_down_until(ddb, table),
        set_sideline_enabled=lambda enabled, held: set_mappings_enabled(
            functions, settings.sideline_mapping_uuids, enabled, held
        ),
        observed_depth=lambda: observed_depth(queues, every_queue),
        read_run_state=state.read_run_state,
        write_run_state=state.write_run_state,
        claim_shard=state.claim_shard,
        dirty_tenants=state.dirty_tenants,
        read_tenants=state.read_tenants,
        commit=state.commit,
        release_shard=state.release_shard,
        read_ledgers=state.read_ledgers,
        sideline_observations=lambda: sideline_observations(ddb, queues, settings, clock_ms()),
        start_archiver=_archiver_starter(functions, settings.archiver_function_name),
        run_elsewhere=_shard_runner(functions, own_name)
        if own_name and settings.controller_invocations > 1
        else None,
        clock_ms=clock_ms,
        queue_depths=lambda: observed_depths(queues, settings.live_queue_urls, shared_queues),
    )
