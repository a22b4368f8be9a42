"""Save: re-enqueue the interleaved envelopes into the live queue set, paced, from the executors.

Each partition is sent by one task (``foreachPartition``): the same shuffle-sharded routing as
ingest (``breakwater.routing``), ``origin=replay`` and ``replay_run`` set, ``SendMessageBatch``
within SQS's bounds (ten entries, 1 MiB summed), and a per-task pace of ``target_rate / concurrent
tasks`` so the run as a whole holds the target rate. Entries that still fail after retries go to
the failures output, a replayable archive. Nothing is collected to the driver: counts travel back
in accumulators.

This module runs on executors with pyspark, boto3 and the shipped ``breakwater`` package; it builds
the body with ``json`` rather than the pydantic model (Glue does not ship pydantic).
"""

from __future__ import annotations

import gzip
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.accumulators import AccumulatorParam

from breakwater.routing import QueueDepths, choose_queue, shard_for
from breakwater.sqs_batches import MAX_BATCH_BYTES, MAX_BATCH_ENTRIES, message_size
from glue_jobs.replay_transforms import ENVELOPE_COLUMNS

SEND_ATTEMPTS = 3
DEPTH_REFRESH_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class SendOptions:
    """What every sending task needs; small and picklable (it travels in the task closure)."""

    queue_urls: tuple[str, ...]
    shard_size: int
    rate_per_task: float
    run_id: str
    failures_path: str
    fair_queues: bool = True
    dry_run: bool = False
    endpoint_url: str | None = None
    region: str | None = None
    partition_rates: tuple[float, ...] = ()  # by partition index; rate_per_task where absent

    def rate_for(self, partition_id: int) -> float:
        if 0 <= partition_id < len(self.partition_rates) and self.partition_rates[partition_id] > 0:
            return self.partition_rates[partition_id]
        return self.rate_per_task


def partition_rates(counts: Sequence[int], target_rate: float, slots: int) -> tuple[float, ...]:
    """Each partition's send rate, so that the tasks together hold ``target_rate`` to the end.

    An equal share (``target / slots``) lets the task of a big partition run long after the others
    (one noisy tenant's partition holds most rows): the run's tail sends at a fraction of the target.
    Instead, each of the ``slots`` concurrent task slots gets the share of the target that its rows
    are of the run (``target * rows(slot) / rows``), so every slot ends at ``rows / target``. Which
    partitions share a slot is Spark's schedule (next partition index to the first free slot),
    simulated here until it agrees with the rates it implies (it does after a pass or two).
    """
    total = sum(max(0, count) for count in counts)
    equal = target_rate / max(1, min(slots, len(counts)))
    if total == 0 or slots < 1:
        return tuple(equal for _ in counts)
    rates = [equal for _ in counts]
    assignment: list[int] = []
    for _ in range(8):
        free = [0.0] * slots
        placed: list[int] = []
        for count, rate in zip(counts, rates, strict=True):
            slot = min(range(slots), key=lambda index: (free[index], index))
            placed.append(slot)
            free[slot] += max(0, count) / rate
        loads = [0] * slots
        for slot, count in zip(placed, counts, strict=True):
            loads[slot] += max(0, count)
        rates = [target_rate * loads[slot] / total if loads[slot] else equal for slot in placed]
        if placed == assignment:
            break
        assignment = placed
    return tuple(rates)


def envelope_body(row: dict[str, Any], run_id: str) -> tuple[str, str]:
    """(replayed body, archived body): the same envelope, re-homed with ``origin=replay``.

    The body has the fields of the Spark schema (``ENVELOPE_COLUMNS``), in its order, which a test
    keeps equal to the pydantic envelope's. ``payload`` was read as JSON text, so it is embedded back
    as JSON, not as a string.
    """
    fields = {name: row.get(name) for name in ENVELOPE_COLUMNS}
    fields["payload"] = json.loads(fields["payload"]) if fields["payload"] is not None else None
    original = json.dumps(fields, separators=(",", ":"))
    fields["origin"] = "replay"
    fields["replay_run"] = run_id
    return json.dumps(fields, separators=(",", ":")), original


class Pacer:
    """Hold ``rate`` messages per second on a fixed schedule, with at most ``catch_up`` seconds of burst.

    A send slower than its slot (a slow API call) may be made up by sending the next ones without
    waiting, but never more than ``catch_up`` seconds' worth: a token bucket whose burst is one
    second of the rate, so the run holds its rate without bursting at the live queues.
    """

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        catch_up: float = 1.0,
    ):
        self._interval = 1.0 / rate
        self._clock = clock
        self._sleep = sleep
        self._catch_up = catch_up
        self._next = clock()

    def wait_for(self, count: int) -> None:
        now = self._clock()
        if self._next > now:
            self._sleep(self._next - now)
        self._next = max(self._next, self._clock() - self._catch_up) + count * self._interval


class Extremes(AccumulatorParam):
    """Accumulates (earliest, latest) epoch seconds over tasks: the run's send window."""

    def zero(self, value: tuple[float, float]) -> tuple[float, float]:
        return (float("inf"), float("-inf"))

    def addInPlace(self, first: tuple[float, float], second: tuple[float, float]) -> tuple[float, float]:  # noqa: N802
        return (min(first[0], second[0]), max(first[1], second[1]))


@dataclass(slots=True)
class _Pending:
    replayed: str
    original: str
    tenant: str


class PartitionSender:
    """Sends one partition's rows; returns (sent, failed) and keeps the failed originals.

    Routes with ingest's parts (``breakwater.routing``) rather than ``breakwater.ingest.Router``:
    the Router stores one pydantic envelope per call, and its module needs pydantic, which Glue does
    not ship; the replay sends JSON bodies in batches per queue.
    """

    def __init__(
        self, options: SendOptions, sqs: Any, pacer: Pacer, clock: Callable[[], float] = time.monotonic
    ):
        self.options = options
        self.sqs = sqs
        self.pacer = pacer
        self.clock = clock
        self.failed_bodies: list[str] = []
        self.sent = 0
        self._batches: dict[int, list[_Pending]] = {}
        self._depths = QueueDepths(DEPTH_REFRESH_SECONDS)

    def send_all(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            replayed, original = envelope_body(row, self.options.run_id)
            queue = self._route(str(row["tenant"]))
            batch = self._batches.setdefault(queue, [])
            size = sum(message_size(p.replayed) for p in batch) + message_size(replayed)
            if batch and size > MAX_BATCH_BYTES:
                self._flush(queue)
                batch = self._batches.setdefault(queue, [])
            batch.append(_Pending(replayed, original, str(row["tenant"])))
            if len(batch) == MAX_BATCH_ENTRIES:
                self._flush(queue)
        for queue in list(self._batches):
            self._flush(queue)

    def _route(self, tenant: str) -> int:
        """Ingest's routing: the tenant's k queues, then the shortest by ingest's depth cache.

        Every queue is probed when its depth goes stale, not only the tenant's candidates: the
        probes are then one round per interval for the whole task, whatever its tenants.
        """
        candidates = shard_for(tenant, len(self.options.queue_urls), self.options.shard_size)
        now = self.clock()
        for index in range(len(self.options.queue_urls)):
            if self._depths.is_stale(index, now):
                self._depths.observe(index, self._depth(index), now)
        return choose_queue(candidates, self._depths.snapshot(candidates))

    def _depth(self, index: int) -> int:
        try:
            attributes = self.sqs.get_queue_attributes(
                QueueUrl=self.options.queue_urls[index], AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]
            return int(attributes.get("ApproximateNumberOfMessages", 0))
        except Exception:
            return 0  # unknown depth: the tenant's own order decides

    def _flush(self, queue: int) -> None:
        batch = self._batches.pop(queue, [])
        if not batch:
            return
        self.pacer.wait_for(len(batch))
        pending = dict(enumerate(batch))
        for attempt in range(SEND_ATTEMPTS):
            entries: list[dict[str, Any]] = []
            for key, item in pending.items():
                entry: dict[str, Any] = {"Id": str(key), "MessageBody": item.replayed}
                if self.options.fair_queues:
                    entry["MessageGroupId"] = item.tenant  # SQS fair queues, as ingest sends
                entries.append(entry)
            try:
                response = self.sqs.send_message_batch(
                    QueueUrl=self.options.queue_urls[queue], Entries=entries
                )
            except Exception:
                response = {"Failed": [{"Id": entry["Id"], "SenderFault": False} for entry in entries]}
            for success in response.get("Successful", []):
                pending.pop(int(success["Id"]), None)
                self.sent += 1
            retryable = [f for f in response.get("Failed", []) if not f.get("SenderFault")]
            if not pending or not retryable:
                break
            time.sleep(0.1 * 2**attempt)
        self.failed_bodies.extend(item.original for item in pending.values())


def write_failures(
    path: str, partition_id: int, bodies: list[str], endpoint_url: str | None, region: str | None
) -> str:
    """One gzipped NDJSON object of failed originals: the next run replays ``path`` as an archive."""
    name = f"part-{partition_id:05d}-{uuid.uuid4().hex[:8]}.ndjson.gz"
    blob = gzip.compress("".join(body + "\n" for body in bodies).encode(), mtime=0)
    target = f"{path.rstrip('/')}/{name}"
    if target.startswith("s3://"):
        import boto3

        bucket, _, key = target.removeprefix("s3://").partition("/")
        boto3.client("s3", endpoint_url=endpoint_url, region_name=region).put_object(
            Bucket=bucket, Key=key, Body=blob
        )
    else:
        local = Path(target.removeprefix("file://"))
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(blob)
    return target


def send_partition_function(
    options: SendOptions, considered: Any, replayed: Any, failed: Any, window: Any
) -> Callable[[Iterator[Any]], None]:
    """The ``foreachPartition`` function: send, count into the accumulators, write failures."""

    def send_partition(rows: Iterator[Any]) -> None:
        from pyspark import TaskContext

        dicts = (row.asDict() for row in rows)
        if options.dry_run:
            considered.add(sum(1 for _ in dicts))
            return
        import boto3

        sqs = boto3.client("sqs", endpoint_url=options.endpoint_url, region_name=options.region)
        context = TaskContext.get()
        partition_id = context.partitionId() if context else 0
        sender = PartitionSender(options, sqs, Pacer(options.rate_for(partition_id)))
        seen = 0

        def counted(items: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            nonlocal seen
            for item in items:
                seen += 1
                yield item

        started = time.time()
        sender.send_all(counted(dicts))
        if sender.sent:
            window.add((started, time.time()))
        considered.add(seen)
        replayed.add(sender.sent)
        failed.add(len(sender.failed_bodies))
        if sender.failed_bodies:
            write_failures(
                options.failures_path,
                partition_id,
                sender.failed_bodies,
                options.endpoint_url,
                options.region,
            )

    return send_partition
