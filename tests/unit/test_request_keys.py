"""Idempotency keys at the front door: the claim policy over an in-memory store."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from breakwater.errors import BadRequestError, IdempotencyConflictError, IdempotencyKeyReusedError
from breakwater.request_keys import Claim, ClaimState, Decision, RequestKeys, fingerprint, request_key
from breakwater.requests import MessageRequest

NOW = 1_700_000_000_000


@dataclass
class MemoryClaims:
    claims: dict[tuple[str, str], tuple[Claim, int]] = field(default_factory=dict)

    def claim(self, tenant: str, key: str, claim: Claim, expires_at_s: int, now_s: int) -> Claim | None:
        held = self.claims.get((tenant, key))
        if held is not None and held[1] >= now_s:
            return held[0]
        self.claims[(tenant, key)] = (claim, expires_at_s)
        return None

    def take_over(self, tenant: str, key: str, stale: Claim, pending_until_ms: int) -> bool:
        held, expires = self.claims[(tenant, key)]
        if held != stale:
            return False
        self.claims[(tenant, key)] = (replace(held, pending_until_ms=pending_until_ms), expires)
        return True

    def accepted(self, tenant: str, key: str, message_id: str, queue: int) -> None:
        held, expires = self.claims[(tenant, key)]
        self.claims[(tenant, key)] = (replace(held, state=ClaimState.ACCEPTED, queue=queue), expires)

    def release(self, tenant: str, key: str, message_id: str) -> None:
        self.claims.pop((tenant, key), None)

    def held(self, tenant: str, key: str, now_s: int) -> Claim | None:
        held = self.claims.get((tenant, key))
        return held[0] if held is not None and held[1] >= now_s else None


def request(payload: object = None) -> MessageRequest:
    return MessageRequest.model_validate({"type": "order", "payload": payload or {"n": 1}})


@pytest.fixture
def keys() -> RequestKeys:
    return RequestKeys(MemoryClaims(), window_seconds=3600, pending_seconds=10)


def test_a_retry_after_the_first_was_stored_gets_its_original_id(keys: RequestKeys) -> None:
    first = keys.decide("acme", "k1", fingerprint(request(), "k1"), "id-1", NOW)
    assert first.message_id == "id-1" and not first.replay
    keys.store.accepted("acme", "k1", "id-1", 3)

    again = keys.decide("acme", "k1", fingerprint(request(), "k1"), "id-2", NOW + 5_000)

    assert (again.message_id, again.replay, again.queue) == ("id-1", True, 3)


def test_the_same_key_for_another_request_is_refused_naming_the_key(keys: RequestKeys) -> None:
    keys.decide("acme", "k1", fingerprint(request(), "k1"), "id-1", NOW)
    with pytest.raises(IdempotencyKeyReusedError, match="'k1'") as refused:
        keys.decide("acme", "k1", fingerprint(request({"n": 2}), "k1"), "id-2", NOW)
    assert refused.value.status == 422


def test_keys_are_per_tenant(keys: RequestKeys) -> None:
    keys.decide("acme", "k1", fingerprint(request(), "k1"), "id-1", NOW)
    other = keys.decide("globex", "k1", fingerprint(request({"n": 2}), "k1"), "id-2", NOW)
    assert other.message_id == "id-2" and not other.replay


def test_a_retry_while_the_first_is_pending_waits_then_takes_it_over_with_the_same_id(
    keys: RequestKeys,
) -> None:
    keys.decide("acme", "k1", fingerprint(request(), "k1"), "id-1", NOW)
    with pytest.raises(IdempotencyConflictError) as busy:
        keys.decide("acme", "k1", fingerprint(request(), "k1"), "id-2", NOW + 2_000)
    assert busy.value.status == 409 and busy.value.headers["Retry-After"] == "8"

    late = keys.decide("acme", "k1", fingerprint(request(), "k1"), "id-3", NOW + 11_000)

    assert late.message_id == "id-1" and not late.replay  # stored again under its first id


def test_the_header_and_the_body_key_must_agree_and_be_printable() -> None:
    assert request_key("abc", None) == "abc"
    assert request_key(None, "abc") == "abc"
    assert request_key("abc", "abc") == "abc"
    assert request_key(None, None) is None
    for header, body in (("abc", "xyz"), ("", None), ("x" * 129, None), ("caf\u00e9", None), ("a\nb", None)):
        with pytest.raises(BadRequestError) as bad:
            request_key(header, body)
        assert bad.value.code == "invalid_idempotency_key"


def test_a_fingerprint_is_the_request_not_its_formatting() -> None:
    assert fingerprint(request({"a": 1, "b": 2}), "k") == fingerprint(request({"b": 2, "a": 1}), "k")
    assert fingerprint(request(), "k") != fingerprint(request(), "other")


def test_an_accepted_request_has_an_earlier_answer_and_nothing_else_does(keys: RequestKeys) -> None:
    print_ = fingerprint(request(), "k1")
    assert keys.earlier_answer("acme", "k1", print_, NOW) is None  # unknown
    keys.decide("acme", "k1", print_, "id-1", NOW)
    assert keys.earlier_answer("acme", "k1", print_, NOW) is None  # still pending
    keys.store.accepted("acme", "k1", "id-1", 2)
    assert keys.earlier_answer("acme", "k1", print_, NOW + 1_000) == Decision("id-1", replay=True, queue=2)
    assert keys.earlier_answer("acme", "k1", fingerprint(request({"n": 2}), "k1"), NOW) is None  # reused
    assert keys.earlier_answer("acme", "k1", print_, NOW + 3_601_000) is None  # its window passed
