"""The sideline drainers' event source mappings, switched on and off by the controller."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

_ON = {"Enabled", "Enabling"}
_OFF = {"Disabled", "Disabling"}


def set_mappings_enabled(client: LambdaClient, uuids: Iterable[str], enabled: bool) -> list[str]:
    """Bring every mapping to ``enabled``; returns the UUIDs that were changed (others are left alone)."""
    changed = []
    for uuid in uuids:
        state = client.get_event_source_mapping(UUID=uuid).get("State", "")
        if state in (_ON if enabled else _OFF):
            continue
        client.update_event_source_mapping(UUID=uuid, Enabled=enabled)
        changed.append(uuid)
    return changed
