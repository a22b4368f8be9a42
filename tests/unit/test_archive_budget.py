"""The archive budget: which sideline queues the controller parks in S3 (pure)."""

from __future__ import annotations

from breakwater.archive_budget import ArchiveBudget, ArchiveReason, SidelineObservation, archive_due

NOW = 1_767_225_600_000
BUDGET = ArchiveBudget(age_s=3600, depth=1000)


def _seen(
    depth: int, age_s: float | None = None, seen_ago_s: float = 10, role: str = "backlog"
) -> SidelineObservation:
    if age_s is None:
        return SidelineObservation(role, f"url-{role}", depth)
    return SidelineObservation(role, f"url-{role}", depth, int(age_s * 1000), NOW - int(seen_ago_s * 1000))


def test_within_budget_nothing_is_archived() -> None:
    assert archive_due([_seen(999, 3599), _seen(0)], BUDGET, NOW) == []


def test_oldest_message_past_the_age_budget_archives_that_queue() -> None:
    (due,) = archive_due([_seen(5, 3600, role="spillover"), _seen(5, 10)], BUDGET, NOW)
    assert (due.role, due.queue_url, due.reason, due.oldest_age_s) == (
        "spillover",
        "url-spillover",
        ArchiveReason.AGE,
        3600,
    )


def test_depth_past_the_budget_archives_without_an_age_report() -> None:
    (due,) = archive_due([_seen(1000)], BUDGET, NOW)
    assert due.reason is ArchiveReason.DEPTH and due.depth == 1000 and due.oldest_age_s is None


def test_a_stale_age_report_is_ignored() -> None:
    # The drainers are off (live set unhealthy): the last report is old and says nothing about now.
    assert archive_due([_seen(5, 7200, seen_ago_s=121)], BUDGET, NOW) == []
    (due,) = archive_due([_seen(1500, 7200, seen_ago_s=121)], BUDGET, NOW)
    assert due.reason is ArchiveReason.DEPTH


def test_an_empty_queue_is_never_archived_whatever_its_last_age() -> None:
    assert archive_due([_seen(0, 99_999)], BUDGET, NOW) == []


def test_each_queue_is_judged_on_its_own() -> None:
    due = archive_due([_seen(2000, role="spillover"), _seen(3, 4000, role="backlog")], BUDGET, NOW)
    assert [(d.role, d.reason) for d in due] == [
        ("spillover", ArchiveReason.DEPTH),
        ("backlog", ArchiveReason.AGE),
    ]
