"""Importing a Lambda handler module again in a test, after the mock started and its environment is set."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import pytest


def load_handler(monkeypatch: pytest.MonkeyPatch, module: str, environment: dict[str, str]) -> ModuleType:
    """Import (or re-import) a handler module after the mock started and its environment is set."""
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return fresh_import(module)


def fresh_import(module: str) -> ModuleType:
    """The module imported anew. The copy it replaces first stops its background tally flush: that
    thread would otherwise flush its counts into whichever moto is active when its interval ends,
    another test's table included."""
    loaded = sys.modules.get(module)
    if loaded is None:
        return importlib.import_module(module)
    stop_background_flush(loaded)
    return importlib.reload(loaded)


def stop_background_flush(module: ModuleType) -> None:
    """Stop a handler module's background tally flush, if it runs one (the ingest handler)."""
    stop = getattr(module, "FLUSH_STOP", None)
    if stop is not None:
        stop.set()
