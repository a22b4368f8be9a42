"""Fixtures of the emulator's tests: the embedded AWS (moto's servers in processes of their own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local.emulator.embedded_aws import EmbeddedAws


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    """One embedded AWS per test module, as the runtime starts it (patched, DynamoDB apart)."""
    embedded = EmbeddedAws().start()
    yield embedded
    embedded.stop()
