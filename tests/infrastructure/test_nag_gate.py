"""The synth fails on an unacknowledged cdk-nag error: the gate `make synth` / `make test` relies on."""

from __future__ import annotations

from pathlib import Path

import pytest
from aws_cdk import Stack
from aws_cdk import aws_sqs as sqs

from app import DEFAULT_STAGE, build_app, stack_id

pytestmark = pytest.mark.slow


def test_an_unacknowledged_nag_error_fails_the_synth(tmp_path: Path) -> None:
    app = build_app(
        {"breakwater": {"queue_set": {"size": 1, "shard_size": 1}}},
        outdir=str(tmp_path),
        stages=[DEFAULT_STAGE],
    )
    # A queue a fork might add carelessly: no DLQ, no TLS-only policy.
    stack = app.node.find_child(stack_id(DEFAULT_STAGE))
    assert isinstance(stack, Stack)
    sqs.Queue(stack, "CarelessQueue")
    with pytest.raises(RuntimeError) as error:
        app.synth()
    message = str(error.value)
    assert "ValidationFailed" in message
    assert "AwsSolutions-SQS4" in message
    assert "CarelessQueue" in message
