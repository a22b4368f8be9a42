"""DynamoDB's limits in moto's response handlers: per-item throughput, transaction conflicts, sizes.

Each item (table and full key) has a partition's budget (:class:`local.aws_limits.ItemThroughput`):
a call's units are those AWS bills (:mod:`local.pricing.usage`: a write unit per KB of the larger of
the item before and after, a read unit per 4 KB, half for an eventually consistent read, twice in a
transaction), taken before the call runs, so a write refused by its condition still consumes and a
throttled call takes nothing. A throttled call gets what an on-demand table answers for a hot key:
``ProvisionedThroughputExceededException`` (HTTP 400) with ``ThrottlingReasons`` naming the
``Table{Read,Write}KeyRangeThroughputExceeded`` reason and the table's ARN; BatchWriteItem and
BatchGetItem return the throttled entries as ``UnprocessedItems`` / ``UnprocessedKeys`` and are refused
whole only when no entry passes; in a transaction, the throttled entry's cancellation reason is
``ThrottlingError``.

A TransactWriteItems holds its items for ``transaction_hold_s`` (its duration on AWS: the call returns
only after it, and waits outside the lock that serializes moto's item operations). Meanwhile a
PutItem, UpdateItem or DeleteItem of a held item gets ``TransactionConflictException``, and a
TransactWriteItems or TransactGetItems touching one is cancelled with ``TransactionConflict`` for that
entry (``None`` for the others), as AWS documents; a BatchWriteItem entry on a held item comes back
unprocessed.

Query and Scan: their units (the items read, rounded to 4 KB, filters included) are spread over the
items they return by size; a Query on an index is metered on the index's partition (its key's value).
A write that changes an item's index key also writes the index's partition (a write unit per KB of
the key), metered there without being refused: the emulator cannot know before the write whether it
changes the key. Items over 400 KB are refused by moto's own check, at AWS's figure; a transaction's
items over 4 MB in total are refused before it runs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Any

from moto.dynamodb.exceptions import ItemSizeTooLarge, MockValidationException, TransactionCanceledException
from moto.dynamodb.models import dynamo_type
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.utilities import bytesize
from moto.dynamodb.responses import DynamoHandler

from local.aws_limits import item_kind
from local.emulator.moto_patches import limits as limits_state
from local.emulator.moto_patches.dynamodb import _dynamodb_lock
from local.emulator.moto_patches.dynamodb_metering import (
    CONFLICT_MESSAGE,
    THROTTLED_MESSAGE,
    TRANSACTION_TOO_LARGE,
    Target,
    ThroughputExceededError,
    TransactionConflictError,
    charge,
    consume,
    index_writes,
    plain,
    stored_after,
    stored_item_size,
    target_of,
    throttle_write,
    written_size,
)
from local.emulator.moto_patches.patch import Kind, Patch, Replacement
from local.pricing.usage import item_size, read_units, update_size, write_units


# What an on-demand table answers for a hot key (the ThrottlingError reason of TransactWriteItems
# carries the same text).
def _single_write(operation: str) -> Callable[[Any], Any]:
    """PutItem / UpdateItem / DeleteItem: conflict, throttle, then moto's own answer."""

    def wrap(original: Any) -> Any:
        @functools.wraps(original)
        def handler(self: Any) -> Any:
            enforcement = limits_state.active()
            if enforcement is None:
                return original(self)
            body = self.body
            # The check and the meter under the lock that serializes the item operations; moto's own
            # handler outside it (its backend calls take the lock themselves), so parsing and answering
            # other requests go on meanwhile. A write checked a moment before a transaction takes its
            # item is not refused: the emulator's window, far shorter than a transaction's hold.
            with _dynamodb_lock:
                target = target_of(
                    self.dynamodb_backend,
                    body.get("TableName", ""),
                    body.get("Key") or body.get("Item") or {},
                )
                if target is not None:
                    if target.item in enforcement.held:
                        with enforcement.lock:
                            enforcement.conflicts[target.kind] += 1
                        raise TransactionConflictError()
                    target.units = write_units(written_size(operation, body, target))
                    if not consume(enforcement, target, reads=False):
                        raise throttle_write(target)
            result = original(self)
            if target is None:
                return result
            # what the write left: an update's growth, and the index keys it may have changed
            indexed = bool(getattr(target.table, "global_indexes", ()))
            if operation == "Update" or indexed:
                with _dynamodb_lock:
                    after = stored_after(target)
                    if operation == "Update" and after is not None:
                        extra = write_units(stored_item_size(after)) - target.units
                        if extra > 0:
                            charge(enforcement, target.item, target.kind, write_units_=extra)
                    if indexed:
                        index_writes(enforcement, target, after)
            return result

        return handler

    return wrap


def _get_item(original: Any) -> Any:
    @functools.wraps(original)
    def get_item(self: Any) -> Any:
        enforcement = limits_state.active()
        if enforcement is None:
            return original(self)
        body = self.body
        with _dynamodb_lock:  # the meter only: moto's answer outside the lock, as for writes
            target = target_of(self.dynamodb_backend, body.get("TableName", ""), body.get("Key") or {})
            if target is not None:
                target.units = read_units(target.stored_size, consistent=bool(body.get("ConsistentRead")))
                if not consume(enforcement, target, reads=True):
                    raise ThroughputExceededError(target.table.table_arn, reads=True)
        return original(self)

    return get_item


_KEY_CONDITION = re.compile(r"^\s*\(?\s*(#?[\w.]+)\s*=\s*(:\w+)")


def _index_partition(body: dict[str, Any], table: Any) -> tuple[str, str] | None:
    """(key attribute, value) of a Query's partition when it queries an index."""
    index_name = body.get("IndexName")
    if not index_name:
        return None
    index = next((i for i in table.global_indexes if i.name == index_name), None)
    match = _KEY_CONDITION.match(body.get("KeyConditionExpression") or "")
    if index is None or match is None:
        return None
    name = (body.get("ExpressionAttributeNames") or {}).get(match.group(1), match.group(1))
    value = (body.get("ExpressionAttributeValues") or {}).get(match.group(2))
    if name != index.schema_key_attrs[0] or value is None:
        return None
    return name, plain(value)


def _reading(original: Any) -> Any:
    """Query and Scan: run (reads change nothing), then meter; a throttled read's answer is dropped."""

    @functools.wraps(original)
    def read(self: Any) -> Any:
        enforcement = limits_state.active()
        if enforcement is None:
            return original(self)
        body = self.body
        with _dynamodb_lock:
            result = original(self)
            try:
                table = self.dynamodb_backend.get_table(body.get("TableName", ""))
            except Exception:  # moto answered already
                return result
            answer = getattr(result, "result", None)
            items = answer.get("Items") or [] if isinstance(answer, dict) else []
            sizes = [item_size(item) for item in items]
            scanned = int(answer.get("ScannedCount", len(items))) if isinstance(answer, dict) else len(items)
            total = sum(sizes) * scanned // len(items) if items and scanned > len(items) else sum(sizes)
            units = read_units(total, consistent=bool(body.get("ConsistentRead")))
            partition = _index_partition(body, table)
            if partition is not None or not items:
                if partition is None:
                    return result
                name, value = partition
                item = (table.name, f"index:{body['IndexName']}", value)
                target = Target(table, item, item_kind(table.name, {name: value}), None, units)
                if not consume(enforcement, target, reads=True):
                    raise ThroughputExceededError(
                        f"{table.table_arn}/index/{body['IndexName']}", reads=True, index=True
                    )
                return result
            targets = []
            for item, size in zip(items, sizes, strict=True):
                found = target_of(self.dynamodb_backend, table.name, item)
                if found is not None:
                    found.units = units * (size / total if total else 1 / len(items))
                    targets.append(found)
            with enforcement.lock:
                now = enforcement.clock()
                refused = [
                    t for t in targets if not enforcement.dynamodb.within(t.item, now, read_units=t.units)
                ]
            if refused:
                consume(enforcement, refused[0], reads=True)  # counted as the throttle it is
                raise ThroughputExceededError(table.table_arn, reads=True)
            for target in targets:
                consume(enforcement, target, reads=True)
            return result

    return read


def _batch_write_item(original: Any) -> Any:
    @functools.wraps(original)
    def batch_write_item(self: Any) -> Any:
        enforcement = limits_state.active()
        if enforcement is None:
            return original(self)
        request_items: dict[str, list[dict[str, Any]]] = self.body.get("RequestItems") or {}
        with _dynamodb_lock:
            passed: dict[str, list[dict[str, Any]]] = {}
            unprocessed: dict[str, list[dict[str, Any]]] = {}
            resource = ""
            for table_name, entries in request_items.items():
                for entry in entries:
                    request = entry.get("PutRequest") or entry.get("DeleteRequest") or {}
                    target = target_of(
                        self.dynamodb_backend, table_name, request.get("Key") or request.get("Item") or {}
                    )
                    if target is not None:
                        operation = "Put" if "PutRequest" in entry else "Delete"
                        target.units = write_units(written_size(operation, request, target))
                        held = target.item in enforcement.held
                        if held:
                            with enforcement.lock:
                                enforcement.conflicts[target.kind] += 1
                        if held or not consume(enforcement, target, reads=False):
                            unprocessed.setdefault(table_name, []).append(entry)
                            resource = resource or target.table.table_arn
                            continue
                    passed.setdefault(table_name, []).append(entry)
            if unprocessed and not passed:
                raise ThroughputExceededError(resource, reads=False)
            self.body["RequestItems"] = passed
            result = original(self)
            if unprocessed:
                result.result["UnprocessedItems"] = unprocessed
            return result

    return batch_write_item


def _batch_get_item(original: Any) -> Any:
    @functools.wraps(original)
    def batch_get_item(self: Any) -> Any:
        enforcement = limits_state.active()
        if enforcement is None:
            return original(self)
        request_items: dict[str, dict[str, Any]] = self.body.get("RequestItems") or {}
        with _dynamodb_lock:
            passed: dict[str, dict[str, Any]] = {}
            unprocessed: dict[str, dict[str, Any]] = {}
            resource = ""
            for table_name, request in request_items.items():
                consistent = bool(request.get("ConsistentRead"))
                for key in request.get("Keys") or []:
                    target = target_of(self.dynamodb_backend, table_name, key)
                    if target is not None:
                        target.units = read_units(target.stored_size, consistent=consistent)
                        if not consume(enforcement, target, reads=True):
                            unprocessed.setdefault(table_name, {**request, "Keys": []})["Keys"].append(key)
                            resource = resource or target.table.table_arn
                            continue
                    passed.setdefault(table_name, {**request, "Keys": []})["Keys"].append(key)
            if unprocessed and not passed:
                raise ThroughputExceededError(resource, reads=True)
            self.body["RequestItems"] = passed
            result = original(self)
            if unprocessed:
                for table_name, request in unprocessed.items():
                    answer = result.result.setdefault("UnprocessedKeys", {})
                    answer.setdefault(table_name, {**request, "Keys": []})["Keys"].extend(request["Keys"])
            return result

    return batch_get_item


def _transaction_targets(
    backend: Any, entries: Iterable[dict[str, Any]]
) -> list[tuple[str, dict[str, Any], Target | None]]:
    targets = []
    for entry in entries:
        operation, request = next(iter(entry.items())) if isinstance(entry, dict) and entry else ("", {})
        attrs = request.get("Key") or request.get("Item") or {} if isinstance(request, dict) else {}
        table_name = request.get("TableName", "") if isinstance(request, dict) else ""
        targets.append((operation, request, target_of(backend, table_name, attrs)))
    return targets


def _cancel(targets: list[Any], failing: dict[int, tuple[str, str]]) -> TransactionCanceledException:
    return TransactionCanceledException(
        [
            (failing[i][0], failing[i][1], None) if i in failing else (None, None, None)
            for i in range(len(targets))
        ]
    )


def _transact_write_items(original: Any) -> Any:
    @functools.wraps(original)
    def transact_write_items(self: Any) -> Any:
        enforcement = limits_state.active()
        if enforcement is None:
            return original(self)
        entries = self.body.get("TransactItems") or []
        if len(entries) > enforcement.limits.transaction_items:
            return original(self)  # moto's own ValidationException
        token = object()
        with _dynamodb_lock:
            targets = _transaction_targets(self.dynamodb_backend, entries)
            total = sum(
                item_size(request.get("Item")) if operation == "Put" else update_size(request)
                for operation, request, _ in targets
                if isinstance(request, dict)
            )
            if total > enforcement.limits.transaction_bytes:
                raise MockValidationException(TRANSACTION_TOO_LARGE)
            failing = {
                i: ("TransactionConflict", CONFLICT_MESSAGE)
                for i, (_, _, target) in enumerate(targets)
                if target is not None and target.item in enforcement.held
            }
            if failing:
                with enforcement.lock:
                    for i in failing:
                        enforcement.conflicts[targets[i][2].kind] += 1  # type: ignore[union-attr]
                raise _cancel(targets, failing)
            now_ok = []
            for i, (operation, request, target) in enumerate(targets):
                if target is None:
                    continue
                target.units = 2 * write_units(written_size(operation, request, target))
                now_ok.append(target)
                with enforcement.lock:
                    fits = enforcement.dynamodb.within(
                        target.item, enforcement.clock(), write_units=target.units
                    )
                if not fits:
                    consume(enforcement, target, reads=False)  # counts the throttle
                    failing[i] = ("ThrottlingError", THROTTLED_MESSAGE)
            if failing:
                raise _cancel(targets, failing)
            for target in now_ok:
                consume(enforcement, target, reads=False)
                enforcement.held[target.item] = token
            try:
                result = original(self)
                for target in now_ok:
                    index_writes(enforcement, target, stored_after(target))
            except BaseException:
                _release(enforcement, now_ok, token)
                raise
        try:
            enforcement.sleep(enforcement.limits.transaction_hold_s)  # the transaction's duration
        finally:
            with _dynamodb_lock:
                _release(enforcement, now_ok, token)
        return result

    return transact_write_items


def _release(enforcement: Any, targets: list[Target], token: object) -> None:
    for target in targets:
        if enforcement.held.get(target.item) is token:
            del enforcement.held[target.item]


def _transact_get_items(original: Any) -> Any:
    @functools.wraps(original)
    def transact_get_items(self: Any) -> Any:
        enforcement = limits_state.active()
        if enforcement is None:
            return original(self)
        entries = self.body.get("TransactItems") or []
        with _dynamodb_lock:
            targets = _transaction_targets(self.dynamodb_backend, entries)
            failing = {
                i: ("TransactionConflict", CONFLICT_MESSAGE)
                for i, (_, _, target) in enumerate(targets)
                if target is not None and target.item in enforcement.held
            }
            for i, (_, _, target) in enumerate(targets):
                if target is not None and i not in failing:
                    target.units = read_units(target.stored_size, transactional=True)
                    if not consume(enforcement, target, reads=True):
                        failing[i] = ("ThrottlingError", THROTTLED_MESSAGE)
            if failing:
                raise _cancel(targets, failing)
            return original(self)

    return transact_get_items


def _limited_size_setitem(original: Any) -> Any:
    """moto refuses an item past 405,000 of its own bytes; AWS's limit is 400 KB (409,600 bytes)."""

    def setitem(self: Any, key: str, value: Any) -> None:
        enforcement = limits_state.active()
        if enforcement is None:
            original(self, key, value)
            return
        size = (
            sum(
                (item.size() if type(item) is DynamoType else bytesize(str(item)))
                for item in (*self.keys(), *self.values())
            )
            + bytesize(key)
            + (value.size() if type(value) is DynamoType else bytesize(str(value)))
        )
        if size > enforcement.limits.item_bytes:
            raise ItemSizeTooLarge
        dict.__setitem__(self, key, value)

    return setitem


PATCHES = (
    Patch(
        name="dynamodb_limits.item_throughput_and_transactions",
        kind=Kind.LIMITS,
        corrects="moto serves any rate on any item, never reports a transaction conflict and holds no "
        "item during a transaction: each item gets a partition's budget, throttled as an on-demand table "
        "throttles a hot key, and a transaction holds its items for its duration.",
        replaces=(
            Replacement(DynamoHandler, "put_item", _single_write("Put")),
            Replacement(DynamoHandler, "update_item", _single_write("Update")),
            Replacement(DynamoHandler, "delete_item", _single_write("Delete")),
            Replacement(DynamoHandler, "get_item", _get_item),
            Replacement(DynamoHandler, "query", _reading),
            Replacement(DynamoHandler, "scan", _reading),
            Replacement(DynamoHandler, "batch_write_item", _batch_write_item),
            Replacement(DynamoHandler, "batch_get_item", _batch_get_item),
            Replacement(DynamoHandler, "transact_write_items", _transact_write_items),
            Replacement(DynamoHandler, "transact_get_items", _transact_get_items),
        ),
    ),
    Patch(
        name="dynamodb_limits.item_size_as_aws",
        kind=Kind.LIMITS,
        corrects="moto refuses an item over 405,000 bytes by its own count (a 399 KB item is refused); "
        "AWS's limit is 400 KB, 409,600 bytes of attribute names and values.",
        replaces=(Replacement(dynamo_type.LimitedSizeDict, "__setitem__", _limited_size_setitem),),
    ),
)
