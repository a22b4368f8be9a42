"""The workers run the processor PROCESSOR_HANDLER names, through ``breakwater.processor.process``."""

from __future__ import annotations

import pytest

from breakwater import processor
from breakwater.envelope import Envelope, new_envelope_id


def _envelope() -> Envelope:
    return Envelope(id=new_envelope_id(1_000), tenant="acme", type="t", payload={}, enqueued_at=1_000)


def test_the_deployed_processor_is_the_one_process_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processor, "_deployed", None)
    with pytest.raises(RuntimeError, match="no processor deployed"):
        processor.process(_envelope(), processor.WorkContext())
    processor.deploy("processor.sample.process")
    assert processor.process(_envelope(), processor.WorkContext())["tenant"] == "acme"


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("process", "is not 'module.function'"),
        ("processor.sample.missing", "module 'processor.sample' has no function 'missing'"),
    ],
)
def test_a_bad_processor_handler_is_named(handler: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        processor.load_processor(handler)
