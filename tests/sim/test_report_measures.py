"""The measures that tell the configurations apart, from a recording made by hand: the subject's fresh
work, stale work done, dead letters of an outage, and the backlog's drain."""

from __future__ import annotations

from collections.abc import Sequence

from sim.report import FRESHNESS_S, summarize
from sim.scenarios import Scenario
from sim.system import Recording

QUIET, SUBJECT = 1, 0


def scenario(kind: str = "noisy", ttl_s: float | None = None) -> Scenario:
    return Scenario(
        kind=kind,  # type: ignore[arg-type]
        tenants=("noisy", "quiet"),
        rates=(1.0, 1.0),
        work_ms=(10.0, 10.0),
        baseline_s=100.0,
        event_s=100.0,
        after_s=300.0,
        ttl_s=ttl_s,
    )


def recording(
    served: list[tuple[float, float, int]],
    samples: list[tuple[float, int]],
    unserved: Sequence[tuple[float, int]] = (),
) -> Recording:
    """``served``: (enqueued, processed at, tenant); each also a prompt first attempt. ``samples``:
    (t, total backlog). ``unserved``: (enqueued, tenant) of what was accepted and never processed."""
    rec = Recording()
    for enqueued, tenant in unserved:
        rec.unserved_enqueued.append(enqueued)
        rec.unserved_tenant.append(tenant)
    for enqueued, at, tenant in served:
        rec.first_enqueued.append(enqueued)
        rec.first_received.append(enqueued + 0.1)
        rec.first_tenant.append(tenant)
        rec.served_enqueued.append(enqueued)
        rec.served_at.append(at)
        rec.served_tenant.append(tenant)
    rec.samples = [(t, total, 0, total, 0) for t, total in samples]
    rec.totals = {"processed": len(served), "in_dlq": 7}
    rec.wall_s = 1.0
    return rec


def test_the_subjects_fresh_work_is_its_messages_sent_since_the_event_started() -> None:
    served = [(50.0 + i, 50.5 + i, QUIET) for i in range(20)]
    served += [(90.0, 90.2, SUBJECT)]  # before the event: not its fresh work
    served += [(150.0, 150.0 + 30.0, SUBJECT)] * 10  # sent during the event, done 30 s later
    summary = summarize(recording(served, [(0.0, 0)]), scenario())
    assert summary["noisy_fresh_p99_ms"] == 30_000.0


def test_the_subjects_fresh_work_never_processed_counts_at_its_age_when_the_run_ended() -> None:
    served = [(50.0 + i, 50.5 + i, QUIET) for i in range(20)]
    served += [(150.0, 150.0 + 30.0, SUBJECT)] * 10  # sent during the event, done 30 s later
    unserved = [(190.0, SUBJECT)]  # never processed: 500 - 190 s old when the run ended
    unserved += [(90.0, SUBJECT), (190.0, QUIET)]  # not the subject's fresh work
    summary = summarize(recording(served, [(0.0, 0)], unserved), scenario())
    assert summary["noisy_fresh_unserved"] == 1
    # ten ages of 30 s and one of 310 s: the p99 (linear, rank 9.9 of 0..10) is nine tenths of the way up
    assert summary["noisy_fresh_p99_ms"] == round((30.0 + 0.9 * (310.0 - 30.0)) * 1000, 1)
    alone = summarize(recording(served[:20], [(0.0, 0)], [(190.0, SUBJECT)] * 3), scenario())
    assert alone["noisy_fresh_p99_ms"] == 310_000.0  # none done: the flood's age counts all the same
    assert alone["noisy_fresh_unserved"] == 3


def test_the_subjects_fresh_work_all_processed_is_measured_on_its_processing_alone() -> None:
    served = [(50.0 + i, 50.5 + i, QUIET) for i in range(20)] + [(150.0, 180.0, SUBJECT)] * 10
    unserved = [(190.0, QUIET), (60.0, SUBJECT)]  # another tenant's, and the subject's from before
    summary = summarize(recording(served, [(0.0, 0)], unserved), scenario())
    assert (
        summary["noisy_fresh_p99_ms"]
        == summarize(recording(served, [(0.0, 0)]), scenario())["noisy_fresh_p99_ms"]
    )
    assert summary["noisy_fresh_p99_ms"] == 30_000.0
    assert summary["noisy_fresh_unserved"] == 0


def test_stale_work_is_what_was_processed_past_the_ttl_or_the_freshness_window() -> None:
    served = [(10.0, 10.5, QUIET), (10.0, 10.0 + 61.0, QUIET), (10.0, 10.0 + FRESHNESS_S + 1, SUBJECT)]
    assert summarize(recording(served, [(0.0, 0)]), scenario(ttl_s=60.0))["stale_processed"] == 2
    assert summarize(recording(served, [(0.0, 0)]), scenario())["stale_processed"] == 1


def test_dead_letters_count_as_the_outages_only_in_the_outage_scenario() -> None:
    served = [(10.0, 10.5, QUIET)]
    assert summarize(recording(served, [(0.0, 0)]), scenario("outage"))["dlq_due_to_outage"] == 7
    assert summarize(recording(served, [(0.0, 0)]), scenario("poison"))["dlq_due_to_outage"] == 0


def test_the_backlog_drains_when_it_is_back_to_its_level_before_the_event() -> None:
    served = [(10.0, 10.5, QUIET)]
    samples = [(0.0, 20), (50.0, 30), (150.0, 900), (200.0, 800), (260.0, 31), (280.0, 25)]
    assert (
        summarize(recording(served, samples), scenario())["drain_s"] == 80.0
    )  # at 280 s, event ended at 200
    never = [(0.0, 5), (150.0, 900), (400.0, 500)]
    assert summarize(recording(served, never), scenario())["drain_s"] is None
