"""The limits model shared by the embedded AWS and the simulator: figures, scale, per-item budget."""

from __future__ import annotations

import pytest

from local.aws_limits import HOLD_ENV, SCALE_ENV, AwsLimits, ItemThroughput, item_kind


def test_defaults_are_aws_figures_and_only_rates_scale() -> None:
    limits = AwsLimits()
    assert (limits.write_units_per_s, limits.read_units_per_s) == (1000, 3000)
    scaled = limits.scaled(20)
    assert (scaled.write_units_per_s, scaled.read_units_per_s) == (50, 150)
    assert scaled.item_bytes == limits.item_bytes == 400 * 1024
    assert scaled.sqs_batch_bytes == 1024 * 1024
    assert "divided by 20" in scaled.describe()


@pytest.mark.parametrize("value", [0.5, 0, -3, float("nan")])
def test_scale_below_one_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="scale"):
        AwsLimits(scale=value)


def test_from_env() -> None:
    assert AwsLimits.from_env({}) is None
    assert AwsLimits.from_env({SCALE_ENV: "off"}) is None
    limits = AwsLimits.from_env({SCALE_ENV: "20"})
    assert limits is not None and limits.scale == 20
    assert AwsLimits.from_env(limits.to_env()) == limits
    with pytest.raises(ValueError, match=SCALE_ENV):
        AwsLimits.from_env({SCALE_ENV: "lots"})
    held = AwsLimits.from_env({SCALE_ENV: "1", HOLD_ENV: "0"})
    assert held is not None and held.transaction_hold_s == 0
    assert AwsLimits.from_env(held.to_env()) == held
    with pytest.raises(ValueError, match=HOLD_ENV):
        AwsLimits.from_env({SCALE_ENV: "1", HOLD_ENV: "-1"})


def test_an_item_past_its_write_limit_is_throttled_and_recovers_when_the_rate_falls() -> None:
    meter = ItemThroughput.for_dynamodb(AwsLimits(scale=100))  # 10 WCU/s, 30 RCU/s per item
    admitted = sum(meter.consume("hot", 0.0, write_units=1, kind="counters") for _ in range(15))
    assert admitted == 10  # one second's budget
    assert meter.stats["hot"].throttled == 5
    # another item is not affected
    assert meter.consume("cold", 0.0, write_units=1)
    # at half the limit, every call passes again
    t = 1.0
    for _ in range(20):
        t += 0.2
        assert meter.consume("hot", t, write_units=1, kind="counters")
    assert meter.throttles_by_kind() == {"counters": 5}


def test_reads_and_writes_share_the_second() -> None:
    meter = ItemThroughput.for_dynamodb(AwsLimits(scale=100))
    assert meter.consume("item", 0.0, read_units=15)  # half the budget
    assert sum(meter.consume("item", 0.0, write_units=1) for _ in range(10)) == 5


def test_a_throttled_call_takes_no_capacity() -> None:
    meter = ItemThroughput.for_dynamodb(AwsLimits(scale=100))
    for _ in range(10):
        assert meter.consume("item", 0.0, write_units=1)
    assert not meter.consume("item", 0.0, write_units=1)
    assert meter.consume("item", 0.1, write_units=1)  # a tenth of a second refilled one unit


def test_a_call_larger_than_the_budget_passes_on_a_full_budget_only() -> None:
    meter = ItemThroughput.for_dynamodb(AwsLimits(scale=100))
    assert meter.within("big", 0.0, write_units=40)
    assert meter.consume("big", 0.0, write_units=40)
    assert not meter.within("big", 2.0, write_units=1)  # in debt for three seconds
    assert meter.consume("big", 3.5, write_units=1)


def test_hottest_ranks_by_peak_write_units_per_second() -> None:
    meter = ItemThroughput.for_dynamodb(AwsLimits())
    for i in range(30):
        meter.consume(("state", "tenant#a", "counters"), i / 10, write_units=3, kind="counters")
        meter.consume(("state", "pool#concurrency", "pool"), i / 10, write_units=1, kind="burst_pool")
    top = meter.hottest(1)
    assert top == [
        {
            "item": "state/tenant#a/counters",
            "kind": "counters",
            "peak_wcu_per_s": 30.0,
            "peak_rcu_per_s": 0.0,
            "throttled": 0,
        }
    ]


def test_write_units_are_totalled_by_kind_over_the_run_throttled_calls_excluded() -> None:
    meter = ItemThroughput.for_dynamodb(AwsLimits(scale=100))  # 10 WCU/s per item
    for second in range(3):
        for _ in range(12):  # two a second over the limit: refused, and not counted as written
            meter.consume(("state", "tenant#a", "counters"), float(second), write_units=1, kind="counters")
        meter.consume(("state", "tenant#b", "counters"), float(second), write_units=2, kind="counters")
        bucket = ("state", "tenant#a", "bucket#ingest")
        meter.consume(bucket, float(second), write_units=1, kind="ingest_bucket")
    meter.charge(("state", "tenant#a", "bucket#ingest"), 3.0, write_units=0.5, kind="ingest_bucket")
    assert meter.write_units_by_kind() == {"counters": 36.0, "ingest_bucket": 3.5}


def test_kinesis_records_and_bytes_are_separate_limits() -> None:
    limits = AwsLimits(scale=100)  # 10 records/s, ~10 KiB/s per shard
    records, size = ItemThroughput.for_kinesis_records(limits), ItemThroughput.for_kinesis_bytes(limits)
    assert sum(records.consume("shard-0", 0.0, write_units=1) for _ in range(12)) == 10
    assert size.consume("shard-0", 0.0, write_units=10_000)
    assert not size.consume("shard-0", 0.0, write_units=1_000)


@pytest.mark.parametrize(
    ("table", "key", "kind"),
    [
        ("Stack-TablesState1-X", {"pk": "tenant#a", "sk": "counters"}, "counters"),
        ("Stack-TablesState1-X", {"pk": {"S": "tenant#a"}, "sk": {"S": "bucket#ingest"}}, "ingest_bucket"),
        ("Stack-TablesState1-X", {"pk": "tenant#a", "sk": "bucket#consumer"}, "consumer_bucket"),
        ("Stack-TablesState1-X", {"pk": "tenant#a", "sk": "sweep"}, "sweep"),
        ("Stack-TablesState1-X", {"pk": "pool#concurrency", "sk": "burst"}, "burst_pool"),
        ("Stack-TablesState1-X", {"pk": "controller#shard#3", "sk": "ledger"}, "ledger"),
        ("Stack-TablesState1-X", {"pk": "controller", "sk": "scale"}, "controller_scale"),
        ("Stack-TablesState1-X", {"pk": "queue#live", "sk": "health"}, "queue_health"),
        ("Stack-TablesState1-X", {"pk": "queue#live", "sk": "health#7"}, "queue_health"),
        ("Stack-TablesState1-X", {"pk": "dependency", "sk": "health"}, "dependency_health"),
        ("Stack-TablesState1-X", {"pk": "group#g1", "sk": "backlog"}, "group_backlog"),
        ("Stack-TablesState1-X", {"pk": "redrive#dlq", "sk": "m-1"}, "redrive_marker"),
        ("Stack-TablesState1-X", {"dirty_shard": "3", "pk": "tenant#a"}, "dirty_shard"),
        ("Stack-TablesIdempotency1-X", {"id": "breakwater.process#abc"}, "idempotency_record"),
        ("Stack-TablesIdempotency1-X", {"id": "breakwater.request#abc"}, "request_key"),
        ("Stack-TablesTenants1-X", {"tenant_id": "a"}, "tenant_config"),
        ("Stack-OrderedWriteAhead1-X", {"pk": "g1", "sk": "d1"}, "write_ahead"),
        ("Stack-StreamingAggregates1-X", {"pk": "k", "sk": "click"}, "stream_aggregate"),
        ("Other", {"pk": "x", "sk": "y"}, "other"),
    ],
)
def test_item_kind_names_the_blueprints_items(table: str, key: dict[str, object], kind: str) -> None:
    assert item_kind(table, key) == kind


def test_a_charge_is_never_refused_and_leaves_a_debt() -> None:
    meter = ItemThroughput.for_dynamodb(AwsLimits(scale=100))  # 10 WCU/s
    meter.charge("item", 0.0, write_units=15, kind="counters")
    assert meter.stats["item"].peak_write_units == 15
    assert not meter.within("item", 0.4, write_units=1)  # half a second in debt
    assert meter.consume("item", 0.7, write_units=1)
