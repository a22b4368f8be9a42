"""A function pool counts what Lambda bills (invocations, GB-seconds, log bytes) and its AWS usage."""

from __future__ import annotations

from pathlib import Path

import pytest

from local.emulator.embedded_aws import EmbeddedAws
from local.emulator.functions import FunctionPool, FunctionSpec
from local.pricing.cost import aws_call_latency_ms
from local.pricing.usage import LAMBDA_PLATFORM_LOG_BYTES, gb_seconds, modelled_duration_ms
from tests.polling import wait_for

HANDLERS = Path(__file__).parent / "handlers"


def _pool(aws: EmbeddedAws, name: str) -> FunctionPool:
    """A pool of one environment of ``handlers/<name>/handler.py``, 512 MB, on the embedded AWS."""
    spec = FunctionSpec(
        name.title(), name, f"arn:aws:lambda:us-east-1:123456789012:function:{name}",
        f"{name}/handler.handler", 10, 512, {}, HANDLERS,
    )  # fmt: skip
    return FunctionPool(spec, {"AWS_LAMBDA_FUNCTION_NAME": name, **aws.environment()}, lambda *_: None, 1)


def test_a_pool_counts_invocations_duration_logs_and_the_handler_s_billed_requests(aws: EmbeddedAws) -> None:
    url = aws.client("sqs", counted=False).create_queue(QueueName="pricing-pool")["QueueUrl"]
    pool = _pool(aws, "metered")
    try:
        pool.warm()
        after_init = dict(pool.usage)
        invocation = pool.invoke({"queue_url": url, "bodies": [f"message {i}" for i in range(10)]})
        assert invocation.ok, invocation.error
        logged = len("sent 10") + LAMBDA_PLATFORM_LOG_BYTES
        # The container's stdout is read by a thread of its own: its line may come after the answer.
        wait_for(lambda: pool.usage.get("logs.ingested_bytes", 0) >= logged)
        usage = dict(pool.usage)
    finally:
        pool.stop()
    assert after_init["lambda.gb_seconds"] > 0  # the INIT phase is billed as duration
    assert usage["lambda.requests"] == 1
    # the duration is billed with AWS's round trip for the handler's SQS call in place of the emulator's
    assert invocation.usage["measured.aws_calls.sqs"] == 1
    billed_ms = modelled_duration_ms(invocation.duration_ms, invocation.usage, aws_call_latency_ms())
    assert billed_ms >= aws_call_latency_ms()["sqs"]
    billed = usage["lambda.gb_seconds"] - after_init["lambda.gb_seconds"]
    assert billed == pytest.approx(gb_seconds(billed_ms, 512))
    measured = usage["measured.lambda_gb_seconds"] - after_init["measured.lambda_gb_seconds"]
    assert measured == pytest.approx(gb_seconds(invocation.duration_ms, 512))
    assert usage["sqs.standard_requests"] == 1  # ten messages in one batch
    assert usage["logs.ingested_bytes"] >= logged


def test_a_pool_stopped_shuts_its_environments_down_with_sigterm_and_bills_what_that_asks(
    aws: EmbeddedAws,
) -> None:
    sqs = aws.client("sqs", counted=False)
    url = sqs.create_queue(QueueName="pricing-shutdown")["QueueUrl"]
    pool = _pool(aws, "shutdown")
    try:
        assert pool.invoke({"queue_url": url}).ok
        assert "sqs.standard_requests" not in pool.usage
    finally:
        pool.stop()

    received = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert [message["Body"] for message in received] == ["flushed at shutdown"]
    assert pool.usage["sqs.standard_requests"] == 1  # the shutdown's request, billed to the function
