"""Stream consumer throughput: records per second through aggregation + compare-and-swap, on moto.

    .venv/bin/python bench/stream.py [--records 20000] [--keys 50] [--batch 100] [--seed 7]

Builds Lambda Kinesis events (batches of ``--batch`` records from one shard, ``--keys`` partition
keys, two event types), then runs the consumer's path on each: decode
(:func:`breakwater.sequencing.from_lambda_record`), fold (:func:`breakwater.sequencing.aggregate`)
and one conditional UpdateItem per aggregate (:class:`breakwater.aws.aggregates.DynamoAggregateStore`),
against moto in-process. DynamoDB writes are counted on the client side (botocore ``before-send``).
Then it redelivers every batch (a retry after a lost checkpoint) and checks nothing changed.
Prints one figure per line.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
    os.environ.setdefault(name, "testing")

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from bench.tables import create_pk_sk_table  # noqa: E402
from breakwater.aws.aggregates import DynamoAggregateStore  # noqa: E402
from breakwater.envelope import new_envelope_id  # noqa: E402
from breakwater.events import StreamEvent  # noqa: E402
from breakwater.sequencing import aggregate, from_lambda_record, write_aggregates  # noqa: E402

TABLE = "bench-aggregates"
SHARD = "shardId-000000000000"


def _batches(records: int, keys: int, batch: int, rng: random.Random) -> list[list[dict[str, Any]]]:
    events = []
    for seq in range(1, records + 1):
        key = f"tenant-{rng.randrange(keys)}"
        event = StreamEvent(
            id=new_envelope_id(),
            tenant=key,
            type=rng.choice(("click", "view")),
            value=rng.random(),
            received_at=1,
        )
        events.append(
            {
                "eventID": f"{SHARD}:{seq}",
                "kinesis": {
                    "data": base64.b64encode(event.to_bytes()).decode(),
                    "sequenceNumber": str(49_000_000_000_000_000_000 + seq),
                    "partitionKey": key,
                },
            }
        )
    return [events[i : i + batch] for i in range(0, len(events), batch)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    batches = _batches(args.records, args.keys, args.batch, random.Random(args.seed))

    started = time.perf_counter()
    for raw in batches:
        aggregate([from_lambda_record(r) for r in raw])
    fold_only = args.records / (time.perf_counter() - started)

    with mock_aws():
        client = boto3.client("dynamodb")
        create_pk_sk_table(client, TABLE)
        writes = {"n": 0}

        def count(**_: Any) -> None:
            writes["n"] += 1

        client.meta.events.register("before-send.dynamodb.UpdateItem", count)
        store = DynamoAggregateStore(client, TABLE)

        distinct = 0
        started = time.perf_counter()
        for raw in batches:
            records = [from_lambda_record(r) for r in raw]
            distinct += len(aggregate(records))
            report = write_aggregates(records, store)
            assert not report.failed_sequences
        elapsed = time.perf_counter() - started
        first_writes = writes["n"]
        snapshot = client.scan(TableName=TABLE)["Items"]

        writes["n"] = 0
        started = time.perf_counter()
        skipped = 0
        for raw in batches:
            skipped += write_aggregates([from_lambda_record(r) for r in raw], store).skipped_records
        redelivery_elapsed = time.perf_counter() - started
        unchanged = client.scan(TableName=TABLE)["Items"] == snapshot

    print(f"records: {args.records} in {len(batches)} batches of {args.batch}, {args.keys} keys x 2 types")
    print(f"records_per_second: {args.records / elapsed:.0f}")
    print(f"decode_and_fold_only_records_per_second: {fold_only:.0f}")
    print(f"dynamodb_writes_per_record: {first_writes / args.records:.3f}")
    print(f"dynamodb_writes_per_distinct_key_per_batch: {first_writes / distinct:.3f}")
    print(f"redelivered_records_per_second: {args.records / redelivery_elapsed:.0f}")
    print(f"redelivery_writes_per_record: {writes['n'] / args.records:.3f}")
    print(f"redelivery_records_skipped: {skipped}")
    print(f"redelivery_changed_nothing: {unchanged}")


if __name__ == "__main__":
    main()
