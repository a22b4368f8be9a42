"""PutRecords with per-record failure handling: retry the failed subset, never call unwritten written.

PutRecords is not atomic: each record succeeds or fails on its own (``ErrorCode`` set, typically
``ProvisionedThroughputExceededException`` on a hot shard). The caller learns, per input index,
either the shard and sequence number it was written at or the last error.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from breakwater.events import KinesisRecord, chunk_indexes

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient
    from mypy_boto3_kinesis.type_defs import PutRecordsRequestEntryTypeDef

THROTTLED = "ProvisionedThroughputExceededException"


@dataclass(frozen=True)
class Written:
    shard_id: str
    sequence_number: str


@dataclass
class PutOutcome:
    written: dict[int, Written] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # index -> last error code
    calls: int = 0

    @property
    def throttled(self) -> bool:
        return any(code == THROTTLED for code in self.failed.values())


def put_records(
    client: KinesisClient,
    stream_arn: str,
    records: Sequence[KinesisRecord],
    *,
    max_attempts: int = 3,
    base_delay: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
) -> PutOutcome:
    """Write ``records``, retrying only the ones that failed, with jittered exponential backoff.

    Records keep their relative order within each call (Kinesis orders a partition key's records by
    arrival), but a retried record lands after records of the same key written in the first call:
    per-key order across a partial failure is the order of successful writes, as with any producer.
    """
    outcome = PutOutcome()
    pending = list(range(len(records)))
    for attempt in range(max_attempts):
        if not pending:
            break
        if attempt:
            sleep(random.uniform(0, base_delay * 2**attempt))
        still_failed: list[int] = []
        for chunk in chunk_indexes([records[i].size for i in pending]):
            indexes = [pending[i] for i in chunk]
            entries: list[PutRecordsRequestEntryTypeDef] = [
                {"Data": records[i].data, "PartitionKey": records[i].partition_key} for i in indexes
            ]
            outcome.calls += 1
            try:
                response = client.put_records(StreamARN=stream_arn, Records=entries)
            except (ClientError, BotoCoreError) as exc:
                code = exc.response["Error"]["Code"] if isinstance(exc, ClientError) else type(exc).__name__
                for index in indexes:
                    outcome.failed[index] = code
                still_failed.extend(indexes)
                continue
            for index, result in zip(indexes, response["Records"], strict=True):
                if "ErrorCode" in result:
                    outcome.failed[index] = result["ErrorCode"]
                    still_failed.append(index)
                else:
                    outcome.written[index] = Written(result["ShardId"], result["SequenceNumber"])
                    outcome.failed.pop(index, None)
        pending = still_failed
    return outcome


class StreamWriter:
    """The events ingest's writer port: PutRecords to one stream, the failed subset retried."""

    def __init__(self, client: KinesisClient, stream_arn: str, *, max_attempts: int = 3) -> None:
        self.client = client
        self.stream_arn = stream_arn
        self.max_attempts = max_attempts

    def put(self, records: Sequence[KinesisRecord]) -> PutOutcome:
        return put_records(self.client, self.stream_arn, records, max_attempts=self.max_attempts)
