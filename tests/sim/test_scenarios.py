"""Small scenarios, end to end: the practices' arithmetic for naive, and what each configuration buys."""

from __future__ import annotations

from typing import Any

import pytest

import sim  # noqa: F401
from sim.config import blueprint, load_context
from sim.run import run_scenario
from sim.scenarios import Scenario, seed_scale
from sim.worker import Costs

COSTS = Costs()
# A small fleet (8 queues x 2) keeps the run to seconds; every other setting is cdk.json's.
SMALL = {
    "worker": {"max_concurrency": 2},
    # the tier scaled with the fleet: one tenant may use a third of it, as cdk.json's tier does of its fleet
    "tiers": {
        "standard": {"rate": 5, "burst": 10, "consumer_rate": 2.5, "concurrency": 4, "concurrency_floor": 1}
    },
}


def small(kind: str, **changes: Any) -> tuple[Scenario, Any]:
    config = blueprint(load_context(), [SMALL])
    settings: dict[str, Any] = {"tenants": 200, "baseline_s": 300, "event_s": 300, "after_s": 3600, **changes}
    scenario = seed_scale(
        kind,  # type: ignore[arg-type]
        config,
        costs=COSTS,
        **settings,
    )
    return scenario, config


@pytest.fixture(scope="module")
def noisy() -> tuple[Scenario, dict[str, dict[str, Any]]]:
    scenario, config = small("noisy")
    return scenario, run_scenario(scenario, config, costs=COSTS).results


def test_naive_recovers_as_the_practices_arithmetic_says(noisy: tuple[Scenario, dict[str, Any]]) -> None:
    scenario, results = noisy
    quiet, surge = 0.10, 10.0
    # the backlog grows at (surge + quiet - 1) x capacity for the event, then drains at (1 - quiet) x capacity
    expected_min = scenario.event_s / 60 * (surge + quiet - 1) / (1 - quiet)
    assert results["naive"]["recovery_min"] == pytest.approx(expected_min, rel=0.10)
    assert results["naive"]["refused"] == 0


def test_fair_queues_keep_quiet_tenants_fast_but_not_the_backlog_away(
    noisy: tuple[Scenario, dict[str, Any]],
) -> None:
    _, results = noisy
    naive, fair = results["naive"], results["fair"]
    assert fair["ages"]["quiet"]["during_p99_ms"] < naive["ages"]["quiet"]["during_p99_ms"] / 100
    assert fair["peak_backlog"] == pytest.approx(naive["peak_backlog"], rel=0.05)  # the flood still waits


def test_breakwater_keeps_quiet_tenants_at_their_baseline_and_recovers_at_once(
    noisy: tuple[Scenario, dict[str, Any]],
) -> None:
    _, results = noisy
    breakwater = results["breakwater"]
    assert breakwater["quiet_p99_ratio"] <= 2.0
    assert breakwater["recovery_min"] is not None and breakwater["recovery_min"] <= 1.0
    assert breakwater["refused"] > 0  # the flood is refused at the front door ...
    assert breakwater["peak_backlog"] < results["naive"]["peak_backlog"] / 10  # ... so no backlog builds
    assert breakwater["moved"]["spilled"] + breakwater["moved"]["deferred"] > 0


def test_an_outage_dead_letters_naive_traffic_but_breakwater_holds_it_aside() -> None:
    # 30 minutes: naive's failures come back every visibility timeout (6 minutes) until the fifth receive
    scenario, config = small("outage", event_s=1800)
    results = run_scenario(scenario, config, costs=COSTS, configurations=("naive", "breakwater")).results
    assert results["naive"]["dead_lettered"] > 0
    assert results["breakwater"]["dead_lettered"] == 0
    assert results["breakwater"]["moved"]["sidelined"] > 0
    assert results["breakwater"]["recovery_min"] is not None and results["breakwater"]["recovery_min"] <= 1.0


def test_poison_messages_reach_the_dead_letter_queue_and_nothing_else_does() -> None:
    scenario, config = small("poison")
    results = run_scenario(scenario, config, costs=COSTS, configurations=("naive", "breakwater")).results
    naive, breakwater = results["naive"], results["breakwater"]
    assert naive["dead_lettered"] == naive["poison_in_dlq"] == naive["poison_sent"] > 0
    # a move (spill, defer) starts a message's receive count again: some are still on their way
    assert breakwater["dead_lettered"] == breakwater["poison_in_dlq"] > 0
    for result in results.values():  # every accepted message processed, dead-lettered, archived or waiting
        ends = result["processed"] + result["dead_lettered"] + result["parked"] + result["waiting_at_end"]
        assert ends == result["accepted"]
