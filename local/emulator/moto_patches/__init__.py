"""Patches of moto, one module per service, each declared once and installed or undone by one call.

moto is this repository's AWS on one machine. Where moto answers differently from AWS in a way the
emulator depends on, a patch corrects it (:attr:`Kind.CORRECTNESS`); where moto's cost grows with a
queue's depth, a table's size or each request in a way AWS's does not, a patch removes the cost and
keeps every answer (:attr:`Kind.SPEED`). Each patch is data (:class:`Patch`): its name, its kind,
the upstream behaviour it corrects, and what it replaces. They are written for one moto release,
:data:`MOTO_VERSION`; any other is refused (:class:`MotoVersionError`) before moto's internals are
touched, since a patch of changed internals could fail quietly.

    install()                                   # all, before a server answers its first request
    install(kinds={Kind.CORRECTNESS})           # only what the emulator needs to be right
    uninstall()                                 # moto as released
    with installed(names={"kinesis.resharding_as_aws"}): ...   # tests: installed for a while
    with removed(names={"sqs.counts_at_one_instant"}): ...     # tests: moto's own for a while

Patches are installed in their declared order (some wrap what an earlier one installed: the speed
patches of DynamoDB are written on top of its correctness patch). Changing the set undoes the
installed patches from the first one that changes and installs the rest again, so each layer sits
on the one it was written for.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from local.emulator.moto_patches.patch import ABSENT, Kind, Patch, Replacement

__all__ = [
    "MOTO_VERSION",
    "Kind",
    "MotoVersionError",
    "Patch",
    "Replacement",
    "check_moto_version",
    "declared",
    "install",
    "installed",
    "installed_names",
    "removed",
    "uninstall",
]

MOTO_VERSION = "5.2.5"  # the release every patch was written against (pyproject.toml pins it)
# modules, installation order
SERVICES = ("sqs", "sqs_fair", "sqs_metrics", "kinesis", "dynamodb", "lambda_", "server")
ALL_KINDS: frozenset[Kind] = frozenset(Kind)


class MotoVersionError(RuntimeError):
    def __init__(self, installed: str, expected: str = MOTO_VERSION) -> None:
        super().__init__(
            f"local/emulator/moto_patches was written for moto {expected}, but moto {installed} is "
            f"installed: install moto=={expected} (pyproject.toml pins it), or check every patch "
            f"against {installed} and change MOTO_VERSION"
        )
        self.installed = installed
        self.expected = expected


def installed_moto_version() -> str:
    return importlib.metadata.version("moto")


def check_moto_version() -> None:
    """Raise :class:`MotoVersionError` unless the installed moto is :data:`MOTO_VERSION`."""
    found = installed_moto_version()
    if found != MOTO_VERSION:
        raise MotoVersionError(found)


def declared() -> tuple[Patch, ...]:
    """Every patch, in installation order (the service modules import moto's internals: checked first)."""
    check_moto_version()
    patches: list[Patch] = []
    for service in SERVICES:
        patches.extend(importlib.import_module(f"{__name__}.{service}").PATCHES)
    return tuple(patches)


_lock = threading.RLock()
# name -> (patch, [(replacement, original)]), in installation order
_installed: dict[str, tuple[Patch, list[tuple[Replacement, Any]]]] = {}


def installed_names() -> tuple[str, ...]:
    with _lock:
        return tuple(_installed)


def _select(patches: tuple[Patch, ...], kinds: Iterable[Kind | str], names: Iterable[str] | None) -> set[str]:
    wanted_kinds = {Kind(kind) for kind in kinds}
    known = {patch.name for patch in patches}
    if names is not None:
        names = set(names)
        unknown = names - known
        if unknown:
            raise KeyError(f"no moto patch named {sorted(unknown)}; the patches: {sorted(known)}")
    return {p.name for p in patches if p.kind in wanted_kinds and (names is None or p.name in names)}


def _apply(patch: Patch) -> None:
    originals: list[tuple[Replacement, Any]] = []
    for replacement in patch.replaces:
        original = vars(replacement.target).get(replacement.attribute, ABSENT)
        setattr(replacement.target, replacement.attribute, replacement.replace(original))
        originals.append((replacement, original))
    _installed[patch.name] = (patch, originals)


def _undo(name: str) -> None:
    patch, originals = _installed.pop(name)
    for replacement, original in reversed(originals):
        if original is ABSENT:
            delattr(replacement.target, replacement.attribute)
        else:
            setattr(replacement.target, replacement.attribute, original)
    patch.forget()


def _change_to(patches: tuple[Patch, ...], wanted: Collection[str]) -> None:
    """Make the installed patches ``wanted``, in declared order, redoing as little as layering allows."""
    current = list(_installed)
    target = [patch.name for patch in patches if patch.name in wanted]
    same = 0
    while same < min(len(current), len(target)) and current[same] == target[same]:
        same += 1
    for name in reversed(current[same:]):
        _undo(name)
    by_name = {patch.name: patch for patch in patches}
    for name in target[same:]:
        _apply(by_name[name])


def install(
    kinds: Iterable[Kind | str] = ALL_KINDS, *, names: Iterable[str] | None = None
) -> tuple[str, ...]:
    """Install the patches of ``kinds`` (only those in ``names``, if given) that are not yet installed.

    Idempotent; call before a moto server answers its first request. Returns the names it installed.
    """
    patches = declared()
    with _lock:
        chosen = _select(patches, kinds, names)
        added = tuple(p.name for p in patches if p.name in chosen and p.name not in _installed)
        _change_to(patches, set(_installed) | chosen)
    return added


def uninstall(names: Iterable[str] | None = None) -> tuple[str, ...]:
    """Undo the patches ``names`` (default: every installed one); returns the names it undid."""
    patches = declared()
    with _lock:
        chosen = _select(patches, ALL_KINDS, names)
        undone = tuple(name for name in _installed if name in chosen)
        _change_to(patches, set(_installed) - chosen)
    return undone


@contextmanager
def installed(
    kinds: Iterable[Kind | str] = ALL_KINDS, *, names: Iterable[str] | None = None
) -> Iterator[None]:
    """The patches installed for the block; afterwards those it installed are undone again."""
    added = install(kinds, names=names)
    try:
        yield
    finally:
        uninstall(added)


@contextmanager
def removed(names: Iterable[str] | None = None) -> Iterator[None]:
    """The patches undone for the block (moto's own behaviour); afterwards those it undid come back."""
    undone = uninstall(names)
    try:
        yield
    finally:
        install(names=undone)
