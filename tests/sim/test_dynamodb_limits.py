"""The simulator meters the DynamoDB items the policies use and takes the real code's path on a throttle.

Small runs in virtual time, with AWS's per-partition rates divided (``AwsLimits(scale=...)``) so that a
handful of calls passes them: what is asserted is where the messages go and what is counted, never
how long a run takes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sim  # noqa: F401
from breakwater.backlog import Ledger, StoredEstimate, shard_of
from breakwater.controller import ShardState, TenantWrite
from breakwater.settings import TierLimits
from local.aws_limits import AwsLimits, ItemThroughput
from sim.__main__ import main
from sim.config import ConfigName, blueprint, load_context, setups
from sim.control import ControllerState
from sim.dynamodb import (
    BURST_POOL,
    CONSUMER_BUCKET,
    COUNTERS,
    LEGACY_DYNAMODB,
    STANDARD,
    StateTable,
    throttled_error,
)
from sim.report import summarize
from sim.scale import scale_scenario, sizing
from sim.system import System
from sim.worker import Costs
from tests.sim.test_worker_model import LIMITS

NAMES = ["t0", "t1", "t2"]
NAIVE_AND_BREAKWATER: tuple[ConfigName, ...] = ("naive", "breakwater")
NOW_S = 1_000.0
LIMIT = AwsLimits(scale=1000)  # a partition: 1 write unit and 3 read units per second


def exhaust(table: StateTable, item: tuple[str, ...], kind: str, at_s: float) -> None:
    """Take the item's whole budget at ``at_s`` (a second's write units and its burst)."""
    while table.write(item, kind, at_s, 1):
        pass


# -- the table --------------------------------------------------------------------------------------------


def test_items_are_keyed_as_the_real_adapters_key_them() -> None:
    table = StateTable(NAMES)
    assert table.counters(1) == ("state", "tenant#t1", "counters")
    assert table.ingest_bucket(0) == ("state", "tenant#t0", "bucket#ingest")
    assert table.consumer_bucket(2) == ("state", "tenant#t2", "bucket#consumer")
    assert table.pool == ("state", "pool#concurrency", "burst")
    assert table.health("live") == ("state", "queue#live", "health")
    assert table.ledgers[3] == ("state", "controller#shard#03", "ledger")


def test_a_write_past_the_partition_limit_is_throttled_and_passes_again_a_second_later() -> None:
    table = StateTable(NAMES, LIMIT)
    item = table.counters(0)
    exhaust(table, item, COUNTERS, NOW_S)
    assert not table.write(item, COUNTERS, NOW_S, 1)
    assert table.write(item, COUNTERS, NOW_S + 1.0, 1)
    report = table.report()
    assert report["dynamodb_throttles"] == {COUNTERS: 2}  # exhaust's last try and the one above
    assert report["hottest_items"][0]["item"] == "state/tenant#t0/counters"
    assert report["limits"] == LIMIT.describe()


def test_units_grow_with_the_leases_a_counters_item_holds_and_double_in_a_transaction() -> None:
    table = StateTable(NAMES)
    assert table.counters_units(0) == 1
    assert table.counters_units(32) == 3  # 600 + 32 x 64 bytes: three 1 KB write units
    assert table.counters_units(32, transactional=True) == 6
    assert table.pool_units(1000) > table.pool_units(10)


def test_a_transaction_with_one_throttled_item_takes_nothing_from_the_others() -> None:
    table = StateTable(NAMES, LIMIT)
    exhaust(table, table.pool, BURST_POOL, NOW_S)
    counters = table.counters(0)
    assert not table.transact([(counters, COUNTERS, 2), (table.pool, BURST_POOL, 2)], NOW_S)
    assert table.write(counters, COUNTERS, NOW_S, 1)  # its budget is whole


def test_botocore_retries_wait_and_pass_once_the_budget_refills() -> None:
    table = StateTable(NAMES, LIMIT)
    item = table.consumer_bucket(0)
    exhaust(table, item, CONSUMER_BUCKET, NOW_S)
    written, waited = table.retried_write(item, CONSUMER_BUCKET, NOW_S, 1, LEGACY_DYNAMODB)
    assert written
    assert 0.5 < waited < 2.0  # 50 ms doubling: the first wait past the refill of one unit
    assert [LEGACY_DYNAMODB.wait(attempt, None) for attempt in (1, 2, 3)] == [0.05, 0.1, 0.2]
    assert STANDARD.attempts == 3


def test_the_error_a_throttled_call_raises_is_the_one_aws_returns() -> None:
    error = throttled_error("UpdateItem")
    assert error.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 400


# -- the controller and the front door ----------------------------------------------------------------------


def test_a_throttled_read_of_the_run_state_fails_the_controller_call() -> None:
    table = StateTable(NAMES, LIMIT)
    for second in range(6):
        while table.read(table.run_state, "controller_scale", NOW_S + second, 1):
            pass
    state = ControllerState(NAMES, lambda _t: LIMITS, table=table, clock_s=lambda: NOW_S)
    ports = state.ports(
        live=[],
        every=[],
        sideline={},
        set_sideline_enabled=lambda _e, _h: [],
        start_archiver=None,
        clock_ms=lambda: int(NOW_S * 1000),
    )
    try:
        ports.read_run_state()
    except Exception as error:  # the ClientError the real port's client raises
        assert "ProvisionedThroughputExceededException" in str(error)
    else:
        raise AssertionError("a throttled read must raise")


def small_scale(limits: AwsLimits) -> dict[str, dict[str, Any]]:
    config = blueprint(load_context(), [sizing(total_rate=400, work_ms=50)])
    scenario = scale_scenario(
        config, tenants=200, total_rate=400, work_ms=50, baseline_s=20, event_s=40, after_s=20
    )
    made = setups(config, same_fleet=True)
    return {
        name: summarize(System(scenario, made[name], Costs(), limits=limits).run(), scenario)
        for name in NAIVE_AND_BREAKWATER
    }


def test_within_the_limits_nothing_is_throttled_and_the_items_are_reported() -> None:
    results = small_scale(AwsLimits())
    breakwater = results["breakwater"]
    assert breakwater["dynamodb_throttles"] == {}
    kinds = {entry["kind"] for entry in breakwater["hottest_items"]}
    assert COUNTERS in kinds
    assert results["naive"]["hottest_items"] == []  # naive writes no item
    assert not any(breakwater["throttle_effects"].values())


def test_past_the_limits_throttles_are_counted_by_kind_with_what_they_did() -> None:
    breakwater = small_scale(AwsLimits(scale=200))["breakwater"]
    throttles = breakwater["dynamodb_throttles"]
    assert isinstance(throttles, dict) and sum(throttles.values()) > 0
    effects = breakwater["throttle_effects"]
    assert isinstance(effects, dict) and any(effects.values())
    assert effects["batch_failures"] == 0  # a gate's trouble costs its tenant, never the batch
    hottest = breakwater["hottest_items"]
    assert isinstance(hottest, list) and len(hottest) == 10
    assert hottest[0]["peak_wcu_per_s"] >= hottest[-1]["peak_wcu_per_s"]
    assert {"item", "kind", "peak_wcu_per_s", "peak_rcu_per_s", "throttled"} <= set(hottest[0])


def test_the_scale_scenario_writes_its_report_in_the_scenarios_shape(tmp_path: Path) -> None:
    code = main(
        [
            "--scenario",
            "scale",
            "--tenants",
            "300",
            "--total-rate",
            "600",
            "--baseline-minutes",
            "0.25",
            "--event-minutes",
            "0.5",
            "--after-hours",
            "0.005",
            "--limit-scale",
            "50",
            "--jobs",
            "1",
            "--no-plot",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    document = json.loads((tmp_path / "scale.json").read_text())
    assert document["limits"] == AwsLimits(scale=50).describe()
    assert document["scenario"]["tenants"] == 300
    assert document["scenario"]["tenant_tiers"] == {"tenant-00001": "premium"}
    assert set(document["configurations"]) == {"naive", "fair", "breakwater"}
    for result in document["configurations"].values():
        for key in (
            "offered",
            "hottest_items",
            "dynamodb_throttles",
            "quiet_p99_ratio",
            "quiet_p99_max_ratio",
            "simulated_messages",
            "wall_s",
        ):
            assert key in result
        assert result["offered"] > 0.9 * 600 * 30  # the full load's half minute at least
    assert document["configurations"]["breakwater"]["hottest_items"]


def test_a_tenant_of_another_tier_gets_that_tiers_limits() -> None:
    config = blueprint(load_context(), [sizing(total_rate=20_000)])
    scenario = scale_scenario(config, tenants=100, total_rate=20_000)
    system = System(scenario, setups(config, same_fleet=True)["breakwater"], Costs())
    premium = config.tiers["premium"]
    assert system.limits(0) == TierLimits(**premium.model_dump())
    assert system.limits(1) == TierLimits(**config.tiers[config.default_tier].model_dump())
    assert scenario.rates[0] == premium.rate * config.backpressure.max_multiplier
    assert abs(sum(scenario.rates) - 20_000) < 1e-6


def test_a_cleared_mark_leaves_the_index_later_and_only_if_nothing_wrote_the_tenant_meanwhile() -> None:
    clock = [NOW_S]
    later: list[tuple[float, Callable[[], object]]] = []
    table = StateTable(NAMES)
    state = ControllerState(
        NAMES,
        lambda _t: LIMITS,
        table=table,
        clock_s=lambda: clock[0],
        defer=lambda delay, call: later.append((delay, call)),
    )
    for tenant in (0, 1):
        state.add(tenant, "accepted", 1)
    ports = state.ports(
        live=[],
        every=[],
        sideline={},
        set_sideline_enabled=lambda _e, _h: [],
        start_archiver=None,
        clock_ms=lambda: int(clock[0] * 1000),
    )

    def write(name: str) -> TenantWrite:
        seen = {"accepted": 1.0, "throttled": 0.0, "at": NOW_S}
        return TenantWrite(name, seen, StoredEstimate(0.0, 0.0, 0.0), 1.0, False, None, False, 0.0)

    for name in ("t0", "t1"):
        shard = shard_of(name)
        ports.commit(ShardState(shard, Ledger(), 0), [write(name)])
    assert all(tenant in state.dirty[shard_of(NAMES[tenant])] for tenant in (0, 1))  # not yet cleared
    state.add(1, "processed", 1)  # t1 written after the run read it: its clear's condition fails
    assert len(later) == 2 and all(delay > 0 for delay, _ in later)  # a round trip after the run
    for _, call in later:
        call()
    assert 0 not in state.dirty[shard_of("t0")]
    assert 1 in state.dirty[shard_of("t1")]


def test_the_simulators_meter_admits_and_counts_as_the_embedded_aws_does() -> None:
    rng = random.Random(3)
    ours, theirs = StateTable(NAMES, LIMIT).meter, ItemThroughput.for_dynamodb(LIMIT)
    at = NOW_S
    for _ in range(5000):
        at += rng.random() * 0.2
        item = rng.choice("abc")
        units = {"read_units": rng.choice([0, 0.5, 1, 4]), "write_units": rng.choice([0, 1, 2, 6])}
        assert ours.consume(item, at, kind="k", **units) == theirs.consume(item, at, kind="k", **units)
    assert ours.hottest() == theirs.hottest()
    assert ours.throttles_by_kind() == theirs.throttles_by_kind() != {}


def test_units_metered_out_of_time_order_count_in_their_own_second() -> None:
    table = StateTable(NAMES)
    item = table.counters(0)
    table.write(item, COUNTERS, NOW_S + 1.5, 300)  # a release written ahead, by an invocation's end
    table.write(item, COUNTERS, NOW_S + 0.5, 200)  # another worker's call, earlier in virtual time
    table.write(item, COUNTERS, NOW_S + 1.7, 300)
    assert table.report()["hottest_items"][0]["peak_wcu_per_s"] == 600
