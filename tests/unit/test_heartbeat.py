"""Heartbeat timing with an injected clock: extend before the visibility lapses, cancel in time."""

from __future__ import annotations

import threading

import pytest

from breakwater.heartbeat import CancelReason, Heartbeat, HeartbeatMonitor, HeartbeatPlan


def plan(**overrides: float | None) -> HeartbeatPlan:
    values: dict[str, float | None] = {
        "visibility_timeout_s": 60,
        "heartbeat_s": 20,
        "started_at": 0.0,
        "lambda_deadline": 300.0,
        "message_deadline": None,
        "safety_margin_s": 2.0,
    }
    values.update(overrides)
    return HeartbeatPlan(**values)  # type: ignore[arg-type]


def test_extends_every_heartbeat_and_always_before_the_visibility_lapses() -> None:
    p = plan()
    assert p.next_extension_at(0) == 20
    assert p.next_extension_at(20) < p.lapses_at(0)
    short = plan(visibility_timeout_s=10, heartbeat_s=30)
    assert short.interval_s == 5  # at least twice per visibility timeout


def test_cancels_before_the_lambda_is_killed() -> None:
    p = plan(lambda_deadline=100)
    assert p.cancel_reason(97.9) is None
    assert p.cancel_reason(98.0) is CancelReason.LAMBDA_TIMEOUT
    assert p.cancel_at() == 98.0


def test_cancels_at_the_message_deadline_first() -> None:
    p = plan(message_deadline=50)
    assert p.cancel_at() == 50
    assert p.cancel_reason(50) is CancelReason.MESSAGE_DEADLINE


def test_ticks_extend_then_cancel() -> None:
    extended: list[int] = []
    beat = Heartbeat(plan(lambda_deadline=70), extended.append)
    assert beat.tick(5) == 20  # nothing due yet
    assert beat.tick(20) == 40 and extended == [60]
    assert beat.tick(40) == 60 and extended == [60, 60]
    assert beat.tick(60) == 68  # extends; the next extension (80) would come after the cancel point
    assert beat.tick(68) == float("inf")
    assert beat.cancel.is_set() and beat.cancel_reason is CancelReason.LAMBDA_TIMEOUT
    assert beat.extensions == 3


def test_a_failed_extension_is_retried_soon() -> None:
    calls: list[int] = []
    errors: list[Exception] = []

    def flaky(seconds: int) -> None:
        calls.append(seconds)
        if len(calls) == 1:
            raise RuntimeError("throttled")

    beat = Heartbeat(plan(), flaky, on_error=errors.append)
    assert beat.tick(20) == 30  # half an interval later, well before the lapse at 60
    assert beat.tick(30) == 50
    assert len(calls) == 2 and len(errors) == 1 and beat.extensions == 1


def test_monitor_ticks_a_watched_heartbeat_on_the_injected_clock() -> None:
    now = [0.0]
    extended = threading.Event()
    beat = Heartbeat(plan(visibility_timeout_s=0.2, heartbeat_s=0.1), lambda _s: extended.set())
    monitor = HeartbeatMonitor(clock=lambda: now[0])
    with monitor.watch(beat):
        now[0] = 0.1  # the thread waits on real time, but decides on the injected clock
        assert extended.wait(5)
    assert beat.extensions >= 1


@pytest.mark.parametrize("deadline", [None, 1000.0])
def test_next_wakeup_never_passes_the_cancel_point(deadline: float | None) -> None:
    p = plan(lambda_deadline=30, message_deadline=deadline)
    assert p.next_wakeup(20) == 28
