"""Per-group and per-tenant backlog counters of the ordered workload, in the state table.

Item: ``pk`` = ``group#<MessageGroupId>`` (``tenant:ordering_key``), or ``ordered-tenant#<tenant>``
for the count over all of a tenant's groups, ``sk`` = ``backlog``;
``generation``, ``backlog`` (messages accepted and not released), ``previous`` (how many of those
were admitted in the generation before), ``updated_at`` (epoch ms) and ``ttl`` (epoch s: when the
item counts nothing any more). The rules are :mod:`breakwater.ordered` (``plan_admission``,
``release_slot``); each condition expression below mirrors one of them.

The common case is one ``UpdateItem``: an ``ADD`` conditional on the generation and the limit (or,
for a release, on a count above zero). A refused condition returns the stored item, so the first
admission of a generation (which moves last generation's count to ``previous``) is one more write,
a compare-and-swap on the counts it read, and never a read. The tenant's count takes a batch's
releases in one write (:meth:`DynamoGroupBacklogs.release_many`), so its item is written once per
admitted message and once per tenant per worker batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from breakwater.errors import UnavailableError
from breakwater.observability import logger
from breakwater.ordered import (
    BacklogWindow,
    GroupAdmission,
    GroupBacklog,
    Slot,
    plan_admission,
    release_slot,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

BACKLOG_SK = "backlog"
GROUP_PREFIX = "group#"
TENANT_PREFIX = "ordered-tenant#"
_CONDITIONAL = "ConditionalCheckFailedException"
# A generation changes once per window, so losing the compare-and-swap twice in a row is contention
# on one group's item; the request is answered 503 (retry) rather than spinning.
_MAX_SWAPS = 3


def group_pk(group_id: str) -> str:
    return f"{GROUP_PREFIX}{group_id}"


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def parse_backlog(item: dict[str, Any] | None) -> GroupBacklog | None:
    if not item or "generation" not in item:
        return None
    return GroupBacklog(
        generation=int(item["generation"]["N"]),
        backlog=int(item.get("backlog", {}).get("N", "0")),
        previous=int(item.get("previous", {}).get("N", "0")),
    )


class DynamoGroupBacklogs:
    """:class:`breakwater.ordered.GroupBacklogs` on the state table.

    ``admit`` fails closed: a DynamoDB error is a 503 (the message is not sent), because a message
    admitted without being counted would later be released from a count that never held it, and
    loosen its group's bound; and the consumer needs DynamoDB to process anything (its write-ahead
    record), so accepting more ordered messages during an outage only deepens the backlog. ``release``
    never raises: a lost release leaves the count one too high until its generation ages out, which
    refuses early at worst, and failing the record for it would stop its group.
    """

    def __init__(
        self, client: DynamoDBClient, table_name: str, window: BacklogWindow, *, prefix: str = GROUP_PREFIX
    ) -> None:
        self._client = client
        self._table = table_name
        self._window = window
        self._prefix = prefix
        # The last ``previous`` count seen per item and generation: release_many's condition needs it.
        self._previous: dict[str, tuple[int, int]] = {}

    def _key(self, counted_id: str) -> dict[str, Any]:
        return {"pk": {"S": f"{self._prefix}{counted_id}"}, "sk": {"S": BACKLOG_SK}}

    # -- admission ---------------------------------------------------------------------------------

    def admit(self, group_id: str, generation: int, limit: int, now_ms: int) -> GroupAdmission:
        try:
            return self._admit(group_id, generation, limit, now_ms)
        except (ClientError, BotoCoreError) as exc:
            raise UnavailableError(f"the message was not stored, please retry: {exc}") from exc

    def _admit(self, group_id: str, generation: int, limit: int, now_ms: int) -> GroupAdmission:
        try:
            response = self._client.update_item(
                TableName=self._table,
                Key=self._key(group_id),
                UpdateExpression="ADD backlog :one SET updated_at = :now",
                ConditionExpression="generation = :generation AND backlog < :limit",
                ExpressionAttributeValues={
                    ":one": _n(1),
                    ":now": _n(now_ms),
                    ":generation": _n(generation),
                    ":limit": _n(limit),
                },
                ReturnValues="UPDATED_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != _CONDITIONAL:
                raise
            stored = parse_backlog(exc.response.get("Item"))  # type: ignore[arg-type]
        else:
            return GroupAdmission(admitted=True, backlog=int(response["Attributes"]["backlog"]["N"]))
        # Another generation, no item yet, or the group is full: decide on what is stored.
        for _ in range(_MAX_SWAPS):
            admitted, counts = plan_admission(stored, generation, limit)
            if not admitted:
                return GroupAdmission(admitted=False, backlog=counts.backlog)
            try:
                self._swap(group_id, stored, counts, now_ms)
            except ClientError as exc:
                if exc.response["Error"]["Code"] != _CONDITIONAL:
                    raise
                stored = parse_backlog(exc.response.get("Item"))  # type: ignore[arg-type]
                continue
            return GroupAdmission(admitted=True, backlog=counts.backlog)
        raise UnavailableError(f"group {group_id!r} is contended, please retry")

    def _swap(self, group_id: str, stored: GroupBacklog | None, counts: GroupBacklog, now_ms: int) -> None:
        """Write ``counts`` only if the item still holds ``stored`` (or still does not exist)."""
        values: dict[str, Any] = {
            ":generation": _n(counts.generation),
            ":backlog": _n(counts.backlog),
            ":previous": _n(counts.previous),
            ":now": _n(now_ms),
            ":ttl": _n(self._window.expires_at_s(counts.generation)),
        }
        if stored is None:
            condition = "attribute_not_exists(pk) OR attribute_not_exists(generation)"
        else:
            condition = "generation = :old_generation AND backlog = :old_backlog AND previous = :old_previous"
            values |= {
                ":old_generation": _n(stored.generation),
                ":old_backlog": _n(stored.backlog),
                ":old_previous": _n(stored.previous),
            }
        self._client.update_item(
            TableName=self._table,
            Key=self._key(group_id),
            UpdateExpression=(
                "SET generation = :generation, backlog = :backlog, previous = :previous, "
                "updated_at = :now, #ttl = :ttl"
            ),
            ConditionExpression=condition,
            ExpressionAttributeNames={"#ttl": "ttl"},
            ExpressionAttributeValues=values,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    # -- release -----------------------------------------------------------------------------------

    def release(self, group_id: str, generation: int, now_ms: int) -> bool:
        """Take one message of ``generation`` off its group's count; False when nothing counted it."""
        try:
            return self._release(group_id, generation, now_ms)
        except (ClientError, BotoCoreError) as exc:
            logger.warning("group backlog release failed", extra={"group_id": group_id, "error": str(exc)})
            return False

    def _release(self, group_id: str, generation: int, now_ms: int) -> bool:
        try:
            self._take(group_id, Slot.CURRENT, generation, now_ms)
            return True
        except ClientError as exc:
            if exc.response["Error"]["Code"] != _CONDITIONAL:
                raise
            stored = parse_backlog(exc.response.get("Item"))  # type: ignore[arg-type]
        if release_slot(stored, generation) is not Slot.PREVIOUS:
            return False
        try:
            self._take(group_id, Slot.PREVIOUS, generation + 1, now_ms)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != _CONDITIONAL:
                raise
            return False  # the item moved on to a later generation meanwhile: the count aged out
        return True

    def _take(self, group_id: str, slot: Slot, item_generation: int, now_ms: int) -> None:
        """One ADD -1, conditional on the item's generation and on the slot's count being above zero."""
        if slot is Slot.CURRENT:
            update = "ADD backlog :minus_one SET updated_at = :now"
            condition = "generation = :generation AND backlog > previous"
        else:
            update = "ADD backlog :minus_one, previous :minus_one SET updated_at = :now"
            condition = "generation = :generation AND previous > :zero"
        values = {":minus_one": _n(-1), ":now": _n(now_ms), ":generation": _n(item_generation)}
        if slot is Slot.PREVIOUS:
            values[":zero"] = _n(0)
        self._client.update_item(
            TableName=self._table,
            Key=self._key(group_id),
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeValues=values,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    def release_many(self, counted_id: str, generation: int, count: int, now_ms: int) -> int:
        """Take ``count`` messages of ``generation`` off the count in one write; returns how many came off.

        Never raises (as :meth:`release`). DynamoDB conditions cannot subtract, so the common write is
        conditional on the ``previous`` count this container last saw; a stale one costs a second,
        compare-and-swap write on the counts the refusal returned.
        """
        if count < 1:
            return 0
        try:
            return self._release_many(counted_id, generation, count, now_ms)
        except (ClientError, BotoCoreError) as exc:
            logger.warning("backlog release failed", extra={"id": counted_id, "error": str(exc)})
            return 0

    def _release_many(self, counted_id: str, generation: int, count: int, now_ms: int) -> int:
        # The first write guesses the item from what this container saw last; a wrong guess is refused
        # and the refusal returns the item, so the second write is exact.
        seen_generation, seen_previous = self._previous.get(counted_id, (generation, 0))
        stored: GroupBacklog | None
        if seen_generation == generation + 1:
            stored = GroupBacklog(generation=seen_generation, backlog=count, previous=count)
        elif seen_generation == generation:
            stored = GroupBacklog(
                generation=generation, backlog=seen_previous + count, previous=seen_previous
            )
        else:
            stored = GroupBacklog(generation=generation, backlog=count, previous=0)
        for _ in range(_MAX_SWAPS):
            if stored is None:
                return 0
            if stored.generation == generation:
                take = min(count, stored.current)
                update = "ADD backlog :minus SET updated_at = :now"
                condition = "generation = :generation AND previous = :previous AND backlog >= :least"
                values = {":previous": _n(stored.previous), ":least": _n(stored.previous + take)}
            elif stored.generation == generation + 1:
                take = min(count, stored.previous)
                update = "ADD backlog :minus, previous :minus SET updated_at = :now"
                condition = "generation = :generation AND previous >= :least"
                values = {":least": _n(take)}
            else:
                return 0  # the item moved past that generation: its count aged out
            if take < 1:
                return 0
            values |= {":minus": _n(-take), ":now": _n(now_ms), ":generation": _n(stored.generation)}
            try:
                response = self._client.update_item(
                    TableName=self._table,
                    Key=self._key(counted_id),
                    UpdateExpression=update,
                    ConditionExpression=condition,
                    ExpressionAttributeValues=values,
                    ReturnValues="ALL_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ClientError as exc:
                if exc.response["Error"]["Code"] != _CONDITIONAL:
                    raise
                stored = parse_backlog(exc.response.get("Item"))  # type: ignore[arg-type]
                continue
            after = parse_backlog(response.get("Attributes"))
            if after is not None:
                self._previous[counted_id] = (after.generation, after.previous)
            return take
        return 0

    def read(self, group_id: str) -> GroupBacklog | None:
        """The stored counts (tests and operators; the admission never reads)."""
        response = self._client.get_item(TableName=self._table, Key=self._key(group_id), ConsistentRead=True)
        return parse_backlog(response.get("Item"))


def tenant_backlogs(client: DynamoDBClient, table_name: str, window: BacklogWindow) -> DynamoGroupBacklogs:
    """The per-tenant counts over all of a tenant's groups (the same rules, ``ordered-tenant#`` items)."""
    return DynamoGroupBacklogs(client, table_name, window, prefix=TENANT_PREFIX)
