"""Moves and redrives of large messages: each SendMessageBatch stays within SQS's summed size (and a
moved copy of redriven work keeps its mark).

moto refuses a batch whose messages add up to more than 1 MiB (``BatchRequestTooLong``), as SQS does;
ten large messages cut by count alone were one call that could never succeed.
"""

from __future__ import annotations

from breakwater.aws.moves import send_moves
from breakwater.aws.redrive import move_by_hand
from breakwater.envelope import REDRIVEN_COPY_ATTRIBUTE
from breakwater.sideline import Move
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import WorkerWorld

world = worker_fixtures.world  # the fixture

LARGE = 300 * 1024  # four of these pass the batch's summed limit, one is a valid message


def test_large_moves_are_all_sent(world: WorkerWorld) -> None:
    url = world.urls["spillover"]
    moves = [Move(key=f"m{i}", queue_url=url, body=str(i) * LARGE, group_id="acme") for i in range(10)]
    assert send_moves(world.sqs, moves) == set()
    assert world.depth("spillover")["Visible"] == 10


def test_large_dead_letters_are_all_redriven(world: WorkerWorld) -> None:
    dlq, source = world.dlqs["live-0"], world.urls["live-0"]
    for i in range(7):
        world.sqs.send_message(QueueUrl=dlq, MessageBody=str(i) * LARGE)
    result = move_by_hand(world.sqs, dlq, source)
    assert (result.moved, result.failed) == (7, 0)
    assert world.depth("live-0")["Visible"] == 7
    assert world.depth("live-0", dlq=True)["Visible"] == 0


def test_a_moved_copy_of_redriven_work_carries_its_mark(world: WorkerWorld) -> None:
    url = world.urls["surge"]
    moves = [
        Move(key="m0", queue_url=url, body="copy", redriven=True),
        Move(key="m1", queue_url=url, body="plain"),
    ]
    assert send_moves(world.sqs, moves) == set()
    received = {m["Body"]: m.get("MessageAttributes", {}) for m in world.receive(url)}
    assert set(received["copy"]) == {REDRIVEN_COPY_ATTRIBUTE} and received["plain"] == {}
