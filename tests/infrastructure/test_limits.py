"""Limits the stack sets from cdk.json that the functions would otherwise leave open."""

from __future__ import annotations

from tests.infrastructure.conftest import Synth
from tests.infrastructure.test_foundation import _env


def test_the_burst_pool_is_set_from_the_config_so_floors_hold(synth: Synth) -> None:
    worker = synth.config.worker
    assert worker.burst_share is not None
    live = _env(synth, synth.breakwater.consumers.live_worker)
    mapped = synth.config.queue_set.size + 1  # the live queues and the surge queue
    assert int(live["CONCURRENCY_BURST_SLOTS"]) == int(worker.burst_share * mapped * worker.max_concurrency)
    sideline = _env(synth, synth.breakwater.consumers.sideline_worker)
    assert 1 <= int(sideline["CONCURRENCY_BURST_SLOTS"]) < int(live["CONCURRENCY_BURST_SLOTS"])


def test_the_workers_know_after_how_many_receives_their_queues_dead_letter(synth: Synth) -> None:
    """A message that fails on its last receive is counted dead_lettered: the count must be the queues'."""
    for worker in (synth.breakwater.consumers.live_worker, synth.breakwater.consumers.sideline_worker):
        assert _env(synth, worker)["MAX_RECEIVE_COUNT"] == str(synth.config.queue_set.max_receive_count)
