"""Kinesis: no inline Lambda delivery, and resharding that leaves records where AWS leaves them."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from moto.kinesis import models as kinesis_models

from local.emulator.moto_patches.patch import Kind, Patch, Replacement, no_event_source_mappings


def open_shard_routing(route: Callable[[Any, str, str], Any]) -> Callable[[Any, str, str], Any]:
    """``route`` (moto's ``Stream.get_shard_for_key``) made to skip closed shards, as AWS routes a put:
    a key whose shard is closed goes to the open shard that owns its hash key (the closed one if none does).
    """

    def open_shard_for_key(self: Any, partition_key: str, explicit_hash_key: str) -> Any:
        shard = route(self, partition_key, explicit_hash_key)
        if shard is None or shard.is_open:
            return shard
        key = (  # Kinesis maps a partition key to a hash key with MD5
            int(explicit_hash_key)
            if explicit_hash_key
            else int(hashlib.md5(partition_key.encode()).hexdigest(), 16)  # noqa: S324
        )
        return next(
            (s for s in self.shards.values() if s.is_open and s.starting_hash <= key <= s.ending_hash),
            shard,
        )

    return open_shard_for_key


def keeping_records(*parents: str) -> Callable[[Any], Any]:
    """Wraps moto's ``split_shard`` / ``merge_shards`` so the parent shards (the arguments ``parents``
    name, in order) keep their records: moto finds none to move, and they are put back afterwards."""

    def wrap(original: Any) -> Any:
        def reshard(self: Any, *args: Any) -> None:
            closing = [
                self.shards[args[index]] for index in range(len(parents)) if args[index] in self.shards
            ]
            kept = [parent.records for parent in closing]
            for parent in closing:
                parent.records = type(parent.records)()  # nothing for moto to move
            try:
                original(self, *args)
            finally:
                for parent, records in zip(closing, kept, strict=True):
                    parent.records = records

        return reshard

    return wrap


PATCHES = (
    Patch(
        name="kinesis.no_inline_delivery",
        kind=Kind.CORRECTNESS,
        corrects="A stream with an event source mapping has each PutRecord(s) invoke the function "
        "(in Docker) with the record; the emulator's Kinesis mapping reads the shards itself, in "
        "lineage order, with the mapping's batching, retries and bisection.",
        replaces=(
            Replacement(kinesis_models.Stream, "lambda_event_source_mappings", no_event_source_mappings),
        ),
    ),
    Patch(
        name="kinesis.resharding_as_aws",
        kind=Kind.CORRECTNESS,
        corrects="SplitShard empties the parent and re-puts its records through a routing that does not "
        "skip closed shards (so they, and every later put, land in the closed parent again); MergeShards "
        "copies both parents' records into the child. On AWS a parent keeps its records (readable until "
        "retention ends) and only the open child that owns the hash key receives puts.",
        replaces=(
            Replacement(kinesis_models.Stream, "get_shard_for_key", open_shard_routing),
            Replacement(kinesis_models.Stream, "split_shard", keeping_records("shard_to_split")),
            Replacement(
                kinesis_models.Stream,
                "merge_shards",
                keeping_records("shard_to_merge", "adjacent_shard_to_merge"),
            ),
        ),
    ),
)
