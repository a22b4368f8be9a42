"""The redrive function with the ordered workload on: it knows the FIFO DLQs and may move them back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.infrastructure.conftest import Synth
from tests.infrastructure.test_foundation import _as_list, _env, _statements

pytestmark = pytest.mark.slow


def _redrive_statements(synth: Synth) -> list[dict[str, Any]]:
    role_id = synth.logical_id(synth.breakwater.control.redrive.role)
    return [
        statement
        for policy in synth.of_type("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in _statements(policy)
    ]


def _granted(statements: list[dict[str, Any]], action: str) -> set[str]:
    """Logical ids of the resources ``action`` is allowed on."""
    return {
        arn["Fn::GetAtt"][0]
        for statement in statements
        if action in _as_list(statement["Action"])
        for arn in _as_list(statement["Resource"])
        if isinstance(arn, dict) and "Fn::GetAtt" in arn
    }


def test_redrive_pairs_every_dlq_with_its_source_fifo_ones_included(ordered_synth: Synth) -> None:
    synth = ordered_synth
    assert synth.breakwater.ordered is not None
    pairs = json.dumps(_env(synth, synth.breakwater.control.redrive)["REDRIVE_PAIRS"])
    for pair in [*synth.breakwater.queues.all, *synth.breakwater.ordered.queues]:
        expected = json.dumps(
            [{"Ref": synth.logical_id(pair.dlq)}, '":"', {"Ref": synth.logical_id(pair.queue)}]
        )
        assert expected[1:-1] in pairs, pair.role


def test_redrive_may_move_the_fifo_dlqs_back_to_their_own_queues(ordered_synth: Synth) -> None:
    synth = ordered_synth
    assert synth.breakwater.ordered is not None
    statements = _redrive_statements(synth)
    fifo_dlqs = {synth.logical_id(pair.dlq) for pair in synth.breakwater.ordered.queues}
    fifo_queues = {synth.logical_id(pair.queue) for pair in synth.breakwater.ordered.queues}
    assert not _granted(statements, "sqs:StartMessageMoveTask")  # moved by hand, each message marked
    assert fifo_dlqs <= _granted(statements, "sqs:ReceiveMessage")
    assert fifo_dlqs <= _granted(statements, "sqs:DeleteMessage")
    assert fifo_queues <= _granted(statements, "sqs:SendMessage")
    assert not fifo_queues & _granted(statements, "sqs:ReceiveMessage")  # sends to the queue, never reads it
