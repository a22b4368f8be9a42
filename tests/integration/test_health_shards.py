"""The workers' oldest-age reports spread over shard items; the controller reads them all and takes the
largest age still in its window (moto's DynamoDB)."""

from __future__ import annotations

import zlib

import pytest

from breakwater.age_reports import resume_offset_ms
from breakwater.aws.controller_ports import build_controller_ports
from breakwater.aws.health import (
    HEALTH_SK,
    WINDOW_MS,
    health_shard,
    health_sk,
    raise_oldest_age,
    read_oldest_age,
    throttled_age_reports,
)
from breakwater.settings import ControllerSettings, SettingsError, WorkerSettings
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import STATE_TABLE, TIERS, WorkerWorld

world = worker_fixtures.world  # the fixture

NOW = 1_700_000_000_000


def holders_on_distinct_shards(shards: int, count: int) -> list[str]:
    """Container ids that land on ``count`` different shards."""
    found: dict[int, str] = {}
    for i in range(10_000):
        holder = f"container-{i}"
        found.setdefault(zlib.crc32(holder.encode()) % shards, holder)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("not enough distinct shards")


def test_each_container_writes_its_own_shard_and_one_shard_keeps_the_original_key(world: WorkerWorld) -> None:
    first, second = holders_on_distinct_shards(8, 2)
    throttled_age_reports(world.dynamodb, STATE_TABLE, holder=first, shards=8)("live", 4_000, NOW)
    throttled_age_reports(world.dynamodb, STATE_TABLE, holder=second, shards=8)("live", 9_000, NOW)
    throttled_age_reports(world.dynamodb, STATE_TABLE, holder=first, shards=1)("live", 2_000, NOW)

    assert world.item("queue#live", f"health#{health_shard(first, 8)}")["oldest_age_ms"] == 4_000
    assert world.item("queue#live", f"health#{health_shard(second, 8)}")["oldest_age_ms"] == 9_000
    assert world.item("queue#live", HEALTH_SK)["oldest_age_ms"] == 2_000  # what a stack of today reads
    assert read_oldest_age(world.dynamodb, STATE_TABLE, "live", shards=8, now_ms=NOW) == (9_000, NOW)
    assert read_oldest_age(world.dynamodb, STATE_TABLE, "live") == (2_000, NOW)


def test_a_container_makes_no_report_the_standing_one_would_refuse(world: WorkerWorld) -> None:
    updates: list[int] = []
    world.dynamodb.meta.events.register(
        "provide-client-params.dynamodb.UpdateItem",
        lambda params, **_: updates.append(int(params["ExpressionAttributeValues"][":age"]["N"])),
    )
    busy = throttled_age_reports(world.dynamodb, STATE_TABLE, holder="container-a")
    idle = throttled_age_reports(world.dynamodb, STATE_TABLE, holder="container-b")

    assert busy("live", 9_000, NOW)
    assert not idle("live", 40, NOW + 1_000)  # refused by the condition: the item answers with 9,000
    for second in range(2, 60):  # due every 5 s, always smaller: no call while 9,000's window is open
        assert not idle("live", 40 + second, NOW + second * 1_000)
    assert updates == [9_000, 40]
    # the window closed: after this container's share of the interval, its fresh report replaces it
    resume = NOW + WINDOW_MS + resume_offset_ms("container-b") + 1
    assert not idle("live", 35, resume - 1)
    assert idle("live", 35, resume)
    assert world.item("queue#live", HEALTH_SK)["oldest_age_ms"] == 35
    assert read_oldest_age(world.dynamodb, STATE_TABLE, "live", now_ms=resume) == (35, resume)


def test_the_reader_takes_the_largest_age_in_its_window_not_a_stopped_ones(world: WorkerWorld) -> None:
    shards = 4
    # A container that stopped long ago left a large age on its shard; nobody replaced it since.
    raise_oldest_age(
        world.dynamodb, STATE_TABLE, "live", 500_000, NOW - WINDOW_MS - 1, sk=health_sk(0, shards)
    )
    raise_oldest_age(world.dynamodb, STATE_TABLE, "live", 3_000, NOW - 10_000, sk=health_sk(1, shards))
    raise_oldest_age(world.dynamodb, STATE_TABLE, "live", 7_000, NOW - 30_000, sk=health_sk(2, shards))

    assert read_oldest_age(world.dynamodb, STATE_TABLE, "live", shards=shards, now_ms=NOW) == (
        7_000,
        NOW - 30_000,
    )
    # Nothing in the window: the newest report, which live health judges stale.
    later = NOW + 2 * WINDOW_MS
    assert read_oldest_age(world.dynamodb, STATE_TABLE, "live", shards=shards, now_ms=later) == (
        3_000,
        NOW - 10_000,
    )
    never = read_oldest_age(world.dynamodb, STATE_TABLE, "spillover", shards=shards, now_ms=NOW)
    assert never == (None, None)


def test_the_controllers_ports_read_every_shard_of_the_live_and_sideline_roles(world: WorkerWorld) -> None:
    settings = ControllerSettings.model_validate(
        {
            "tiers": TIERS,
            "default_tier": "standard",
            "state_table_name": STATE_TABLE,
            "live_queue_urls": [world.urls["live-0"]],
            "sideline_queue_urls": [world.urls["spillover"]],
            "sideline_queue_roles": ["spillover"],
            "backlog_target": 100,
            "min_multiplier": 0.1,
            "growth_step": 0.1,
            "max_multiplier": 2,
            "healthy_age_seconds": 60,
            "dirty_index_name": "dirty",
            "health_report_shards": 16,
        }
    )
    raise_oldest_age(world.dynamodb, STATE_TABLE, "live", 1_000, NOW, sk=health_sk(3, 16))
    raise_oldest_age(world.dynamodb, STATE_TABLE, "live", 90_000, NOW - 5_000, sk=health_sk(15, 16))
    raise_oldest_age(world.dynamodb, STATE_TABLE, "spillover", 700_000, NOW, sk=health_sk(9, 16))
    ports = build_controller_ports(settings, dynamodb=world.dynamodb, sqs=world.sqs, clock_ms=lambda: NOW)

    assert ports.live_oldest() == (90_000, NOW - 5_000)
    (spillover,) = ports.sideline_observations()
    assert (spillover.oldest_age_ms, spillover.observed_at_ms) == (700_000, NOW)


def test_shard_counts_outside_one_batch_get_are_refused() -> None:
    for bad in ("0", "101"):
        with pytest.raises(SettingsError, match="health_report_shards"):
            WorkerSettings.from_env({"HEALTH_REPORT_SHARDS": bad})
    with pytest.raises(ValueError, match=r"1\.\.100"):
        health_shard("container", 0)
