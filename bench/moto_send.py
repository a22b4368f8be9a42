"""SendMessage (and receive + delete) throughput of moto's server against a deep queue, unpatched vs patched.

    .venv/bin/python bench/moto_send.py [--depth 20000] [--seconds 5]

Each configuration runs in a fresh interpreter (the patch is process-wide). ``unpatched`` and
``patched`` run ``moto.server.ThreadedMotoServer`` in the client's process, with the queue filled
through moto's backend directly (filling it over HTTP unpatched would itself take hours).
``runtime`` is what the emulator runs: the patched server in a process of its own
(``local.emulator.embedded_aws.EmbeddedAws``), the queue filled over HTTP with ``SendMessageBatch``. Then
boto3 sends one message at a time over HTTP for a fixed time. Prints one figure per line; "per CPU
second" counts the client's and the server's CPU, whichever process each runs in.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import DeleteMessageBatchRequestEntryTypeDef

ROOT = Path(__file__).resolve().parent.parent
MODES = ("unpatched", "patched", "runtime")
# "patched": the SQS request path and the server's per-request listings (local/emulator/moto_patches)
SQS_PATH_PATCHES = (
    "sqs.lazy_attributes",
    "sqs.counts_at_one_instant",
    "sqs.pending_groups_snapshot",
    "sqs.delete_by_handle_index",
    "server.moto_modules_listed_once",
    "server.response_methods_listed_once",
)


def _process_cpu_s(pid: int) -> float:
    """utime + stime of another process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_runtime(depth: int, seconds: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from local.emulator.embedded_aws import EmbeddedAws

    aws = EmbeddedAws().start()
    server_pid = aws.server_pid
    assert server_pid is not None
    try:
        sqs = aws.client("sqs", counted=False)
        url = sqs.create_queue(QueueName="bench")["QueueUrl"]
        for start in range(0, depth, 10):
            entries = [
                {"Id": str(i), "MessageBody": f'{{"n": {start + i}}}'} for i in range(min(10, depth - start))
            ]
            sqs.send_message_batch(QueueUrl=url, Entries=entries)
        return _rates(sqs, url, seconds, lambda: _process_cpu_s(server_pid))
    finally:
        aws.stop()


def _rates(sqs: Any, url: str, seconds: float, server_cpu: Any = lambda: 0.0) -> dict[str, float]:
    def rate(call: object) -> tuple[float, float]:
        """Calls per wall-clock second, and per CPU second of client and server."""
        count, started = 0, time.perf_counter()
        cpu = time.process_time() + server_cpu()
        while time.perf_counter() - started < seconds:
            call()  # type: ignore[operator]
            count += 1
        used = time.process_time() + server_cpu() - cpu
        return count / (time.perf_counter() - started), count / max(used, 1e-9)

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
    return {
        "sends_per_s": sends,
        "sends_per_cpu_s": sends_cpu,
        "received_and_deleted_per_s": batches * 10,
        "received_and_deleted_per_cpu_s": batches_cpu * 10,
        "depth_after": float(attributes["ApproximateNumberOfMessages"]),
    }


def measure(depth: int, seconds: float, patched: bool) -> dict[str, float]:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    import logging

    import boto3
    from moto.server import ThreadedMotoServer
    from moto.sqs.models import Message, sqs_backends

    sys.path.insert(0, str(ROOT))
    from local.emulator import moto_patches

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request is not the subject
    if patched:
        moto_patches.install(names=SQS_PATH_PATCHES)
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

    result = _rates(sqs, url, seconds)
    server.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--depth", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--modes", default=",".join(MODES), help="which of unpatched,patched,runtime")
    args = parser.parse_args()
    if args.child == "runtime":
        print(json.dumps(measure_runtime(args.depth, args.seconds)))
        return
    if args.child:
        print(json.dumps(measure(args.depth, args.seconds, args.child == "patched")))
        return
    for mode in args.modes.split(","):
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
