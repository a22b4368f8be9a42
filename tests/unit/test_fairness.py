"""Token bucket math with an injected clock: rate, burst, refill, lease bounds, multiplier."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from breakwater.fairness import (
    BACKOFF_REQUESTS,
    MAX_CONTENTION_BACKOFF_S,
    REFUSAL_JITTER,
    BucketLimits,
    BucketState,
    DemandMeter,
    LocalLease,
    backoff_cap,
    contention_backoff,
    full_at,
    is_full,
    lease_size,
    local_refusal_seconds,
    refill,
    relaxed_backoff,
    retry_after_header,
    take_lease,
)

LIMITS = BucketLimits(rate=10, burst=20)


def test_a_new_bucket_holds_the_burst():
    assert BucketState.full(LIMITS, now=5).tokens == 20


def test_refill_adds_rate_per_second_up_to_the_burst():
    empty = BucketState(tokens=0, updated_at=100)
    assert refill(empty, LIMITS, now=100.5).tokens == pytest.approx(5)
    assert refill(empty, LIMITS, now=101).tokens == pytest.approx(10)
    assert refill(empty, LIMITS, now=1000).tokens == 20


def test_time_never_runs_backwards():
    state = BucketState(tokens=3, updated_at=100)
    after = refill(state, LIMITS, now=90)
    assert after.tokens == 3
    assert after.updated_at == 100


def test_take_lease_grants_what_is_there_or_says_when_to_come_back():
    state = BucketState(tokens=3.5, updated_at=100)
    partial = take_lease(state, LIMITS, now=100, wanted=5)
    assert partial.granted == 3
    assert partial.state.tokens == pytest.approx(0.5)

    refused = take_lease(partial.state, LIMITS, now=100, wanted=5)
    assert not refused.ok
    assert refused.retry_after == pytest.approx(0.45)  # until a whole lease of 5 is there
    assert take_lease(partial.state, LIMITS, now=100 + refused.retry_after, wanted=5).granted == 5


def test_admission_over_time_is_burst_plus_rate():
    state = BucketState.full(LIMITS, now=0)
    admitted = 0
    for step in range(1000):  # 10 s, a request every 10 ms
        decision = take_lease(state, LIMITS, now=step * 0.01, wanted=1)
        state = decision.state
        admitted += decision.granted
    assert admitted == pytest.approx(20 + 10 * 10, abs=1)


def test_lease_size_is_rate_times_lease_seconds_bounded_by_a_share_of_the_burst():
    assert lease_size(LIMITS, lease_seconds=1, max_fraction=0.5) == 10
    assert lease_size(LIMITS, lease_seconds=1, max_fraction=0.25) == 5
    assert lease_size(LIMITS, lease_seconds=0.01, max_fraction=1) == 1  # never zero
    assert lease_size(BucketLimits(rate=1000, burst=4000), 1, 0.25) == 1000


@given(
    rate=st.floats(min_value=0.1, max_value=1000),
    burst=st.integers(min_value=1, max_value=10_000),
    lease_seconds=st.floats(min_value=0.01, max_value=60),
    fraction=st.floats(min_value=0.01, max_value=1),
)
def test_a_lease_never_exceeds_its_share_of_the_burst(rate, burst, lease_seconds, fraction):
    limits = BucketLimits(rate=rate, burst=burst)
    size = lease_size(limits, lease_seconds, fraction)
    assert 1 <= size <= max(1, burst * fraction)


def test_multiplier_scales_the_rate_and_never_raises_the_burst():
    assert LIMITS.scaled(0.5) == BucketLimits(rate=5, burst=10)
    assert LIMITS.scaled(2.0) == BucketLimits(rate=20, burst=20)
    assert BucketLimits(rate=1, burst=1).scaled(0.1).burst == 1


def test_invalid_limits_are_refused():
    with pytest.raises(ValueError, match="rate"):
        BucketLimits(rate=0, burst=1)
    with pytest.raises(ValueError, match="burst"):
        BucketLimits(rate=1, burst=0.5)


def test_local_lease_is_spent_expires_and_blocks_after_a_refusal():
    lease = LocalLease()
    assert lease.spend_up_to(1, now=0) == 0
    lease.grant(2, now=0, ttl=1)
    assert lease.spend_up_to(1, now=0.5) == 1
    assert lease.spend_up_to(1, now=0.6) == 1
    assert lease.spend_up_to(1, now=0.7) == 0

    lease.grant(5, now=1, ttl=1)
    assert lease.spend_up_to(3, now=1.5) == 3
    assert lease.spend_up_to(3, now=1.6) == 2  # what is left, no more
    lease.grant(5, now=1, ttl=1)
    assert lease.spend_up_to(1, now=2) == 0  # unspent tokens expire with the lease
    assert lease.tokens == 0

    lease.refuse(now=3, retry_after=0.25)
    assert lease.is_blocked(now=3.2)
    assert not lease.is_blocked(now=3.25)


def test_a_lost_probe_doubles_the_longest_of_backoff_refill_and_shared_up_to_the_cap():
    assert contention_backoff(0.0, 0.5, 0.0, cap=10) == 1.0  # the first: twice the refill
    assert contention_backoff(1.0, 0.5, 0.0, cap=10) == 2.0
    assert contention_backoff(1.0, 0.5, 3.0, cap=10) == 6.0  # others' backoff, learnt from the item
    assert contention_backoff(8.0, 0.5, 0.0, cap=10) == 10.0


def test_the_backoff_cap_follows_the_requests_a_container_sees():
    # a container seeing few of the tenant's requests (it shares them with many) may wait longer
    assert backoff_cap(LIMITS, own_rate=0.5) == MAX_CONTENTION_BACKOFF_S
    assert backoff_cap(LIMITS, own_rate=4.0) == BACKOFF_REQUESTS / 4.0
    # one that sees many never waits past the bucket's refill from empty (20 tokens at 10/s)
    assert backoff_cap(LIMITS, own_rate=100.0) == 2.0
    assert backoff_cap(LIMITS, own_rate=0.0) == MAX_CONTENTION_BACKOFF_S


def test_a_won_lease_relaxes_the_backoff_gently_unless_the_bucket_had_plenty():
    assert relaxed_backoff(4.0, left=0.5, limits=LIMITS) == pytest.approx(3.6)
    assert relaxed_backoff(4.0, left=None, limits=LIMITS) == pytest.approx(3.6)
    assert relaxed_backoff(4.0, left=10.0, limits=LIMITS) == 2.0  # half full: containers ask too seldom


def test_a_local_refusal_lasts_the_refill_or_the_backoff_jittered():
    assert local_refusal_seconds(0.5, 0.0, uniform=0.9) == 0.5  # never contended: exactly the refill
    assert local_refusal_seconds(0.5, 2.0, uniform=0.0) == 2.0
    assert local_refusal_seconds(0.5, 2.0, uniform=1.0) == pytest.approx(2.0 * (1 + REFUSAL_JITTER))
    assert local_refusal_seconds(0.5, 0.1, uniform=1.0) == pytest.approx(0.5 * (1 + REFUSAL_JITTER))


def test_a_grant_paces_the_next_ask_by_the_backoff():
    lease = LocalLease(backoff=4.0)
    lease.grant(1, now=10, ttl=1, backoff=3.6)
    assert lease.backoff == 3.6
    assert lease.spend_up_to(1, now=10) == 1  # the lease itself is spent at once
    assert lease.is_blocked(now=13.5) and not lease.is_blocked(now=13.6)
    lease.grant(1, now=20, ttl=1)
    assert not lease.is_blocked(now=20)  # no contention, no pacing


def test_own_rate_counts_the_first_seconds_requests():
    meter = DemandMeter()
    for _ in range(6):
        meter.observe(100.0)
    assert meter.own_rate(100.0) == 6  # no whole second seen yet: the requests so far
    meter.observe(101.5)
    assert meter.own_rate(101.5) == pytest.approx(6 * 0.5 + 1)  # the last second's


@pytest.mark.parametrize(("seconds", "header"), [(0.001, "1"), (1.0, "1"), (1.2, "2"), (30, "30")])
def test_retry_after_header_is_whole_seconds_never_zero(seconds, header):
    assert retry_after_header(seconds) == header


def test_full_at_is_when_the_refill_reaches_the_burst():
    state = BucketState(tokens=5, updated_at=100.0)  # 15 tokens short at 10/s
    assert full_at(state, LIMITS) == pytest.approx(101.5)
    assert not is_full(state, LIMITS, 101.4)
    assert is_full(state, LIMITS, full_at(state, LIMITS))
    assert full_at(BucketState.full(LIMITS, 100.0), LIMITS) == 100.0


def test_demand_is_the_last_second_of_requests_once_a_second_was_seen():
    from breakwater.fairness import DemandMeter

    meter = DemandMeter()
    for i in range(10):
        meter.observe(100.0 + i / 10)
    assert meter.rate(100.95) is None  # a container new to the tenant: no whole second yet
    assert meter.rate(101.0) == pytest.approx(10)
    meter.observe(101.5, 4)
    assert meter.rate(101.5) == pytest.approx(10 * 0.5 + 4)
    assert meter.rate(103.2) == pytest.approx(0)  # quiet for a whole second


def test_a_lease_is_half_what_the_container_will_spend_and_never_more_than_usual():
    from breakwater.fairness import demand_lease_size

    assert demand_lease_size(usual=25, demand_per_second=1.1, lease_seconds=1.0) == 1
    assert demand_lease_size(usual=25, demand_per_second=9.0, lease_seconds=1.0) == 4
    assert demand_lease_size(usual=25, demand_per_second=200.0, lease_seconds=1.0) == 25
    assert demand_lease_size(usual=25, demand_per_second=0.0, lease_seconds=1.0) == 1


def test_recent_demand_sees_a_trickle_that_a_one_second_window_sees_as_nothing():
    from breakwater.fairness import RECENT_DEMAND_SECONDS, DemandMeter

    meter = DemandMeter()
    for i in range(200):  # one request every two seconds for 400 s
        meter.observe(100.0 + 2 * i)
    now = 100.0 + 2 * 199 + 2.5
    assert meter.rate(now) == pytest.approx(0)  # the last second held no request
    assert meter.recent_rate(now) == pytest.approx(0.5, rel=0.2)
    later = now + 3 * RECENT_DEMAND_SECONDS
    assert meter.recent_rate(later) < 0.05 * meter.recent_rate(now)  # a trickle that stopped fades


def test_a_quiet_lease_is_the_horizons_expected_requests_capped_at_half_the_burst_or_usual():
    from breakwater.fairness import QUIET_LEASE_SECONDS, quiet_lease_size

    assert quiet_lease_size(usual=25, recent_per_second=0.1, burst=100) == math.floor(
        0.1 * QUIET_LEASE_SECONDS
    )
    assert quiet_lease_size(usual=3, recent_per_second=0.5, burst=10) == 5  # half the burst
    assert quiet_lease_size(usual=25, recent_per_second=0.5, burst=10) == 25  # the usual lease
    assert quiet_lease_size(usual=1, recent_per_second=0.5, burst=5) == 2  # a small consumer bucket
    assert quiet_lease_size(usual=25, recent_per_second=0.001, burst=100) == 0
