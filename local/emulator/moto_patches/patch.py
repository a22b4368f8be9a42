"""What a patch of moto is, as data: its name, its kind, what it corrects and what it replaces."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    # moto answers differently from AWS where the emulator depends on AWS's answer
    CORRECTNESS = "correctness"
    # moto's answers are kept; a cost that grows where AWS's does not (with a queue's depth, a table's
    # size, each request) is removed
    SPEED = "speed"
    # AWS's limits (throughput, conflicts, sizes): installed only by ``moto_patches.limits.enforce``
    LIMITS = "limits"


class _Absent:
    """An attribute the target does not define itself (moto sets it on each instance, or nowhere)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class Replacement:
    """``target.attribute`` (a class's or a module's own) replaced by ``replace(original)``.

    ``original`` is the target's own entry (its ``__dict__``'s: a function, a property, a classmethod),
    or :data:`ABSENT`; undoing puts it back, or deletes the attribute again.
    """

    target: Any
    attribute: str
    replace: Callable[[Any], Any]


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Patch:
    """One change to moto, installed and undone as a whole (``moto_patches.install`` / ``uninstall``)."""

    name: str  # "<service>.<what it does>"
    kind: Kind
    corrects: str  # what moto does upstream that this changes, and why that matters here
    replaces: tuple[Replacement, ...]
    forget: Callable[[], None] = _nothing  # drops what the patch kept (caches, indexes) when undone


def _no_mappings(_owner: Any) -> dict[str, Any]:
    return {}  # a fresh dict each read: registrations land nowhere, and a send finds nothing to invoke


def _ignore_mappings(_owner: Any, _value: dict[str, Any]) -> None:
    return None


def no_event_source_mappings(_original: Any) -> property:
    """A ``lambda_event_source_mappings`` that never holds one: moto then invokes nothing inline."""
    return property(_no_mappings, _ignore_mappings)
