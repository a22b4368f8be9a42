"""Local-only hooks around the user's processor, installed by ``container.py`` in a worker's container.

Two environment variables switch them on (the demo's scenarios set them; nothing in the stack does):

- ``BREAKWATER_LOCAL_FAULTS``: a JSON file of switches the scenario flips while it runs, read at most
  every :data:`REREAD_S`: ``dependency_down`` makes every call raise the processor contract's
  :class:`~breakwater.processor.DependencyUnavailableError` (the downstream is out), and a payload
  with ``"poison": true`` fails with ``ValueError`` every time until ``poison_fixed`` is set (the fix
  deployed).
- ``BREAKWATER_LOCAL_EFFECTS``: a JSON-lines file; each successful call of the processor appends one
  line (envelope id, tenant, when it was enqueued and processed, whether it was poison), the effect a
  scenario counts: how soon fresh messages were served, and that no message was processed twice. One
  ``write`` per line on a file opened for appending, so lines from several containers never interleave.

The hooks wrap ``breakwater.processor.process``, which the worker looks up at call time, so they sit
inside the idempotency layer: what they record is what the processor really ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAULTS_ENV = "BREAKWATER_LOCAL_FAULTS"
EFFECTS_ENV = "BREAKWATER_LOCAL_EFFECTS"
REREAD_S = 0.1


class _Switches:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._read_at = 0.0
        self._value: dict[str, Any] = {}

    def __call__(self) -> dict[str, Any]:
        now = time.monotonic()
        if now - self._read_at >= REREAD_S:
            self._read_at = now
            # not written yet, or being replaced: the last switches stand
            with contextlib.suppress(OSError, ValueError):
                self._value = dict(json.loads(self._path.read_text(encoding="utf-8")))
        return self._value


def install() -> bool:
    """Wrap ``breakwater.processor.process`` if either variable is set; False if there is nothing to do."""
    faults_path, effects_path = os.environ.get(FAULTS_ENV), os.environ.get(EFFECTS_ENV)
    if not faults_path and not effects_path:
        return False
    from breakwater import processor

    original: Callable[..., dict[str, Any]] = processor.process
    switches: Callable[[], dict[str, Any]] = _Switches(Path(faults_path)) if faults_path else dict
    effects = Path(effects_path).open("a", encoding="utf-8", buffering=1) if effects_path else None  # noqa: SIM115
    lock = threading.Lock()

    def process(envelope: Any, work: Any) -> dict[str, Any]:
        faults = switches()
        poison = isinstance(envelope.payload, dict) and envelope.payload.get("poison") is True
        if faults.get("dependency_down"):
            raise processor.DependencyUnavailableError("the sample downstream is down (a local scenario)")
        if poison and not faults.get("poison_fixed"):
            raise ValueError("poison message: the processor fails on it every time, until the fix")
        result = original(envelope, work)
        if effects is not None:
            line = json.dumps(
                {
                    "id": envelope.id,
                    "tenant": envelope.tenant,
                    "enqueued_at": envelope.enqueued_at,
                    "at": int(time.time() * 1000),
                    "poison": poison,
                }
            )
            with lock:
                effects.write(line + "\n")
        return result

    processor.process = process
    return True
