"""A short noisy-neighbour scenario on the embedded runtime: the demo's pipeline, in seconds.

The same code path as ``make demo`` (``local.scenarios.demo.run_config``): the stack synthesized and created
in moto, tenants added, open-loop load through the emulated API, the workers on the emulated
mappings, the report computed. Phases are too short to measure isolation *quantitatively* (that is
the demo's job, docs/performance.md); this asserts the report's shape and the property
qualitatively: quiet tenants are served throughout, the noisy one is held back, and every accepted
message is accounted for exactly (processed, dropped as expired, still queued, in a DLQ, or parked in
the archive and not replayed). With an archive budget of 5 waiting messages, the controller starts the
archiver (Lambda Invoke to the local containers) during the burst, and the replay job runs on local[2]
after the load: the whole park-and-replay path, end to end.
"""

from __future__ import annotations

from typing import Any

import pytest

from app import merge_context
from local.scenarios.demo import run_config
from local.scenarios.noisy_neighbour import DEMO_CONTEXT, Scenario
from local.scenarios.observations import COUNTER_NAMES

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")]

SHORT = Scenario(tenants=8, baseline_s=3.0, burst_s=4.0, after_s=3.0, drain_s=25.0, senders=6)

GROUP_KEYS = {
    "tenants",
    "accepted",
    "throttled",
    "rejected",
    "first_attempts_live",
    "age_p50_ms",
    "age_p99_ms",
    "age_p99_before_burst_ms",
    "age_p99_during_burst_ms",
    "peak_live_backlog",
    *COUNTER_NAMES,
}


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    context = merge_context(DEMO_CONTEXT, {"breakwater": {"sideline": {"archive_depth": 5}}})
    return run_config("test-breakwater", context, SHORT, progress=False)


def test_the_report_has_its_shape(report: dict[str, Any]) -> None:
    assert report["config"] == "test-breakwater"
    assert set(report["groups"]) == {"noisy", "quiet"}
    for group in report["groups"].values():
        assert set(group) >= GROUP_KEYS
    assert report["groups"]["noisy"]["tenants"] == 1
    assert report["groups"]["quiet"]["tenants"] == SHORT.tenants - 1
    for key in (
        "quiet_p99_ratio_burst_vs_baseline",
        "recovery_s_after_burst",
        "peak_live_depth",
        "aws_requests_per_delivered_message",
        "accounting",
        "series",
        "runtime",
    ):
        assert key in report
    assert report["workers_deployed"]
    assert report["aws_requests"] > 0
    assert report["series"]["first_attempts"] and report["series"]["depths"]


def test_quiet_tenants_are_not_starved(report: dict[str, Any]) -> None:
    quiet, noisy = report["groups"]["quiet"], report["groups"]["noisy"]
    # Quiet tenants stay within their rate: nothing of theirs is refused at the door.
    assert quiet["throttled"] == 0 and quiet["rejected"] == 0
    assert quiet["accepted"] >= (SHORT.tenants - 1) * SHORT.duration_s * SHORT.quiet_rate * 0.8
    # They are served during the burst, not only before and after it ...
    assert quiet["age_p99_during_burst_ms"] is not None
    # ... and almost everything they sent is processed by the end (the rest is still in a queue).
    assert quiet["processed"] >= 0.8 * quiet["accepted"]
    # The noisy tenant, at 10x its consumer rate, is held back: refused at the door or moved aside.
    held_back = noisy["throttled"] + noisy["sidelined"] + noisy["spilled"] + noisy["deferred"]
    assert held_back > 0


def test_every_accepted_message_is_accounted_for(report: dict[str, Any]) -> None:
    accounting = report["accounting"]
    assert accounting["accepted"] == sum(g["accepted"] for g in report["groups"].values())
    assert accounting["accepted"] > 0
    assert (
        accounting["processed"]
        + accounting["dropped_expired"]
        + accounting["queued"]
        + accounting["in_dlq"]
        + accounting["parked_in_archive"]
        == accounting["accepted"]
    ), accounting
    assert accounting["unaccounted"] == 0


def test_a_parked_backlog_is_replayed(report: dict[str, Any]) -> None:
    parked = report["archive_and_replay"]
    assert parked["archiver_runs"] >= 1 and parked["archived"] > 0, parked
    replay = parked["replay"]
    assert replay["failed"] == 0 and replay["rejected"] == 0
    # Every archived envelope comes back once, unless it expired in the archive.
    assert replay["replayed"] + replay["expired"] == parked["archived"], parked
    assert report["accounting"]["replayed"] == replay["replayed"]
