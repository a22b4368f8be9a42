"""Alarms that read what they claim: retries' age, and polling headroom as a ratio of receive calls."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.infrastructure.conftest import Synth


def _alarms(synth: Synth) -> list[dict[str, Any]]:
    return [alarm["Properties"] for alarm in synth.of_type("AWS::CloudWatch::Alarm").values()]


def _ratio(expression: str, empty_calls: float, received_messages: float) -> float:
    """Evaluate the alarm's metric math for one period's numbers."""
    empty = next(n for n in re.findall(r"empty\d+", expression))
    received = next(n for n in re.findall(r"received\d+", expression))
    python = expression.replace(empty, str(empty_calls)).replace(received, str(received_messages))
    match = re.fullmatch(r"IF\((.*?) > 0, (.*), 1\)", python)
    assert match, expression
    return float(eval(match.group(2))) if float(match.group(1)) > 0 else 1.0  # noqa: S307 - our own template


def test_retried_messages_have_an_age_alarm_and_a_graph(synth: Synth) -> None:
    (props,) = [p for p in _alarms(synth) if p.get("MetricName") == "AgeOfAttempt"]
    assert props["ExtendedStatistic"] == "p99"
    assert props["Threshold"] == synth.config.alarms.age_of_attempt_p99_ms
    assert {"Name": "QueueRole", "Value": "live"} in props["Dimensions"]
    (dashboard,) = synth.of_type("AWS::CloudWatch::Dashboard").values()
    assert "AgeOfAttempt p99" in json.dumps(dashboard["Properties"]["DashboardBody"])


def test_empty_receive_ratio_counts_calls_not_messages(synth: Synth) -> None:
    ratio_alarms = [
        p for p in _alarms(synth) if any("empty" in m.get("Expression", "") for m in p.get("Metrics", []))
    ]
    assert ratio_alarms
    for props in ratio_alarms:
        (expression,) = [m["Expression"] for m in props["Metrics"] if "Expression" in m]
        # Half of 10 calls were empty, the other 5 returned a full batch of 10 each: headroom is 0.5.
        assert _ratio(expression, empty_calls=5, received_messages=50) == 0.5
        # Busy pollers that never find the queue empty have no headroom, however many messages flow.
        assert _ratio(expression, empty_calls=0, received_messages=1000) == 0.0
        assert _ratio(expression, empty_calls=0, received_messages=0) == 1.0  # idle is not a lack of headroom
