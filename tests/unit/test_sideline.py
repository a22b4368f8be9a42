"""Every branch of the sidelining decision."""

from __future__ import annotations

import random

import pytest

from breakwater.envelope import Envelope, Origin
from breakwater.sideline import (
    DecisionConfig,
    Reason,
    SidelineDecision,
    TenantState,
    decide,
    defer_delay_seconds,
    queue_role,
)

NOW = 1_700_000_000_000
LIVE = DecisionConfig(mode="live", sideline_age_ms=300_000, defer_base_seconds=2, max_defer_seconds=900)
SIDELINE = DecisionConfig(
    mode="sideline", sideline_age_ms=300_000, defer_base_seconds=2, max_defer_seconds=900
)
NAIVE = DecisionConfig(mode="live", sidelining_enabled=False)


def envelope(age_ms: int = 1_000, **fields: object) -> Envelope:
    values: dict[str, object] = {
        "id": "01HZZZZZZZZZZZZZZZZZZZZZZZ",
        "tenant": "acme",
        "type": "t",
        "enqueued_at": NOW - age_ms,
    }
    values.update(fields)
    return Envelope.model_validate(values)


def test_fresh_message_with_open_gates_is_processed() -> None:
    decision = decide(envelope(), NOW, TenantState(), LIVE)
    assert decision.action is SidelineDecision.PROCESS
    assert not decision.moves


def test_expired_message_is_dropped_first() -> None:
    decision = decide(
        envelope(age_ms=10**9, expires_at=NOW), NOW, TenantState(within_consumer_rate=False), LIVE
    )
    assert (decision.action, decision.reason) == (SidelineDecision.DROP, Reason.EXPIRED)


def test_message_enqueued_before_the_sweep_is_dropped() -> None:
    message = envelope(age_ms=5_000)
    decision = decide(message, NOW, TenantState(swept_at_ms=message.enqueued_at + 1), LIVE)
    assert (decision.action, decision.reason) == (SidelineDecision.DROP, Reason.SWEPT)


def test_message_enqueued_at_or_after_the_sweep_is_kept() -> None:
    message = envelope(age_ms=5_000)
    assert (
        decide(message, NOW, TenantState(swept_at_ms=message.enqueued_at), LIVE).action
        is SidelineDecision.PROCESS
    )


def test_old_message_is_sidelined_to_the_backlog() -> None:
    decision = decide(envelope(age_ms=300_001), NOW, TenantState(), LIVE)
    assert (decision.action, decision.destination) == (SidelineDecision.SIDELINE, Origin.BACKLOG)


def test_message_exactly_at_the_sideline_age_is_not_sidelined() -> None:
    assert decide(envelope(age_ms=300_000), NOW, TenantState(), LIVE).action is SidelineDecision.PROCESS


def test_over_consumer_rate_spills() -> None:
    decision = decide(envelope(), NOW, TenantState(within_consumer_rate=False), LIVE)
    assert (decision.action, decision.destination, decision.reason) == (
        SidelineDecision.SPILL,
        Origin.SPILLOVER,
        Reason.OVER_RATE,
    )


def test_over_concurrency_defers_to_surge_with_backoff() -> None:
    decision = decide(envelope(attempt=3), NOW, TenantState(holds_concurrency_slot=False), LIVE)
    assert (decision.action, decision.destination, decision.delay_seconds) == (
        SidelineDecision.DEFER,
        Origin.SURGE,
        16,
    )


def test_rate_is_checked_before_concurrency() -> None:
    state = TenantState(within_consumer_rate=False, holds_concurrency_slot=False)
    assert decide(envelope(), NOW, state, LIVE).action is SidelineDecision.SPILL


@pytest.mark.parametrize("origin", [Origin.BACKLOG, Origin.SPILLOVER])
def test_sideline_mode_never_sidelines_again(origin: Origin) -> None:
    decision = decide(envelope(age_ms=10**7, origin=origin), NOW, TenantState(), SIDELINE)
    assert decision.action is SidelineDecision.PROCESS


@pytest.mark.parametrize("origin", [Origin.BACKLOG, Origin.SPILLOVER])
def test_sideline_mode_defers_over_rate_into_its_own_queue(origin: Origin) -> None:
    decision = decide(envelope(origin=origin), NOW, TenantState(within_consumer_rate=False), SIDELINE)
    assert (decision.action, decision.destination, decision.reason) == (
        SidelineDecision.DEFER,
        origin,
        Reason.OVER_RATE,
    )


def test_sideline_mode_defers_over_concurrency_into_its_own_queue() -> None:
    message = envelope(origin=Origin.SPILLOVER, attempt=1)
    decision = decide(message, NOW, TenantState(holds_concurrency_slot=False), SIDELINE)
    assert (decision.destination, decision.delay_seconds) == (Origin.SPILLOVER, 4)


def test_sideline_mode_sends_a_stray_live_message_to_the_backlog() -> None:
    decision = decide(envelope(origin=Origin.LIVE), NOW, TenantState(holds_concurrency_slot=False), SIDELINE)
    assert decision.destination is Origin.BACKLOG


def test_sideline_mode_still_drops_expired_and_swept() -> None:
    message = envelope(origin=Origin.BACKLOG, age_ms=10_000)
    assert decide(message, NOW, TenantState(swept_at_ms=NOW), SIDELINE).action is SidelineDecision.DROP


def test_naive_mode_processes_everything_but_expired() -> None:
    state = TenantState(swept_at_ms=NOW, within_consumer_rate=False, holds_concurrency_slot=False)
    assert decide(envelope(age_ms=10**8), NOW, state, NAIVE).action is SidelineDecision.PROCESS
    assert decide(envelope(expires_at=NOW - 1), NOW, state, NAIVE).action is SidelineDecision.DROP


@pytest.mark.parametrize(("attempt", "delay"), [(0, 2), (1, 4), (5, 64), (9, 900), (10_000, 900)])
def test_defer_delay_grows_with_attempt_and_is_capped(attempt: int, delay: int) -> None:
    assert defer_delay_seconds(attempt, LIVE) == delay


@pytest.mark.parametrize(("jitter", "delay"), [(0.0, 2), (0.001, 2), (0.5, 450), (0.999, 900), (1.0, 900)])
def test_a_jittered_delay_takes_its_share_of_the_backoff_at_least_the_base(jitter: float, delay: int) -> None:
    assert defer_delay_seconds(9, LIVE, jitter) == delay


def test_messages_deferred_together_come_back_spread_over_their_backoff() -> None:
    # A wave deferred at one attempt, each with its own draw: spread over the backoff, not one instant.
    rng = random.Random(7)
    over_rate = TenantState(within_consumer_rate=False)
    delays = [
        decide(envelope(attempt=9), NOW, over_rate, SIDELINE, jitter=rng.random()) for _ in range(1_000)
    ]
    seconds = [decision.delay_seconds for decision in delays]
    assert {decision.action for decision in delays} == {SidelineDecision.DEFER}
    assert min(seconds) >= 2 and max(seconds) <= 900
    assert len(set(seconds)) > 500  # no wave: most deferred messages come back at a second of their own
    assert sum(1 for second in seconds if second <= 450) == pytest.approx(500, abs=60)


def test_replayed_messages_count_as_live() -> None:
    assert queue_role(Origin.REPLAY) == "live"
    assert queue_role(Origin.SURGE) == "surge"


def test_a_replayed_message_is_not_sidelined_for_its_age_but_still_gated() -> None:
    old = envelope(age_ms=3_600_000, origin=Origin.REPLAY, replay_run="r1")
    assert decide(old, NOW, TenantState(), LIVE).action is SidelineDecision.PROCESS
    over_rate = decide(old, NOW, TenantState(within_consumer_rate=False), LIVE)
    assert over_rate.action is SidelineDecision.SPILL


def test_replayed_work_deferred_to_surge_is_still_not_sidelined_for_its_age() -> None:
    # A deferral re-homes it to surge; replay_run stays, and so does the exemption (else it is parked
    # in the backlog and archived again for the age it had when it was archived the first time).
    deferred = envelope(age_ms=3_600_000, origin=Origin.SURGE, replay_run="r1", attempt=1)
    assert decide(deferred, NOW, TenantState(), LIVE).action is SidelineDecision.PROCESS
    again = decide(deferred, NOW, TenantState(holds_concurrency_slot=False), LIVE)
    assert (again.action, again.destination) == (SidelineDecision.DEFER, Origin.SURGE)


def test_old_surge_work_that_was_never_replayed_is_sidelined() -> None:
    old = envelope(age_ms=3_600_000, origin=Origin.SURGE, attempt=1)
    assert decide(old, NOW, TenantState(), LIVE).action is SidelineDecision.SIDELINE
