"""SQS fair queues' own metrics on the live queues: an alarm per queue on the oldest message outside
the noisy tenants, and graphs of it and of the noisy tenants' count, whenever messages carry the tenant
as their MessageGroupId (the naive baseline's too); none when ``queue_set.fair_queues`` is off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app import build_app
from breakwater_cdk.config import ConfigError
from tests.infrastructure.conftest import Synth, synthesize
from tests.infrastructure.test_tenant_views import dashboard, rule_bodies

QUIET_AGE = "ApproximateAgeOfOldestMessageInQuietGroups"
NOISY_GROUPS = "ApproximateNumberOfNoisyGroups"


def quiet_age_alarms(synth: Synth) -> list[dict[str, Any]]:
    return [
        alarm["Properties"]
        for alarm in synth.of_type("AWS::CloudWatch::Alarm").values()
        if alarm["Properties"].get("MetricName") == QUIET_AGE
    ]


def assert_one_quiet_age_alarm_per_live_queue(synth: Synth) -> None:
    alarms = quiet_age_alarms(synth)
    live = {synth.logical_id(pair.queue) for pair in synth.breakwater.queues.live}
    (topic_id,) = synth.of_type("AWS::SNS::Topic")
    alarmed = []
    for props in alarms:
        assert props["Namespace"] == "AWS/SQS"
        (dimension,) = props["Dimensions"]
        assert dimension["Name"] == "QueueName"
        alarmed.append(dimension["Value"]["Fn::GetAtt"])
        assert props["Statistic"] == "Maximum" and props["Period"] == 60
        assert props["Threshold"] == synth.config.alarms.quiet_groups_threshold_seconds
        assert props["ComparisonOperator"] == "GreaterThanThreshold"
        assert (props["EvaluationPeriods"], props["DatapointsToAlarm"]) == (3, 3)
        assert props["TreatMissingData"] == "notBreaching"
        assert props["AlarmActions"] == props["OKActions"] == [{"Ref": topic_id}]
    assert sorted(alarmed) == sorted([queue_id, "QueueName"] for queue_id in live)  # one per live queue


def test_each_live_queue_alarms_on_its_quiet_groups_oldest_age(synth: Synth) -> None:
    assert synth.config.queue_set.fair_queues
    assert len(quiet_age_alarms(synth)) == synth.config.queue_set.size
    assert_one_quiet_age_alarm_per_live_queue(synth)
    # Without its own key the threshold is the live queues' oldest-age threshold.
    assert synth.config.alarms.quiet_groups_oldest_age_seconds is None
    assert quiet_age_alarms(synth)[0]["Threshold"] == synth.config.alarms.oldest_message_age_seconds


def test_naive_mode_alarms_on_its_one_queue_whose_messages_carry_the_tenant_group(naive_synth: Synth) -> None:
    (live,) = naive_synth.breakwater.queues.live
    ingest = naive_synth.resources[naive_synth.logical_id(naive_synth.breakwater.ingest.function)]
    # The naive baseline still sends MessageGroupId = tenant: SQS publishes its fair-queue metrics too.
    assert ingest["Properties"]["Environment"]["Variables"]["FAIR_QUEUES"] == "true"
    (alarm,) = quiet_age_alarms(naive_synth)
    assert alarm["Dimensions"][0]["Value"] == {
        "Fn::GetAtt": [naive_synth.logical_id(live.queue), "QueueName"]
    }
    assert_one_quiet_age_alarm_per_live_queue(naive_synth)


@pytest.fixture(scope="module")
def tuned_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Two live queues and a quiet-groups threshold of its own."""
    context = {"queue_set": {"size": 2, "shard_size": 1}, "alarms": {"quiet_groups_oldest_age_seconds": 120}}
    return synthesize(tmp_path_factory.mktemp("cdk-quiet-threshold"), {"breakwater": context})


def test_the_quiet_groups_threshold_is_its_own_key_when_set(tuned_synth: Synth) -> None:
    alarms = quiet_age_alarms(tuned_synth)
    assert [alarm["Threshold"] for alarm in alarms] == [120, 120]
    assert_one_quiet_age_alarm_per_live_queue(tuned_synth)


def test_without_fair_queues_there_is_no_quiet_groups_alarm_or_graph(tmp_path: Path) -> None:
    context = {"queue_set": {"size": 2, "shard_size": 1, "fair_queues": False}}
    synth = synthesize(tmp_path, {"breakwater": context})
    assert quiet_age_alarms(synth) == []
    body = json.dumps(dashboard(synth))
    assert QUIET_AGE not in body and NOISY_GROUPS not in body
    assert len(rule_bodies(synth)) == 4  # the per-tenant views read logs, not the fair queues


def test_the_dashboard_graphs_quiet_age_and_noisy_groups_per_live_queue(synth: Synth) -> None:
    live = sorted(synth.logical_id(pair.queue) for pair in synth.breakwater.queues.live)
    graphs = {
        name: [
            metric
            for widget in dashboard(synth)["widgets"]
            for metric in widget["properties"].get("metrics", [])
            if name in metric
        ]
        for name in (QUIET_AGE, NOISY_GROUPS)
    }
    for rows in graphs.values():
        # ["AWS/SQS", name, "QueueName", "<GetAtt:queue.QueueName>", {...}]
        assert sorted(row[3].removeprefix("<GetAtt:").removesuffix(".QueueName>") for row in rows) == live
        assert all(row[0] == "AWS/SQS" for row in rows)


@pytest.mark.parametrize(
    ("alarms", "expected"),
    [
        ({"quiet_groups_oldest_age_seconds": 30}, ["breakwater.alarms.quiet_groups_oldest_age_seconds = 30"]),
        ({"quiet_groups_oldest_age_seconds": "soon"}, ["quiet_groups_oldest_age_seconds = 'soon'"]),
        (
            {"quiet_groups_oldest_age_seconds": 600},
            [
                "breakwater.alarms",
                "quiet_groups_oldest_age_seconds (600)",
                "oldest_message_age_seconds (300)",
            ],
        ),
    ],
)
def test_an_invalid_quiet_groups_threshold_names_the_key_and_the_value(
    alarms: dict[str, object], expected: list[str]
) -> None:
    with pytest.raises(ConfigError) as error:
        build_app({"breakwater": {"alarms": alarms}})
    for fragment in expected:
        assert fragment in str(error.value)
