"""A container's health writes: at most one per role per interval, unless the oldest age rose."""

from __future__ import annotations

from breakwater.age_reports import LastReport, ThrottledAgeReports, report_due


def test_reports_are_written_when_new_rising_or_due() -> None:
    written: list[tuple[str, int, int]] = []

    def write(role: str, age: int, now: int) -> bool:
        written.append((role, age, now))
        return True

    reports = ThrottledAgeReports(write, 5_000, rise_ms=1_000)

    assert reports("live", 800, 0)  # the first report of a role
    assert not reports("live", 500, 1_000)  # no larger, not due: the stored maximum already says more
    assert not reports("live", 800, 2_000)
    assert not reports("live", 1_799, 3_000)  # risen by less than the margin: not news yet
    assert reports("live", 1_800, 4_999)  # risen by the margin: the live set may be falling behind
    assert reports("backlog", 100, 5_000)  # roles are independent
    assert not reports("live", 2_000, 9_998)
    assert reports("live", 200, 9_999)  # due again: a fresh observation, even if smaller
    assert written == [
        ("live", 800, 0),
        ("live", 1_800, 4_999),
        ("backlog", 100, 5_000),
        ("live", 200, 9_999),
    ]


def test_a_refused_write_is_reported_as_such() -> None:
    reports = ThrottledAgeReports(lambda role, age, now: False, 5_000)
    assert not reports("live", 800, 0)  # a larger window maximum stood: nothing changed


def test_a_first_report_is_always_due() -> None:
    assert report_due(None, 0, 0)


def test_a_report_is_due_once_the_interval_passed_or_the_age_rose_by_the_margin() -> None:
    last = LastReport(age_ms=2_000, at_ms=10_000)
    assert not report_due(last, 2_999, 14_999, interval_ms=5_000, rise_ms=1_000)
    assert report_due(last, 3_000, 10_001, interval_ms=5_000, rise_ms=1_000)  # risen: news
    assert report_due(last, 0, 15_000, interval_ms=5_000, rise_ms=1_000)  # due: a fresh observation
    assert not report_due(last, 100, 10_001, interval_ms=5_000, rise_ms=1_000)  # lower, not due
