"""API keys, constant-time compare with a rotation overlap, tier limits with overrides, the record cache."""

from __future__ import annotations

import json

import pytest

from breakwater.auth import (
    Authorizer,
    MalformedKeyError,
    TenantCache,
    TenantRecord,
    TenantStatus,
    Verdict,
    decide,
    generate_api_key,
    hash_key,
    parse_authorization,
    record_from_item,
    rest_api_id_of,
    usage_identifier_key,
)
from breakwater.settings import TierSettings

TIERS = TierSettings.model_validate(
    {
        "tiers": json.dumps(
            {
                "standard": {
                    "rate": 5,
                    "burst": 10,
                    "consumer_rate": 5,
                    "concurrency": 2,
                    "concurrency_floor": 1,
                },
                "premium": {
                    "rate": 50,
                    "burst": 100,
                    "consumer_rate": 50,
                    "concurrency": 8,
                    "concurrency_floor": 2,
                },
            }
        ),
        "default_tier": "standard",
    }
)


def record(key, **overrides):
    return TenantRecord(**{"tenant_id": "acme", "key_sha256": hash_key(key), "tier": "standard", **overrides})


def test_usage_keys_name_the_api_and_the_tenant():
    key = usage_identifier_key("a1b2c3d4e5", "acme")
    assert key == "breakwater-usage.a1b2c3d4e5.acme"
    assert len(usage_identifier_key("a", "b")) >= 20  # API Gateway's minimum for a key's value
    assert rest_api_id_of("arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/prod/POST/v1/messages") == (
        "a1b2c3d4e5"
    )
    with pytest.raises(ValueError, match="not an execute-api method ARN"):
        rest_api_id_of("a1b2c3d4e5/prod/POST/v1/messages")
    with pytest.raises(ValueError, match="must be 1-64 characters"):
        usage_identifier_key("a1b2c3d4e5", "a.b")


def test_keys_parse_and_carry_the_tenant():
    key = generate_api_key("acme")
    assert parse_authorization(f"Bearer {key}").tenant_id == "acme"
    assert parse_authorization(f"bearer   {key} ").raw == key


@pytest.mark.parametrize(
    "header", [None, "", "Bearer", "Basic x.y", "Bearer x", "Bearer .secret", "Bearer a b.c"]
)
def test_malformed_headers(header):
    with pytest.raises(MalformedKeyError):
        parse_authorization(header)


def test_generated_keys_are_unique_and_tenant_ids_are_checked():
    assert generate_api_key("acme") != generate_api_key("acme")
    with pytest.raises(ValueError, match="tenant id"):
        generate_api_key("a.b")


def test_decisions():
    key = parse_authorization(f"Bearer {generate_api_key('acme')}")
    assert decide(None, key, TIERS, now=0).verdict == Verdict.UNAUTHORIZED
    assert decide(record("acme.other"), key, TIERS, now=0).verdict == Verdict.UNAUTHORIZED
    assert decide(record(key.raw, status=TenantStatus.DISABLED), key, TIERS, now=0).verdict == Verdict.DENY
    allowed = decide(record(key.raw, limits={"rate": 7, "ignored": 1}), key, TIERS, now=0)
    assert allowed.verdict == Verdict.ALLOW
    assert allowed.context() == {
        "tenant": "acme",
        "tier": "standard",
        "rate": 7.0,
        "burst": 10,
        "consumer_rate": 5.0,
        "concurrency": 2,
        "concurrency_floor": 1,
    }


def test_an_unknown_tier_falls_back_to_the_default():
    key = parse_authorization(f"Bearer {generate_api_key('acme')}")
    assert decide(record(key.raw, tier="gold"), key, TIERS, now=0).tier == "standard"


def test_the_previous_key_works_only_inside_the_overlap():
    old = parse_authorization(f"Bearer {generate_api_key('acme')}")
    rotated = record("acme.new", previous_key_sha256=hash_key(old.raw), previous_key_valid_until=100)
    assert decide(rotated, old, TIERS, now=99).verdict == Verdict.ALLOW
    assert decide(rotated, old, TIERS, now=100).verdict == Verdict.UNAUTHORIZED


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_cache_keeps_records_for_the_ttl_and_misses_briefly():
    clock, reads = Clock(), []
    records = {"acme": record("acme.k")}

    def fetch(tenant_id):
        reads.append(tenant_id)
        return records.get(tenant_id)

    cache = TenantCache(fetch, clock, ttl_seconds=60, negative_ttl_seconds=5)
    for _ in range(10):
        cache.get("acme")
        cache.get("nobody")
    assert reads == ["acme", "nobody"]
    clock.now = 5
    cache.get("nobody")
    cache.get("acme")
    assert reads == ["acme", "nobody", "nobody"]
    clock.now = 60
    cache.get("acme")
    assert reads[-1] == "acme" and len(reads) == 4


def test_a_wrong_key_rereads_at_most_every_few_seconds():
    clock, reads = Clock(), []
    current = {"record": record("acme.old")}

    def fetch(tenant_id):
        reads.append(tenant_id)
        return current["record"]

    authorizer = Authorizer(TenantCache(fetch, clock, ttl_seconds=300, recheck_seconds=5), TIERS, clock)
    assert authorizer.authorize("Bearer acme.old").verdict == Verdict.ALLOW
    current["record"] = record("acme.new")
    for _ in range(20):
        assert authorizer.authorize("Bearer acme.wrong").verdict == Verdict.UNAUTHORIZED
    assert len(reads) == 1  # bogus keys cannot force reads
    clock.now = 5
    assert authorizer.authorize("Bearer acme.new").verdict == Verdict.ALLOW  # a rotated key works in seconds
    assert len(reads) == 2


def test_records_from_items():
    item = {
        "tenant_id": "acme",
        "key_sha256": "ab",
        "tier": "premium",
        "status": "disabled",
        "limits": {"rate": 3},
        "previous_key_valid_until": 10,
    }
    parsed = record_from_item(item)
    assert parsed.status == TenantStatus.DISABLED
    assert parsed.limits == {"rate": 3.0}
    assert parsed.previous_key_sha256 is None
