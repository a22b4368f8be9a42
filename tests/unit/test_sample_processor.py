"""The sample workload: its cost, and a payload that asks for more of it."""

from __future__ import annotations

import pytest

from breakwater.envelope import Envelope, new_envelope_id
from breakwater.processor import WorkContext
from processor.sample import process, work_factor


def _envelope(payload: object) -> Envelope:
    return Envelope(id=new_envelope_id(1_000), tenant="acme", type="t", payload=payload, enqueued_at=1_000)


def test_a_payload_may_ask_for_n_times_the_work_within_bounds() -> None:
    assert work_factor({"work_factor": 20}) == 20.0
    assert work_factor({"work_factor": 1000}) == 100.0
    assert work_factor({"work_factor": 0.5}) == 1.0
    assert work_factor({"work_factor": True}) == 1.0
    assert work_factor({"work_factor": "20"}) == 1.0
    assert work_factor([1, 2]) == 1.0 and work_factor(None) == 1.0


class _CountingWork(WorkContext):
    """Counts the work the processor asks for instead of sleeping."""

    slept: float = 0.0

    def pause(self, seconds: float) -> None:
        self.slept += seconds


def test_the_slowed_message_asks_for_n_times_the_work_and_still_answers() -> None:
    usual, slowed = _CountingWork(simulated_work_ms=100), _CountingWork(simulated_work_ms=100)
    assert process(_envelope({"work_factor": 1}), usual)["tenant"] == "acme"
    assert process(_envelope({"work_factor": 20}), slowed)["tenant"] == "acme"
    assert usual.slept == pytest.approx(0.1)
    assert slowed.slept == pytest.approx(2.0)
