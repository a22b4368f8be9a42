"""The FIFO worker's batch, pure: groups stop on a failure, an outage holds instead of failing, the
hold's length, and the held messages' early return when a probe closes the breaker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from breakwater.breaker import CircuitBreaker
from breakwater.envelope import Envelope, new_envelope_id
from breakwater.fifo_batch import (
    MAX_HOLD_S,
    FifoBatchWorker,
    FifoRecord,
    HeldMessage,
    OutageHolds,
    VisibilityPort,
)
from breakwater.fifo_consumer import FifoConsumer
from breakwater.processor import DependencyUnavailableError
from tests.unit.test_ordered_policy import FakeStore

QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/breakwater-ordered-0.fifo"


@dataclass
class Visibility(VisibilityPort):
    """The visibility port in memory: what was held for how long, and what failed to be."""

    calls: list[tuple[list[str], int]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)

    def hold(self, messages: Sequence[HeldMessage], seconds: int) -> list[HeldMessage]:
        self.calls.append(([each.receipt_handle for each in messages], seconds))
        return [each for each in messages if each.receipt_handle in self.refuse]


@dataclass
class Downstream:
    down: bool = False
    broken: set[str] = field(default_factory=set)  # labels that fail as bad messages
    done: list[str] = field(default_factory=list)

    def __call__(self, envelope: Envelope) -> None:
        label = f"{envelope.ordering_key}{envelope.payload['seq']}"
        if self.down:
            raise DependencyUnavailableError("connection refused")
        if label in self.broken:
            raise ValueError(f"{label} is malformed")
        self.done.append(label)


def _record(key: str, seq: int, receives: int = 1) -> FifoRecord:
    envelope = Envelope(
        id=new_envelope_id(), tenant="acme", type="t", payload={"seq": seq}, enqueued_at=1, ordering_key=key
    )
    label = f"{key}{seq}"
    return FifoRecord(
        message_id=label,
        receipt_handle=f"rh-{label}",
        queue_url=QUEUE,
        group_id=f"acme:{key}",
        receive_count=receives,
        body=envelope.to_json(),
    )


@dataclass
class Clock:
    now: float = 1_000.0


def _worker(
    downstream: Downstream, visibility: Visibility, clock: Clock, *, breaker: bool = True
) -> FifoBatchWorker:
    return FifoBatchWorker(
        FifoConsumer(FakeStore(), downstream),
        visibility=visibility,
        monotonic=lambda: clock.now,
        clock_ms=lambda: int(clock.now * 1000),
        breaker=CircuitBreaker(base_s=5, max_s=60) if breaker else None,
        holds=OutageHolds(base_s=5, max_s=60, max_receive_count=5, last_hold_s=900) if breaker else None,
    )


def test_a_bad_message_fails_its_group_in_order_while_others_go_on() -> None:
    downstream, visibility = Downstream(broken={"A1"}), Visibility()
    worker = _worker(downstream, visibility, Clock())
    report = worker.handle([_record("A", 1), _record("B", 1), _record("A", 2), _record("B", 2)])
    assert report.failures == ["A1", "A2"] and downstream.done == ["B1", "B2"]
    assert report.failed == 1 and report.held == 0 and visibility.calls == []  # not an outage: no hold


def test_an_outage_holds_the_rest_of_the_batch_until_the_probe_and_fails_nothing() -> None:
    downstream, visibility, clock = Downstream(down=True), Visibility(), Clock()
    worker = _worker(downstream, visibility, clock)
    report = worker.handle([_record("A", 1), _record("B", 1), _record("A", 2)])
    assert report.failures == ["A1", "B1", "A2"]  # returned unprocessed, in record order
    assert (report.failed, report.held, report.outages) == (0, 3, 1)
    assert visibility.calls == [(["rh-A1", "rh-B1", "rh-A2"], 5)]
    # Still open: a later batch is held without calling the processor.
    downstream.down = False
    clock.now += 4
    report = worker.handle([_record("C", 1)])
    assert report.held == 1 and downstream.done == [] and visibility.calls[-1] == (["rh-C1"], 1)


def test_a_successful_probe_closes_the_breaker_and_returns_what_was_held() -> None:
    downstream, visibility, clock = Downstream(down=True), Visibility(refuse={"rh-B1"}), Clock()
    worker = _worker(downstream, visibility, clock)
    worker.handle([_record("A", 1), _record("B", 1)])
    downstream.down, clock.now = False, clock.now + 5
    report = worker.handle([_record("C", 1)])
    assert report.failures == [] and downstream.done == ["C1"]
    # A1 comes back at once; B1's hold had failed (it returns at the queue's visibility timeout).
    assert visibility.calls[-1] == (["rh-A1"], 0)
    assert worker.breaker is not None and worker.breaker.state(clock.now).value == "closed"


def test_without_a_breaker_an_outage_is_a_failure() -> None:
    downstream, visibility = Downstream(down=True), Visibility()
    report = _worker(downstream, visibility, Clock(), breaker=False).handle(
        [_record("A", 1), _record("A", 2)]
    )
    assert report.failures == ["A1", "A2"] and report.failed == 1 and visibility.calls == []


def test_the_hold_grows_with_the_receives_and_spares_the_last_ones() -> None:
    holds = OutageHolds(base_s=5, max_s=60, max_receive_count=5, last_hold_s=900)
    assert [holds.seconds(receives, 1) for receives in range(1, 7)] == [1, 5, 10, 900, 900, 900]
    assert holds.seconds(2, 30) == 30  # never shorter than the breaker's own wait
    assert OutageHolds(base_s=5, max_s=60).seconds(10, 1) == 60  # no redrive policy known: the back-off
    with pytest.raises(ValueError, match="last_hold_s"):
        OutageHolds(base_s=5, max_s=60, last_hold_s=MAX_HOLD_S + 1)
    with pytest.raises(ValueError, match="base_s"):
        OutageHolds(base_s=5, max_s=1)


def test_fifo_worker_settings_defaults_and_the_tenant_bound_default() -> None:
    from breakwater.settings import FifoWorkerSettings, OrderedIngestSettings, SettingsError

    base = {
        "WRITE_AHEAD_TABLE_NAME": "wa",
        "WRITE_AHEAD_LEASE_SECONDS": "90",
        "WRITE_AHEAD_RETENTION_SECONDS": "86400",
    }
    settings = FifoWorkerSettings.from_env(base)
    assert (settings.outage_backoff_seconds, settings.outage_backoff_max_seconds) == (5, 60)
    assert (settings.max_receive_count, settings.outage_last_hold_seconds) == (None, 900)
    with pytest.raises(SettingsError, match="OUTAGE_BACKOFF_MAX_SECONDS"):
        FifoWorkerSettings.from_env(
            base | {"OUTAGE_BACKOFF_SECONDS": "10", "OUTAGE_BACKOFF_MAX_SECONDS": "5"}
        )
    ingest = {"FIFO_QUEUE_URLS": "q", "MAX_PAYLOAD_BYTES": "1", "MAX_TTL_SECONDS": "1"}
    assert OrderedIngestSettings.from_env(ingest).tenant_backlog_limit is None
    bound = ingest | {"MAX_GROUP_BACKLOG": "7", "GROUP_BACKLOG_WINDOW_SECONDS": "60"}
    assert OrderedIngestSettings.from_env(bound).tenant_backlog_limit == 7
    assert OrderedIngestSettings.from_env(bound | {"MAX_TENANT_BACKLOG": "70"}).tenant_backlog_limit == 70
