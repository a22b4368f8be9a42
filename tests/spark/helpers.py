"""Small archived records for the Spark tests: envelopes as the archiver writes them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from breakwater.archive import object_key, partition_for
from breakwater.envelope import Envelope, new_envelope_id

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
NOW = T0 + 3_600_000


def envelope(tenant: str, at: int, **fields: Any) -> Envelope:
    values: dict[str, Any] = {
        "id": new_envelope_id(at, at.to_bytes(10, "big")[:6] + tenant.encode().ljust(4, b"_")[:4]),
        "tenant": tenant,
        "type": "order.created",
        "payload": {"at": at, "items": [1, 2]},
        "enqueued_at": at,
        "origin": "backlog",
    }
    values.update(fields)
    return Envelope.model_validate(values)


def write_archive(root: Path, lines: list[str], tenant: str = "t", at: int = T0, name: str = "part") -> Path:
    """Write ``lines`` as one archive object of ``tenant``'s ``at`` hour; returns the archive root."""
    target = root / object_key(partition_for(tenant, at), name)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode()))
    return root


def archive_envelopes(root: Path, envelopes: list[Envelope], name: str = "part") -> Path:
    by_dir: dict[tuple[str, int], list[str]] = {}
    for item in envelopes:
        by_dir.setdefault((item.tenant, item.enqueued_at // 3_600_000), []).append(item.to_json())
    for (tenant, hour), lines in by_dir.items():
        write_archive(root, lines, tenant, hour * 3_600_000, name)
    return root


def rows(frame: Any) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]


def body(item: Envelope) -> dict[str, Any]:
    return json.loads(item.to_json())
