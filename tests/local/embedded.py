"""Shared by the tests that run against the embedded AWS (moto's server in its own process)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from local.emulator.embedded_aws import EmbeddedAws


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    embedded = EmbeddedAws().start()
    yield embedded
    embedded.stop()


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    """Poll ``condition`` every 0.1 s until it holds (True) or ``timeout`` passes (its last answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()
