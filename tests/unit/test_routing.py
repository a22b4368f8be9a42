"""Shuffle sharding: deterministic, k distinct queues, even spread, stable as N grows; cached depths."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from breakwater.routing import QueueDepths, choose_queue, full_overlap_probability, shard_for

TENANTS = [f"tenant-{i}" for i in range(4000)]


def test_shard_is_deterministic_and_k_distinct():
    for tenant in TENANTS[:200]:
        shard = shard_for(tenant, 8, 3)
        assert shard == shard_for(tenant, 8, 3)
        assert len(set(shard)) == 3
        assert all(0 <= index < 8 for index in shard)


@pytest.mark.parametrize(("queues", "k"), [(8, 2), (16, 3), (5, 5), (1, 1)])
def test_spread_over_many_tenants_is_even(queues, k):
    load = Counter(index for tenant in TENANTS for index in shard_for(tenant, queues, k))
    expected = len(TENANTS) * k / queues
    chi_square = sum((load[index] - expected) ** 2 / expected for index in range(queues))
    # 99.9th percentile of chi-square with up to 15 degrees of freedom is ~37.7.
    assert chi_square < 40
    assert max(load.values()) / min(load.values()) < 1.15


def test_shard_pairs_are_spread_too():
    # Two tenants share all k queues with probability 1/C(N, k): the k-subsets must be spread evenly.
    subsets = Counter(frozenset(shard_for(tenant, 8, 2)) for tenant in TENANTS)
    assert len(subsets) == math.comb(8, 2)
    expected = len(TENANTS) / math.comb(8, 2)
    assert max(subsets.values()) < 1.5 * expected
    assert min(subsets.values()) > 0.5 * expected


def test_growing_the_queue_set_moves_few_tenants_and_only_onto_the_new_queue():
    moved = 0
    for tenant in TENANTS:
        before, after = set(shard_for(tenant, 8, 2)), set(shard_for(tenant, 9, 2))
        assert after <= before | {8}
        moved += before != after
    # A tenant moves only when the new queue enters its top k: about k / (N + 1) of them.
    assert moved / len(TENANTS) == pytest.approx(2 / 9, abs=0.03)


def test_full_overlap_probability():
    assert full_overlap_probability(8, 2) == pytest.approx(1 / 28)
    assert full_overlap_probability(16, 3) == pytest.approx(1 / 560)


@pytest.mark.parametrize(("queues", "k"), [(0, 1), (4, 0), (4, 5)])
def test_invalid_sizes_are_refused(queues, k):
    with pytest.raises(ValueError, match="must be"):
        shard_for("acme", queues, k)


def test_choose_queue_prefers_the_shortest_then_the_tenants_order():
    assert choose_queue((3, 1), {3: 10, 1: 2}) == 1
    assert choose_queue((3, 1), {3: 2, 1: 2}) == 3
    assert choose_queue((3, 1), {}) == 3
    with pytest.raises(ValueError):
        choose_queue((), {})


def test_queue_depths_refresh_on_an_interval_and_count_local_sends():
    depths = QueueDepths(refresh_seconds=5)
    assert depths.is_stale(0, now=100)
    depths.observe(0, 7, now=100)
    assert not depths.is_stale(0, now=104.9)
    assert depths.is_stale(0, now=105)

    depths.record_send(0)
    depths.record_send(0)
    assert depths.depth(0) == 9
    depths.observe(0, 3, now=105)  # a fresh probe replaces the estimate
    assert depths.depth(0) == 3

    depths.observe(0, None, now=110)  # a failed probe keeps it and waits for the next interval
    assert depths.depth(0) == 3
    assert not depths.is_stale(0, now=111)
    assert depths.snapshot([0, 1]) == {0: 3, 1: 0}
