"""Per-tenant aggregate counters (``tenant#<id>``/``counters``), flushed by ingest and workers.

Every counter is a monotonically increasing DynamoDB ``ADD``, so concurrent writers never conflict
and a flush is one UpdateItem per tenant per batch, never one per message. The controller keeps its
own bookmarks (``seen_*``) on the same item with ``SET``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.types import TypeDeserializer

from breakwater.backpressure import COUNTER_NAMES

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

COUNTERS_SK = "counters"
_deserializer = TypeDeserializer()


def tenant_pk(tenant: str) -> str:
    return f"tenant#{tenant}"


def plain(item: Mapping[str, Any]) -> dict[str, Any]:
    """A low-level DynamoDB item as Python values (numbers become ``Decimal``)."""
    return {name: _deserializer.deserialize(value) for name, value in item.items()}


def add_counters(client: DynamoDBClient, table_name: str, tenant: str, deltas: Mapping[str, int]) -> None:
    """ADD ``deltas`` to the tenant's counters in one write; zeros are skipped, unknown names refused."""
    unknown = set(deltas) - set(COUNTER_NAMES)
    if unknown:
        raise ValueError(f"unknown counter(s) {sorted(unknown)}; known: {COUNTER_NAMES}")
    nonzero = {name: int(value) for name, value in deltas.items() if value}
    if not nonzero:
        return
    names = {f"#c{i}": name for i, name in enumerate(nonzero)}
    values = {f":c{i}": {"N": str(value)} for i, value in enumerate(nonzero.values())}
    client.update_item(
        TableName=table_name,
        Key={"pk": {"S": tenant_pk(tenant)}, "sk": {"S": COUNTERS_SK}},
        UpdateExpression="ADD " + ", ".join(f"{n} {v}" for n, v in zip(names, values, strict=True)),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues=values,
    )


def set_bookmark(client: DynamoDBClient, table_name: str, tenant: str, seen: Mapping[str, float]) -> None:
    """The controller's ``seen_<name>`` bookmarks (values at its last run), next to the counters."""
    names = {f"#s{i}": f"seen_{name}" for i, name in enumerate(seen)}
    values = {f":s{i}": {"N": str(Decimal(str(value)))} for i, value in enumerate(seen.values())}
    client.update_item(
        TableName=table_name,
        Key={"pk": {"S": tenant_pk(tenant)}, "sk": {"S": COUNTERS_SK}},
        UpdateExpression="SET " + ", ".join(f"{n} = {v}" for n, v in zip(names, values, strict=True)),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues=values,
    )


def batch_get(
    client: DynamoDBClient, table_name: str, keys: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], dict[str, Any]]:
    """Items by (pk, sk), 100 keys per BatchGetItem, retrying unprocessed keys; missing items are absent."""
    pending: list[Any] = [{"pk": {"S": pk}, "sk": {"S": sk}} for pk, sk in dict.fromkeys(keys)]
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for attempt in range(10):
        if not pending:
            break
        chunk, pending = pending[:100], pending[100:]
        response = client.batch_get_item(RequestItems={table_name: {"Keys": chunk}})
        for item in response.get("Responses", {}).get(table_name, []):
            value = plain(item)
            found[(str(value["pk"]), str(value["sk"]))] = value
        unprocessed: dict[str, Any] = dict(response.get("UnprocessedKeys") or {})
        pending.extend((unprocessed.get(table_name) or {}).get("Keys", []))
        if attempt == 9 and pending:
            raise RuntimeError(f"BatchGetItem left {len(pending)} keys unprocessed")
    return found
