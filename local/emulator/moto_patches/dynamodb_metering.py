"""How DynamoDB's limits see a request: the items it touches, their kinds, what they cost, the errors.

Units as AWS bills them (:mod:`local.pricing.usage`): a write unit per KB of the larger of the item
before and after (known before the write as far as the request shows it; an update that grows its
item is charged the rest afterwards), a read unit per 4 KB, half for an eventually consistent read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from moto.core.exceptions import JsonRESTError
from moto.dynamodb.exceptions import ERROR_TYPE_PREFIX
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.utilities import bytesize

from local.aws_limits import item_kind
from local.pricing.usage import item_size, update_size, value_size, write_units

THROTTLED_MESSAGE = (
    "Throughput exceeds the current capacity of your table or index. DynamoDB is automatically scaling "
    "your table or index so please try again shortly. If exceptions persist, check if you have a hot "
    "key: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html."
)
CONFLICT_MESSAGE = "Transaction is ongoing for the item"
TRANSACTION_TOO_LARGE = "Transaction request cannot be larger than 4 MB"


class ThroughputExceededError(JsonRESTError):
    """``ProvisionedThroughputExceededException`` with the hot key's throttling reason."""

    def __init__(self, resource: str, *, reads: bool, index: bool = False) -> None:
        error_type = ERROR_TYPE_PREFIX + "ProvisionedThroughputExceededException"
        super().__init__(error_type, THROTTLED_MESSAGE)
        reason = f"{'Index' if index else 'Table'}{'Read' if reads else 'Write'}KeyRangeThroughputExceeded"
        self.description = json.dumps(
            {
                "__type": error_type,
                "message": THROTTLED_MESSAGE,
                "ThrottlingReasons": [{"reason": reason, "resource": resource}],
            }
        )


class TransactionConflictError(JsonRESTError):
    def __init__(self) -> None:
        super().__init__(ERROR_TYPE_PREFIX + "TransactionConflictException", CONFLICT_MESSAGE)


@dataclass
class Target:
    """One item a request touches: where it is, what kind, what it costs."""

    table: Any
    item: tuple[str, str, str]  # (table name, hash key value, range key value or "")
    kind: str
    stored: Any  # moto's Item before the call, or None
    units: float = 0.0

    @property
    def stored_size(self) -> int:
        return stored_item_size(self.stored)


def plain(value: Any) -> str:
    return str(next(iter(value.values()))) if isinstance(value, dict) and value else str(value)


def target_of(backend: Any, table_name: str, attrs: dict[str, Any]) -> Target | None:
    """The item ``attrs`` (a key, or a whole item) names, or None for a request moto will refuse."""
    try:
        table = backend.get_table(table_name)
        hash_value = attrs[table.hash_key_attr]
        range_value = attrs[table.range_key_attr] if table.range_key_attr else None
        stored = table.get_item(DynamoType(hash_value), DynamoType(range_value) if range_value else None)
    except Exception:  # moto's own validation answers for a malformed request
        return None
    key = {table.hash_key_attr: plain(hash_value)}
    if table.range_key_attr:
        key[table.range_key_attr] = plain(range_value)
    item = (table_name, plain(hash_value), plain(range_value) if range_value else "")
    return Target(table, item, item_kind(table_name, key), stored)


def written_size(operation: str, request: dict[str, Any], target: Target) -> int:
    """The larger of the item before and after, as far as it is known before the write."""
    before = target.stored_size
    if operation == "Put":
        return max(before, item_size(request.get("Item")))
    if operation == "Update":
        return max(before, update_size(request))
    return before  # Delete, ConditionCheck


def throttle_write(target: Target) -> ThroughputExceededError:
    return ThroughputExceededError(target.table.table_arn, reads=False)


def consume(enforcement: Any, target: Target, *, reads: bool) -> bool:
    meter = enforcement.dynamodb
    units = target.units
    with enforcement.lock:
        return bool(
            meter.consume(
                target.item,
                enforcement.clock(),
                read_units=units if reads else 0.0,
                write_units=0.0 if reads else units,
                kind=target.kind,
            )
        )


def charge(
    enforcement: Any, item: Any, kind: str, *, write_units_: float = 0.0, read_units_: float = 0.0
) -> None:
    with enforcement.lock:
        enforcement.dynamodb.charge(
            item, enforcement.clock(), read_units=read_units_, write_units=write_units_, kind=kind
        )


def index_writes(enforcement: Any, target: Target, after: Any) -> None:
    """A write that changes an item's index key writes the index partitions it leaves and joins."""
    for index in getattr(target.table, "global_indexes", ()):
        attribute = index.schema_key_attrs[0]
        old = target.stored.attrs.get(attribute) if target.stored is not None else None
        new = after.attrs.get(attribute) if after is not None else None
        if (old is None and new is None) or (old is not None and new is not None and old == new):
            continue
        for value in (old, new):
            if value is not None:
                key = {attribute: str(value.value)}
                item = (target.item[0], f"index:{index.name}", str(value.value))
                units = write_units(bytesize(attribute) + value.size() + item_size({}))
                charge(enforcement, item, item_kind(target.item[0], key), write_units_=units)


def stored_after(target: Target) -> Any:
    _, hash_value, range_value = target.item
    try:
        key_type = target.table.hash_key_type
        range_type = target.table.range_key_type
        return target.table.get_item(
            DynamoType({key_type: hash_value}), DynamoType({range_type: range_value}) if range_value else None
        )
    except Exception:  # only sizes depend on it
        return None


def stored_item_size(item: Any) -> int:
    """A stored item's size by :func:`local.pricing.usage.item_size`'s rules, read from moto's values
    directly (converting the item to its wire form first cost more than the call it meters)."""
    if item is None:
        return 0
    return sum(len(name.encode("utf-8")) + _stored_value_size(value) for name, value in item.attrs.items())


def _stored_value_size(value: Any) -> int:
    if not isinstance(value, DynamoType):
        return value_size(value) if isinstance(value, dict) else 0
    kind, inner = value.type, value.value
    if kind == "M" and isinstance(inner, dict):
        return 3 + sum(len(k.encode("utf-8")) + 1 + _stored_value_size(v) for k, v in inner.items())
    if kind == "L" and isinstance(inner, list):
        return 3 + sum(1 + _stored_value_size(v) for v in inner)
    if kind == "S" and isinstance(inner, str):
        return len(inner.encode("utf-8"))
    return value_size({kind: inner})
