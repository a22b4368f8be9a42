"""The example app's processor: what app.py deploys in the workers (``Processor(handler="sample.process")``).

Replace it with your own: a directory of your code (and its requirements.txt) and a function
``process(envelope, work) -> dict`` under the contract of :mod:`breakwater.processor`.
"""

from __future__ import annotations

from typing import Any

from breakwater.envelope import Envelope
from breakwater.processor import WorkContext


def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
    """Sample workload: simulates ``simulated_work_ms`` of work, cooperatively cancellable.

    A payload ``{"work_factor": n}`` (1 to 100) makes the message ``n`` times as expensive: it stands
    for a downstream that got slower for this message's tenant (the demo's ``slow`` scenario).
    """
    remaining = work.simulated_work_ms * work_factor(envelope.payload) / 1000
    step = 0.05
    while remaining > 0:
        work.pause(min(step, remaining))
        remaining -= step
    work.check()
    return {"id": envelope.id, "tenant": envelope.tenant, "type": envelope.type}


MAX_WORK_FACTOR = 100.0


def work_factor(payload: Any) -> float:
    """The sample workload's cost multiplier named by the payload (1 when it names none or a bad one)."""
    if not isinstance(payload, dict):
        return 1.0
    value = payload.get("work_factor")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 1.0
    return min(max(float(value), 1.0), MAX_WORK_FACTOR)
