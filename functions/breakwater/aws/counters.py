"""Per-tenant aggregate counters (``tenant#<id>``/``counters``), flushed by ingest and workers.

Every counter is a monotonically increasing DynamoDB ``ADD``, so concurrent writers never conflict
and a flush is one UpdateItem per tenant per batch, never one per message. The same update marks the
tenant changed for the controller: ``dirty_shard`` (its shard, the key of the state table's sparse
index of changed tenants) and ``writes`` (one more per flush, so the controller clears the mark only
if nothing was written since it read the counters). The controller keeps its own attributes
(bookmarks ``seen_*``, its estimate and offset) on the same item with ``SET``, and the tenant's
concurrency leases live there too (``leases``, ``version``: :mod:`breakwater.aws.concurrency`), so a
worker's release and its counters are one write (:func:`merged_update`), and so does its consumer
bucket (``consumer_*``), whose lease write carries the floor lease (:class:`Rider`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.types import TypeDeserializer
from botocore.exceptions import ClientError

from breakwater.aws import clients
from breakwater.aws.conflicts import pause_before_retry
from breakwater.backlog import COUNTER_NAMES, shard_key, shard_of

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

COUNTERS_SK = "counters"
_deserializer = TypeDeserializer()


def condition_held(write: Callable[[], object]) -> bool:
    """Make a conditional write; False if its condition failed (any other error is raised)."""
    try:
        write()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise
    return True


def tenant_pk(tenant: str) -> str:
    return f"tenant#{tenant}"


def plain(item: Mapping[str, Any]) -> dict[str, Any]:
    """A low-level DynamoDB item as Python values (numbers become ``Decimal``)."""
    return {name: _deserializer.deserialize(value) for name, value in item.items()}


def counters_update(table_name: str, tenant: str, deltas: Mapping[str, int]) -> dict[str, Any] | None:
    """The UpdateItem arguments that ADD ``deltas`` (None if all are zero); unknown names refused."""
    unknown = set(deltas) - set(COUNTER_NAMES)
    if unknown:
        raise ValueError(f"unknown counter(s) {sorted(unknown)}; known: {COUNTER_NAMES}")
    nonzero = {name: int(value) for name, value in deltas.items() if value}
    if not nonzero:
        return None
    names = {f"#c{i}": name for i, name in enumerate(nonzero)}
    values = {f":c{i}": {"N": str(value)} for i, value in enumerate(nonzero.values())}
    adds = ", ".join(f"{n} {v}" for n, v in zip(names, values, strict=True))
    # Index key writes happen only when the item enters the index: re-marking a marked tenant is free.
    return {
        "TableName": table_name,
        "Key": {"pk": {"S": tenant_pk(tenant)}, "sk": {"S": COUNTERS_SK}},
        "UpdateExpression": f"SET dirty_shard = :shard ADD {adds}, writes :one",
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values
        | {":shard": {"S": shard_key(shard_of(tenant))}, ":one": {"N": "1"}},
    }


_ACTIONS = re.compile(r"\b(SET|REMOVE|ADD|DELETE)\b")


def merged_update(
    first: Mapping[str, Any], second: Mapping[str, Any], *, conditional: bool = False
) -> dict[str, Any]:
    """Two UpdateItems of one item as one (one write unit where two took two).

    Their clauses are joined per action (``SET``, ``REMOVE``, ``ADD``, ``DELETE``); a placeholder
    both use must stand for the same name or value. Conditional updates merge only if ``conditional``
    (their conditions must then both hold: the write is all or nothing); ``first`` says what is
    returned.
    """
    if first["TableName"] != second["TableName"] or first["Key"] != second["Key"]:
        raise ValueError("only updates of the same item merge")
    conditions = [
        str(update["ConditionExpression"]) for update in (first, second) if "ConditionExpression" in update
    ]
    if conditions and not conditional:
        raise ValueError("conditional updates do not merge")
    clauses: dict[str, list[str]] = {}
    for update in (first, second):
        parts = _ACTIONS.split(str(update["UpdateExpression"]))
        for action, body in zip(parts[1::2], parts[2::2], strict=True):
            clauses.setdefault(action, []).append(body.strip().rstrip(","))
    merged: dict[str, Any] = {
        "TableName": first["TableName"],
        "Key": first["Key"],
        "UpdateExpression": " ".join(f"{action} {', '.join(bodies)}" for action, bodies in clauses.items()),
    }
    if len(conditions) == 1:  # DynamoDB refuses redundant parentheses (a merge of a merge)
        merged["ConditionExpression"] = conditions[0]
    elif conditions:
        merged["ConditionExpression"] = " AND ".join(f"({condition})" for condition in conditions)
    for field in ("ExpressionAttributeNames", "ExpressionAttributeValues"):
        joined = dict(first.get(field) or {})
        for placeholder, value in (second.get(field) or {}).items():
            if joined.setdefault(placeholder, value) != value:
                raise ValueError(f"{placeholder} stands for two things in the updates to merge")
        if joined:
            merged[field] = joined
    for field in ("ReturnValues", "ReturnValuesOnConditionCheckFailure"):
        if field in first:
            merged[field] = first[field]
    return merged


@dataclass
class Rider:
    """A conditional write of an item that another conditional write of the same item (the carrier)
    takes along, so both cost one write unit where they cost two: a consumer bucket's lease write
    carries the tenant's floor lease this way (:mod:`breakwater.aws.bucket_items`).

    ``update`` is the rider's UpdateItem, its condition included (placeholders other than the
    carrier's, or standing for the same); ``holds`` tells from the item a failed joint write returned
    whether the rider's own condition held on it (then the carrier's failed, and its next attempt may
    carry the rider again); ``on_landed`` runs once a joint write succeeded, ``on_refused`` with that
    item when the rider's condition failed (the carrier is then written alone).
    """

    update: Mapping[str, Any]
    holds: Callable[[Mapping[str, Any]], bool]
    on_landed: Callable[[], None] = lambda: None
    on_refused: Callable[[Mapping[str, Any]], None] = lambda _item: None
    landed: bool = False
    refused: bool = False


def carried_write(client: DynamoDBClient, request: Mapping[str, Any], rider: Rider | None) -> dict[str, Any]:
    """The UpdateItem ``request`` with ``rider`` in it (if any, neither landed nor refused yet): the response.

    A failed condition raises as the carrier's own would, with the item, unless the rider's condition
    is the one that failed: then the rider is refused and the carrier written alone. A write refused
    while a transaction holds the item is made again after a pause.
    """
    if rider is None or rider.landed or rider.refused:
        return _update_past_transactions(client, request)
    try:
        response = _update_past_transactions(client, merged_update(request, rider.update, conditional=True))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise
        item: Mapping[str, Any] = exc.response.get("Item") or {}  # type: ignore[assignment]
        if rider.holds(item):
            raise
        rider.refused = True
        rider.on_refused(item)
        return _update_past_transactions(client, request)
    rider.landed = True
    rider.on_landed()
    return response


def _update_past_transactions(client: DynamoDBClient, request: Mapping[str, Any]) -> dict[str, Any]:
    """The UpdateItem's response, made again while a transaction holds the item (a burst lease's
    holds the tenant's counters item, where a consumer bucket may be kept: :func:`retrying_conflicts`)."""
    response: dict[str, Any] = {}

    def write() -> None:
        nonlocal response
        response = dict(client.update_item(**request))

    retrying_conflicts(write)
    return response


def held_by_a_transaction(exc: ClientError) -> bool:
    """Whether a plain write was refused because another writer's transaction held its item."""
    return exc.response.get("Error", {}).get("Code") == "TransactionConflictException"


def retrying_conflicts(
    write: Callable[[], object],
    attempts: int = 4,
    conflicted: Callable[[ClientError], bool] = held_by_a_transaction,
) -> None:
    """A write to an item that a writer's transaction holds is refused, not queued: try again after
    a jittered pause, while the invocation has the time (:func:`pause_before_retry`). ``conflicted``
    tells such a refusal from any other (raised at once); the last refusal is raised too.

    (A burst lease's transaction holds the tenant's counters item for the moment it takes.)
    """
    for attempt in range(attempts):
        try:
            write()
            return
        except ClientError as exc:
            if not conflicted(exc):
                raise
            if attempt == attempts - 1 or not pause_before_retry(attempt):
                raise


def add_counters(client: DynamoDBClient, table_name: str, tenant: str, deltas: Mapping[str, int]) -> None:
    """ADD ``deltas`` to the tenant's counters in one write; zeros are skipped, unknown names refused."""
    update = counters_update(table_name, tenant, deltas)
    if update is not None:
        retrying_conflicts(functools.partial(client.update_item, **update))


def write_updates(client: DynamoDBClient, updates: Sequence[dict[str, Any]]) -> list[Exception]:
    """Unconditional UpdateItems of distinct items, each its own call; returns what failed.

    Not one TransactWriteItems: an item in a transaction costs two write units, a plain update one,
    and nothing needs these updates to land together.
    """
    errors: list[Exception] = []
    for update in updates:
        try:
            retrying_conflicts(functools.partial(client.update_item, **update))
        except Exception as exc:
            errors.append(exc)
    return errors


def batch_get_items(
    client: DynamoDBClient,
    table_name: str,
    keys: Sequence[Mapping[str, Any]],
    *,
    consistent: bool = False,
    calls: int = 10,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The items of ``keys`` (low-level keys), 100 per BatchGetItem, unprocessed keys asked again, in
    at most ``calls`` calls; returns the items found (missing ones are absent) and the keys left."""
    pending: list[Any] = list(keys)
    found: list[dict[str, Any]] = []
    for _ in range(calls):
        if not pending:
            break
        chunk, pending = pending[:100], pending[100:]
        request: Any = {"Keys": chunk, "ConsistentRead": consistent}
        response = client.batch_get_item(RequestItems={table_name: request})
        found.extend(response.get("Responses", {}).get(table_name, []))
        unprocessed: dict[str, Any] = dict(response.get("UnprocessedKeys") or {})
        pending.extend((unprocessed.get(table_name) or {}).get("Keys", []))
    return found, pending


def batch_get_some(
    client: DynamoDBClient,
    table_name: str,
    keys: Iterable[tuple[str, str]],
    *,
    consistent: bool = False,
    calls: int = 10,
) -> tuple[dict[tuple[str, str], dict[str, Any]], set[tuple[str, str]]]:
    """Items by (pk, sk) as :func:`batch_get` reads them, and the (pk, sk) DynamoDB still left
    unprocessed after ``calls`` calls (a throttled item's), for the caller to deal with."""
    requested = [{"pk": {"S": pk}, "sk": {"S": sk}} for pk, sk in dict.fromkeys(keys)]
    items, left = batch_get_items(client, table_name, requested, consistent=consistent, calls=calls)
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for item in items:
        value = plain(item)
        found[(str(value["pk"]), str(value["sk"]))] = value
    return found, {(key["pk"]["S"], key["sk"]["S"]) for key in left}


def batch_get(
    client: DynamoDBClient, table_name: str, keys: Iterable[tuple[str, str]], *, consistent: bool = False
) -> dict[tuple[str, str], dict[str, Any]]:
    """Items by (pk, sk), 100 keys per BatchGetItem, retrying unprocessed keys; missing items are absent."""
    found, left = batch_get_some(client, table_name, keys, consistent=consistent)
    if left:
        raise RuntimeError(f"BatchGetItem left {len(left)} keys unprocessed")
    return found


class TenantCounters:
    """The ``CounterSink`` of ingest: every tenant's deltas in as few writes as possible."""

    def __init__(self, table_name: str, client: DynamoDBClient | None = None) -> None:
        self._table_name = table_name
        self._client: DynamoDBClient = client or clients.client("dynamodb")

    def add(self, deltas: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
        """One UpdateItem per tenant; returns the deltas of the tenants whose write failed (a write that
        landed must not be made again: counters only ever ADD)."""
        failed: dict[str, dict[str, int]] = {}
        for tenant, counts in deltas.items():
            update = counters_update(self._table_name, tenant, counts)
            if update is not None and write_updates(self._client, [update]):
                failed[tenant] = dict(counts)
        return failed
