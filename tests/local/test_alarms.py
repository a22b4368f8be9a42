"""The stack's alarms evaluated locally: CloudWatch's period, M-of-N and missing-data semantics on hand-made
datapoints; the alarms read from a synthesized template; and a LocalRuntime's queues and EMF output
making the real alarms fire (and an untouched stack firing none)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater_cdk.config import AlarmConfig
from local.emulator import moto_patches
from local.emulator.alarms import (
    ALARM,
    OK,
    AlarmDefinition,
    AlarmWatch,
    MetricStore,
    alarm_definitions,
    emf_datapoints,
    evaluate,
    statistic,
)
from local.emulator.assembly import CloudAssembly, synthesize
from local.emulator.moto_patches import sqs_metrics
from local.emulator.runtime import LocalRuntime, RuntimeOptions
from local.scenarios.noisy_neighbour import DEMO_CONTEXT
from tests.local.helpers import queue_gauges

NS, NAME = "Test", "Depth"


def definition(**overrides: Any) -> AlarmDefinition:
    fields: dict[str, Any] = {
        "logical_id": "Alarm",
        "description": "a test alarm",
        "namespace": NS,
        "metric_name": NAME,
        "dimensions": (("Queue", "Q"),),
        "statistic": "Maximum",
        "period_s": 60.0,
        "evaluation_periods": 1,
        "datapoints_to_alarm": 1,
        "threshold": 10.0,
        "comparison": "GreaterThanThreshold",
        "treat_missing_data": "notBreaching",
    }
    return AlarmDefinition(**{**fields, **overrides})


def store_of(points: Sequence[tuple[float, float]], *, gauge: bool = False) -> MetricStore:
    store = MetricStore()
    for t, value in points:
        store.add(NS, NAME, {"Queue": "Q"}, t, value, gauge=gauge)
    return store


def states(report: Any) -> list[tuple[str, float]]:
    return [(t["state"], t["at_s"]) for t in report.transitions]


# -- the evaluator ---------------------------------------------------------------------------------------


def test_m_of_n_fires_only_after_m_breaching_periods_and_recovers() -> None:
    alarm = definition(evaluation_periods=5, datapoints_to_alarm=3)
    per_period = [1, 20, 1, 20, 20, 1, 1, 1, 1, 1]  # breaching in periods 1, 3 and 4
    store = store_of([(60 * i + 30, value) for i, value in enumerate(per_period)])
    report = evaluate([alarm], store, 0, 600)
    # The third breaching period of five ends at 300 s; at 420 s only two of the last five breach.
    assert states(report) == [(ALARM, 300), (OK, 420)]
    assert report.transitions[0]["value"] == 20 and report.transitions[1]["value"] == 1
    assert report.fired == ["Alarm"] and report.in_alarm_at_end == []
    assert report.transitions[0]["description"] == "a test alarm"


def test_two_breaching_periods_of_three_needed_are_not_enough() -> None:
    alarm = definition(evaluation_periods=3, datapoints_to_alarm=3)
    store = store_of([(30, 20), (90, 20), (150, 1), (210, 20), (270, 20)])
    assert evaluate([alarm], store, 0, 300).transitions == []


def test_missing_data_is_treated_as_the_alarm_says() -> None:
    store = store_of([(30, 20)])  # one breaching datapoint, then nothing
    not_breaching = evaluate([definition(treat_missing_data="notBreaching")], store, 0, 240)
    assert states(not_breaching) == [(ALARM, 60), (OK, 120)]
    assert not_breaching.transitions[1]["value"] is None
    ignore = evaluate([definition(treat_missing_data="ignore")], store, 0, 240)
    assert states(ignore) == [(ALARM, 60)] and ignore.in_alarm_at_end == ["Alarm"]
    breaching = evaluate([definition(treat_missing_data="breaching")], store_of([(30, 1)]), 0, 240)
    assert states(breaching) == [(ALARM, 120)]
    missing = evaluate([definition(treat_missing_data="missing")], store, 0, 240)
    assert states(missing) == [(ALARM, 60), (OK, 120)]  # INSUFFICIENT_DATA, reported as OK


def test_percentile_statistics_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert statistic("p99", values) == 99
    assert statistic("p50", values) == 50
    assert statistic("p100", values) == 100
    assert statistic("p99.9", values) == 100
    assert statistic("Average", [1.0, 2.0, 6.0]) == 3
    assert statistic("SampleCount", [5.0, 5.0]) == 2
    assert statistic("Sum", [1.0, 2.0]) == 3
    assert statistic("Minimum", [4.0, 2.0]) == 2
    assert statistic("Maximum", []) is None
    store = store_of([(10 + i * 0.1, v) for i, v in enumerate(values)])
    assert states(evaluate([definition(statistic="p99", threshold=98.5)], store, 0, 60)) == [(ALARM, 60)]
    assert evaluate([definition(statistic="p50", threshold=98.5)], store, 0, 60).transitions == []


def test_time_scale_divides_the_periods() -> None:
    store = store_of([(7, 20)])
    assert states(evaluate([definition()], store, 0, 60, time_scale=12)) == [(ALARM, 10), (OK, 15)]
    assert states(evaluate([definition()], store, 0, 180, time_scale=1)) == [(ALARM, 60), (OK, 120)]


def test_a_gauge_holds_its_last_sample_until_the_next() -> None:
    points = [(1, 20), (21, 0)]
    held = evaluate([definition()], store_of(points, gauge=True), 0, 30, time_scale=12)
    assert states(held) == [(ALARM, 5), (OK, 25)]
    events = evaluate([definition()], store_of(points), 0, 30, time_scale=12)
    assert states(events) == [(ALARM, 5), (OK, 10)]


def test_the_last_unfinished_period_is_evaluated_at_the_end() -> None:
    report = evaluate([definition()], store_of([(61, 20)]), 0, 90)
    assert states(report) == [(ALARM, 90)]


def test_only_the_exact_dimension_set_is_the_alarms_metric() -> None:
    store = MetricStore()
    store.add(NS, NAME, {"Queue": "Q", "Other": "x"}, 30, 20)
    store.add(NS, NAME, {"Queue": "R"}, 30, 20)
    assert evaluate([definition()], store, 0, 60).transitions == []


def test_alarms_that_cannot_be_evaluated_are_listed_with_the_reason() -> None:
    math = definition(logical_id="Math", not_evaluated="metric math")
    kinesis = definition(logical_id="Kinesis")
    report = evaluate(
        [math, kinesis, definition()], MetricStore(), 0, 60, unavailable={"Kinesis": "no source"}
    )
    assert report.not_evaluated == [
        {"alarm": "Math", "description": "a test alarm", "reason": "metric math"},
        {"alarm": "Kinesis", "description": "a test alarm", "reason": "no source"},
    ]
    assert report.evaluated == ["Alarm"]
    assert report.as_dict()["evaluated"] == 1


def test_emf_datapoints_follow_the_declared_dimension_sets() -> None:
    blob = {
        "_aws": {
            "Timestamp": 1,
            "CloudWatchMetrics": [
                {
                    "Namespace": "Breakwater",
                    "Dimensions": [["QueueRole", "service"], ["service"]],
                    "Metrics": [{"Name": "AgeOfFirstAttempt", "Unit": "Milliseconds"}],
                }
            ],
        },
        "QueueRole": "live",
        "service": "breakwater",
        "AgeOfFirstAttempt": [5.0, 7.0],
    }
    points = emf_datapoints(blob, "Breakwater", "AgeOfFirstAttempt")
    assert points == [
        ({"QueueRole": "live", "service": "breakwater"}, 5.0),
        ({"QueueRole": "live", "service": "breakwater"}, 7.0),
        ({"service": "breakwater"}, 5.0),
        ({"service": "breakwater"}, 7.0),
    ]
    assert emf_datapoints(blob, "Other", "AgeOfFirstAttempt") == []


# -- definitions from a template -------------------------------------------------------------------------


def test_definitions_resolve_references_and_take_cloudwatchs_defaults() -> None:
    template = {
        "Resources": {
            "Queue": {"Type": "AWS::SQS::Queue"},
            "Age": {
                "Type": "AWS::CloudWatch::Alarm",
                "Properties": {
                    "AlarmDescription": "age",
                    "Namespace": "AWS/SQS",
                    "MetricName": "ApproximateAgeOfOldestMessage",
                    "Dimensions": [{"Name": "QueueName", "Value": {"Fn::GetAtt": ["Queue", "QueueName"]}}],
                    "Statistic": "Maximum",
                    "Period": 60,
                    "EvaluationPeriods": 3,
                    "Threshold": 300,
                    "ComparisonOperator": "GreaterThanThreshold",
                },
            },
            "P99": {
                "Type": "AWS::CloudWatch::Alarm",
                "Properties": {
                    "Namespace": "N",
                    "MetricName": "M",
                    "Dimensions": [{"Name": "Stream", "Value": {"Ref": "Queue"}}],
                    "ExtendedStatistic": "p99",
                    "Period": 60,
                    "EvaluationPeriods": 5,
                    "DatapointsToAlarm": 2,
                    "Threshold": 1,
                    "ComparisonOperator": "GreaterThanThreshold",
                    "TreatMissingData": "notBreaching",
                },
            },
            "Joined": {
                "Type": "AWS::CloudWatch::Alarm",
                "Properties": {
                    "Namespace": "N",
                    "MetricName": "M",
                    "Dimensions": [{"Name": "D", "Value": {"Fn::Join": ["-", ["a", {"Ref": "Queue"}]]}}],
                    "Statistic": "Sum",
                    "Period": 60,
                    "EvaluationPeriods": 1,
                    "Threshold": 1,
                    "ComparisonOperator": "GreaterThanThreshold",
                },
            },
            "Math": {
                "Type": "AWS::CloudWatch::Alarm",
                "Properties": {
                    "Metrics": [{"Id": "e", "Expression": "1"}],
                    "EvaluationPeriods": 1,
                    "Threshold": 1,
                    "ComparisonOperator": "LessThanThreshold",
                },
            },
        }
    }
    age, p99, joined, math = alarm_definitions(template)
    assert age.dimension_map == {"QueueName": "Queue"}
    assert (age.statistic, age.evaluation_periods, age.datapoints_to_alarm) == ("Maximum", 3, 3)
    assert (age.threshold, age.treat_missing_data, age.not_evaluated) == (300, "missing", None)
    assert (p99.statistic, p99.datapoints_to_alarm, p99.dimension_map) == ("p99", 2, {"Stream": "Queue"})
    assert joined.not_evaluated is not None and "Fn::Join" in joined.not_evaluated
    assert math.not_evaluated is not None and "metric math" in math.not_evaluated


# -- the queue gauges in moto's CloudWatch ----------------------------------------------------------------


def gauges(cloudwatch: Any, queue: str) -> dict[str, list[float]]:
    return queue_gauges(cloudwatch, queue, list(sqs_metrics.GAUGES))


def test_cloudwatch_serves_the_queue_gauges_and_the_oldest_messages_age(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with moto_patches.installed(names={"sqs.cloudwatch_metrics"}), mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q", Attributes={"VisibilityTimeout": "0"})["QueueUrl"]
        empty = gauges(cloudwatch, "q")
        assert empty["ApproximateNumberOfMessagesVisible"] == [0.0]
        assert empty["ApproximateAgeOfOldestMessage"] == []  # SQS publishes no age for an empty queue
        sqs.send_message(QueueUrl=url, MessageBody="poison")
        sqs.send_message(QueueUrl=url, MessageBody="younger")
        later = time.time() * 1000 + 400_000
        monkeypatch.setattr(sqs_metrics, "unix_time_millis", lambda: later)
        held = gauges(cloudwatch, "q")
        assert held["ApproximateNumberOfMessagesVisible"] == [2.0]
        assert held["ApproximateAgeOfOldestMessage"][0] >= 400
        # Received three times, the oldest stops counting while a younger one is there.
        for _ in range(3):
            sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=0)
        queue = next(iter(sqs_metrics.sqs_models.sqs_backends["123456789012"]["us-east-1"].queues.values()))
        stamps = {m.body: int(m.sent_timestamp or 0) for m in queue._messages}
        received = {m.body: m.approximate_receive_count for m in queue._messages}
        assert received["poison"] >= 3 and received["younger"] == 0
        age = gauges(cloudwatch, "q")["ApproximateAgeOfOldestMessage"][0]
        assert age == pytest.approx((later - stamps["younger"]) / 1000)
    with moto_patches.removed(names={"sqs.cloudwatch_metrics"}), mock_aws():
        boto3.client("sqs", region_name="us-east-1").create_queue(QueueName="q")
        cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
        assert gauges(cloudwatch, "q")["ApproximateNumberOfMessagesVisible"] == []  # moto as released


# -- the synthesized stack, and a LocalRuntime of it -----------------------------------------------------


@pytest.fixture(scope="module")
def assembly(tmp_path_factory: pytest.TempPathFactory) -> CloudAssembly:
    return synthesize(tmp_path_factory.mktemp("alarms") / "cdk.out", DEMO_CONTEXT)


def by_prefix(definitions: list[AlarmDefinition], prefix: str) -> list[AlarmDefinition]:
    """The alarms whose logical id, under the app's Breakwater construct, starts with ``prefix``."""
    return [d for d in definitions if d.logical_id.removeprefix("Breakwater").startswith(prefix)]


@pytest.mark.slow
def test_the_stacks_queue_alarms_watch_its_queues(assembly: CloudAssembly) -> None:
    definitions = alarm_definitions(assembly.template)
    queues = assembly.resources("AWS::SQS::Queue")
    dlq, age = by_prefix(definitions, "MonitoringDlqVisible"), by_prefix(definitions, "MonitoringOldestAge")
    assert dlq and len(dlq) == len(age)
    for alarm in dlq:
        assert (alarm.namespace, alarm.metric_name) == ("AWS/SQS", "ApproximateNumberOfMessagesVisible")
        assert (alarm.statistic, alarm.comparison, alarm.threshold) == (
            "Maximum",
            "GreaterThanOrEqualToThreshold",
            1,
        )
        assert (alarm.evaluation_periods, alarm.datapoints_to_alarm, alarm.period_s) == (1, 1, 60)
        assert alarm.treat_missing_data == "notBreaching" and alarm.not_evaluated is None
        assert alarm.dimension_map["QueueName"] in queues and "Dlq" in alarm.dimension_map["QueueName"]
    live_age = [a for a in age if "live" in a.logical_id]
    assert live_age
    for alarm in age:
        assert (alarm.metric_name, alarm.statistic) == ("ApproximateAgeOfOldestMessage", "Maximum")
        assert (alarm.evaluation_periods, alarm.datapoints_to_alarm) == (3, 3)
        assert alarm.dimension_map["QueueName"] in queues and "Dlq" not in alarm.dimension_map["QueueName"]
    expected = AlarmConfig.model_validate(DEMO_CONTEXT["breakwater"].get("alarms", {}))
    assert {a.threshold for a in live_age} == {expected.oldest_message_age_seconds}
    p99 = by_prefix(definitions, "MonitoringAgeOfFirstAttemptP99")[0]
    assert (p99.statistic, p99.dimension_map["QueueRole"]) == ("p99", "live")
    assert (p99.evaluation_periods, p99.datapoints_to_alarm) == (5, 3)
    headroom = by_prefix(definitions, "MonitoringPollingHeadroom")
    assert headroom and all(a.not_evaluated and "metric math" in a.not_evaluated for a in headroom)


@pytest.fixture(scope="module")
def runtime(assembly: CloudAssembly, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRuntime]:
    options = RuntimeOptions(
        workdir=Path(tmp_path_factory.mktemp("alarms-runtime")),
        start_api=False,
        start_mappings=False,
        start_schedules=False,
    )
    local = LocalRuntime(context=DEMO_CONTEXT, options=options, assembly=assembly).start()
    yield local
    local.stop()


def queue_url(runtime: LocalRuntime, logical_id: str) -> str:
    assert runtime.deployment is not None
    return runtime.deployment.physical_ids[logical_id]


@pytest.mark.slow
def test_an_untouched_stack_fires_nothing(runtime: LocalRuntime) -> None:
    started = time.time()
    watch = AlarmWatch(runtime, started)
    for k in range(4):
        watch.sample(now=started + 1 + 5 * k)
    report = watch.evaluate(end_s=20, time_scale=12)
    assert report.transitions == [] and report.fired == []
    evaluated, skipped = set(report.evaluated), {row["alarm"] for row in report.not_evaluated}
    assert {d.logical_id for d in by_prefix(watch.definitions, "MonitoringDlqVisible")} <= evaluated
    assert {d.logical_id for d in by_prefix(watch.definitions, "MonitoringOldestAge")} <= evaluated
    assert {d.logical_id for d in by_prefix(watch.definitions, "MonitoringPollingHeadroom")} <= skipped
    kinesis = [d.logical_id for d in watch.definitions if d.namespace == "AWS/Kinesis"]
    assert set(kinesis) <= skipped
    reasons = {row["alarm"]: row["reason"] for row in report.not_evaluated}
    assert all("no source" in reasons[alarm] for alarm in kinesis)


@pytest.mark.slow
def test_a_message_in_a_dlq_fires_its_alarm_until_it_is_gone(runtime: LocalRuntime) -> None:
    started = time.time()
    watch = AlarmWatch(runtime, started)
    alarm = by_prefix(watch.definitions, "MonitoringDlqVisible")[0]
    sqs = runtime.aws.client("sqs", counted=False)
    url = queue_url(runtime, alarm.dimension_map["QueueName"])
    watch.sample(now=started + 1)
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"poison": True}))
    watch.sample(now=started + 6)
    watch.sample(now=started + 11)
    handle = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"][0]["ReceiptHandle"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    watch.sample(now=started + 16)
    report = watch.evaluate(end_s=20, time_scale=12)
    assert [(t["alarm"], t["state"], t["at_s"]) for t in report.transitions] == [
        (alarm.logical_id, ALARM, 10),
        (alarm.logical_id, OK, 20),
    ]
    assert report.transitions[0]["value"] == 1 and report.transitions[1]["value"] == 0
    assert report.fired == [alarm.logical_id] and report.in_alarm_at_end == []


@pytest.mark.slow
def test_the_oldest_messages_age_is_sampled_per_alarmed_queue(runtime: LocalRuntime) -> None:
    started = time.time()
    watch = AlarmWatch(runtime, started)
    alarm = next(a for a in by_prefix(watch.definitions, "MonitoringOldestAge") if "live" in a.logical_id)
    sqs = runtime.aws.client("sqs", counted=False)
    url = queue_url(runtime, alarm.dimension_map["QueueName"])
    sqs.send_message(QueueUrl=url, MessageBody="{}")  # no mapping polls: it stays
    watch.sample(now=started + 1)
    ages = watch.sqs_samples.points(alarm.key)
    assert len(ages) == 1 and ages[0][0] == 1 and ages[0][1] >= 0
    assert watch.samples == 1
    sqs.purge_queue(QueueUrl=url)


@pytest.mark.slow
def test_the_functions_emf_makes_the_p99_alarm_fire(runtime: LocalRuntime) -> None:
    started = time.time() + 3600  # an hour ahead: EMF lines of other tests fall outside this run
    watch = AlarmWatch(runtime, started)
    alarm = by_prefix(watch.definitions, "MonitoringAgeOfFirstAttemptP99")[0]
    assert alarm.threshold is not None
    dimensions = alarm.dimension_map
    for second in range(0, 25):  # 5 periods of 5 s (time_scale 12); the 2nd, 3rd and 4th breach
        slow = 5 <= second < 20
        blob = {
            "_aws": {
                "Timestamp": int((started + second + 0.5) * 1000),
                "CloudWatchMetrics": [
                    {
                        "Namespace": alarm.namespace,
                        "Dimensions": [sorted(dimensions)],
                        "Metrics": [{"Name": alarm.metric_name, "Unit": "Milliseconds"}],
                    }
                ],
            },
            **dimensions,
            alarm.metric_name: [alarm.threshold * (2 if slow else 0.1)],
        }
        runtime.logs("BreakwaterFunctionsLiveWorkerFunction", json.dumps(blob))
    report = watch.evaluate(end_s=25, time_scale=12)
    mine = [(t["state"], t["at_s"]) for t in report.transitions if t["alarm"] == alarm.logical_id]
    assert mine == [(ALARM, 20)]  # the third breaching period; the last five still hold three at 25 s
    assert report.in_alarm_at_end == [alarm.logical_id]
