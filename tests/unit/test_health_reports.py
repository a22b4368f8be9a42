"""A container's health writes: at most one per role per interval, unless the oldest age rose."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from breakwater.age_reports import WINDOW_MS, LastReport, ThrottledAgeReports, report_due, resume_offset_ms


def _item_of_one_shard() -> tuple[list[tuple[str, int, int]], Callable[[str, int, int], LastReport]]:
    """The calls made, and a write that keeps the health item's rule: the largest report within its
    window stands; the answer is the report the item stands on after the call."""
    calls: list[tuple[str, int, int]] = []
    stored: dict[str, LastReport] = {}

    def write(role: str, age: int, now: int) -> LastReport:
        calls.append((role, age, now))
        standing = stored.get(role)
        if standing is None or standing.at_ms < now - WINDOW_MS or standing.age_ms <= age:
            standing = stored[role] = LastReport(age, now)
        return standing

    return calls, write


def test_reports_are_written_when_new_rising_or_due() -> None:
    written, write = _item_of_one_shard()
    reports = ThrottledAgeReports(write, 5_000, rise_ms=1_000)

    assert reports("live", 800, 0)  # the first report of a role
    assert not reports("live", 500, 1_000)  # no larger, not due: the stored maximum already says more
    assert not reports("live", 800, 2_000)
    assert not reports("live", 1_799, 3_000)  # risen by less than the margin: not news yet
    assert reports("live", 1_800, 4_999)  # risen by the margin: the live set may be falling behind
    assert reports("backlog", 100, 5_000)  # roles are independent
    assert not reports("live", 2_000, 9_998)
    assert reports("live", 2_000, 9_999)  # due again
    assert written == [
        ("live", 800, 0),
        ("live", 1_800, 4_999),
        ("backlog", 100, 5_000),
        ("live", 2_000, 9_999),
    ]


def test_no_report_is_made_that_the_report_standing_on_the_item_would_refuse() -> None:
    calls, write = _item_of_one_shard()
    first = ThrottledAgeReports(write, 5_000, rise_ms=1_000)  # two containers writing one shard
    second = ThrottledAgeReports(write, 5_000, rise_ms=1_000)

    assert first("live", 9_000, 0)
    assert not second("live", 400, 1_000)  # refused: the item answers with the report that stands
    assert not second("live", 8_000, 10_000)  # due, but no larger than what stands: no call
    assert not first("live", 300, 20_000)  # its own report stands as well
    assert second("live", 9_500, 30_000)  # larger: news, written
    assert not first("live", 9_400, 40_000)  # refused once (it had not seen 9,500), then known
    assert not first("live", 9_400, 50_000)
    assert not first("live", 200, 30_000 + WINDOW_MS)  # the standing report's window not yet closed
    assert first("live", 200, 30_001 + WINDOW_MS)  # closed: a fresh report replaces it
    assert calls == [
        ("live", 9_000, 0),
        ("live", 400, 1_000),
        ("live", 9_500, 30_000),
        ("live", 9_400, 40_000),
        ("live", 200, 30_001 + WINDOW_MS),
    ]


def test_containers_that_learnt_one_report_resume_over_the_interval_not_in_one_instant() -> None:
    _, write = _item_of_one_shard()
    resumed: dict[int, int] = {}  # container -> when it reported again

    def reports(index: int) -> ThrottledAgeReports:
        def tracked(role: str, age: int, now: int) -> LastReport:
            resumed.setdefault(index, now)
            return write(role, age, now)

        return ThrottledAgeReports(tracked, 5_000, offset_ms=resume_offset_ms(f"container-{index}"))

    containers = [reports(index) for index in range(1_000)]
    assert containers[0]("live", 9_000, 0)
    for each in containers[1:]:
        assert not each("live", 100, 1_000)  # refused: every one learns that 9,000 stands
    resumed.clear()
    for now in range(WINDOW_MS + 1, WINDOW_MS + 5_102, 100):  # a smaller age, every 100 ms, from each
        for each in containers:
            each("live", 100, now)

    assert len(resumed) == 1_000  # each reports again once the window closed, after its own offset
    per_second = Counter(now // 1_000 for now in resumed.values())
    assert max(per_second.values()) <= 300  # spread over the interval (all 1,000 at once without it)


def test_a_refused_write_is_reported_as_such() -> None:
    reports = ThrottledAgeReports(lambda role, age, now: LastReport(age + 1, now), 5_000)
    assert not reports("live", 800, 0)  # a larger window maximum stood: nothing changed


def test_a_first_report_is_always_due() -> None:
    assert report_due(None, 0, 0)


def test_a_report_is_due_once_the_interval_passed_or_the_age_rose_by_the_margin() -> None:
    last = LastReport(age_ms=2_000, at_ms=10_000)
    assert not report_due(last, 2_999, 14_999, interval_ms=5_000, rise_ms=1_000)
    assert report_due(last, 3_000, 10_001, interval_ms=5_000, rise_ms=1_000)  # risen: news
    assert report_due(last, 0, 15_000, interval_ms=5_000, rise_ms=1_000)  # due: a fresh observation
    assert not report_due(last, 100, 10_001, interval_ms=5_000, rise_ms=1_000)  # lower, not due
