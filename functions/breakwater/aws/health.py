"""Queue health: the oldest age workers observed per queue role (``queue#<role>``/``health``) and depths.

SQS has no age-of-oldest-message attribute through its API, so every worker batch reports the oldest
age it saw. The write is conditional: it replaces the stored value only when it is larger or the
stored one is older than the window, so the item holds the maximum observed in the last window
across all containers, for one write per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from breakwater.aws.counters import plain

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.literals import QueueAttributeFilterType

HEALTH_SK = "health"
WINDOW_MS = 60_000
REPORT_INTERVAL_MS = 5_000  # a container writes a role's age at most this often, unless it rose
# ... by at least this much over its last write: the controller judges health in whole seconds
# (``healthy_age_seconds`` >= 1), so a rise of a few milliseconds between batches is not news.
RISE_MS = 1_000


class ThrottledAgeReports:
    """One container's health writes: at most one per role per ``interval_ms``, unless the age rose.

    The item keeps the window's maximum anyway (``record_oldest_age``), so a report not
    ``rise_ms`` above this container's last one, written less than ``interval_ms`` ago, adds
    nothing the controller reads once a minute: skipping it saves a DynamoDB write per batch. An
    age rising by ``rise_ms`` or more is news (the live set may be falling behind) and is always
    written. Without the margin, ages that creep up by milliseconds from batch to batch (a steady
    queue) were written on every batch.
    """

    def __init__(
        self,
        write: Callable[[str, int, int], bool],
        interval_ms: int = REPORT_INTERVAL_MS,
        rise_ms: int = RISE_MS,
    ) -> None:
        self._write = write
        self._interval_ms = interval_ms
        self._rise_ms = rise_ms
        self._last: dict[str, tuple[int, int]] = {}  # role -> (age written, when)

    def __call__(self, role: str, oldest_age_ms: int, now_ms: int) -> bool:
        last = self._last.get(role)
        if (
            last is not None
            and oldest_age_ms < last[0] + self._rise_ms
            and now_ms - last[1] < self._interval_ms
        ):
            return False
        self._last[role] = (oldest_age_ms, now_ms)
        return self._write(role, oldest_age_ms, now_ms)


def queue_pk(role: str) -> str:
    return f"queue#{role}"


def record_oldest_age(
    client: DynamoDBClient, table_name: str, role: str, oldest_age_ms: int, now_ms: int
) -> bool:
    """Raise the window's maximum to ``oldest_age_ms`` (or open a window); False if a larger one stands."""
    try:
        client.update_item(
            TableName=table_name,
            Key={"pk": {"S": queue_pk(role)}, "sk": {"S": HEALTH_SK}},
            UpdateExpression="SET oldest_age_ms = :age, observed_at = :now",
            ConditionExpression=(
                "attribute_not_exists(oldest_age_ms) OR observed_at < :window OR oldest_age_ms <= :age"
            ),
            ExpressionAttributeValues={
                ":age": {"N": str(oldest_age_ms)},
                ":now": {"N": str(now_ms)},
                ":window": {"N": str(now_ms - WINDOW_MS)},
            },
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise
    return True


def read_oldest_age(client: DynamoDBClient, table_name: str, role: str) -> tuple[int | None, int | None]:
    """(oldest_age_ms, observed_at epoch ms) of the role, or (None, None) if never reported."""
    response = client.get_item(
        TableName=table_name, Key={"pk": {"S": queue_pk(role)}, "sk": {"S": HEALTH_SK}}, ConsistentRead=True
    )
    item = plain(response.get("Item") or {})
    if "oldest_age_ms" not in item:
        return None, None
    return int(item["oldest_age_ms"]), int(item["observed_at"])


def _attribute_total(client: SQSClient, queue_url: str, names: Sequence[QueueAttributeFilterType]) -> int:
    """The sum of the queue's numeric attributes ``names`` (one GetQueueAttributes)."""
    attributes = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return sum(int(value) for value in attributes.values())


def queue_depth(client: SQSClient, queue_urls: Iterable[str]) -> int:
    """Visible plus in-flight messages over the queues (GetQueueAttributes, one call per queue)."""
    names: list[QueueAttributeFilterType] = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
    ]
    return sum(_attribute_total(client, url, names) for url in queue_urls)


def waiting_messages(client: SQSClient, queue_url: str) -> int:
    """Visible plus delayed: what waits to be worked (in-flight messages are being worked or archived).

    Delayed ones (a sideline drainer's deferrals) count: they are backlog too. The archiver waits for
    them to come due (``ArchiverSettings.wait_for_delayed_seconds``) rather than leave them behind.
    """
    return _attribute_total(
        client, queue_url, ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
    )
