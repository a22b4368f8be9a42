"""AWS's limits in moto: installed by a call of their own, on only where a run asks for them.

moto never throttles, never reports a transaction conflict and meters nothing, so a design tested on
it has never met the limits it meets in an account. :func:`enforce` installs the patches of
``dynamodb_limits``, ``sqs_limits`` and ``kinesis_limits`` with one :class:`Enforcement` (the limits
of :class:`local.aws_limits.AwsLimits`, a clock, a sleep); :func:`stop_enforcing` undoes them.

    enforce(AwsLimits(scale=20))                       # a server process (BREAKWATER_LOCAL_LIMIT_SCALE)
    with limits_enforced(AwsLimits(scale=100), clock=clock, sleep=sleep) as enforcement: ...  # tests
    enforcement.report()                               # throttles by item kind, hottest items, conflicts

They are not a :class:`Kind` of ``moto_patches.install()``: that call installs what every run needs,
and a test of moto as released, or of the emulator without limits, must never get them by default.
They replace moto's response handlers (DynamoDB, SQS) and the Kinesis backend's puts, which no other
patch replaces, so they install and undo independently of the others.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from local.aws_limits import AwsLimits, ItemThroughput
from local.emulator.moto_patches import check_moto_version
from local.emulator.moto_patches.patch import ABSENT, Patch, Replacement

SERVICES = ("dynamodb_limits", "sqs_limits", "kinesis_limits")  # modules, installation order
HOTTEST = 10  # items a report lists


@dataclass
class Enforcement:
    """The limits a server enforces, and what they refused.

    ``clock`` only moves forward (monotonic seconds); ``sleep`` is how a transaction waits out its
    hold (tests pass one that waits for an event, so nothing depends on wall time).
    """

    limits: AwsLimits
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    dynamodb: ItemThroughput = field(init=False)
    kinesis_records: ItemThroughput = field(init=False)
    kinesis_bytes: ItemThroughput = field(init=False)
    # DynamoDB items held by a transaction in flight: item -> the transaction's token
    held: dict[Any, object] = field(default_factory=dict)
    # writes refused because a transaction held their item, by item kind (plain writes and transactions)
    conflicts: Counter[str] = field(default_factory=Counter)
    # other refusals by error code (sizes, counts, Kinesis shards)
    refused: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.dynamodb = ItemThroughput.for_dynamodb(self.limits)
        self.kinesis_records = ItemThroughput.for_kinesis_records(self.limits)
        self.kinesis_bytes = ItemThroughput.for_kinesis_bytes(self.limits)

    def report(self) -> dict[str, Any]:
        """What a run's report states: the limits, and what they did."""
        with self.lock:
            kinesis_throttled = sum(s.throttled for s in self.kinesis_records.stats.values()) + sum(
                s.throttled for s in self.kinesis_bytes.stats.values()
            )
            return {
                "limits": self.limits.describe(),
                "scale": self.limits.scale,
                "dynamodb_throttles": self.dynamodb.throttles_by_kind(),
                "transaction_conflicts": dict(sorted(self.conflicts.items())),
                "hottest_items": self.dynamodb.hottest(HOTTEST),
                "dynamodb_write_units_by_kind": self.dynamodb.write_units_by_kind(),
                "kinesis_throttled_records": kinesis_throttled,
                "refused": dict(sorted(self.refused.items())),
            }


_active: Enforcement | None = None
_install_lock = threading.RLock()
_installed: list[tuple[Patch, list[tuple[Replacement, Any]]]] = []


def active() -> Enforcement | None:
    """The enforcement in place (None: moto as the other patches leave it)."""
    return _active


def declared() -> tuple[Patch, ...]:
    check_moto_version()
    patches: list[Patch] = []
    for service in SERVICES:
        patches.extend(importlib.import_module(f"local.emulator.moto_patches.{service}").PATCHES)
    return tuple(patches)


def enforce(
    limits: AwsLimits,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Enforcement:
    """Install the limit patches (once) and enforce ``limits`` from now on, with fresh meters."""
    global _active
    with _install_lock:
        if not _installed:
            for patch in declared():
                originals = []
                for replacement in patch.replaces:
                    original = vars(replacement.target).get(replacement.attribute, ABSENT)
                    setattr(replacement.target, replacement.attribute, replacement.replace(original))
                    originals.append((replacement, original))
                _installed.append((patch, originals))
        _active = Enforcement(limits, clock=clock, sleep=sleep)
        return _active


def stop_enforcing() -> None:
    """moto without limits again: the patches undone, the meters dropped."""
    global _active
    with _install_lock:
        _active = None
        while _installed:
            patch, originals = _installed.pop()
            for replacement, original in reversed(originals):
                if original is ABSENT:
                    delattr(replacement.target, replacement.attribute)
                else:
                    setattr(replacement.target, replacement.attribute, original)
            patch.forget()


def installed_names() -> tuple[str, ...]:
    with _install_lock:
        return tuple(patch.name for patch, _ in _installed)


@contextmanager
def limits_enforced(
    limits: AwsLimits,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Enforcement]:
    """The limits enforced for the block (tests with ``mock_aws`` or an in-process server)."""
    enforcement = enforce(limits, clock=clock, sleep=sleep)
    try:
        yield enforcement
    finally:
        stop_enforcing()
