"""Local-only hooks around the user's processor, installed by ``container.py`` in a worker's container.

Environment variables switch them on (the emulator, the scenarios and the chaos run set them; nothing in
the stack does):

- ``BREAKWATER_LOCAL_WORK_MS``: the demo's stand-in for a processor's own work, paused (cancellably,
  as ``work.pause`` does) before the deployed processor runs: this many milliseconds per message,
  times the payload's ``work_factor`` (1 to 100; the ``slow`` scenario's slower downstream). The
  runtime sets it from the context's ``breakwater_local.work_ms`` (:data:`DEFAULT_WORK_MS` unless it
  says otherwise; 0 runs the processor alone).

- ``BREAKWATER_LOCAL_FAULTS``: a JSON file of switches the scenario flips while it runs, read at most
  every :data:`REREAD_S`: ``dependency_down`` makes every call raise the processor contract's
  :class:`~breakwater.processor.DependencyUnavailableError` (the downstream is out), and a payload
  with ``"poison": true`` fails with ``ValueError`` every time until ``poison_fixed`` is set (the fix
  deployed). Its ``chaos`` object holds the chaos run's processor faults (:class:`ChaosFaults`).
- ``BREAKWATER_LOCAL_EFFECTS``: a JSON-lines file; each successful call of the processor appends one
  line (envelope id, tenant, when it was enqueued and processed, whether it was poison), the effect a
  scenario counts: how soon fresh messages were served, and that no message was processed twice. One
  ``write`` per line on a file opened for appending, so lines from several containers never interleave.
- ``BREAKWATER_LOCAL_EFFECTS_TABLE``: a DynamoDB table (the chaos run creates it; it is not part of the
  stack) that holds, per ``(tenant, key)``, the message's effect: an update handed to
  ``work.add_effect``, so the worker writes it in one transaction with the message's idempotency
  record (``effects`` and ``effect_log`` count every effect written, so a repeat is counted even when
  two commits race); and, written at once with the hooks' own client, every run of the processor
  that returned (``runs``, ``run_log``), whether its effect was committed or not. A log entry is
  ``request id|started|ended|envelope id|pid``.
- ``BREAKWATER_LOCAL_FAULT_LOG``: a JSON-lines file with one line per fault the hooks injected.

The hooks wrap ``breakwater.processor.process``, which the worker looks up at call time, so they sit
inside the idempotency layer: what they record is what the processor really ran. Their own AWS calls
use a session of their own: the AWS faults a container injects (``container.py``) are the handler's,
not the instrument's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAULTS_ENV = "BREAKWATER_LOCAL_FAULTS"
EFFECTS_ENV = "BREAKWATER_LOCAL_EFFECTS"
EFFECTS_TABLE_ENV = "BREAKWATER_LOCAL_EFFECTS_TABLE"
FAULT_LOG_ENV = "BREAKWATER_LOCAL_FAULT_LOG"
REQUEST_ID_ENV = "BREAKWATER_LOCAL_REQUEST_ID"  # the invocation in progress (set by container.py)
WORK_MS_ENV = "BREAKWATER_LOCAL_WORK_MS"
DEFAULT_WORK_MS = 20
REREAD_S = 0.1
MAX_WORK_FACTOR = 100.0
WORK_STEP_S = 0.05  # how often the simulated work looks at the cancel signal


def work_factor(payload: Any) -> float:
    """The simulated work's multiplier a payload names (1 when it names none or a bad one)."""
    if not isinstance(payload, dict):
        return 1.0
    value = payload.get("work_factor")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 1.0
    return min(max(float(value), 1.0), MAX_WORK_FACTOR)


def simulate_work(work: Any, seconds: float) -> None:
    """Pause ``seconds`` in steps, raising as soon as the work is cancelled (deadline, Lambda's time)."""
    remaining = seconds
    while remaining > 0:
        work.pause(min(WORK_STEP_S, remaining))
        remaining -= WORK_STEP_S
    work.check()


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


def draw(seed: int, tenant: str, key: str, kind: str) -> float:
    """A number in [0, 1) fixed by the seed, the message and the fault kind: which messages a fault picks.

    The chaos checker draws the same numbers, so it knows which messages had to fail for good.
    """
    digest = hashlib.sha256(f"{seed}|{tenant}|{key}|{kind}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def effect_key(envelope: Any) -> str:
    """What an effect is recorded under beside its tenant: the client's key, else the envelope id."""
    return effect_key_of(envelope.dedup_key, envelope.id)


def effect_key_of(dedup_key: Any, envelope_id: Any) -> str:
    """:func:`effect_key` from an envelope's two fields (the chaos checker reads envelopes as JSON)."""
    return str(dedup_key) if dedup_key else f"id:{envelope_id}"


@dataclass(frozen=True)
class ChaosFaults:
    """The chaos run's processor faults, each drawn per message with :func:`draw`.

    ``permanent_share`` of the messages fail on every run (they end in a dead-letter queue);
    ``transient_rate`` fail on their first run only; ``long_share`` spend ``long_s`` (longer than the
    queue's visibility timeout) on their first run before the work, for the heartbeat to cover.
    """

    seed: int = 0
    transient_rate: float = 0.0
    permanent_share: float = 0.0
    long_share: float = 0.0
    long_s: float = 0.0

    @classmethod
    def of(cls, switches: dict[str, Any]) -> ChaosFaults | None:
        chaos = switches.get("chaos")
        return cls(**chaos) if isinstance(chaos, dict) else None

    def permanent(self, tenant: str, key: str) -> bool:
        return draw(self.seed, tenant, key, "permanent") < self.permanent_share

    def transient(self, tenant: str, key: str) -> bool:
        return draw(self.seed, tenant, key, "transient") < self.transient_rate

    def long(self, tenant: str, key: str) -> bool:
        return draw(self.seed, tenant, key, "long") < self.long_share


class ProcessorFailedError(RuntimeError):
    """A failure the chaos run injected into the processor."""


class _EffectsTable:
    """The chaos run's effects table, written with a client of its own (retrying, never fault-injected)."""

    def __init__(self, table: str) -> None:
        import boto3
        from botocore.config import Config

        self.table = table
        self.client = boto3.session.Session().client(
            "dynamodb", config=Config(retries={"mode": "standard", "max_attempts": 10})
        )

    def record_run(self, tenant: str, key: str, run: str) -> None:
        """A run of the processor that returned (written now, whatever becomes of its effect)."""
        self.client.update_item(
            TableName=self.table,
            Key={"tenant": {"S": tenant}, "key": {"S": key}},
            UpdateExpression="ADD runs :one, run_log :runs",
            ExpressionAttributeValues={":one": {"N": "1"}, ":runs": {"SS": [run]}},
        )

    def effect(self, tenant: str, key: str, run: str) -> dict[str, Any]:
        """The message's effect, as a transaction entry for ``work.add_effect``."""
        return {
            "Update": {
                "TableName": self.table,
                "Key": {"tenant": {"S": tenant}, "key": {"S": key}},
                "UpdateExpression": "SET first_effect = if_not_exists(first_effect, :run) "
                "ADD effects :one, effect_log :runs",
                "ExpressionAttributeValues": {":run": {"S": run}, ":one": {"N": "1"}, ":runs": {"SS": [run]}},
            }
        }

    def first_time(self, tenant: str, key: str, marker: str) -> bool:
        """True the first time a fault marks this message (a conditional write), False ever after."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key={"tenant": {"S": tenant}, "key": {"S": key}},
                UpdateExpression="SET #marker = :true",
                ConditionExpression="attribute_not_exists(#marker)",
                ExpressionAttributeNames={"#marker": marker},
                ExpressionAttributeValues={":true": {"BOOL": True}},
            )
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        return True


class _FaultLog:
    def __init__(self, path: str | None) -> None:
        self._file = Path(path).open("a", encoding="utf-8", buffering=1) if path else None  # noqa: SIM115
        self._lock = threading.Lock()

    def __call__(self, kind: str, **detail: Any) -> None:
        if self._file is None:
            return
        line = json.dumps(
            {"kind": kind, "at": time.time(), "request_id": os.environ.get(REQUEST_ID_ENV), **detail}
        )
        with self._lock:
            self._file.write(line + "\n")


def install() -> bool:
    """Wrap ``breakwater.processor.process`` if any variable is set; False if there is nothing to do."""
    faults_path, effects_path = os.environ.get(FAULTS_ENV), os.environ.get(EFFECTS_ENV)
    table_name = os.environ.get(EFFECTS_TABLE_ENV)
    work_s = float(os.environ.get(WORK_MS_ENV) or 0) / 1000
    if not faults_path and not effects_path and not table_name and not work_s:
        return False
    from breakwater import processor

    original: Callable[..., dict[str, Any]] = processor.process
    switches: Callable[[], dict[str, Any]] = _Switches(Path(faults_path)) if faults_path else dict
    effects = Path(effects_path).open("a", encoding="utf-8", buffering=1) if effects_path else None  # noqa: SIM115
    table = _EffectsTable(table_name) if table_name else None
    fault_log = _FaultLog(os.environ.get(FAULT_LOG_ENV))
    lock = threading.Lock()

    def chaos_faults(chaos: ChaosFaults, envelope: Any, work: Any) -> None:
        tenant, key = envelope.tenant, effect_key(envelope)
        if chaos.permanent(tenant, key):
            fault_log("processor_permanent", tenant=tenant, key=key)
            raise ProcessorFailedError("a permanent failure (chaos): this message fails every time")
        if chaos.transient(tenant, key) and table is not None and table.first_time(tenant, key, "transient"):
            fault_log("processor_transient", tenant=tenant, key=key)
            raise ProcessorFailedError("a transient failure (chaos): the next run succeeds")
        if chaos.long(tenant, key) and table is not None and table.first_time(tenant, key, "long"):
            fault_log("long_handler", tenant=tenant, key=key, seconds=chaos.long_s)
            work.pause(chaos.long_s)  # cancellable: the heartbeat stops it before the Lambda's deadline

    def process(envelope: Any, work: Any) -> dict[str, Any]:
        started_ms = int(time.time() * 1000)
        faults = switches()
        poison = isinstance(envelope.payload, dict) and envelope.payload.get("poison") is True
        if faults.get("dependency_down"):
            raise processor.DependencyUnavailableError("the sample downstream is down (a local scenario)")
        if poison and not faults.get("poison_fixed"):
            raise ValueError("poison message: the processor fails on it every time, until the fix")
        chaos = ChaosFaults.of(faults)
        if chaos is not None:
            chaos_faults(chaos, envelope, work)
        if work_s:
            simulate_work(work, work_s * work_factor(envelope.payload))
        result = original(envelope, work)
        if table is not None:
            run = "|".join(
                (
                    os.environ.get(REQUEST_ID_ENV, ""),
                    str(started_ms),
                    str(int(time.time() * 1000)),
                    envelope.id,
                    str(os.getpid()),
                )
            )
            table.record_run(envelope.tenant, effect_key(envelope), run)
            work.add_effect(table.effect(envelope.tenant, effect_key(envelope), run))
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
