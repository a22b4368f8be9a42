"""SendMessage (and receive + delete) throughput of moto's server against a deep queue, unpatched vs patched.

    .venv/bin/python bench/moto_send.py [--depth 20000] [--seconds 5]

Each configuration runs in a fresh interpreter (the patch is process-wide). The queue is filled
through moto's backend directly (filling it over HTTP unpatched would itself take hours), then
boto3 sends one message at a time over HTTP to ``moto.server.ThreadedMotoServer`` for a fixed
time. Prints one figure per line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import DeleteMessageBatchRequestEntryTypeDef

ROOT = Path(__file__).resolve().parent.parent


def measure(depth: int, seconds: float, patched: bool) -> dict[str, float]:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    import logging

    import boto3
    from moto.server import ThreadedMotoServer
    from moto.sqs.models import Message, sqs_backends

    sys.path.insert(0, str(ROOT))
    from local import moto_patches

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request is not the subject
    if patched:
        moto_patches.apply()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    sqs = boto3.client("sqs", region_name="us-east-1", endpoint_url=f"http://{host}:{port}")
    url = sqs.create_queue(QueueName="bench")["QueueUrl"]
    queue = sqs_backends["123456789012"]["us-east-1"].queues["bench"]
    for index in range(depth):
        message = Message(f"prefill-{index}", f'{{"n": {index}}}')
        message.mark_sent()
        queue._messages.append(message)

    def rate(call: object) -> tuple[float, float]:
        """Calls per wall-clock second, and per CPU second of this process (client and server both)."""
        count, started, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - started < seconds:
            call()  # type: ignore[operator]
            count += 1
        return count / (time.perf_counter() - started), count / max(time.process_time() - cpu, 1e-9)

    def send() -> None:
        sqs.send_message(QueueUrl=url, MessageBody='{"hello": "world"}', MessageGroupId="t1")

    sends, sends_cpu = rate(send)

    def receive_and_delete() -> None:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
        entries: list[DeleteMessageBatchRequestEntryTypeDef] = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
        ]
        sqs.delete_message_batch(QueueUrl=url, Entries=entries)

    batches, batches_cpu = rate(receive_and_delete)
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    server.stop()
    return {
        "sends_per_s": sends,
        "sends_per_cpu_s": sends_cpu,
        "received_and_deleted_per_s": batches * 10,
        "received_and_deleted_per_cpu_s": batches_cpu * 10,
        "depth_after": float(attributes["ApproximateNumberOfMessages"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--depth", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--child", choices=["patched", "unpatched"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.depth, args.seconds, args.child == "patched")))
        return
    for mode in ("unpatched", "patched"):
        child = [sys.executable, __file__, "--child", mode, "--depth", str(args.depth)]
        out = subprocess.run(  # noqa: S603 - this interpreter running this file
            [*child, "--seconds", str(args.seconds)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        result = json.loads(out.strip().splitlines()[-1])
        print(
            f"moto SendMessage, depth {args.depth}, {mode}: {result['sends_per_s']:.1f} sends/s "
            f"({result['sends_per_cpu_s']:.1f} per CPU second)"
        )
        print(
            f"moto ReceiveMessage(10)+DeleteMessageBatch, depth {args.depth}, {mode}: "
            f"{result['received_and_deleted_per_s']:.1f} messages/s "
            f"({result['received_and_deleted_per_cpu_s']:.1f} per CPU second)"
        )


if __name__ == "__main__":
    main()
