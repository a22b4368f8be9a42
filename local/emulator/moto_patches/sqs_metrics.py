"""SQS's metrics in CloudWatch: the ``AWS/SQS`` queue gauges, as AWS publishes them for every queue.

AWS SQS publishes each queue's gauges to CloudWatch (namespace ``AWS/SQS``, dimension ``QueueName``):
the visible, in-flight and delayed counts, and ``ApproximateAgeOfOldestMessage``, which no SQS API
returns (``GetQueueAttributes`` refuses the name): CloudWatch is the only place to read it. moto
5.2.5's CloudWatch serves the metrics its providers compute (S3's bucket sizes) and none of SQS's,
so ``GetMetricData`` for a queue's alarm metric finds nothing. Here CloudWatch's computed metrics
gain one datum per queue and gauge, stamped at the request's instant (what the queue holds now,
where AWS publishes once a minute). A datum's value is computed only when a query reads it, so a
read of a few queues' gauges scans those queues only, once each.

A standard queue that uses fair queues (the ``sqs.fair_queues`` patch saw a message with a group id
sent to it) also gets SQS's five fair-queue gauges: ``ApproximateNumberOfNoisyGroups`` and the
``...InQuietGroups`` subsets of the visible, in-flight and delayed counts and of the oldest message's
age, each excluding the messages of the groups noisy at the read (``sqs_fair.noisy_now``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moto.cloudwatch import models as cloudwatch_models
from moto.core.utils import unix_time_millis, utcnow
from moto.sqs import models as sqs_models

from local.emulator.moto_patches import sqs_fair
from local.emulator.moto_patches.patch import Kind, Patch, Replacement

NAMESPACE = "AWS/SQS"
# SQS moves a message received this many times behind the others for the age metric: a poison
# message's age would otherwise hide every other message's.
AGE_RECEIVE_LIMIT = 3


def oldest_age_seconds(queue: sqs_models.Queue, now_ms: float) -> float:
    """``ApproximateAgeOfOldestMessage``: the age of the oldest message not yet deleted, in seconds.

    As SQS documents it, a message received three times or more stops counting while younger ones are
    there. A message moved to a dead-letter queue keeps its original send time in moto (SQS counts
    its age in the dead-letter queue from the move).
    """
    return _oldest_age_among(list(queue._messages), now_ms)


def _oldest_age_among(messages: list[sqs_models.Message], now_ms: float) -> float:
    if not messages:
        return 0.0
    counted = [m for m in messages if m.approximate_receive_count < AGE_RECEIVE_LIMIT] or messages
    oldest = min(int(m.sent_timestamp or now_ms) for m in counted)
    return max(0.0, (now_ms - oldest) / 1000)


def _visible(queue: sqs_models.Queue) -> float:
    return float(queue.approximate_number_of_messages)


def _not_visible(queue: sqs_models.Queue) -> float:
    return float(queue.approximate_number_of_messages_not_visible)


def _delayed(queue: sqs_models.Queue) -> float:
    return float(queue.approximate_number_of_messages_delayed)


def _oldest_age(queue: sqs_models.Queue) -> float:
    return oldest_age_seconds(queue, unix_time_millis())


def _quiet_messages(queue: sqs_models.Queue) -> list[sqs_models.Message]:
    """The queue's messages outside the groups noisy now (group-less ones are their own, never noisy)."""
    noisy = sqs_fair.noisy_now(queue) or frozenset()
    return [m for m in list(queue._messages) if m.group_id is None or m.group_id not in noisy]


def _noisy_groups(queue: sqs_models.Queue) -> float:
    return float(len(sqs_fair.noisy_now(queue) or ()))


def _visible_in_quiet_groups(queue: sqs_models.Queue) -> float:
    now = unix_time_millis()
    return float(sum(1 for m in _quiet_messages(queue) if now > m.visible_at and not now < m.delayed_until))


def _not_visible_in_quiet_groups(queue: sqs_models.Queue) -> float:
    now = unix_time_millis()
    return float(sum(1 for m in _quiet_messages(queue) if not now > m.visible_at))


def _delayed_in_quiet_groups(queue: sqs_models.Queue) -> float:
    now = unix_time_millis()
    return float(sum(1 for m in _quiet_messages(queue) if now < m.delayed_until))


def _oldest_age_in_quiet_groups(queue: sqs_models.Queue) -> float:
    return _oldest_age_among(_quiet_messages(queue), unix_time_millis())


# metric name -> (unit, read), as SQS publishes them; the age only while the queue holds a message.
GAUGES: dict[str, tuple[str, Callable[[sqs_models.Queue], float]]] = {
    "ApproximateNumberOfMessagesVisible": ("Count", _visible),
    "ApproximateNumberOfMessagesNotVisible": ("Count", _not_visible),
    "ApproximateNumberOfMessagesDelayed": ("Count", _delayed),
    "ApproximateAgeOfOldestMessage": ("Seconds", _oldest_age),
    # only for a queue that uses fair queues (FAIR_GAUGES)
    "ApproximateNumberOfNoisyGroups": ("Count", _noisy_groups),
    "ApproximateNumberOfMessagesVisibleInQuietGroups": ("Count", _visible_in_quiet_groups),
    "ApproximateNumberOfMessagesNotVisibleInQuietGroups": ("Count", _not_visible_in_quiet_groups),
    "ApproximateNumberOfMessagesDelayedInQuietGroups": ("Count", _delayed_in_quiet_groups),
    "ApproximateAgeOfOldestMessageInQuietGroups": ("Seconds", _oldest_age_in_quiet_groups),
}
FAIR_GAUGES = frozenset(name for name in GAUGES if "Noisy" in name or "InQuietGroups" in name)
AGES = frozenset({"ApproximateAgeOfOldestMessage", "ApproximateAgeOfOldestMessageInQuietGroups"})


def _published(queue: sqs_models.Queue, name: str) -> bool:
    if name in FAIR_GAUGES and not sqs_fair.uses_fair_queues(queue):
        return False
    return name not in AGES or bool(queue._messages)


class QueueGauge(cloudwatch_models.MetricDatum):
    """One gauge of one queue, a ``MetricDatum`` whose value is read from the queue when first asked."""

    def __init__(
        self, queue: sqs_models.Queue, name: str, unit: str, read: Callable[[sqs_models.Queue], float]
    ) -> None:
        cloudwatch_models.MetricDatumBase.__init__(
            self,
            namespace=NAMESPACE,
            name=name,
            dimensions=[{"Name": "QueueName", "Value": queue.name}],
            timestamp=utcnow(),
            unit=unit,
        )
        self._queue, self._read = queue, read
        self._value: float | None = None

    @property
    def value(self) -> float:
        if self._value is None:
            self._value = self._read(self._queue)
        return self._value

    @value.setter
    def value(self, value: float) -> None:
        self._value = value


def queue_gauges(account_id: str, region_name: str) -> list[QueueGauge]:
    """Every queue's gauges in the account and region, as of now."""
    queues = list(sqs_models.sqs_backends[account_id][region_name].queues.values())
    return [
        QueueGauge(queue, name, unit, read)
        for queue in queues
        for name, (unit, read) in GAUGES.items()
        if _published(queue, name)
    ]


def _with_queue_gauges(original: Any) -> property:
    def aws_metric_data(self: cloudwatch_models.CloudWatchBackend) -> list[Any]:
        return [*original.fget(self), *queue_gauges(self.account_id, self.region_name)]

    return property(aws_metric_data)


PATCHES = (
    Patch(
        name="sqs.cloudwatch_metrics",
        kind=Kind.CORRECTNESS,
        corrects="moto's CloudWatch holds no AWS/SQS metrics, which SQS publishes for every queue: an "
        "alarm's queue metric (ApproximateNumberOfMessagesVisible, ApproximateAgeOfOldestMessage) "
        "reads as no data, and the oldest message's age is in no other API.",
        replaces=(Replacement(cloudwatch_models.CloudWatchBackend, "aws_metric_data", _with_queue_gauges),),
    ),
)
