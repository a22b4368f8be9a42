"""Per-group backlog counters of the ordered workload, in the state table.

Item: ``pk`` = ``group#<MessageGroupId>`` (``tenant:ordering_key``), ``sk`` = ``backlog``;
``generation``, ``backlog`` (messages accepted and not released), ``previous`` (how many of those
were admitted in the generation before), ``updated_at`` (epoch ms) and ``ttl`` (epoch s: when the
item counts nothing any more). The rules are :mod:`breakwater.ordered` (``plan_admission``,
``release_slot``); each condition expression below mirrors one of them.

The common case is one ``UpdateItem``: an ``ADD`` conditional on the generation and the limit (or,
for a release, on a count above zero). A refused condition returns the stored item, so the first
admission of a generation (which moves last generation's count to ``previous``) is one more write,
a compare-and-swap on the counts it read, and never a read.
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
_CONDITIONAL = "ConditionalCheckFailedException"
# A generation changes once per window, so losing the compare-and-swap twice in a row is contention
# on one group's item; the request is answered 503 (retry) rather than spinning.
_MAX_SWAPS = 3


def group_pk(group_id: str) -> str:
    return f"group#{group_id}"


def _key(group_id: str) -> dict[str, Any]:
    return {"pk": {"S": group_pk(group_id)}, "sk": {"S": BACKLOG_SK}}


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

    def __init__(self, client: DynamoDBClient, table_name: str, window: BacklogWindow) -> None:
        self._client = client
        self._table = table_name
        self._window = window

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
                Key=_key(group_id),
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
            Key=_key(group_id),
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
            Key=_key(group_id),
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeValues=values,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    def read(self, group_id: str) -> GroupBacklog | None:
        """The stored counts (tests and operators; the admission never reads)."""
        response = self._client.get_item(TableName=self._table, Key=_key(group_id), ConsistentRead=True)
        return parse_backlog(response.get("Item"))
