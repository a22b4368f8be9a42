"""The archive's layout and encoding: where a parked envelope goes in S3 and how it is written.

Sidelined traffic past its budget is parked in S3 instead of growing an insurmountable backlog
(Builders' Library, "Avoiding insurmountable queue backlogs"); the replay job brings it back.
Objects are gzipped NDJSON, one envelope per line, under
``<prefix>tenant=<tenant>/dt=<YYYY-MM-DD>/hour=<HH>/`` of the envelope's ``enqueued_at`` (UTC), so a
replay can select tenants and a time window by listing directories. Pure: no boto3 here.
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from pydantic import ValidationError

from breakwater.envelope import Envelope

# Bodies that are not envelopes are archived too (never lose a message); the replay rejects them
# with a reason. They are filed under this tenant and the hour they were archived.
UNPARSEABLE_TENANT = "_unparseable"


@dataclass(frozen=True, slots=True)
class ArchivePartition:
    """One ``tenant=/dt=/hour=`` directory of the archive."""

    tenant: str
    dt: str
    hour: str

    def prefix(self, root: str = "") -> str:
        # Percent-encode the tenant (Hive-style), so any tenant string is a single safe path segment.
        root = root if not root or root.endswith("/") else f"{root}/"
        return f"{root}tenant={quote(self.tenant, safe='')}/dt={self.dt}/hour={self.hour}/"


def partition_for(tenant: str, epoch_ms: int) -> ArchivePartition:
    """The directory an envelope of ``tenant`` enqueued at ``epoch_ms`` belongs to (UTC hours)."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return ArchivePartition(tenant=tenant, dt=moment.strftime("%Y-%m-%d"), hour=moment.strftime("%H"))


def object_key(partition: ArchivePartition, object_name: str, root: str = "") -> str:
    """The S3 key of one archive object; ``object_name`` must be unique (a uuid or the batch id)."""
    return f"{partition.prefix(root)}{object_name}.ndjson.gz"


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """A queue message on its way into the archive: the body as received and its receipt handle."""

    body: str
    receipt_handle: str
    message_id: str


def group_by_partition(
    messages: Iterable[ArchivedMessage], now_ms: int
) -> dict[ArchivePartition, list[ArchivedMessage]]:
    """Group messages by the directory their envelope belongs to; unparseable bodies by archive time."""
    groups: dict[ArchivePartition, list[ArchivedMessage]] = defaultdict(list)
    for message in messages:
        try:
            envelope = Envelope.from_json(message.body)
        except ValidationError:
            groups[partition_for(UNPARSEABLE_TENANT, now_ms)].append(message)
            continue
        groups[partition_for(envelope.tenant, envelope.enqueued_at)].append(message)
    return dict(groups)


def first_archives_by_tenant(messages: Iterable[ArchivedMessage]) -> dict[str, int]:
    """Per tenant, the envelopes among ``messages`` that leave the system now: the tenants' ``archived``.

    An envelope a replay brought back (``replay_run`` set) was counted when it was first archived,
    and the worker gives that back only once (``replayed``), so parking it again is not counted.
    Bodies that are not envelopes have no tenant to count against.
    """
    counts: dict[str, int] = defaultdict(int)
    for message in messages:
        try:
            envelope = Envelope.from_json(message.body)
        except ValidationError:
            continue
        if envelope.replay_run is None:
            counts[envelope.tenant] += 1
    return dict(counts)


def encode_ndjson_gz(bodies: Sequence[str]) -> bytes:
    """One body per line, gzipped; kept as received (a newline inside a non-JSON body becomes a space).

    The replay, not the archiver, judges bodies: a bad one is archived and rejected there with a reason.
    """
    text = "".join(body.replace("\n", " ") + "\n" for body in bodies)
    return gzip.compress(text.encode(), compresslevel=6, mtime=0)


def decode_ndjson_gz(blob: bytes) -> list[str]:
    """The lines of an archive object (the inverse of :func:`encode_ndjson_gz`)."""
    return [line for line in gzip.decompress(blob).decode().split("\n") if line]
