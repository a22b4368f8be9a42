"""The aggregates table: compare-and-swap writes keyed by shard and sequence number.

Item: ``pk`` = partition key (tenant or ``tenant:key``), ``sk`` = event type; ``count`` and ``total``
(sums), ``last_value``, ``updated_at`` (epoch ms) and, per shard that ever fed it, ``seq#<shard id>``:
the sortable sequence number (:func:`breakwater.sequencing.sortable_sequence`) of the last record
applied from that shard.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from breakwater.aws import clients
from breakwater.sequencing import Aggregate, sortable_sequence

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from breakwater.settings import StreamConsumerSettings

SEQUENCE_ATTRIBUTE_PREFIX = "seq#"
_UPDATE = "SET #seq = :last, last_value = :lv, updated_at = :now ADD #count :n, #total :t"


def _number(value: float) -> str:
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def _unsortable(stored: str) -> str:
    """The plain sequence number back from its sortable form."""
    return stored[3:]


class DynamoAggregateStore:
    """:class:`breakwater.sequencing.AggregateStore` on DynamoDB (one UpdateItem per aggregate)."""

    def __init__(self, client: DynamoDBClient, table_name: str, clock: Any = time.time) -> None:
        self._client = client
        self._table = table_name
        self._clock = clock

    def apply_if_newer(self, aggregate: Aggregate) -> str | None:
        return self._update(
            aggregate,
            "attribute_not_exists(#seq) OR #seq < :first",
            {":first": {"S": sortable_sequence(aggregate.first_sequence)}},
        )

    def apply_if_unchanged(self, aggregate: Aggregate, stored_sequence: str) -> str | None:
        return self._update(
            aggregate, "#seq = :stored", {":stored": {"S": sortable_sequence(stored_sequence)}}
        )

    def _update(self, aggregate: Aggregate, condition: str, condition_values: dict[str, Any]) -> str | None:
        key = aggregate.key
        try:
            self._client.update_item(
                TableName=self._table,
                Key={"pk": {"S": key.partition_key}, "sk": {"S": key.type}},
                UpdateExpression=_UPDATE,
                ConditionExpression=condition,
                ExpressionAttributeNames={
                    "#seq": f"{SEQUENCE_ATTRIBUTE_PREFIX}{key.shard_id}",
                    "#count": "count",
                    "#total": "total",
                },
                ExpressionAttributeValues={
                    ":last": {"S": sortable_sequence(aggregate.last_sequence)},
                    ":lv": {"N": _number(aggregate.last_value)},
                    ":now": {"N": str(int(self._clock() * 1000))},
                    ":n": {"N": str(aggregate.count)},
                    ":t": {"N": _number(aggregate.total)},
                    **condition_values,
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            item: dict[str, Any] = exc.response.get("Item", {})  # type: ignore[assignment]
            stored = item.get(f"{SEQUENCE_ATTRIBUTE_PREFIX}{key.shard_id}", {}).get("S")
            if stored is None:  # raced with a writer that created the attribute; retry as a swap from scratch
                raise
            return _unsortable(stored)
        return None

    def read(self, partition_key: str, event_type: str) -> dict[str, Any]:
        """The item as plain values (for tests, the bench and operators)."""
        response = self._client.get_item(
            TableName=self._table,
            Key={"pk": {"S": partition_key}, "sk": {"S": event_type}},
            ConsistentRead=True,
        )
        item = response.get("Item", {})
        plain: dict[str, Any] = {}
        for name, value in item.items():
            if "N" in value:
                plain[name] = float(value["N"])
            elif "S" in value:
                plain[name] = (
                    _unsortable(value["S"]) if name.startswith(SEQUENCE_ATTRIBUTE_PREFIX) else value["S"]
                )
        return plain


def build_aggregate_store(settings: StreamConsumerSettings) -> DynamoAggregateStore:
    """The stream consumer's store: the only place its DynamoDB client is made."""
    return DynamoAggregateStore(clients.client("dynamodb"), settings.aggregates_table_name)
