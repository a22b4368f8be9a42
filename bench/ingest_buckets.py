"""Writes per admitted request of one tenant's leased token bucket shared by several containers.

    .venv/bin/python bench/ingest_buckets.py [--containers 1 10 40 100] [--seconds 20]

Runs the real ``breakwater.aws.buckets.LeasedTokenBucket`` against moto's in-memory DynamoDB (no
server), one instance per simulated container, on a simulated clock: each request goes to a
container picked at random (as Lambda spreads a tenant's requests), and the bucket decides. Prints,
per case (limits, request rate; at least 60 requests), the ``UpdateItem`` calls, how many lost a race
(``ConditionalCheckFailedException``), what was admitted and the writes per admitted request.
The cases are the demo's: ingest's standard tier (rate 10, burst 20) at the burst's 50 requests/s,
just over and far under its rate; the worker's consumer bucket (rate 5, burst 5).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]
for name, value in (
    ("AWS_DEFAULT_REGION", "us-east-1"),
    ("AWS_ACCESS_KEY_ID", "x"),
    ("AWS_SECRET_ACCESS_KEY", "x"),
):
    os.environ.setdefault(name, value)

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from bench.tables import create_pk_sk_table  # noqa: E402
from breakwater.aws.buckets import LeasedTokenBucket  # noqa: E402
from breakwater.fairness import BucketLimits  # noqa: E402

CASES = [  # (purpose, rate, burst, requests per second)
    ("ingest", 50.0, 100.0, 45.0),  # cdk.json's standard tier just under its rate
    ("ingest", 50.0, 100.0, 100.0),  # ... and at twice its rate
    ("ingest", 10.0, 20.0, 50.0),
    ("ingest", 10.0, 20.0, 11.0),
    ("ingest", 10.0, 20.0, 0.5),
    ("consumer", 5.0, 5.0, 10.0),
    ("consumer", 5.0, 5.0, 0.5),
]


def run(purpose: str, rate: float, burst: float, per_second: float, containers: int, seconds: float) -> str:
    rng = random.Random(1)
    with mock_aws():
        client = boto3.client("dynamodb")
        create_pk_sk_table(client, "state")
        counts = {"writes": 0, "lost": 0}

        def before(**_: object) -> None:
            counts["writes"] += 1

        def after(parsed: dict[str, object] | None = None, **_: object) -> None:
            error = (parsed or {}).get("Error") or {}
            if isinstance(error, dict) and error.get("Code") == "ConditionalCheckFailedException":
                counts["lost"] += 1

        client.meta.events.register("before-call.dynamodb.UpdateItem", before)
        client.meta.events.register("after-call.dynamodb.UpdateItem", after)
        now = [1_700_000_000.0]
        gates = [
            LeasedTokenBucket("state", purpose, lambda: now[0], 1.0, 0.25, client=client)
            for _ in range(containers)
        ]
        limits = BucketLimits(rate=rate, burst=burst)
        t = admitted = requests = 0.0
        seconds = max(seconds, 60 / per_second)  # at least 60 requests
        while t < seconds:
            t += 1.0 / per_second if per_second >= 40 else rng.expovariate(per_second)
            now[0] = 1_700_000_000.0 + t
            requests += 1
            admitted += gates[rng.randrange(containers)].try_acquire("tenant", limits)[0]
    return (
        f"{purpose:8s} rate {rate:g} burst {burst:g} at {per_second:g}/s: requests {requests:.0f} "
        f"admitted {admitted:.0f} writes {counts['writes']} lost races {counts['lost']} "
        f"writes per admitted {counts['writes'] / max(admitted, 1):.2f} "
        f"admitted/s {admitted / seconds:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--containers", type=int, nargs="+", default=[1, 10, 40, 100])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    for containers in args.containers:
        print(f"-- {containers} containers")
        for case in CASES:
            print(run(*case, containers=containers, seconds=args.seconds))


if __name__ == "__main__":
    main()
