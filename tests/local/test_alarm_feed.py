"""``python -m local serve``'s alarm feed prints each alarm's change of state once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from local.emulator.alarms import AlarmReport
from local.scenarios.alarm_feed import AlarmFeed


def transition(alarm: str, state: str, at_s: float) -> dict[str, Any]:
    return {"alarm": alarm, "description": f"{alarm} says so", "state": state, "at_s": at_s, "value": 1.0}


@dataclass
class FakeWatch:
    """Answers each evaluation with the next report; records the windows asked for."""

    reports: list[list[dict[str, Any]]]
    started_at: float = 1_000.0
    samples: int = 0
    windows: list[tuple[float, float]] = field(default_factory=list)

    def sample(self, now: float | None = None) -> None:
        self.samples += 1

    def evaluate(
        self, end_s: float | None = None, time_scale: float = 1.0, start_s: float = 0.0
    ) -> AlarmReport:
        self.windows.append((start_s, end_s or 0.0))
        return AlarmReport(transitions=self.reports.pop(0))


def test_a_transition_is_printed_once_and_the_recovery_after_it() -> None:
    dlq = "MonitoringDlqVisiblelive0"
    watch = FakeWatch(
        reports=[
            [],
            [transition(dlq, "ALARM", 20.0)],
            [transition(dlq, "ALARM", 20.0)],  # still in the window: not news
            [transition(dlq, "ALARM", 20.0), transition(dlq, "OK", 40.0)],
        ]
    )
    printed: list[str] = []
    feed = AlarmFeed(watch, time_scale=12.0, window_s=150.0, emit=printed.append)

    for now in (1_010.0, 1_025.0, 1_030.0, 1_045.0):
        feed.step(now)

    assert len(printed) == 2
    assert printed[0].startswith(f"[alarm] ALARM {dlq} at +20s")
    assert printed[1].startswith(f"[alarm] ok    {dlq} at +40s")
    assert watch.samples == 4
    assert watch.windows[-1] == (0.0, 45.0)


def test_the_window_follows_the_clock() -> None:
    watch = FakeWatch(reports=[[]])
    AlarmFeed(watch, time_scale=1.0, window_s=100.0, emit=lambda _line: None).step(1_500.0)
    assert watch.windows == [(400.0, 500.0)]
