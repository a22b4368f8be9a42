"""The measures that set naive, fair and breakwater apart, each on a hand-built run of the demo's scenario.

The scenario is the demo's default: a 15 s baseline, then the event (tenant-01's burst) for 20 s, so the
event runs from t = 15 to t = 35 (seconds after the load's start, ``STARTED`` in epoch seconds).
"""

from __future__ import annotations

from typing import Any

import pytest

from local.scenarios.measures import FRESHNESS_S, WINDOW_S, comparison, drain_seconds, measure_rows
from local.scenarios.noisy_neighbour import Scenario
from local.scenarios.observations import Observations
from local.scenarios.report import comparison_table

STARTED = 1_000.0
SCENARIO = Scenario()
SUBJECT = SCENARIO.noisy


def observations(
    accepted_at: list[tuple[float, str]] | None = None,
    depths: list[tuple[float, int, int, int]] | None = None,
) -> Observations:
    obs = Observations(started=STARTED)
    obs.accepted_at = accepted_at or []
    obs.depths = depths or []
    return obs


def effect(envelope: str, tenant: str, sent_t: float, age_s: float) -> dict[str, Any]:
    """One processing as the hooks record it: enqueued ``sent_t`` after the start, run ``age_s`` later."""
    enqueued_ms = (STARTED + sent_t) * 1000
    return {"id": envelope, "tenant": tenant, "enqueued_at": enqueued_ms, "at": enqueued_ms + age_s * 1000}


def measure(
    obs: Observations | None = None,
    first_attempts: list[tuple[float, str, float, str]] | None = None,
    effects: list[dict[str, Any]] | None = None,
    scenario: Scenario = SCENARIO,
    in_dlq: int = 0,
    cost: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return comparison(
        scenario, obs or observations(), first_attempts or [], effects or [], in_dlq=in_dlq, cost=cost
    )


def test_the_quiet_tenants_worst_window_over_their_baseline() -> None:
    rows = [(t / 2, "tenant-02", 100.0, "live") for t in range(30)]  # the baseline: 100 ms
    rows += [(15 + t / 2, "tenant-03", 200.0, "live") for t in range(20)]  # first window of the event
    rows += [(25 + t / 2, "tenant-02", 500.0, "live") for t in range(20)]  # second: the worst
    rows += [(35 + t / 2, "tenant-04", 120.0, "live") for t in range(20)]
    rows += [(26.0, SUBJECT, 90_000.0, "live"), (27.0, "tenant-02", 60_000.0, "replay")]  # not quiet live

    result = measure(first_attempts=rows)

    assert result["quiet_baseline_p99_ms"] == 100.0
    assert result["quiet_p99_max_ratio"] == 5.0
    assert result["quiet_p99_max_window_s"] == WINDOW_S == 10.0
    assert result["quiet_p99_windows_ms"] == [(15.0, 200.0), (25.0, 500.0), (35.0, 120.0)]


def test_no_baseline_no_worst_window_ratio() -> None:
    result = measure(first_attempts=[(20.0, "tenant-02", 300.0, "live")])
    assert result["quiet_p99_max_ratio"] is None


def test_the_subject_s_fresh_work_is_its_messages_sent_since_the_event_each_run_once() -> None:
    effects = [
        effect("old", SUBJECT, 10.0, 50.0),  # sent before the event: not fresh
        effect("a", SUBJECT, 20.0, 3.0),
        effect("b", SUBJECT, 30.0, 4.0),
        effect("b", SUBJECT, 30.0, 40.0),  # run again (a redelivery): its first run counts
        effect("q", "tenant-02", 20.0, 90.0),  # a quiet tenant's
    ]
    accepted = [(10.0, SUBJECT), (20.0, SUBJECT), (30.0, SUBJECT), (31.0, SUBJECT), (20.0, "tenant-02")]
    first = [
        (23.0, SUBJECT, 3000.0, "live"),
        (40.0, SUBJECT, 25_000.0, "live"),
        (21.0, SUBJECT, 9000.0, "live"),
    ]

    result = measure(observations(accepted_at=accepted), first_attempts=first, effects=effects)

    assert result["noisy_fresh_p99_ms"] == 4000.0
    assert result["noisy_fresh_processed"] == 2
    assert result["noisy_fresh_unserved"] == 1  # accepted at 31 s, never run
    # by first receive: sent at 23 - 3 = 20 s and 40 - 25 = 15 s count, 21 - 9 = 12 s does not
    assert result["noisy_fresh_first_attempt_p99_ms"] == 25_000.0


def test_the_subject_s_work_never_run_counts_at_its_age_when_the_run_ended() -> None:
    """A configuration that leaves the subject's oldest work undone must not look fresher for it."""
    effects = [effect(name, SUBJECT, 20.0, 3.0) for name in "abc"]
    accepted = [(20.0, SUBJECT)] * 3 + [(30.0, SUBJECT), (32.0, SUBJECT)]

    result = comparison(
        SCENARIO, observations(accepted_at=accepted), [], effects, in_dlq=0, cost=None, ended_t=100.0
    )

    assert result["noisy_fresh_unserved"] == 2
    # the two never run count at least as old as the latest fresh sends: 100 - 30 and 100 - 32 s
    assert result["noisy_fresh_p99_ms"] == 70_000.0


def test_stale_work_is_what_ran_older_than_the_freshness_window() -> None:
    assert FRESHNESS_S == 30.0  # three of the demo's 10 s sideline ages
    effects = [
        effect("a", "tenant-02", 5.0, FRESHNESS_S + 1),
        effect("b", SUBJECT, 20.0, FRESHNESS_S - 1),
        effect("c", SUBJECT, 21.0, 2 * FRESHNESS_S),
        effect("c", SUBJECT, 21.0, 3 * FRESHNESS_S),  # the same message again: counted once
    ]
    result = measure(effects=effects)
    assert result["stale_processed"] == 2
    assert result["freshness_s"] == FRESHNESS_S


@pytest.mark.parametrize(("kind", "expected"), [("outage", 7), ("noisy", 0), ("poison", 0)])
def test_dead_letters_count_as_the_outage_s_in_the_outage_scenario_only(kind: str, expected: int) -> None:
    assert measure(scenario=Scenario(kind=kind), in_dlq=7)["dlq_due_to_outage"] == expected  # type: ignore[arg-type]


def test_peak_backlog_and_its_drain_after_the_event() -> None:
    depths = [
        (5.0, 6, 0, 0),
        (10.0, 8, 0, 0),  # the baseline's deepest: 8
        (20.0, 60, 40, 0),  # the peak: live and sideline together
        (36.0, 40, 10, 0),
        (38.0, 10, 3, 0),  # 13 = 8 + the slack of 5: drained, 3 s after the event's end
        (40.0, 2, 0, 0),
    ]
    result = measure(observations(depths=depths))
    assert result["peak_backlog"] == 100
    assert result["drain_s"] == 3.0


def test_a_backlog_never_drained_within_the_run_has_no_drain_time() -> None:
    depths = [(10.0, 8, 0, 0), (20.0, 500, 0, 0), (50.0, 400, 0, 0)]
    assert drain_seconds(depths, 15.0, 35.0) is None
    assert measure(observations(depths=depths))["drain_s"] is None


def test_the_cost_per_million_delivered_comes_from_the_cost_section() -> None:
    assert measure(cost={"usd_per_million_delivered": 12.5})["usd_per_million"] == 12.5
    assert measure(cost=None)["usd_per_million"] is None


def test_the_table_puts_the_configurations_side_by_side() -> None:
    results = [
        {"config": name, **measure(cost={"usd_per_million_delivered": usd})}
        for name, usd in (("naive", 10.0), ("fair", 11.0), ("breakwater", 20.0))
    ]
    results[0]["quiet_p99_ratio"] = 4.25
    rows = dict(measure_rows(results))
    assert rows["$ per million delivered"] == ["$10.00", "$11.00", "$20.00"]
    assert rows["quiet p99 age, event / before"] == ["4.25x", "-", "-"]
    assert rows["backlog drained after the event"] == ["not within the run"] * 3
    assert rows[f"stale work run (older than {FRESHNESS_S:g} s)"] == ["0", "0", "0"]
    header = comparison_table(results).splitlines()[0].split()
    assert header == ["naive", "fair", "breakwater"]
