"""The sideline drainers' event source mappings, switched on and off by the controller."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

_ON = {"Enabled", "Enabling"}
_OFF = {"Disabled", "Disabling"}


def queue_name(url_or_arn: str) -> str:
    """The queue's name, the last segment of its URL (``.../<account>/<name>``) or ARN (``...:<name>``)."""
    return url_or_arn.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]


def set_mappings_enabled(
    client: LambdaClient, uuids: Iterable[str], enabled: bool, held: Iterable[str] = ()
) -> list[str]:
    """Bring every mapping to ``enabled``; returns the UUIDs that were changed (others are left alone).

    A mapping whose source queue is in ``held`` (queue URLs or ARNs) is brought to disabled whatever
    ``enabled`` says: the archiver owns that queue for now, and a drainer would only race it.
    """
    held_names = {queue_name(queue) for queue in held}
    changed = []
    for uuid in uuids:
        mapping = client.get_event_source_mapping(UUID=uuid)
        want = enabled and queue_name(str(mapping.get("EventSourceArn", ""))) not in held_names
        if mapping.get("State", "") in (_ON if want else _OFF):
            continue
        client.update_event_source_mapping(UUID=uuid, Enabled=want)
        changed.append(uuid)
    return changed
