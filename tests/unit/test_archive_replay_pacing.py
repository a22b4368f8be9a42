"""The replay's pacing and send batching (glue_jobs/replay_save.py), with a fake clock and a fake SQS."""

from __future__ import annotations

import json
from typing import Any

import pytest

from glue_jobs.replay_save import Pacer, PartitionSender, SendOptions, envelope_body


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeSqs:
    def __init__(self, clock: FakeClock, fail_ids: set[str] | None = None) -> None:
        self.clock, self.fail_ids = clock, fail_ids or set()
        self.sent: list[tuple[float, str, dict[str, Any]]] = []

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
        ok = [e for e in Entries if json.loads(e["MessageBody"])["id"] not in self.fail_ids]
        self.sent.extend((self.clock.now, QueueUrl, e) for e in ok)
        failed = [{"Id": e["Id"], "SenderFault": True} for e in Entries if e not in ok]
        return {"Successful": [{"Id": e["Id"]} for e in ok], "Failed": failed}

    def get_queue_attributes(self, **_: Any) -> dict[str, Any]:
        return {"Attributes": {"ApproximateNumberOfMessages": "0"}}


def _row(n: int, tenant: str = "acme") -> dict[str, Any]:
    return {
        "v": 1, "id": f"{n:026d}", "tenant": tenant, "type": "t", "payload": '{"n":' + str(n) + "}",
        "request_id": None, "trace_id": None, "enqueued_at": n, "expires_at": None, "dedup_key": None,
        "ordering_key": None, "attempt": 0, "origin": "backlog", "replay_run": None,
    }  # fmt: skip


def test_pacer_holds_the_rate() -> None:
    clock = FakeClock()
    pacer = Pacer(50, clock=clock, sleep=clock.sleep)
    for _ in range(100):
        pacer.wait_for(10)
    assert clock.now == pytest.approx(99 * 10 / 50)  # 1000 messages at 50/s: the last batch at 19.8 s


def test_pacer_catches_up_after_a_slow_call_but_never_bursts_more_than_a_second() -> None:
    clock = FakeClock()
    pacer = Pacer(10, clock=clock, sleep=clock.sleep, catch_up=1.0)
    pacer.wait_for(1)
    clock.now += 5.0  # one call took five seconds
    sleeps_before = clock.now
    for _ in range(11):
        pacer.wait_for(1)  # this slot plus one second of catch-up (ten) go out without waiting
    assert clock.now == sleeps_before
    pacer.wait_for(1)
    assert clock.now > sleeps_before  # then the schedule holds again


def test_sender_paces_batches_and_routes_like_ingest() -> None:
    clock = FakeClock()
    sqs = FakeSqs(clock)
    options = SendOptions(
        queue_urls=("q0", "q1", "q2"), shard_size=2, rate_per_task=100, run_id="r", failures_path=""
    )
    sender = PartitionSender(options, sqs, Pacer(100, clock=clock, sleep=clock.sleep), clock=clock)
    sender.send_all(_row(n, tenant=f"t{n % 4}") for n in range(400))

    assert sender.sent == 400 and not sender.failed_bodies
    assert 400 / clock.now == pytest.approx(100, rel=0.05)
    bodies = [json.loads(entry["MessageBody"]) for _, _, entry in sqs.sent]
    assert {(b["origin"], b["replay_run"]) for b in bodies} == {("replay", "r")}
    assert bodies[0]["payload"] == {"n": bodies[0]["enqueued_at"]}  # JSON again, not a string
    assert all(
        entry["MessageGroupId"] == json.loads(entry["MessageBody"])["tenant"] for _, _, entry in sqs.sent
    )


def test_failed_entries_keep_the_original_envelope() -> None:
    clock = FakeClock()
    sqs = FakeSqs(clock, fail_ids={f"{3:026d}"})
    options = SendOptions(queue_urls=("q0",), shard_size=1, rate_per_task=1000, run_id="r", failures_path="")
    sender = PartitionSender(options, sqs, Pacer(1000, clock=clock, sleep=clock.sleep), clock=clock)
    sender.send_all(_row(n) for n in range(5))
    assert sender.sent == 4
    (failed,) = sender.failed_bodies
    assert json.loads(failed)["origin"] == "backlog" and json.loads(failed)["replay_run"] is None


def test_envelope_body_round_trips_the_fields() -> None:
    replayed, original = envelope_body(_row(7), "run-1")
    assert json.loads(original)["payload"] == {"n": 7}
    assert {k: v for k, v in json.loads(replayed).items() if k not in {"origin", "replay_run"}} == {
        k: v for k, v in json.loads(original).items() if k not in {"origin", "replay_run"}
    }


def test_partition_rates_hold_the_target_when_one_partition_is_huge() -> None:
    from glue_jobs.replay_save import partition_rates

    counts = [620, 130, 120, 130]  # the noisy tenant's partition first, 2 slots
    rates = partition_rates(counts, 500, slots=2)
    # Spark's schedule: partition 0 alone on one slot, 1-3 one after another on the other.
    assert rates[0] == pytest.approx(500 * 0.62)
    assert rates[1:] == pytest.approx([500 * 0.38] * 3)
    # Both slots end together, at rows / target: the run as a whole sends at the target.
    assert counts[0] / rates[0] == pytest.approx(sum(counts[1:]) / rates[1]) == pytest.approx(1000 / 500)


def test_partition_rates_equal_shares_and_edge_cases() -> None:
    from glue_jobs.replay_save import partition_rates

    assert partition_rates([100] * 4, 200, slots=2) == pytest.approx([100] * 4)
    assert partition_rates([0, 0], 200, slots=2) == pytest.approx([100, 100])
    assert all(rate > 0 for rate in partition_rates([50, 0, 0, 0], 200, slots=2))
    assert partition_rates([30, 70], 100, slots=4) == pytest.approx([30, 70])
