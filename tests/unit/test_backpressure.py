"""The controller's multiplier: inverse-proportional backpressure, release, organic growth; live health."""

from __future__ import annotations

import pytest

from breakwater.backpressure import (
    BackpressureConfig,
    MultiplierChange,
    backlog_estimate,
    live_health,
    next_multiplier,
    pressure_factor,
    utilisation,
)

CONFIG = BackpressureConfig(backlog_target=1000, min_multiplier=0.1, growth_step=0.1, max_multiplier=2.0)


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


def test_utilisation() -> None:
    assert utilisation(600, 0, 60, 10) == pytest.approx(1.0)
    assert utilisation(0, 1, 60, 10) == 1.0
    assert utilisation(10, 0, 0, 10) == 0.0


def test_live_health() -> None:
    now = 1_000_000
    assert live_health(5, 10_000, now - 1_000, now, 60).healthy
    assert not live_health(5, 120_000, now - 1_000, now, 60).healthy
    assert live_health(0, None, None, now, 60).healthy  # idle: nothing to observe
    assert not live_health(7, 1_000, now - 600_000, now, 60).healthy  # stale with messages waiting
