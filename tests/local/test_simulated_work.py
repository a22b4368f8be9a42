"""The demo's work is the emulator's, around whichever processor is deployed: never the processor's own."""

from __future__ import annotations

from typing import Any

import pytest

from breakwater import processor
from breakwater.envelope import Envelope, new_envelope_id
from breakwater.processor import WorkCancelledError, WorkContext
from local.emulator import processor_hooks
from local.emulator.processor_hooks import work_factor


def _envelope(payload: object) -> Envelope:
    return Envelope(id=new_envelope_id(1_000), tenant="acme", type="t", payload=payload, enqueued_at=1_000)


class _CountingWork(WorkContext):
    """Counts the work asked for instead of sleeping."""

    slept: float = 0.0

    def pause(self, seconds: float) -> None:
        self.slept += seconds
        self.check()


def test_a_payload_may_ask_for_n_times_the_work_within_bounds() -> None:
    assert work_factor({"work_factor": 20}) == 20.0
    assert work_factor({"work_factor": 1000}) == 100.0
    assert work_factor({"work_factor": 0.5}) == 1.0
    assert work_factor({"work_factor": True}) == 1.0
    assert work_factor({"work_factor": "20"}) == 1.0
    assert work_factor([1, 2]) == 1.0 and work_factor(None) == 1.0


def test_the_hooks_work_before_the_deployed_processor_n_times_for_a_slowed_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []

    def deployed(envelope: Envelope, work: Any) -> dict[str, Any]:
        ran.append(envelope.id)
        return {"ok": envelope.id}

    for name in (processor_hooks.FAULTS_ENV, processor_hooks.EFFECTS_ENV, processor_hooks.EFFECTS_TABLE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(processor_hooks.WORK_MS_ENV, "100")
    monkeypatch.setattr(processor, "process", deployed)
    assert processor_hooks.install()
    usual, slowed = _CountingWork(), _CountingWork()
    usual_message, slowed_message = _envelope({"work_factor": 1}), _envelope({"work_factor": 20})

    assert processor.process(usual_message, usual) == {"ok": usual_message.id}
    assert processor.process(slowed_message, slowed) == {"ok": slowed_message.id}
    assert usual.slept == pytest.approx(0.1)
    assert slowed.slept == pytest.approx(2.0)
    assert ran == [usual_message.id, slowed_message.id]

    cancelled = _CountingWork()
    cancelled.cancel.set()
    with pytest.raises(WorkCancelledError):
        processor.process(_envelope({}), cancelled)
    assert len(ran) == 2  # cancelled during the simulated work: the processor never ran


def test_the_sample_processor_does_no_work_of_its_own() -> None:
    from processor.sample import process

    work = _CountingWork()
    assert process(_envelope({"work_factor": 50}), work)["tenant"] == "acme"
    assert work.slept == 0.0
