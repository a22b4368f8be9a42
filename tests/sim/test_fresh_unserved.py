"""A run records every message it accepted and never processed (waiting in a queue or a dead-letter
queue, in a worker's hands, parked by the archiver), so that the subject's fresh work left undone
counts in its p99 age."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import sim  # noqa: F401
from sim.config import ConfigName, blueprint, load_context, setups
from sim.report import summarize
from sim.scenarios import Scenario
from sim.system import Recording, System
from sim.worker import Costs

# A fleet far below the subject's flood: much of it is still waiting when the run ends.
SMALL = {
    "worker": {"max_concurrency": 2},
    "tiers": {
        "standard": {"rate": 5, "burst": 10, "consumer_rate": 2.5, "concurrency": 4, "concurrency_floor": 1}
    },
}
# the sideline archived soon: some of the subject's work is parked before the run ends
ARCHIVING = {**SMALL, "sideline": {"archive_age_seconds": 60, "archive_depth": 1}}


def flood(ttl_s: float | None = None) -> Scenario:
    return Scenario(
        kind="noisy",
        tenants=("noisy", "quiet-1", "quiet-2"),
        rates=(2.0, 2.0, 2.0),
        work_ms=(100.0, 100.0, 100.0),
        baseline_s=60.0,
        event_s=120.0,
        after_s=240.0,
        event_rate=200.0,
        ttl_s=ttl_s,
    )


def run(name: ConfigName, scenario: Scenario, override: dict[str, Any]) -> Recording:
    config = blueprint(load_context(), [override])
    return System(scenario, setups(config, same_fleet=False)[name], Costs()).run()


@pytest.mark.parametrize(("name", "override"), [("naive", SMALL), ("fair", SMALL), ("breakwater", ARCHIVING)])
def test_every_accepted_message_is_processed_once_or_recorded_unserved(
    name: ConfigName, override: dict[str, Any]
) -> None:
    scenario = flood()
    rec = run(name, scenario, override)
    accepted = rec.totals["accepted"]
    assert len(rec.served_tenant) + len(rec.unserved_tenant) + rec.totals.get("dropped", 0) == accepted
    subject_unserved = np.asarray(rec.unserved_tenant) == scenario.subject
    assert subject_unserved.any()  # the flood outlasts the run
    if name == "breakwater":
        assert rec.totals.get("archived", 0) > 0  # parked ones are among them
    summary = summarize(rec, scenario)
    enqueued = np.asarray(rec.unserved_enqueued)[subject_unserved]
    fresh = enqueued[enqueued >= scenario.event_start_s]
    assert summary["noisy_fresh_unserved"] == len(fresh)
    # the oldest fresh message left undone is at least as old as the p99 says, never younger than it
    oldest_ms = (scenario.end_s - fresh.min()) * 1000
    assert summary["noisy_fresh_p99_ms"] <= oldest_ms + 0.1


@pytest.mark.parametrize("name", ["naive", "breakwater"])
def test_failures_in_a_workers_hands_or_waiting_out_their_visibility_timeout_are_unserved(
    name: ConfigName,
) -> None:
    # the dependency is down until the run ends: every receive fails, and the failures wait to be seen again
    scenario = replace(flood(), kind="outage", event_rate=None, event_s=600.0, after_s=0.0)
    rec = run(name, scenario, SMALL)
    assert len(rec.served_tenant) + len(rec.unserved_tenant) == rec.totals["accepted"]


def test_a_message_expired_by_the_runs_end_is_not_counted_as_left_undone() -> None:
    ttl_s = 300.0  # the flood's oldest messages expire in the queue before the run ends
    scenario = flood(ttl_s=ttl_s)
    rec = run("naive", scenario, SMALL)
    enqueued = np.asarray(rec.unserved_enqueued)
    assert len(enqueued) and (enqueued + ttl_s > scenario.end_s).all()
    # accepted, neither processed nor dropped, and left out: the ones expired in the queue
    neither = rec.totals["accepted"] - len(rec.served_tenant) - rec.totals["dropped"]
    assert neither > len(enqueued)
