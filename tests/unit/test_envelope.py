"""The envelope: time-ordered ids, expiry, re-homing, JSON round trip."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from breakwater.envelope import Envelope, Origin, envelope_id_time_ms, new_envelope_id


def make(**overrides):
    fields = {"id": new_envelope_id(1_000), "tenant": "acme", "type": "t", "enqueued_at": 1_000}
    return Envelope(**{**fields, **overrides})


def test_ids_are_time_ordered_and_carry_their_millisecond():
    ids = [new_envelope_id(ms) for ms in (1, 2, 1_000, 1_700_000_000_000, 1_700_000_000_001)]
    assert ids == sorted(ids)
    assert [envelope_id_time_ms(i) for i in ids] == [1, 2, 1_000, 1_700_000_000_000, 1_700_000_000_001]
    assert all(len(i) == 26 for i in ids)


def test_ids_within_one_millisecond_are_unique():
    ids = {new_envelope_id(42) for _ in range(1000)}
    assert len(ids) == 1000


def test_ids_sort_by_time_before_randomness():
    late_low = new_envelope_id(2, randomness=bytes(10))
    early_high = new_envelope_id(1, randomness=b"\xff" * 10)
    assert early_high < late_low


def test_randomness_must_be_ten_bytes():
    with pytest.raises(ValueError, match="10 bytes"):
        new_envelope_id(1, randomness=b"short")


def test_round_trip_and_expiry():
    envelope = make(expires_at=2_000, payload={"a": [1, 2]})
    assert Envelope.from_json(envelope.to_json()) == envelope
    assert not envelope.is_expired(1_999)
    assert envelope.is_expired(2_000)
    assert envelope.age_ms(1_500) == 500
    assert make().is_expired(10**15) is False


def test_moving_keeps_id_and_enqueued_at():
    envelope = make()
    moved = envelope.moved(Origin.SURGE, attempt=2)
    assert (moved.id, moved.enqueued_at, moved.origin, moved.attempt) == (envelope.id, 1_000, Origin.SURGE, 2)


def test_unknown_fields_are_refused():
    with pytest.raises(ValidationError):
        Envelope.model_validate({**make().model_dump(), "extra": 1})
