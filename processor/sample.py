"""The example app's processor: what app.py deploys in the workers (``Processor(handler="sample.process")``).

Replace it with your own: a directory of your code (and its requirements.txt) and a function
``process(envelope, work) -> dict`` under the contract of :mod:`breakwater.processor`. It does no
work of its own: on the embedded AWS, the demo's simulated work comes from the emulator's hooks
around whichever processor is deployed (``local/emulator/processor_hooks.py``), never from here.
"""

from __future__ import annotations

from typing import Any

from breakwater.envelope import Envelope
from breakwater.processor import WorkContext


def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
    """Accept the message: its id, tenant and type are the result the worker records."""
    work.check()
    return {"id": envelope.id, "tenant": envelope.tenant, "type": envelope.type}
