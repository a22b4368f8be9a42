"""A container's health writes: at most one per role per interval, unless the oldest age rose."""

from __future__ import annotations

from breakwater.aws.health import ThrottledAgeReports


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
