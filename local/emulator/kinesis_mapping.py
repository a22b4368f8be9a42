"""Kinesis event source mappings, emulated as Lambda runs them (moto stores mappings but runs none).

Per mapping, one poller thread that re-reads the mapping (``GetEventSourceMapping``) and the
stream's shards (``ListShards``) about once a second, and one reader thread per shard that may be
read now. A shard may be read once every parent still listed is *finished*: closed and processed to
its end (:func:`breakwater.sequencing.ready_shards`), so after a split or merge a partition key's
records reach the function in order. Shards open when the mapping starts begin at its
``StartingPosition`` (``TRIM_HORIZON`` or ``LATEST``); shards that appear later (children) begin
at ``TRIM_HORIZON``, as on AWS.

A reader takes up to ``BatchSize`` records (``GetShardIterator`` + ``GetRecords``), waiting up to
``MaximumBatchingWindowInSeconds`` to fill a batch, and invokes the function with the event Lambda
delivers (base64 ``data``, ``sequenceNumber``, ``approximateArrivalTimestamp``, ``partitionKey``,
``eventID`` = ``<shard id>:<sequence number>``). Then, per AWS's documented semantics:

- success: the shard's checkpoint moves past the batch;
- ``batchItemFailures`` (with ``ReportBatchItemFailures``): the checkpoint moves to just before the
  lowest failed sequence number and the rest of the batch is retried (an identifier that is not a
  sequence number of the batch fails the whole batch);
- a function error: with ``BisectBatchOnFunctionError`` the batch is split in two and each half is
  retried, first half first (splitting does not consume the retry quota); a batch of one, or
  without bisection, is retried as it is;
- after ``MaximumRetryAttempts`` retries (-1: unbounded), or when a record is older than
  ``MaximumRecordAgeInSeconds`` (-1: no limit), the records are given up on: the JSON document AWS
  sends (``requestContext``, ``responseContext``, ``KinesisBatchInfo``) goes to the SQS on-failure
  destination (``DestinationConfig.OnFailure``) and the shard moves on.

``ParallelizationFactor`` is treated as 1 (one batch in flight per shard): a factor > 1 only adds
concurrent batches of *different* partition keys of a shard, which the consumer's per-key CAS
already tolerates; it changes throughput, not what the consumer must get right. Tumbling windows,
filters and ``AT_TIMESTAMP`` are not emulated.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from breakwater.sequencing import ShardLineage, ready_shards
from local.emulator.discovery import MappingSpec
from local.emulator.embedded_aws import REGION, AwsClients
from local.emulator.functions import FunctionInvoker, Invocation
from local.emulator.mappings import MappingConfigs

log = logging.getLogger("breakwater.local.kinesis")

REFRESH_SECONDS = 1.0
IDLE_SLEEP_SECONDS = 0.2  # a reader with nothing to read polls again after this (AWS: about once a second)
GET_RECORDS_LIMIT = 10_000


@dataclass
class KinesisMappingState:
    enabled: bool
    batch_size: int
    window_s: float
    starting_position: str
    bisect: bool
    max_retries: int  # -1: unbounded
    max_record_age_s: int  # -1: no limit
    report_failures: bool
    on_failure_arn: str | None
    parallelization_factor: int


@dataclass
class KinesisMappingStats:
    invocations: int = 0
    function_errors: int = 0
    records_delivered: int = 0  # counted per delivery: a retried record counts again
    records_done: int = 0  # checkpointed past after success
    reported_failures: int = 0
    bisections: int = 0
    gave_up_batches: int = 0
    gave_up_records: int = 0
    expired_records: int = 0
    shard_order: list[str] = field(default_factory=list)  # the shard of each invocation, in order
    finished_shards: list[str] = field(default_factory=list)
    in_flight: int = 0


def kinesis_record(
    shard_id: str, record: dict[str, Any], stream_arn: str, invoke_identity_arn: str
) -> dict[str, Any]:
    """One record of the Kinesis event Lambda delivers, from a ``GetRecords`` record."""
    arrival = record.get("ApproximateArrivalTimestamp")
    stamp = arrival.timestamp() if isinstance(arrival, datetime) else float(arrival or time.time())
    return {
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "partitionKey": record["PartitionKey"],
            "sequenceNumber": record["SequenceNumber"],
            "data": base64.b64encode(record["Data"]).decode(),
            "approximateArrivalTimestamp": round(stamp, 3),
        },
        "eventSource": "aws:kinesis",
        "eventVersion": "1.0",
        "eventID": f"{shard_id}:{record['SequenceNumber']}",
        "eventName": "aws:kinesis:record",
        "invokeIdentityArn": invoke_identity_arn,
        "awsRegion": REGION,
        "eventSourceARN": stream_arn,
    }


def lowest_failure(invocation: Invocation, sequences: list[str], report_failures: bool) -> int | None:
    """Index in the batch to resume from after ``invocation`` (None: the whole batch succeeded).

    Only for an invocation without a function error. With ReportBatchItemFailures, the lowest
    reported sequence number; an identifier that is empty or not in the batch fails it all (0).
    """
    if not report_failures or not isinstance(invocation.result, dict):
        return None
    failures = invocation.result.get("batchItemFailures") or []
    positions = {sequence: index for index, sequence in enumerate(sequences)}
    lowest: int | None = None
    for failure in failures:
        identifier = failure.get("itemIdentifier") if isinstance(failure, dict) else None
        if not identifier or identifier not in positions:
            return 0
        index = positions[identifier]
        lowest = index if lowest is None else min(lowest, index)
    return lowest


def _iso(moment: float) -> str:
    return (
        datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{int(moment * 1000) % 1000:03d}Z"
    )


def _arrival(record: dict[str, Any]) -> float:
    arrival = record.get("ApproximateArrivalTimestamp")
    return arrival.timestamp() if isinstance(arrival, datetime) else time.time()


def on_failure_record(
    *,
    function_arn: str,
    stream_arn: str,
    shard_id: str,
    records: list[dict[str, Any]],
    condition: str,
    invoke_count: int,
    invocation: Invocation | None,
) -> dict[str, Any]:
    """The invocation record AWS sends to a Kinesis mapping's on-failure destination (metadata, no data)."""
    response: dict[str, Any] = {"statusCode": 200, "executedVersion": "$LATEST"}
    if invocation is not None and not invocation.ok:
        response["functionError"] = "Unhandled"
    return {
        "requestContext": {
            "requestId": invocation.request_id if invocation is not None else str(uuid.uuid4()),
            "functionArn": function_arn,
            "condition": condition,
            "approximateInvokeCount": invoke_count,
        },
        "responseContext": response,
        "version": "1.0",
        "timestamp": _iso(time.time()),
        "KinesisBatchInfo": {
            "shardId": shard_id,
            "startSequenceNumber": records[0]["SequenceNumber"],
            "endSequenceNumber": records[-1]["SequenceNumber"],
            "approximateArrivalOfFirstRecord": _iso(_arrival(records[0])),
            "approximateArrivalOfLastRecord": _iso(_arrival(records[-1])),
            "batchSize": len(records),
            "streamArn": stream_arn,
        },
    }


class KinesisMapping:
    """The poller of one Kinesis event source mapping: one reader per shard that may be read now.

    ``template_properties`` are the mapping's properties in the synthesized template; a setting
    ``GetEventSourceMapping`` does not return is read from there (moto returns every setting the
    stack's consumer mapping declares today; the template stays the fallback).
    """

    def __init__(
        self,
        spec: MappingSpec,
        pool: FunctionInvoker,
        aws: AwsClients,
        *,
        template_properties: dict[str, Any] | None = None,
        on_invocation: Callable[[MappingSpec, list[dict[str, Any]], Invocation, float], None] | None = None,
        configs: MappingConfigs | None = None,
    ) -> None:
        if ":kinesis:" not in spec.source_arn:
            raise ValueError(f"mapping {spec.uuid} is not a Kinesis mapping")
        self.spec = spec
        self.stream_arn = spec.source_arn
        self._pool = pool
        # The emulator re-reading its mapping (the Lambda service has it in hand): not counted.
        self._lambda = aws.client("lambda", counted=False)
        self._configs = configs or MappingConfigs(aws)  # the runtime passes one for all its pollers
        self._kinesis = aws.client("kinesis")
        self._sqs = aws.client("sqs")
        self._template = template_properties or {}
        self._on_invocation = on_invocation
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._state: KinesisMappingState | None = None
        self._state_read_at = 0.0
        self._started_at_shards: set[str] | None = None  # shards listed when the mapping started
        self._finished: set[str] = set()
        self._readers: dict[str, threading.Thread] = {}
        self._closed: dict[str, str] = {}  # closed shard -> its ending sequence number
        self._checkpoints: dict[str, str] = {}  # shard -> last sequence number done with
        self._queue_urls: dict[str, str] = {}
        config = self._lambda.get_function_configuration(FunctionName=pool.spec.name)
        self.function_arn: str = config["FunctionArn"]
        self._role: str = config.get("Role", "")
        self.stats = KinesisMappingStats()
        self._thread = threading.Thread(target=self._run, name=f"kinesis-{spec.uuid[:8]}", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> KinesisMapping:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        for reader in list(self._readers.values()):
            reader.join(timeout)

    def drain(self, timeout: float = 30.0) -> None:
        """Wait until no invocation of this mapping is in flight (as ``SqsMapping.drain``)."""
        deadline = time.monotonic() + timeout
        while self.stats.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait_caught_up(self, timeout: float = 30.0) -> bool:
        """Wait until every shard is read to its end (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.caught_up():
                return True
            time.sleep(0.1)
        return self.caught_up()

    def caught_up(self) -> bool:
        shards = self._kinesis.list_shards(StreamARN=self.stream_arn)["Shards"]
        for shard in shards:
            shard_id = shard["ShardId"]
            if shard_id in self._finished:
                continue
            reader = self._readers.get(shard_id)
            if reader is None or not reader.is_alive():
                return False
            latest = self._latest_sequence(shard_id)
            if latest is not None and self._checkpoints.get(shard_id) != latest:
                return False
        return True

    def _latest_sequence(self, shard_id: str) -> str | None:
        iterator = self._kinesis.get_shard_iterator(
            StreamARN=self.stream_arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records = self._kinesis.get_records(
            StreamARN=self.stream_arn, ShardIterator=iterator, Limit=GET_RECORDS_LIMIT
        )["Records"]
        return str(records[-1]["SequenceNumber"]) if records else None

    # -- configuration -----------------------------------------------------------------------------------
    def _setting(self, config: dict[str, Any], name: str, default: Any) -> Any:
        if config.get(name) is not None:
            return config[name]
        if self._template.get(name) is not None:
            return self._template[name]
        return default

    def state(self) -> KinesisMappingState:
        now = time.monotonic()
        if self._state is None or now - self._state_read_at >= REFRESH_SECONDS:
            config = self._configs.get(self.spec.uuid, REFRESH_SECONDS)
            destination = self._setting(config, "DestinationConfig", {}) or {}
            self._state = KinesisMappingState(
                enabled=config.get("State") in ("Enabled", "Enabling", "Updating"),
                batch_size=int(self._setting(config, "BatchSize", 100)),
                window_s=float(self._setting(config, "MaximumBatchingWindowInSeconds", 0)),
                starting_position=str(self._setting(config, "StartingPosition", "TRIM_HORIZON")),
                bisect=bool(self._setting(config, "BisectBatchOnFunctionError", False)),
                max_retries=int(self._setting(config, "MaximumRetryAttempts", -1)),
                max_record_age_s=int(self._setting(config, "MaximumRecordAgeInSeconds", -1)),
                report_failures="ReportBatchItemFailures"
                in (self._setting(config, "FunctionResponseTypes", []) or []),
                on_failure_arn=(destination.get("OnFailure") or {}).get("Destination"),
                parallelization_factor=int(self._setting(config, "ParallelizationFactor", 1)),
            )
            self._state_read_at = now
        return self._state

    # -- the poller: which shards may be read ------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.state().enabled:
                    self._start_ready_readers()
            except Exception:  # keep polling, as the service does; the error is logged
                log.exception("mapping %s: poll failed", self.spec.uuid)
            self._stop.wait(REFRESH_SECONDS)

    def _start_ready_readers(self) -> None:
        shards = self._kinesis.list_shards(StreamARN=self.stream_arn)["Shards"]
        if self._started_at_shards is None:
            self._started_at_shards = {s["ShardId"] for s in shards}
        with self._lock:
            for shard in shards:
                ending = shard["SequenceNumberRange"].get("EndingSequenceNumber")
                if ending is not None:
                    self._closed[shard["ShardId"]] = str(ending)
            lineage = [
                ShardLineage(s["ShardId"], s.get("ParentShardId"), s.get("AdjacentParentShardId"))
                for s in shards
            ]
            for shard_id in ready_shards(lineage, self._finished):
                if shard_id not in self._readers:
                    reader = threading.Thread(
                        target=self._read_shard,
                        args=(shard_id,),
                        name=f"kinesis-{shard_id[-4:]}",
                        daemon=True,
                    )
                    self._readers[shard_id] = reader
                    reader.start()

    # -- one shard ---------------------------------------------------------------------------------------
    def _iterator(self, shard_id: str) -> str:
        checkpoint = self._checkpoints.get(shard_id)
        if checkpoint is not None:
            kwargs: dict[str, Any] = {
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                "StartingSequenceNumber": checkpoint,
            }
        elif self._started_at_shards and shard_id in self._started_at_shards:
            kwargs = {"ShardIteratorType": self.state().starting_position}
        else:
            kwargs = {"ShardIteratorType": "TRIM_HORIZON"}  # a shard created after the mapping started
        return str(
            self._kinesis.get_shard_iterator(StreamARN=self.stream_arn, ShardId=shard_id, **kwargs)[
                "ShardIterator"
            ]
        )

    def _read_shard(self, shard_id: str) -> None:
        iterator: str | None = None
        buffered: list[dict[str, Any]] = []
        while not self._stop.is_set():
            try:
                state = self.state()
                if not state.enabled:
                    self._stop.wait(REFRESH_SECONDS)
                    continue
                if iterator is None:
                    iterator = self._iterator(shard_id)
                with self._lock:  # known closed before this read: an empty read is then its end
                    closed_before_read = shard_id in self._closed
                window_ends = time.monotonic() + state.window_s
                while len(buffered) < state.batch_size and not self._stop.is_set():
                    page = self._kinesis.get_records(
                        StreamARN=self.stream_arn, ShardIterator=iterator, Limit=GET_RECORDS_LIMIT
                    )
                    iterator = page.get("NextShardIterator") or iterator
                    buffered.extend(page["Records"])
                    if not buffered or len(buffered) >= state.batch_size:
                        break
                    remaining = window_ends - time.monotonic()
                    if remaining <= 0:
                        break
                    if not page["Records"]:
                        self._stop.wait(min(IDLE_SLEEP_SECONDS, remaining))
                if not buffered:
                    if closed_before_read:
                        self._finish(shard_id)
                        return
                    self._stop.wait(IDLE_SLEEP_SECONDS)
                    continue
                batch, buffered = buffered[: state.batch_size], buffered[state.batch_size :]
                self._process(shard_id, batch, state)
            except Exception:
                log.exception(
                    "mapping %s: shard %s failed; re-reading from its checkpoint", self.spec.uuid, shard_id
                )
                iterator, buffered = None, []
                self._stop.wait(1.0)

    def _finish(self, shard_id: str) -> None:
        """A closed shard read to its end is finished: its children may start (on the next poll).

        Closed is what the poller saw in ``ListShards`` (once per ``REFRESH_SECONDS`` for all shards),
        before the empty read: a read that came back empty before the split was seen proves nothing.
        """
        with self._lock:
            self._finished.add(shard_id)
            self.stats.finished_shards.append(shard_id)
        log.info("mapping %s: shard %s closed and read to its end", self.spec.uuid, shard_id)

    def _checkpoint(self, shard_id: str, records: list[dict[str, Any]]) -> None:
        if records:
            self._checkpoints[shard_id] = str(records[-1]["SequenceNumber"])

    def _process(self, shard_id: str, batch: list[dict[str, Any]], state: KinesisMappingState) -> None:
        """Deliver ``batch`` until every record is done or given up on; the shard waits meanwhile."""
        work: list[tuple[list[dict[str, Any]], int]] = [(batch, 0)]  # (records, retries so far)
        while work and not self._stop.is_set():
            records, retries = work.pop(0)
            if state.max_record_age_s >= 0:
                cutoff = time.time() - state.max_record_age_s
                expired = [r for r in records if _arrival(r) < cutoff]
                if expired:  # the shard's oldest records come first
                    self.stats.expired_records += len(expired)
                    self._give_up(shard_id, expired, "RecordAgeExceeded", retries, None, state)
                    records = records[len(expired) :]
                    if not records:
                        continue
            invocation = self._invoke(shard_id, records)
            if invocation.ok:
                resume = lowest_failure(
                    invocation, [r["SequenceNumber"] for r in records], state.report_failures
                )
                if resume is None:
                    self._checkpoint(shard_id, records)
                    self.stats.records_done += len(records)
                    continue
                self.stats.reported_failures += len(records) - resume
                done, failed = records[:resume], records[resume:]
                self._checkpoint(shard_id, done)
                self.stats.records_done += len(done)
            else:
                self.stats.function_errors += 1
                log.warning("mapping %s: function error %s", self.spec.uuid, invocation.error)
                if state.bisect and len(records) > 1:  # splitting does not consume the retry quota
                    self.stats.bisections += 1
                    middle = len(records) // 2
                    work[:0] = [(records[:middle], retries), (records[middle:], retries)]
                    continue
                failed = records
            if state.max_retries >= 0 and retries >= state.max_retries:
                self._give_up(shard_id, failed, "RetryAttemptsExhausted", retries + 1, invocation, state)
                continue
            work.insert(0, (failed, retries + 1))

    def _invoke(self, shard_id: str, records: list[dict[str, Any]]) -> Invocation:
        event = {"Records": [kinesis_record(shard_id, r, self.stream_arn, self._role) for r in records]}
        delivered_at = time.time()
        self.stats.in_flight += 1
        try:
            invocation = self._pool.invoke(event, source=self.stream_arn)
        finally:
            self.stats.in_flight -= 1
        self.stats.invocations += 1
        self.stats.records_delivered += len(records)
        self.stats.shard_order.append(shard_id)
        if self._on_invocation is not None:
            try:
                self._on_invocation(self.spec, records, invocation, delivered_at)
            except Exception:
                log.exception("mapping %s: on_invocation hook failed", self.spec.uuid)
        return invocation

    def _give_up(
        self,
        shard_id: str,
        records: list[dict[str, Any]],
        condition: str,
        invoke_count: int,
        invocation: Invocation | None,
        state: KinesisMappingState,
    ) -> None:
        self.stats.gave_up_batches += 1
        self.stats.gave_up_records += len(records)
        if state.on_failure_arn is not None:
            document = on_failure_record(
                function_arn=self.function_arn,
                stream_arn=self.stream_arn,
                shard_id=shard_id,
                records=records,
                condition=condition,
                invoke_count=invoke_count,
                invocation=invocation,
            )
            self._send_on_failure(state.on_failure_arn, document)
        log.warning(
            "mapping %s: gave up on %s %s..%s (%s)",
            self.spec.uuid,
            shard_id,
            records[0]["SequenceNumber"],
            records[-1]["SequenceNumber"],
            condition,
        )
        self._checkpoint(shard_id, records)

    def _send_on_failure(self, destination_arn: str, document: dict[str, Any]) -> None:
        if ":sqs:" not in destination_arn:
            log.warning("mapping %s: on-failure destination %s not emulated", self.spec.uuid, destination_arn)
            return
        url = self._queue_urls.get(destination_arn)
        if url is None:
            url = self._sqs.get_queue_url(QueueName=destination_arn.rsplit(":", 1)[-1])["QueueUrl"]
            self._queue_urls[destination_arn] = url
        self._sqs.send_message(QueueUrl=url, MessageBody=json.dumps(document))
