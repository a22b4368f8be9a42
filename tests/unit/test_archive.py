"""The archive's layout and encoding (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from breakwater.archive import (
    UNPARSEABLE_TENANT,
    ArchivedMessage,
    decode_ndjson_gz,
    encode_ndjson_gz,
    group_by_partition,
    object_key,
    partition_for,
)
from breakwater.envelope import Envelope, new_envelope_id

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _message(tenant: str, at: int) -> ArchivedMessage:
    envelope = Envelope(id=new_envelope_id(at), tenant=tenant, type="t", enqueued_at=at)
    return ArchivedMessage(body=envelope.to_json(), receipt_handle=f"rh-{tenant}-{at}", message_id=str(at))


def test_key_layout_is_tenant_dt_hour_of_the_enqueue_time() -> None:
    partition = partition_for("acme", T0 + 13 * 3_600_000 + 59_999)
    assert (
        object_key(partition, "abc", "archive") == "archive/tenant=acme/dt=2026-01-01/hour=13/abc.ndjson.gz"
    )
    assert object_key(partition, "abc") == "tenant=acme/dt=2026-01-01/hour=13/abc.ndjson.gz"


def test_tenant_is_one_escaped_path_segment() -> None:
    assert partition_for("a/b c", T0).prefix("x/") == "x/tenant=a%2Fb%20c/dt=2026-01-01/hour=00/"


def test_messages_group_by_tenant_and_hour() -> None:
    messages = [_message("a", T0), _message("a", T0 + 1), _message("a", T0 + 3_600_000), _message("b", T0)]
    groups = group_by_partition(messages, now_ms=T0)
    sizes = {(p.tenant, p.hour): len(items) for p, items in groups.items()}
    assert sizes == {("a", "00"): 2, ("a", "01"): 1, ("b", "00"): 1}


def test_unparseable_bodies_are_archived_not_lost() -> None:
    bad = ArchivedMessage(body="not an envelope", receipt_handle="rh", message_id="m")
    groups = group_by_partition([bad], now_ms=T0 + 5 * 3_600_000)
    ((partition, items),) = groups.items()
    assert (partition.tenant, partition.hour, items) == (UNPARSEABLE_TENANT, "05", [bad])


_BODY = st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=["Cs"]), min_size=1)


@given(st.lists(_BODY))
def test_ndjson_gz_round_trips_one_body_per_line(bodies: list[str]) -> None:
    assert decode_ndjson_gz(encode_ndjson_gz(bodies)) == bodies


def test_encoding_is_deterministic() -> None:
    assert encode_ndjson_gz(["{}", "{}"]) == encode_ndjson_gz(["{}", "{}"])
