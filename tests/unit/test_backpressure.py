"""The controller's multiplier: inverse-proportional backpressure, release, organic growth; live health;
the backlog estimate and its corrections."""

from __future__ import annotations

import math

import pytest

from breakwater.backlog import (
    DIRTY_SHARDS,
    DriftLimits,
    Ledger,
    RunState,
    StoredEstimate,
    backlog_estimate,
    evaluate,
    reconcile,
    shard_groups,
    shard_of,
    will_dead_letter,
)
from breakwater.backpressure import (
    BackpressurePolicy,
    MultiplierChange,
    live_health,
    next_multiplier,
    pressure_factor,
    utilisation,
)

CONFIG = BackpressurePolicy(backlog_target=1000, min_multiplier=0.1, growth_step=0.1, max_multiplier=2.0)


@pytest.mark.parametrize(
    ("backlog", "factor"), [(0, 1.0), (1000, 1.0), (2000, 0.5), (4000, 0.25), (10_000, 0.1), (10**9, 0.1)]
)
def test_pressure_factor_is_inverse_proportional_and_bounded(backlog: int, factor: float) -> None:
    assert pressure_factor(backlog, CONFIG) == pytest.approx(factor)


def test_growing_backlog_throttles_harder() -> None:
    first = next_multiplier(1.0, 2000, 1.0, CONFIG)
    second = next_multiplier(first.multiplier, 5000, 1.0, CONFIG)
    assert first.change is second.change is MultiplierChange.THROTTLE
    assert second.multiplier < first.multiplier < 1.0


def test_draining_backlog_restores_the_rate() -> None:
    assert next_multiplier(0.2, 2500, 0.0, CONFIG).multiplier == pytest.approx(0.4)
    released = next_multiplier(0.4, 900, 0.0, CONFIG)
    assert (released.multiplier, released.change) == (1.0, MultiplierChange.RELEASE)


def test_near_the_limit_without_backlog_grows_up_to_the_ceiling() -> None:
    grown = next_multiplier(1.0, 0, 0.9, CONFIG)
    assert (grown.multiplier, grown.change) == (pytest.approx(1.1), MultiplierChange.GROW)
    assert next_multiplier(1.95, 0, 0.9, CONFIG).multiplier == pytest.approx(2.0)
    assert next_multiplier(2.0, 0, 1.0, CONFIG).change is MultiplierChange.HOLD


def test_no_growth_with_some_backlog_or_low_use() -> None:
    assert next_multiplier(1.0, 500, 1.0, CONFIG).change is MultiplierChange.HOLD
    assert next_multiplier(1.0, 0, 0.5, CONFIG).change is MultiplierChange.HOLD


def test_backlog_estimate_counts_only_finished_messages() -> None:
    counters = {
        "accepted": 100,
        "processed": 50,
        "dropped": 5,
        "sidelined": 30,
        "deferred": 10,
        "archived": 5,
    }
    assert backlog_estimate(counters) == 40
    assert backlog_estimate({"processed": 3}) == 0


def test_a_replayed_message_leaves_the_backlog_estimate_once() -> None:
    # 10 accepted, 4 archived; a replay brings 3 back and they are processed (each also ``replayed``).
    parked = {"accepted": 10, "processed": 6, "archived": 4}
    assert backlog_estimate(parked) == 0
    assert backlog_estimate(parked | {"processed": 9, "replayed": 3}) == 0
    assert backlog_estimate({"accepted": 12, "processed": 6, "archived": 4}) == 2


def test_dead_lettered_messages_leave_the_estimate_and_redriven_ones_come_back() -> None:
    counters = {"accepted": 50, "processed": 20, "dead_lettered": 10}
    assert backlog_estimate(counters) == 20
    assert backlog_estimate(counters | {"redriven": 4}) == 24
    assert will_dead_letter(5, 5) and not will_dead_letter(4, 5)


LIMITS = DriftLimits(minimum=10, fraction=0.05)


def test_the_floor_takes_a_negative_estimate_into_the_offset() -> None:
    first = evaluate({"accepted": 10, "processed": 30}, None, depth=0, scale_log=0.0, limits=LIMITS)
    assert (first.backlog, first.correction.value, first.stored.offset) == (0, "floor", 20)
    later = evaluate({"accepted": 50, "processed": 30}, first.stored, depth=40, scale_log=0.0, limits=LIMITS)
    assert (later.backlog, later.correction.value, later.ledger_delta) == (40, "none", 40)


def test_the_ceiling_is_everything_the_queues_hold() -> None:
    phantom = evaluate({"accepted": 1020}, None, depth=100, scale_log=0.0, limits=LIMITS)
    assert (phantom.backlog, phantom.correction.value) == (110, "ceiling")
    assert phantom.stored.offset == -910
    # The offset stays: 50 more accepted (and in the queues) count as 50 more.
    later = evaluate({"accepted": 1070}, phantom.stored, depth=150, scale_log=0.0, limits=LIMITS)
    assert later.backlog == 160 and later.correction.value == "none"


def test_a_reconciliation_reaches_a_tenant_the_next_time_it_is_evaluated() -> None:
    stored = StoredEstimate(estimate=400, mark=0.0, offset=0)
    scaled = evaluate({"accepted": 400}, stored, depth=10_000, scale_log=math.log(0.25), limits=LIMITS)
    assert scaled.backlog == 100
    assert scaled.ledger_delta == pytest.approx(0)  # the ledger was scaled already
    assert scaled.stored.offset == pytest.approx(-300)


def test_reconciliation_needs_the_excess_twice_and_takes_the_smaller() -> None:
    ledgers = [Ledger(total=700), Ledger(total=500)]
    seen = reconcile(ledgers, 1000, RunState(), LIMITS)
    assert seen.scale == 1.0 and seen.state.excess == 200
    corrected = reconcile(ledgers, 1000, seen.state, LIMITS)
    assert corrected.scale == pytest.approx(1000 / 1200)
    assert corrected.state.excess == 0
    after = [Ledger(total=700), Ledger(total=500)]  # as stored, carried by the new scale
    assert sum(ledger.at(corrected.state.scale_log) for ledger in after) == pytest.approx(1000)


def test_an_excess_within_tolerance_or_seen_once_is_left_alone() -> None:
    assert reconcile([Ledger(total=1040)], 1000, RunState(excess=500), LIMITS).scale == 1.0
    spike = reconcile([Ledger(total=2000)], 1000, RunState(), LIMITS)
    assert spike.scale == 1.0
    assert reconcile([Ledger(total=1000)], 1000, spike.state, LIMITS).state.excess == 0


def test_empty_queues_scale_every_estimate_to_nothing() -> None:
    first = reconcile([Ledger(total=500)], 0, RunState(), LIMITS)
    second = reconcile([Ledger(total=500)], 0, first.state, LIMITS)
    assert Ledger(total=500).at(second.state.scale_log) < 1


def test_shards_are_stable_and_groups_cover_each_shard_once() -> None:
    assert shard_of("tenant-a") == shard_of("tenant-a") < DIRTY_SHARDS
    for invocations in (1, 3, 4, 32, 100):
        groups = shard_groups(invocations)
        assert sorted(s for g in groups for s in g) == list(range(DIRTY_SHARDS))
        assert len(groups) == min(invocations, DIRTY_SHARDS)


def test_utilisation() -> None:
    assert utilisation(600, 60, 10) == pytest.approx(1.0)
    assert utilisation(10, 0, 10) == 0.0
    assert utilisation(-5, 60, 10) == 0.0  # counts read out of order: no use, never negative


def test_a_throttle_in_a_quiet_minute_is_not_full_use() -> None:
    """One throttled burst beside 60 admitted requests in a minute at 10/s is 10 % use: no growth."""
    used = utilisation(60, 60, 10)
    assert used == pytest.approx(0.1)
    assert next_multiplier(1.0, 0, used, CONFIG).change is MultiplierChange.HOLD


def test_growth_is_given_back_a_step_a_run_when_the_tenant_no_longer_uses_it() -> None:
    multiplier, runs = 2.0, 0
    while multiplier > 1.0:
        decision = next_multiplier(multiplier, 0, 0.2, CONFIG)
        assert decision.change is MultiplierChange.SHRINK
        multiplier, runs = decision.multiplier, runs + 1
    assert (multiplier, runs) == (1.0, 10)  # back to the tier's rate, one growth step a run
    assert next_multiplier(1.0, 0, 0.0, CONFIG).change is MultiplierChange.HOLD  # never below 1 this way


def test_growth_in_use_is_kept_and_unmeasured_use_changes_nothing() -> None:
    assert next_multiplier(1.5, 0, 0.6, CONFIG) == (1.5, MultiplierChange.HOLD)  # between low and near
    assert next_multiplier(1.5, 500, 0.9, CONFIG) == (1.5, MultiplierChange.HOLD)  # some backlog: held
    assert next_multiplier(1.5, 500, 0.1, CONFIG) == (1.4, MultiplierChange.SHRINK)
    assert next_multiplier(1.5, 0, None, CONFIG) == (1.5, MultiplierChange.HOLD)  # first sight


def test_low_use_must_be_below_near_limit() -> None:
    with pytest.raises(ValueError, match="low_use"):
        BackpressurePolicy(100, 0.1, 0.1, 2.0, near_limit=0.8, low_use=0.8)


def test_live_health() -> None:
    now = 1_000_000
    assert live_health(5, 10_000, now - 1_000, now, 60).healthy
    assert not live_health(5, 120_000, now - 1_000, now, 60).healthy
    assert live_health(0, None, None, now, 60).healthy  # idle: nothing to observe
    assert not live_health(7, 1_000, now - 600_000, now, 60).healthy  # stale with messages waiting
