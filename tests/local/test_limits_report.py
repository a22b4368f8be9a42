"""A report's limits lines: the limits and scale, throttles by kind, conflicts, the hottest items."""

from __future__ import annotations

from local.scenarios.html_report import limits_block
from local.scenarios.limits_report import API_THROTTLES, limits_lines

SECTION = {
    "limits": "AWS limits on (AWS's rates divided by 20): a DynamoDB item 50 WCU/s, 150 RCU/s; ...",
    "scale": 20,
    "dynamodb_throttles": {"burst_pool": 3, "counters": 2},
    "transaction_conflicts": {"burst_pool": 7},
    "hottest_items": [
        {
            "item": "Stack-TablesState-X/pool#concurrency/burst",
            "kind": "burst_pool",
            "peak_wcu_per_s": 61.0,
            "peak_rcu_per_s": 12.5,
            "throttled": 3,
        }
    ],
    "dynamodb_write_units_by_kind": {"counters": 1293.0, "consumer_bucket": 420.0, "sweep": 0.0},
    "kinesis_throttled_records": 0,
    "refused": {},
    "api_gateway": API_THROTTLES,
}


def test_the_lines_state_the_limits_the_throttles_the_conflicts_and_the_hottest_items() -> None:
    text = "\n".join(limits_lines("breakwater", SECTION))
    assert "divided by 20" in text
    assert "not scaled" in text
    assert "DynamoDB throttled calls = 5 (burst_pool 3, counters 2)" in text
    assert "transaction conflicts = 7 (burst_pool 7)" in text
    assert "pool#concurrency/burst" in text and "61.0" in text
    assert "write units by item kind: counters 1293, consumer_bucket 420" in text
    assert "sweep" not in text  # a kind nothing was written to


def test_limits_off_is_one_line_and_a_report_without_the_section_says_so() -> None:
    assert limits_lines("naive", {"limits": "off (moto's own answers)"}) == [
        "naive      off (moto's own answers)"
    ]
    assert "not recorded" in limits_block({"config": "old"})
    assert "burst_pool" in limits_block({"config": "breakwater", "aws_limits": SECTION})
