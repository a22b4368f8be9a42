"""Writes per admitted request of one tenant's leased token bucket shared by several containers.

    .venv/bin/python bench/ingest_buckets.py [--containers 1 10 40 100] [--seconds 90] [--premium]

Runs the real ``breakwater.aws.buckets.LeasedTokenBucket`` against moto's in-memory DynamoDB (no
server), one instance per simulated container, on a simulated clock: each request goes to a
container picked at random (as Lambda spreads a tenant's requests), and the bucket decides. Prints,
per case (limits, offered rate) and container count, over the run after ``--warmup`` seconds (the
bucket's first burst and every container's first sight of the tenant behind it): the ``UpdateItem``
calls, how many failed their condition (``ConditionalCheckFailedException``, a lost probe), what was
admitted, the writes per admitted request, the admitted rate and the writes per second on the
tenant's one bucket item (each a write unit: the item is far under 1 KB, and a failed conditional
write consumes one too). Then the summary the issue asks for: writes per admitted request at 2x and
5x the rate, and the admitted rate of a tenant just over its rate (11/s against 10/s).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from dataclasses import dataclass
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

START = 1_700_000_000.0


@dataclass(frozen=True)
class Case:
    label: str
    purpose: str
    rate: float
    burst: float
    per_second: float


CASES = [  # cdk.json's tiers: standard rate 50 burst 100, premium rate 500 burst 1000
    Case("standard under", "ingest", 50.0, 100.0, 45.0),
    Case("standard 2x", "ingest", 50.0, 100.0, 100.0),
    Case("standard 5x", "ingest", 50.0, 100.0, 250.0),
    Case("small 5x", "ingest", 10.0, 20.0, 50.0),
    Case("small 11/10", "ingest", 10.0, 20.0, 11.0),
    Case("small trickle", "ingest", 10.0, 20.0, 0.5),
    Case("consumer 2x", "consumer", 5.0, 5.0, 10.0),
    Case("consumer trickle", "consumer", 5.0, 5.0, 0.5),
]
PREMIUM = Case("premium 5x", "ingest", 500.0, 1000.0, 2500.0)


@dataclass(frozen=True)
class Result:
    case: Case
    containers: int
    requests: int
    admitted: int
    writes: int
    lost: int
    seconds: float

    @property
    def writes_per_admitted(self) -> float:
        return self.writes / max(self.admitted, 1)

    @property
    def admitted_per_second(self) -> float:
        return self.admitted / self.seconds

    @property
    def writes_per_second(self) -> float:
        return self.writes / self.seconds

    def line(self) -> str:
        case = self.case
        return (
            f"{case.label:16s} {case.purpose:8s} rate {case.rate:g} burst {case.burst:g} "
            f"at {case.per_second:g}/s: "
            f"requests {self.requests} admitted {self.admitted} writes {self.writes} lost {self.lost} "
            f"writes/admitted {self.writes_per_admitted:.2f} admitted/s {self.admitted_per_second:.2f} "
            f"item writes/s {self.writes_per_second:.1f}"
        )


def run(case: Case, containers: int, seconds: float, warmup: float) -> Result:
    rng = random.Random(1)
    with mock_aws():
        client = boto3.client("dynamodb")
        create_pk_sk_table(client, "state")
        counts = {"writes": 0, "lost": 0}
        measuring = [False]

        def before(**_: object) -> None:
            counts["writes"] += measuring[0]

        def after(parsed: dict[str, object] | None = None, **_: object) -> None:
            error = (parsed or {}).get("Error") or {}
            if isinstance(error, dict) and error.get("Code") == "ConditionalCheckFailedException":
                counts["lost"] += measuring[0]

        client.meta.events.register("before-call.dynamodb.UpdateItem", before)
        client.meta.events.register("after-call.dynamodb.UpdateItem", after)
        now = [START]
        gates = [
            LeasedTokenBucket(
                "state",
                case.purpose,
                lambda: now[0],
                1.0,
                0.25,
                client=client,
                rng=random.Random(i),
                pause=lambda _attempt: True,  # the containers take turns on a simulated clock: no sleep
            )
            for i in range(containers)
        ]
        limits = BucketLimits(rate=case.rate, burst=case.burst)
        seconds = max(seconds, warmup + 120 / case.per_second)  # at least 120 requests measured
        t, admitted, requests = 0.0, 0, 0
        while True:
            t += rng.expovariate(case.per_second)
            if t >= seconds:
                break
            now[0] = START + t
            measuring[0] = t >= warmup
            ok = gates[rng.randrange(containers)].try_acquire("tenant", limits)[0]
            if measuring[0]:
                requests += 1
                admitted += ok
    return Result(case, containers, requests, admitted, counts["writes"], counts["lost"], seconds - warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--containers", type=int, nargs="+", default=[1, 10, 40, 100])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--premium", action="store_true", help="also the premium tier offered 5x its rate")
    args = parser.parse_args()
    cases = [*CASES, PREMIUM] if args.premium else CASES
    results: dict[tuple[str, int], Result] = {}
    for containers in args.containers:
        print(f"-- {containers} containers", flush=True)
        for case in cases:
            result = run(case, containers, args.seconds, args.warmup)
            results[case.label, containers] = result
            print(result.line(), flush=True)

    def figures(label: str, pick: str) -> str:
        row = [results[label, n] for n in args.containers if (label, n) in results]
        if pick == "writes":
            return ", ".join(f"{r.writes_per_admitted:.2f}" for r in row)
        return ", ".join(f"{r.admitted_per_second:.2f}" for r in row)

    counts = "/".join(str(n) for n in args.containers)
    print(f"-- summary at {counts} containers")
    labels = [
        "standard 2x",
        "standard 5x",
        "small 5x",
        "consumer 2x",
        *(["premium 5x"] if args.premium else []),
    ]
    for label in labels:
        print(f"writes per admitted request, {label}: {figures(label, 'writes')}")
    print(f"admitted/s of small 11/10 (rate 10, offered 11/s): {figures('small 11/10', 'rate')}")


if __name__ == "__main__":
    main()
