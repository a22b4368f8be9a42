"""Short outage and poison scenarios on the embedded runtime (Breakwater): the property each one shows.

The same code path as ``make scenarios`` (``local.scenarios.demo.run_config``), with phases too short
to measure how fast anything recovers (docs/performance.md does); what is asserted holds at any
length: an outage dead-letters nothing and loses nothing, fresh traffic is served again after it, and
poison messages (only they) end in the dead-letter queues, fire the DLQ alarm, and are each processed
once after the fix and the redrive.
"""

from __future__ import annotations

from typing import Any

import pytest

from app import merge_context
from local.scenarios.demo import run_config
from local.scenarios.noisy_neighbour import DEMO_CONTEXT, Scenario, scenario_context

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")]


def run(scenario: Scenario, name: str) -> dict[str, Any]:
    context = merge_context(DEMO_CONTEXT, scenario_context(scenario.kind))
    return run_config(name, context, scenario, progress=False)


@pytest.fixture(scope="module")
def outage() -> dict[str, Any]:
    scenario = Scenario(
        kind="outage",
        tenants=6,
        baseline_s=4.0,
        burst_s=6.0,
        after_s=6.0,
        drain_s=20.0,
        senders=4,
        replay=False,
    )
    return run(scenario, "test-outage")


@pytest.fixture(scope="module")
def poison() -> dict[str, Any]:
    scenario = Scenario(
        kind="poison",
        tenants=4,
        baseline_s=3.0,
        burst_s=4.0,
        after_s=3.0,
        drain_s=45.0,
        senders=4,
        poison_share=0.1,
        replay=False,
    )
    return run(scenario, "test-poison")


def test_an_outage_dead_letters_nothing_and_loses_nothing(outage: dict[str, Any]) -> None:
    assert outage["dlq_due_to_outage"] == 0
    assert outage["accounting"]["unaccounted"] == 0
    assert outage["processed_twice"] == 0
    quiet = outage["groups"]["quiet"]
    # the breaker held the outage's messages aside: sidelined, not failed toward the DLQ
    assert quiet["sidelined"] > 0
    assert outage["fresh_recovery_s"] is not None  # fresh traffic is served again within the run


def test_the_outage_report_has_its_keys(outage: dict[str, Any]) -> None:
    for key in ("fresh_recovery_s", "drain_s", "dlq_due_to_outage", "peak_backlog", "backlog_at_outage_end"):
        assert key in outage
    assert outage["peak_backlog"] >= outage["backlog_at_outage_end"] > 0


def test_poison_alone_reaches_the_dlq_and_is_processed_once_after_the_redrive(poison: dict[str, Any]) -> None:
    assert poison["poison_sent"] > 0
    assert poison["in_dlq_poison"] == poison["poison_sent"]
    assert poison["in_dlq_other"] == 0
    assert poison["redrive_moved"] == poison["in_dlq"]
    assert poison["redriven_processed"] == poison["poison_sent"]
    assert poison["processed_twice"] == 0
    assert poison["accounting"]["unaccounted"] == 0
    assert poison["accounting"]["in_dlq"] == 0  # all redriven


def test_the_dlq_alarm_fires_while_poison_waits_and_clears_after_the_redrive(poison: dict[str, Any]) -> None:
    transitions = [(t["alarm"], t["state"]) for t in poison["alarms_fired"] if "DlqVisible" in t["alarm"]]
    assert any(state == "ALARM" for _, state in transitions)
    fired = {alarm for alarm, state in transitions if state == "ALARM"}
    assert not set(poison["alarms"]["in_alarm_at_end"]) & fired


def test_an_outage_fires_no_dead_letter_alarm(outage: dict[str, Any]) -> None:
    assert "DlqVisible" not in " ".join(t["alarm"] for t in outage["alarms_fired"])


MEASURES = (
    "quiet_p99_ratio",
    "quiet_p99_max_ratio",
    "quiet_p99_max_window_s",
    "noisy_fresh_p99_ms",
    "stale_processed",
    "freshness_s",
    "dlq_due_to_outage",
    "peak_backlog",
    "drain_s",
    "usd_per_million",
)


def test_each_report_has_the_measures_the_configurations_are_compared_by(
    outage: dict[str, Any], poison: dict[str, Any]
) -> None:
    for report in (outage, poison):
        assert not set(MEASURES) - set(report)
        assert report["usd_per_million"] == report["cost"]["usd_per_million_delivered"] > 0
        assert report["noisy_fresh_processed"] > 0  # tenant-01 keeps sending through the event
    assert poison["dlq_due_to_outage"] == 0  # poison dead-letters, but there is no outage
