"""A processor whose work takes ``SLOW_PROCESSOR_SECONDS`` (cancellable), for the heartbeat's tests."""

from __future__ import annotations

import os
from typing import Any

from breakwater.envelope import Envelope
from breakwater.processor import WorkContext


def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
    work.pause(float(os.environ["SLOW_PROCESSOR_SECONDS"]))
    work.check()
    return {"id": envelope.id}
