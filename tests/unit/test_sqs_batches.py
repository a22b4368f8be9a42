"""SQS batches cut by entries and by the entries' summed size."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from breakwater.sqs_batches import MAX_BATCH_BYTES, MAX_BATCH_ENTRIES, batches, entry_size, message_size


def test_message_size_counts_body_and_attributes_as_sqs_does() -> None:
    assert message_size("héllo") == 6
    attributes = {"breakwater-redriven": {"DataType": "Number", "StringValue": "1700000000000"}}
    assert message_size("x", attributes) == 1 + len("breakwater-redriven") + len("Number") + 13
    assert message_size("", {"b": {"DataType": "Binary", "BinaryValue": b"\x00\x01"}}) == 1 + 6 + 2
    assert entry_size({"Id": "0", "MessageBody": "abc", "MessageAttributes": attributes}) == 3 + 19 + 6 + 13


def test_ten_small_messages_make_one_batch_and_an_eleventh_a_second() -> None:
    assert [len(b) for b in batches(range(11), lambda _: 1)] == [10, 1]


def test_large_messages_are_cut_by_bytes() -> None:
    sizes = [300 * 1024] * 7
    assert [len(b) for b in batches(sizes, int)] == [3, 3, 1]


def test_a_message_too_large_alone_is_sent_alone() -> None:
    assert list(batches([10, MAX_BATCH_BYTES + 1, 10], int)) == [[10], [MAX_BATCH_BYTES + 1], [10]]


@given(st.lists(st.integers(min_value=0, max_value=MAX_BATCH_BYTES), max_size=60))
def test_batches_keep_order_and_respect_both_bounds(sizes: list[int]) -> None:
    cut = list(batches(sizes, int))
    assert [size for batch in cut for size in batch] == sizes
    for batch in cut:
        assert 1 <= len(batch) <= MAX_BATCH_ENTRIES
        assert sum(batch) <= MAX_BATCH_BYTES
