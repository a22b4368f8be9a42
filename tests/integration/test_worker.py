"""The worker against moto: every decision ends in the right queue, failures are reported exactly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from breakwater import processor
from breakwater.aws.redrive import move_by_hand
from breakwater.backlog import COUNTER_NAMES, raw_backlog
from breakwater.envelope import Origin
from breakwater.processor import WorkContext
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import (
    MAX_RECEIVE_COUNT,
    STATE_TABLE,
    WorkerWorld,
    add_tenant,
    floor_slot,
    lease_holders,
    load,
    make_envelope,
    now_ms,
)

world = worker_fixtures.world  # the fixture

FAR = 10**13


def hold_concurrency(world: WorkerWorld, tenant: str) -> None:
    """Another container holds the tenant's only slot."""
    world.put(
        {
            "pk": {"S": f"tenant#{tenant}"},
            "sk": {"S": "counters"},
            "leases": {"M": {"#0": floor_slot("other", FAR)}},
            "version": {"N": "1"},
        }
    )


def counts(world: WorkerWorld, tenant: str) -> dict[str, int]:
    """The tenant's counters (its counters item also holds the controller's attributes and the leases),
    those at zero left out (a count written ahead and taken back, a failed message's ``processed``)."""
    item = world.item(f"tenant#{tenant}", "counters")
    return {name: int(value) for name, value in item.items() if name in COUNTER_NAMES and int(value)}


def empty_consumer_bucket(world: WorkerWorld, tenant: str) -> None:
    """An empty consumer bucket where a tenant of one lease shard keeps it: on its counters item."""
    world.dynamodb.update_item(
        TableName=STATE_TABLE,
        Key={"pk": {"S": f"tenant#{tenant}"}, "sk": {"S": "counters"}},
        UpdateExpression="SET consumer_tokens = :zero, consumer_updated_at = :now, consumer_version = :one",
        ExpressionAttributeValues={
            ":zero": {"N": "0"},
            ":now": {"N": str(now_ms() / 1000)},
            ":one": {"N": "1"},
        },
    )


def test_a_batch_with_one_message_of_each_kind_ends_in_the_right_queues(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_tenant("spilly", "tiny")
    add_tenant("busy", "tiny")
    empty_consumer_bucket(world, "spilly")
    hold_concurrency(world, "busy")
    world.put({"pk": {"S": "tenant#swept"}, "sk": {"S": "sweep"}, "swept_at": {"N": str(now_ms() + 60_000)}})
    fresh = make_envelope("acme")
    expired = make_envelope("acme", expires_at=now_ms() - 1)
    swept = make_envelope("swept")
    old = make_envelope("acme", age_ms=301_000)
    spilled = make_envelope("spilly")
    deferred = make_envelope("busy")
    for envelope in (fresh, expired, swept, old, spilled, deferred):
        world.send("live-0", envelope)
    handler = load(monkeypatch, "worker.handler", world.environment())

    response, received = world.deliver(handler, "live-0")

    assert len(received) == 6
    assert response == {"batchItemFailures": []}
    assert world.depth("live-0") == {"Visible": 0, "NotVisible": 0, "Delayed": 0}
    assert world.depth("surge")["Delayed"] == 1  # deferred with DelaySeconds
    backlog, spillover, surge = world.bodies("backlog"), world.bodies("spillover"), world.bodies("surge")
    assert [(e.id, e.origin) for e in backlog] == [(old.id, Origin.BACKLOG)]
    assert [(e.id, e.origin) for e in spillover] == [(spilled.id, Origin.SPILLOVER)]
    assert [(e.id, e.origin, e.attempt) for e in surge] == [(deferred.id, Origin.SURGE, 1)]
    assert counts(world, "acme") == {"processed": 1, "dropped": 1, "sidelined": 1}
    assert world.item("tenant#swept", "counters")["dropped"] == 1
    assert world.item("tenant#busy", "counters")["deferred"] == 1
    assert world.item("tenant#spilly", "counters")["spilled"] == 1
    health = world.item("queue#live", "health")
    assert health["oldest_age_ms"] >= 301_000
    # the other container's lease is untouched; ours was released
    assert lease_holders(world.item("tenant#busy", "counters")["leases"]) == {"other"}
    assert world.dynamodb.scan(TableName="bw-idempotency")["Count"] == 1


def test_partial_batch_failures_report_exactly_the_failed_ids(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    def flaky(envelope: Any, work: WorkContext) -> dict[str, Any]:
        if envelope.payload.get("fail"):
            raise RuntimeError("boom")
        return {}

    monkeypatch.setattr(processor, "process", flaky)
    add_tenant("spilly", "tiny")
    empty_consumer_bucket(world, "spilly")
    good = [make_envelope("acme") for _ in range(3)]
    bad = [make_envelope("acme", payload={"fail": True}) for _ in range(2)]
    unmovable = make_envelope("spilly")  # its move target does not exist: the move fails
    for envelope in (*good, *bad, unmovable):
        world.send("live-0", envelope)
    environment = world.environment(spillover_queue_url=world.urls["spillover"] + "-missing")
    handler = load(monkeypatch, "worker.handler", environment)

    response, received = world.deliver(handler, "live-0")

    by_envelope = {message["MessageId"]: message["Body"] for message in received}
    failed_bodies = {by_envelope[item["itemIdentifier"]] for item in response["batchItemFailures"]}
    assert failed_bodies == {envelope.to_json() for envelope in (*bad, unmovable)}
    assert len(response["batchItemFailures"]) == 3
    assert world.item("tenant#acme", "counters")["failed"] == 2
    assert world.item("tenant#spilly", "counters")["failed"] == 1


def test_a_processed_envelope_is_not_processed_again(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def counting(envelope: Any, work: WorkContext) -> dict[str, Any]:
        calls.append(envelope.id)
        return {"ok": True}

    monkeypatch.setattr(processor, "process", counting)
    envelope = make_envelope("acme")
    world.send("live-0", envelope)
    world.send("live-0", envelope)  # an at-least-once duplicate
    handler = load(monkeypatch, "worker.handler", world.environment())

    response, received = world.deliver(handler, "live-0")

    assert len(received) == 2 and response == {"batchItemFailures": []}
    assert calls == [envelope.id]


def test_sideline_mode_drains_the_backlog_without_sidelining_again(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_tenant("busy", "tiny")
    hold_concurrency(world, "busy")
    old = make_envelope("acme", age_ms=3_600_000, origin="backlog")
    blocked = make_envelope("busy", age_ms=3_600_000, origin="backlog")
    world.send("backlog", old)
    world.send("backlog", blocked)
    handler = load(monkeypatch, "worker.handler", world.environment(mode="sideline"))

    response, _ = world.deliver(handler, "backlog")

    assert response == {"batchItemFailures": []}
    assert world.item("tenant#acme", "counters")["processed"] == 1
    assert [(e.id, e.origin, e.attempt) for e in world.bodies("backlog")] == [(blocked.id, Origin.BACKLOG, 1)]


def test_naive_baseline_processes_old_and_limited_messages(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_tenant("busy", "tiny")
    hold_concurrency(world, "busy")
    for envelope in (make_envelope("acme", age_ms=10**7), make_envelope("busy")):
        world.send("live-0", envelope)
    handler = load(monkeypatch, "worker.handler", world.environment(sidelining_enabled="false"))

    response, _ = world.deliver(handler, "live-0")

    assert response == {"batchItemFailures": []}
    assert world.item("tenant#acme", "counters")["processed"] == 1
    assert world.item("tenant#busy", "counters")["processed"] == 1
    assert world.depth("backlog")["Visible"] == 0 and world.depth("surge")["Delayed"] == 0


def test_first_attempt_ages_per_tenant_are_an_emf_property(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per-tenant ages: a property of the blob beside AgeOfFirstAttempt; QueueRole stays the dimension."""
    import json

    for tenant, age in (("acme", 1_000), ("acme", 2_000), ("globex", 3_000)):
        world.send("live-0", make_envelope(tenant, age_ms=age))
    handler = load(monkeypatch, "worker.handler", world.environment())
    capsys.readouterr()
    world.deliver(handler, "live-0")
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    (blob,) = [b for b in blobs if "AgeOfFirstAttempt" in b]
    by_tenant = blob["AgeOfFirstAttemptByTenant"]
    assert set(by_tenant) == {"acme", "globex"}
    assert len(by_tenant["acme"]) == 2 and len(by_tenant["globex"]) == 1
    assert sorted(a for ages in by_tenant.values() for a in ages) == sorted(blob["AgeOfFirstAttempt"])
    assert min(by_tenant["acme"]) >= 1_000 and by_tenant["globex"][0] >= 3_000
    assert all("tenant" not in dims for dims in blob["_aws"]["CloudWatchMetrics"][0]["Dimensions"])


def test_a_replayed_envelope_gives_back_what_its_archiving_counted(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The archiver counted it ``archived``; finished after a replay it counts ``replayed`` too, so the
    # tenant's backlog estimate is not reduced twice. A fresh envelope counts only ``processed``.
    world.send("live-0", make_envelope("acme", origin="replay", replay_run="run-1"))
    world.send("live-0", make_envelope("acme"))
    world.send("live-0", make_envelope("acme", origin="replay", replay_run="run-1", expires_at=1))
    handler = load(monkeypatch, "worker.handler", world.environment())

    response, _ = world.deliver(handler, "live-0")

    assert response == {"batchItemFailures": []}
    counters = world.item("tenant#acme", "counters")
    assert (counters["processed"], counters["dropped"], counters["replayed"]) == (2, 1, 2)


def test_the_worker_handler_does_not_import_every_powertools_parser_model(world: WorkerWorld) -> None:
    """worker/handler.py's import order keeps Powertools' batch module from loading them."""
    functions = Path(__file__).resolve().parents[2] / "functions"
    code = (
        "import sys, worker.handler\n"
        "print(sorted(m for m in sys.modules if m.startswith('aws_lambda_powertools.utilities.parser')))"
    )
    done = subprocess.run(  # noqa: S603 - our interpreter, our snippet
        [sys.executable, "-c", code],
        env={**os.environ, **world.environment(), "PYTHONPATH": str(functions)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_a_batch_takes_its_tenant_s_consumer_tokens_and_floor_lease_in_one_write(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_tenant("slow", "slow")  # consumer rate 3/s, burst 3
    envelopes = [make_envelope("slow") for _ in range(5)]
    for envelope in envelopes:
        world.send("live-0", envelope)
    # the tenant's counters item as ingest leaves it, with the map its leases go in
    world.dynamodb.update_item(
        TableName=STATE_TABLE,
        Key={"pk": {"S": "tenant#slow"}, "sk": {"S": "counters"}},
        UpdateExpression="SET leases = :none ADD accepted :five",
        ExpressionAttributeValues={":none": {"M": {}}, ":five": {"N": "5"}},
    )
    handler = load(monkeypatch, "worker.handler", world.environment())
    writes: list[str] = []

    def count(params: dict[str, Any], **_: Any) -> None:
        assert params["Key"]["sk"]["S"] != "bucket#consumer"  # kept on the counters item
        if params["Key"] == {"pk": {"S": "tenant#slow"}, "sk": {"S": "counters"}}:
            writes.append(params["UpdateExpression"])

    handler.worker.ports.rate._client.meta.events.register("provide-client-params.dynamodb.UpdateItem", count)

    response, received = world.deliver(handler, "live-0")

    assert len(received) == 5 and response == {"batchItemFailures": []}
    # the batch's three tokens in one lease (not one write per message), and the floor lease in it
    taking = [update for update in writes if "#tok" in update]
    assert len(taking) == 1 and "leases.#slot = :lease" in taking[0]
    # then only the release with the counters: two writes of the tenant's item for the whole batch
    assert len(writes) == 2 and "REMOVE leases.#h" in writes[1]
    # the first three (record order) are processed, the other two are over the rate and spill
    assert world.item("tenant#slow", "counters")["processed"] == 3
    assert sorted(e.id for e in world.bodies("spillover")) == sorted(e.id for e in envelopes[3:])


def values(blob: dict[str, Any], name: str) -> list[float]:
    """A metric's values in an EMF blob (one value is written bare, several as a list)."""
    value = blob.get(name, [])
    return list(value) if isinstance(value, list) else [value]


def test_replayed_work_leaves_the_live_age_metric_and_health_report_untouched(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replay's ages run from the first enqueue: under the live dimension they fired the live p99
    alarm, and in the live health report they turned the sideline drainers off."""
    import json

    three_days = 3 * 86_400_000
    world.send("live-0", make_envelope("acme", age_ms=three_days, origin="replay", replay_run="run-1"))
    handler = load(monkeypatch, "worker.handler", world.environment())
    capsys.readouterr()

    response, _ = world.deliver(handler, "live-0")

    assert response == {"batchItemFailures": []}
    assert world.item("queue#live", "health") == {}  # no live health report at all
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert [blob["QueueRole"] for blob in blobs] == ["replay"]
    assert min(values(blobs[0], "AgeOfFirstAttempt")) >= three_days
    assert values(blobs[0], "Processed") == [1]

    world.send("live-0", make_envelope("acme", age_ms=2_000))
    world.send("live-0", make_envelope("acme", age_ms=three_days, origin="replay", replay_run="run-1"))
    world.deliver(handler, "live-0")

    health = world.item("queue#live", "health")
    assert 2_000 <= health["oldest_age_ms"] < three_days  # the live message's age, not the replay's
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    by_role = {blob["QueueRole"]: blob for blob in blobs}
    assert set(by_role) == {"live", "replay"}
    assert [age < three_days for age in values(by_role["live"], "AgeOfFirstAttempt")] == [True]
    assert [age >= three_days for age in values(by_role["replay"], "AgeOfFirstAttempt")] == [True]


def test_a_message_that_fails_on_its_last_receive_leaves_the_estimate_with_it(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(envelope: Any, work: WorkContext) -> dict[str, Any]:
        raise RuntimeError("bug")

    monkeypatch.setattr(processor, "process", broken)
    world.send("live-0", make_envelope("acme"))
    handler = load(monkeypatch, "worker.handler", world.environment())

    for receive in range(1, MAX_RECEIVE_COUNT + 1):
        response, received = world.deliver(handler, "live-0", requeue_failures=True)
        assert received[0]["Attributes"]["ApproximateReceiveCount"] == str(receive)
        assert len(response["batchItemFailures"]) == 1
        dead_lettered = counts(world, "acme").get("dead_lettered", 0)
        assert dead_lettered == (1 if receive == MAX_RECEIVE_COUNT else 0)

    assert world.deliver(handler, "live-0")[1] == []  # SQS moved it on this receive
    assert world.depth("live-0", dlq=True)["Visible"] == 1
    assert counts(world, "acme") == {"failed": MAX_RECEIVE_COUNT, "dead_lettered": 1}


def test_counters_the_state_table_refused_are_written_with_the_next_batch(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(2):
        world.send("live-0", make_envelope("acme"))
    handler = load(monkeypatch, "worker.handler", world.environment())
    client = handler.worker.ports.rate._client
    refusals = {"UpdateItem": 1}  # the batch's counters

    def refuse_counters(params: dict[str, Any], model: Any, **_: Any) -> None:
        adds_counters = "writes :one" in params.get("UpdateExpression", "")
        if adds_counters and params["Key"]["sk"]["S"] == "counters" and refusals[model.name] > 0:
            refusals[model.name] -= 1
            raise ClientError({"Error": {"Code": "ThrottlingException"}}, model.name)

    for operation in refusals:
        client.meta.events.register(f"provide-client-params.dynamodb.{operation}", refuse_counters)

    response, received = world.deliver(handler, "live-0")

    assert len(received) == 2 and response == {"batchItemFailures": []}
    assert refusals == {"UpdateItem": 0}
    assert counts(world, "acme") == {}
    # the lease goes back with the counters: refused with them, it is left to expire (or to be renewed)
    assert len(world.item("tenant#acme", "counters")["leases"]) == 1

    world.send("live-0", make_envelope("acme"))
    world.deliver(handler, "live-0")  # the same container

    # the kept ones rode on the next batch's floor write (or went with its release)
    assert counts(world, "acme") == {"processed": 3}


def breakable(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """A processor that fails while the switch returned is on (the bug), and succeeds once it is off."""
    broken = {"on": True}

    def sometimes_broken(envelope: Any, work: WorkContext) -> dict[str, Any]:
        if broken["on"]:
            raise RuntimeError("bug")
        return {}

    monkeypatch.setattr(processor, "process", sometimes_broken)
    return broken


def test_work_the_redrive_brings_back_is_counted_back_and_measured_apart(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    broken = breakable(monkeypatch)
    world.send("live-0", make_envelope("acme", age_ms=1_000))
    handler = load(monkeypatch, "worker.handler", world.environment())
    for _ in range(MAX_RECEIVE_COUNT):
        world.deliver(handler, "live-0", requeue_failures=True)
    assert world.deliver(handler, "live-0")[1] == []  # in the dead-letter queue now
    assert counts(world, "acme") == {"failed": MAX_RECEIVE_COUNT, "dead_lettered": 1}

    broken["on"] = False  # the fix; then the redrive by hand, which marks what it moves
    assert move_by_hand(world.sqs, world.dlqs["live-0"], world.urls["live-0"]).moved == 1
    capsys.readouterr()
    response, received = world.deliver(handler, "live-0")
    handler.worker.flush_kept_counters(force=True)  # as at shutdown: those a lapsed lease's batch kept

    assert len(received) == 1 and response == {"batchItemFailures": []}
    counters = counts(world, "acme")
    assert counters == {"failed": MAX_RECEIVE_COUNT, "dead_lettered": 1, "redriven": 1, "processed": 1}
    assert raw_backlog({**counters, "accepted": 1}) == 0  # it left the estimate once, with its processing
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert [(blob["QueueRole"], values(blob, "Processed")) for blob in blobs] == [("redrive", [1])]


def test_a_message_moved_between_failures_still_reaches_a_dead_letter_queue_and_is_redriven_once(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQS counts one queue's receives: the worker counts those the message failed before its move."""
    broken = breakable(monkeypatch)
    world.send("live-0", make_envelope("acme"))
    handler = load(monkeypatch, "worker.handler", world.environment(defer_base_seconds=1))
    world.deliver(handler, "live-0", requeue_failures=True)  # fails on its first receive
    leases = {f"other-{i}": {"M": {"exp": {"N": str(FAR)}, "burst": {"BOOL": True}}} for i in range(1, 4)}
    leases["#0"] = floor_slot("other-0", FAR)
    world.put(
        {
            "pk": {"S": "tenant#acme"},
            "sk": {"S": "counters"},
            "leases": {"M": leases},  # other containers hold every slot of its tier
            "version": {"N": "1"},
            **{name: {"N": str(value)} for name, value in counts(world, "acme").items()},
        }
    )
    world.deliver(handler, "live-0")  # over its concurrency on the second: deferred to surge
    assert [body.failed_receives for body in world.bodies("surge")] == [MAX_RECEIVE_COUNT - 1]
    world.dynamodb.update_item(
        TableName=worker_fixtures.STATE_TABLE,
        Key={"pk": {"S": "tenant#acme"}, "sk": {"S": "counters"}},
        UpdateExpression="REMOVE leases.#a, leases.#b, leases.#c, leases.#d",
        ExpressionAttributeNames={f"#{k}": f"other-{i}" if i else "#0" for i, k in enumerate("abcd")},
    )

    deadline = time.monotonic() + 10
    while not (received := world.deliver(handler, "surge")[1]) and time.monotonic() < deadline:
        time.sleep(0.2)  # the deferral's delay
    assert received[0]["Attributes"]["ApproximateReceiveCount"] == "1"

    assert world.depth("surge", dlq=True)["Visible"] == 1  # its second failure: out, by the worker
    assert world.depth("surge")["Visible"] + world.depth("surge")["NotVisible"] == 0
    handler.worker.flush_kept_counters(force=True)  # as at shutdown: those a lapsed lease's batch kept
    assert counts(world, "acme") == {"failed": 2, "deferred": 1, "dead_lettered": 1}

    broken["on"] = False
    assert move_by_hand(world.sqs, world.dlqs["surge"], world.urls["surge"]).moved == 1
    response, received = world.deliver(handler, "surge")
    assert len(received) == 1 and response == {"batchItemFailures": []}
    handler.worker.flush_kept_counters(force=True)
    counters = counts(world, "acme")
    assert counters == {"failed": 2, "deferred": 1, "dead_lettered": 1, "redriven": 1, "processed": 1}
    assert raw_backlog({**counters, "accepted": 1}) == 0
