"""The controller on in-memory ports: only changed tenants are read, drift is corrected, shards resume."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.controller import LIMITS, MemoryStore
from breakwater.backlog import DIRTY_SHARDS, shard_of
from breakwater.backpressure import BackpressurePolicy
from breakwater.controller import ControllerConfig, ControllerReport, run_controller

CONFIG = ControllerConfig(
    backpressure=BackpressurePolicy(
        backlog_target=100, min_multiplier=0.1, growth_step=0.1, max_multiplier=2.0
    ),
    healthy_age_s=60,
)
FAR = 10**15  # a deadline no test reaches


def run(store: MemoryStore, config: ControllerConfig = CONFIG) -> ControllerReport:
    """The next scheduled run, a minute after the last, with the time a real one has."""
    store.now_ms += 60_000
    return run_controller(config, store.ports(), deadline_ms=store.now_ms + 45_000)


def multiplier(store: MemoryStore, tenant: str) -> float:
    return store.buckets.get(tenant, 1.0)


def backlog(store: MemoryStore, tenant: str, depth_of_others: int = 0) -> int:
    """Put ``tenant``'s real backlog in the queues and count it accepted."""
    store.write(tenant, {"accepted": depth_of_others})
    store.depth += depth_of_others
    return depth_of_others


def drain(store: MemoryStore, tenant: str, messages: int) -> None:
    store.write(tenant, {"processed": messages})
    store.depth -= messages


def test_a_growing_backlog_throttles_and_a_drained_one_releases() -> None:
    store = MemoryStore()
    backlog(store, "noisy", 300)
    backlog(store, "quiet", 0)
    first = run(store)
    assert multiplier(store, "noisy") == pytest.approx(100 / 300, abs=1e-3)
    assert first.backlogs == {"noisy": 300, "quiet": 0}
    backlog(store, "noisy", 600)
    run(store)
    assert multiplier(store, "noisy") == pytest.approx(100 / 900, abs=1e-3)
    drain(store, "noisy", 850)
    run(store)
    assert multiplier(store, "noisy") == 1.0


def test_only_changed_and_throttled_tenants_are_read() -> None:
    store = MemoryStore()
    for i in range(50):
        backlog(store, f"t{i}", 1)
    backlog(store, "noisy", 500)
    assert run(store).shards.evaluated == 51
    # Nothing written since: only the throttled tenant is looked at again.
    second = run(store)
    assert second.shards.evaluated == 1 and set(second.backlogs) == {"noisy"}
    store.write("t7", {"processed": 1})
    store.depth -= 1
    third = run(store)
    assert set(third.backlogs) == {"noisy", "t7"}
    # No multiplier is written unless it changed.
    assert set(store.buckets) == {"noisy"}


def test_a_tenant_written_to_while_evaluated_stays_marked() -> None:
    store = MemoryStore()
    backlog(store, "busy", 5)
    ports = store.ports()
    read = ports.read_tenants

    def racing_read(tenants):  # type: ignore[no-untyped-def]
        snapshots = read(tenants)
        store.write("busy", {"accepted": 1})  # a writer's flush lands between read and write
        store.depth += 1
        return snapshots

    store.now_ms += 60_000
    run_controller(CONFIG, replace(ports, read_tenants=racing_read), deadline_ms=FAR)
    assert "dirty_shard" in store.counters["busy"]
    assert run(store).backlogs == {"busy": 6}


def test_an_injected_phantom_is_corrected_and_the_stuck_tenant_recovers() -> None:
    """+1,000 phantom accepted for one tenant (a lost ``processed`` write): stuck at the minimum
    multiplier at first, released while the others' real backlog drains, its estimate back to what
    it really holds; the phantom stays in its offset, so its later traffic counts as before."""
    store = MemoryStore()
    backlog(store, "victim", 20)
    backlog(store, "other", 2000)
    run(store)
    store.write("victim", {"accepted": 1000})  # counted, never sent
    run(store)
    assert multiplier(store, "victim") == pytest.approx(0.1)  # 1,020 over a target of 100
    runs = 0
    while multiplier(store, "victim") < 1.0:
        drain(
            store,
            "other",
            min(500, int(store.counters["other"]["accepted"] - store.counters["other"].get("processed", 0))),
        )
        run(store)
        runs += 1
        assert runs <= 6, "the phantom was not corrected within six runs"
    assert store.estimate("victim") <= 20 + 10
    assert store.ledger_total() <= store.depth + 10
    backlog(store, "victim", 200)
    run(store)
    assert store.estimate("victim") == pytest.approx(220, abs=15)


def test_a_phantom_alone_in_the_system_goes_in_one_run() -> None:
    store = MemoryStore()
    backlog(store, "victim", 20)
    run(store)
    store.write("victim", {"accepted": 5000})
    report = run(store)
    assert report.backlogs == {"victim": 30} and report.shards.corrections["ceiling"] == 1
    assert multiplier(store, "victim") == 1.0


def test_drift_spread_over_many_tenants_is_scaled_away_within_two_runs() -> None:
    """Each tenant's phantom is under the total depth (no ceiling applies): only the sum shows it."""
    store = MemoryStore()
    backlog(store, "big", 2000)  # real
    for i in range(40):
        store.write(f"lost{i}", {"accepted": 100})  # dead-lettered, nobody counted them out
    first = run(store)
    assert first.reconciliation is not None and first.reconciliation.scale == 1.0  # seen once
    second = run(store)
    assert second.reconciliation is not None and second.reconciliation.scale < 1.0
    assert store.ledger_total() <= store.depth + max(10, 0.05 * store.depth)
    # The scale reaches every tenant the next time it is looked at, idle or not.
    assert sum(store.estimate(f"lost{i}") for i in range(40)) < 4000 * 0.6


def test_a_negative_estimate_is_floored_and_stays_corrected() -> None:
    store = MemoryStore()
    backlog(store, "t", 10)
    run(store)
    store.write("t", {"processed": 30})  # 20 more than it ever accepted: accepted counts were lost
    store.depth -= 10
    report = run(store)
    assert report.backlogs == {"t": 0} and report.shards.corrections["floor"] == 1
    backlog(store, "t", 50)
    assert run(store).backlogs == {"t": 50}


def test_dead_lettered_and_redriven_messages_leave_and_come_back() -> None:
    store = MemoryStore()
    backlog(store, "t", 30)
    store.write("t", {"dead_lettered": 10})
    store.depth -= 10
    assert run(store).backlogs == {"t": 20}
    store.write("t", {"redriven": 10})
    store.depth += 10
    assert run(store).backlogs == {"t": 30}


def test_a_run_out_of_time_leaves_a_cursor_and_the_next_resumes() -> None:
    store = MemoryStore()
    tenants = [f"t{i:04d}" for i in range(1200)]
    for tenant in tenants:
        backlog(store, tenant, 1)
    clock = {"calls": 0}

    def ticking() -> int:  # every clock read is a second: the deadline falls mid-run
        clock["calls"] += 1
        return store.now_ms + clock["calls"] * 1000

    ports = replace(store.ports(), clock_ms=ticking)
    store.now_ms += 60_000
    first = run_controller(replace(CONFIG, parallel_shards=1), ports, deadline_ms=store.now_ms + 40_000)
    assert first.shards.pending and first.reconciliation is None  # no sum compared while work is left
    assert 0 < first.shards.evaluated < len(tenants)
    seen = set(first.backlogs)
    for _ in range(5):
        clock["calls"] = 0
        store.now_ms += 60_000
        report = run_controller(replace(CONFIG, parallel_shards=1), ports, deadline_ms=store.now_ms + 40_000)
        seen |= set(report.backlogs)
    assert seen == set(tenants)
    assert not any("dirty_shard" in store.counters[t] for t in tenants)


def test_a_shard_held_by_another_run_is_left_to_it() -> None:
    store = MemoryStore()
    backlog(store, "t", 5)
    store.ledgers[shard_of("t")]["lease_until"] = FAR
    report = run(store)
    assert report.shards.busy == [shard_of("t")] and report.backlogs == {}
    assert "dirty_shard" in store.counters["t"]


def test_a_failed_write_leaves_the_tenant_marked_and_the_ledger_as_committed() -> None:
    store = MemoryStore()
    backlog(store, "ok", 5)
    run(store)
    before = store.ledger_total()
    backlog(store, "broken", 7)
    store.fail_writes.add("broken")
    report = run(store)
    assert shard_of("broken") in report.shards.failed
    assert store.ledger_total() == before and "dirty_shard" in store.counters["broken"]
    store.fail_writes.clear()
    run(store)
    assert store.ledger_total() == pytest.approx(12)


def test_split_runs_cover_every_shard_once() -> None:
    store = MemoryStore()
    tenants = [f"t{i}" for i in range(300)]
    for tenant in tenants:
        backlog(store, tenant, 1)
    groups_run: list[list[int]] = []
    ports = store.ports()

    def elsewhere(groups, request):  # type: ignore[no-untyped-def]
        from breakwater.controller import run_shards

        groups_run.extend(list(g) for g in groups)
        return [run_shards(CONFIG, ports, group, request) for group in groups]

    store.now_ms += 60_000
    report = run_controller(replace(CONFIG, invocations=4), replace(ports, run_elsewhere=elsewhere), FAR)
    assert len(groups_run) == 3
    assert report.shards.evaluated == len(tenants)
    shards = sorted(s for g in groups_run for s in g)
    assert len(shards) == DIRTY_SHARDS - len(range(0, DIRTY_SHARDS, 4))


def test_an_inactive_tenant_keeps_its_estimate_but_gets_no_multiplier() -> None:
    store = MemoryStore()
    backlog(store, "gone", 500)
    store.limits["gone"] = None
    report = run(store)
    assert report.backlogs == {"gone": 500} and "gone" not in report.multipliers
    assert "gone" not in store.buckets


def test_limits_are_the_tier_and_the_current_multiplier() -> None:
    store = MemoryStore()
    backlog(store, "t", 0)
    store.write("t", {"accepted": int(LIMITS.rate * 60)})  # its whole limit for a minute, all done
    store.write("t", {"processed": int(LIMITS.rate * 60)})
    run(store)  # first sight: no interval to measure
    store.write("t", {"accepted": int(LIMITS.rate * 60), "processed": int(LIMITS.rate * 60)})
    report = run(store)
    assert report.changes["grow"] == 1 and multiplier(store, "t") == pytest.approx(1.1)


def test_the_drainers_wait_while_the_workers_report_their_dependency_down() -> None:
    store = MemoryStore()
    run(store)
    assert store.sideline_enabled  # empty live queues: healthy
    store.dependency_down_until = store.now_ms + 90_000  # a breaker opened until then
    report = run(store)
    assert report.dependency_down and not store.sideline_enabled
    store.now_ms += 60_000  # its window has passed and no breaker opened since
    report = run(store)
    assert not report.dependency_down and store.sideline_enabled
