"""Failing processor -> retries -> DLQ -> redrive back after the fix; the fallback never duplicates."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from breakwater import processor
from breakwater.aws.redrive import RedriveMarkers, move_by_hand, start_move_task
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import STATE_TABLE, WorkerWorld, load, make_envelope

world = worker_fixtures.world  # the fixture


def test_failing_message_goes_to_the_dlq_and_is_redriven_after_the_fix(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = {"on": True}

    def sometimes_broken(envelope: Any, work: Any) -> dict[str, Any]:
        if broken["on"]:
            raise RuntimeError("bug")
        return {}

    monkeypatch.setattr(processor, "process", sometimes_broken)
    envelope = make_envelope("acme")
    world.send("live-0", envelope)
    worker = load(monkeypatch, "worker.handler", world.environment())

    for _ in range(2):  # maxReceiveCount = 2
        response, received = world.deliver(worker, "live-0", requeue_failures=True)
        assert len(received) == 1 and len(response["batchItemFailures"]) == 1
    _, received = world.deliver(worker, "live-0")  # the third receive dead-letters it
    assert received == []
    assert world.depth("live-0", dlq=True)["Visible"] == 1

    broken["on"] = False
    pairs = json.dumps({world.dlqs["live-0"]: world.urls["live-0"]})
    redrive = load(monkeypatch, "redrive.handler", {"REDRIVE_PAIRS": pairs, "STATE_TABLE_NAME": STATE_TABLE})
    result = redrive.handler({}, worker_fixtures.FakeLambdaContext())

    assert [(r["method"], r["moved"], r["failed"]) for r in result["results"]] == [("fallback", 1, 0)]
    assert world.depth("live-0", dlq=True)["Visible"] == 0
    response, received = world.deliver(worker, "live-0")
    assert [m["Body"] for m in received] == [envelope.to_json()]
    assert response == {"batchItemFailures": []}
    assert world.item("tenant#acme", "counters")["processed"] == 1


def test_moto_has_no_move_task_so_the_fallback_runs(world: WorkerWorld) -> None:
    assert start_move_task(world.sqs, world.dlqs["live-0"], world.urls["live-0"]) is None


class DeleteFailsOnce:
    """The SQS client, except that the first DeleteMessageBatch is lost (as if the process died)."""

    def __init__(self, sqs: Any) -> None:
        self._sqs = sqs
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sqs, name)

    def delete_message_batch(self, **kwargs: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise ConnectionError("lost")
        return self._sqs.delete_message_batch(**kwargs)


def test_a_lost_delete_does_not_send_the_message_twice(world: WorkerWorld) -> None:
    dlq, source = world.dlqs["live-0"], world.urls["live-0"]
    envelope = make_envelope("acme")
    world.sqs.send_message(QueueUrl=dlq, MessageBody=envelope.to_json())
    markers = RedriveMarkers(world.dynamodb, STATE_TABLE, dlq)
    flaky = DeleteFailsOnce(world.sqs)

    with pytest.raises(ConnectionError):
        move_by_hand(flaky, dlq, source, markers=markers, visibility_timeout=0)
    result = move_by_hand(flaky, dlq, source, markers=markers)

    assert (result.moved, result.already_moved) == (0, 1)
    assert world.depth("live-0", dlq=True)["Visible"] == 0
    assert [e.id for e in world.bodies("live-0")] == [envelope.id]


def _bin_redrive() -> Any:
    path = Path(__file__).resolve().parents[2] / "bin" / "redrive"
    loader = importlib.machinery.SourceFileLoader("bin_redrive", str(path))
    spec = importlib.util.spec_from_loader("bin_redrive", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_bin_redrive_moves_one_pair_from_this_machine(
    world: WorkerWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    dlq, source = world.dlqs["live-0"], world.urls["live-0"]
    envelope = make_envelope("acme")
    world.sqs.send_message(QueueUrl=dlq, MessageBody=envelope.to_json())

    code = _bin_redrive().main(["--dlq-url", dlq, "--source-url", source, "--state-table", STATE_TABLE])

    assert code == 0
    assert json.loads(capsys.readouterr().out)["moved"] == 1
    assert [e.id for e in world.bodies("live-0")] == [envelope.id]
