"""Each transform of the replay job on small frames."""

from __future__ import annotations

import re
from pathlib import Path

from pyspark.sql import functions as F  # noqa: N812

from glue_jobs import replay_transforms as transforms
from glue_jobs.replay_load import read_archive
from tests.spark.helpers import NOW, T0, archive_envelopes, envelope, rows, write_archive


def _classified(spark, root: Path, **kwargs):
    return transforms.classify(transforms.validate(read_archive(spark, str(root))), now_ms=NOW, **kwargs)


def test_malformed_lines_are_rejected_with_a_reason_not_fatal(spark, tmp_path) -> None:
    good = envelope("acme", T0)
    no_tenant = good.to_json().replace('"tenant":"acme",', "")
    wrong_type = good.to_json().replace(f'"enqueued_at":{T0}', '"enqueued_at":"soon"')
    v2 = good.to_json().replace('"v":1', '"v":2')
    write_archive(tmp_path, [good.to_json(), "{not json", no_tenant, wrong_type, v2, "[1,2]"])

    classified = _classified(spark, tmp_path)
    reasons = sorted(r["reject_reason"] for r in rows(transforms.rejects(classified)))

    assert reasons == sorted(
        [
            transforms.REASON_MALFORMED,
            transforms.REASON_MALFORMED,
            transforms.REASON_MALFORMED,
            "missing required field: tenant",
            transforms.REASON_VERSION,
        ]
    )
    assert [r["id"] for r in rows(transforms.replayable(classified))] == [good.id]
    assert {r["line"] for r in rows(transforms.rejects(classified))} >= {"{not json", wrong_type}


def test_payload_is_kept_as_json_text(spark, tmp_path) -> None:
    archive_envelopes(tmp_path, [envelope("acme", T0, payload={"a": [1, {"b": None}]})])
    (row,) = rows(transforms.replayable(_classified(spark, tmp_path)))
    assert row["payload"] == '{"a":[1,{"b":null}]}'


def test_expired_and_before_cutoff_are_dropped(spark, tmp_path) -> None:
    live = envelope("acme", T0 + 10, expires_at=NOW + 1)
    expired = envelope("acme", T0 + 20, expires_at=NOW)
    old = envelope("acme", T0 - 1)
    archive_envelopes(tmp_path, [live, expired, old])

    statuses = {r["id"]: r["status"] for r in rows(_classified(spark, tmp_path, cutoff_ms=T0))}

    assert statuses == {
        live.id: transforms.STATUS_OK,
        expired.id: transforms.STATUS_EXPIRED,
        old.id: transforms.STATUS_BEFORE_CUTOFF,
    }


def test_window_and_tenant_filter_scope_the_run(spark, tmp_path) -> None:
    inside = envelope("acme", T0 + 5)
    archive_envelopes(tmp_path, [inside, envelope("acme", T0 + 7_200_000), envelope("zeta", T0 + 5)])
    records = read_archive(
        spark, str(tmp_path), window_start_ms=T0, window_end_ms=T0 + 3_600_000, tenants=("acme",)
    )
    classified = transforms.classify(
        transforms.validate(records),
        now_ms=NOW,
        window_start_ms=T0,
        window_end_ms=T0 + 3_600_000,
        tenants=("acme",),
    )
    assert [r["id"] for r in rows(classified)] == [inside.id]


def test_duplicates_by_id_and_by_dedup_key_keep_one_the_newest(spark, tmp_path) -> None:
    first = envelope("acme", T0 + 1)
    old_key = envelope("acme", T0 + 2, dedup_key="order-7")
    new_key = envelope("acme", T0 + 3, dedup_key="order-7")
    other_tenant_same_key = envelope("zeta", T0 + 1, dedup_key="order-7")
    archive_envelopes(tmp_path, [first, old_key, new_key, other_tenant_same_key], name="a")
    archive_envelopes(tmp_path, [first, new_key], name="b")  # an archiver crash wrote these twice

    ordered = transforms.replay_order(_classified(spark, tmp_path), partitions=2)
    ids = sorted(r["id"] for r in rows(ordered))

    assert ids == sorted([first.id, new_key.id, other_tenant_same_key.id])


def test_order_within_tenant_and_fair_interleave(spark, tmp_path) -> None:
    noisy = [envelope("noisy", T0 + i) for i in range(30)]
    quiet = [envelope(f"quiet-{n}", T0 + 100 + n) for n in range(3)]
    archive_envelopes(tmp_path, list(reversed(noisy)) + quiet)

    ordered = transforms.replay_order(_classified(spark, tmp_path), partitions=1)
    sent = [(r["tenant"], r["rank"], r["enqueued_at"]) for r in rows(ordered)]

    # Round 1 holds every tenant's first envelope: quiet tenants are not behind the noisy backlog.
    assert {tenant for tenant, rank, _ in sent[:4]} == {"noisy", "quiet-0", "quiet-1", "quiet-2"}
    assert all(rank == 1 for _, rank, _ in sent[:4])
    noisy_times = [at for tenant, _, at in sent if tenant == "noisy"]
    assert noisy_times == sorted(noisy_times) and len(noisy_times) == 30


def test_interleave_is_partition_local(spark, tmp_path) -> None:
    archive_envelopes(
        tmp_path, [envelope(f"t{n}", T0 + n, dedup_key="k" if n % 2 else None) for n in range(8)]
    )
    ordered = transforms.replay_order(_classified(spark, tmp_path), partitions=2)
    ordered.collect()  # adaptive execution settles the plan (the reused exchange) when it runs
    final = ordered._jdf.queryExecution().executedPlan().toString().split("== Initial Plan ==")[0]

    assert "isFinalPlan=true" in final
    # The one repartition by tenant, read by both branches of the dedup: the archive is read once.
    nodes = [re.sub(r"^\*\(\d+\) ", "", line.lstrip(" :+-")) for line in final.splitlines()]
    assert sum(node.startswith("Exchange ") for node in nodes) == 1
    assert sum(node.startswith("ReusedExchange ") for node in nodes) == 1
    assert sum(node.startswith("FileScan ") for node in nodes) == 1
    # Sorts: each map task's rows into runs; after the exchange the keyed rows by key, every row in
    # time order per tenant, every row by round.
    assert sum(node.startswith("Sort [") for node in nodes) == 4


def test_partition_of_is_the_partition_by_tenant_puts_a_row_in(spark, tmp_path) -> None:
    archive_envelopes(tmp_path, [envelope(f"t{n}", T0 + n) for n in range(40)])
    replayable = transforms.replayable(_classified(spark, tmp_path))
    placed = transforms.by_tenant(replayable, 4).select(
        (transforms.partition_of(4) == F.spark_partition_id()).alias("same")
    )
    assert all(r["same"] for r in rows(placed))


def test_ranks_are_gapless_per_tenant_in_time_order_after_dedup(spark, tmp_path) -> None:
    """Many tenants over several partitions, one big one, copies by id and keys reused over time.

    The dedup window sorts on the hash of (tenant, key) first, not on the tenant: the kept rows and
    their ranks must still be exactly the newest of each (tenant, key), numbered 1..n per tenant
    in ``enqueued_at`` order, and every partition must come out round by round.
    """
    archived = []
    for i in range(300):  # the big tenant: times out of order, every 7th a reused key
        key = f"order-{i % 11}" if i % 7 == 0 else None
        archived.append(envelope("big", T0 + (i * 37) % 1000, dedup_key=key))
    for n in range(12):
        for i in range(6):
            archived.append(envelope(f"q-{n}", T0 + 10 * i + n, dedup_key="order-1" if i % 3 else None))
    copies = archived[::5]  # an archiver crash wrote every fifth envelope twice
    archive_envelopes(tmp_path, archived, name="a")
    archive_envelopes(tmp_path, copies, name="b")

    newest: dict[tuple[str, str], tuple[int, str]] = {}
    for item in archived:
        group = (item.tenant, f"k:{item.dedup_key}" if item.dedup_key else f"i:{item.id}")
        newest[group] = max(newest.get(group, (-1, "")), (item.enqueued_at, item.id))
    expected: dict[str, list[str]] = {}
    for (tenant, _), (_, kept_id) in sorted(newest.items(), key=lambda entry: entry[1]):
        expected.setdefault(tenant, []).append(kept_id)

    ordered = transforms.replay_order(_classified(spark, tmp_path), partitions=3)
    sent = ordered.select("tenant", "id", "rank", F.spark_partition_id().alias("partition")).collect()

    ranked: dict[str, list[tuple[int, str]]] = {}
    for row in sent:
        ranked.setdefault(row["tenant"], []).append((row["rank"], row["id"]))
    assert {tenant: [i for _, i in sorted(pairs)] for tenant, pairs in ranked.items()} == expected
    assert all(sorted(r for r, _ in pairs) == list(range(1, len(pairs) + 1)) for pairs in ranked.values())
    by_partition: dict[int, list[int]] = {}
    for row in sent:
        by_partition.setdefault(row["partition"], []).append(row["rank"])
    assert all(ranks == sorted(ranks) for ranks in by_partition.values())
    assert len({(row["tenant"], row["partition"]) for row in sent}) == len(expected)  # one partition each
