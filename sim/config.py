"""The configuration a simulation runs: cdk.json's ``breakwater`` object, overrides, and the three setups.

The blueprint's own configuration is read and validated by ``breakwater_cdk.config.load_config``, as at
synth, so a fork simulates its own settings and a bad value is refused with the same message. The
three configurations compared are derived from it:

- ``naive``: one queue, no MessageGroupId, no throttling, no sidelining, no breaker (``mode: naive``).
- ``fair``: the same single queue, with MessageGroupId = tenant, so SQS fair queues apply; nothing else.
- ``breakwater``: the configuration as it is (shuffle-sharded live queues, every practice).

With ``same_fleet`` the single queue of naive and fair gets the concurrency of Breakwater's live
queues together, so the three are compared on the same worker fleet.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from breakwater_cdk.config import BlueprintConfig, load_config

CONTEXT_KEY = "breakwater"
REPO = Path(__file__).resolve().parents[1]
CDK_JSON = REPO / "cdk.json"

ConfigName = Literal["naive", "fair", "breakwater"]
CONFIGURATIONS: tuple[ConfigName, ...] = ("naive", "fair", "breakwater")


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` deep-merged into a copy of ``base`` (objects merge, anything else replaces)."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def parse_assignment(text: str) -> dict[str, Any]:
    """``worker.max_concurrency=20`` -> ``{"worker": {"max_concurrency": 20}}`` (the value read as JSON)."""
    if "=" not in text:
        raise ValueError(f"--set takes key.path=value, got {text!r}")
    path, raw = text.split("=", 1)
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    keys = [key for key in path.split(".") if key]
    if keys and keys[0] == CONTEXT_KEY:
        keys = keys[1:]
    if not keys:
        raise ValueError(f"--set needs a key, got {text!r}")
    result: dict[str, Any] = {}
    node = result
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return result


def load_context(cdk_json: Path = CDK_JSON) -> dict[str, Any]:
    """The raw ``breakwater`` object of a cdk.json."""
    data = json.loads(cdk_json.read_text())
    context = data.get("context", {}).get(CONTEXT_KEY)
    if not isinstance(context, dict):
        raise ValueError(f"{cdk_json} has no context.{CONTEXT_KEY} object")
    return context


def blueprint(context: Mapping[str, Any], overrides: Sequence[Mapping[str, Any]] = ()) -> BlueprintConfig:
    """The validated configuration: ``context`` with each override merged in, in order."""
    raw: dict[str, Any] = dict(context)
    for override in overrides:
        raw = merge(raw, override.get(CONTEXT_KEY, override))
    return load_config(raw)


@dataclass(frozen=True)
class Setup:
    """One of the three configurations, derived from the blueprint's."""

    name: ConfigName
    config: BlueprintConfig
    queue_count: int
    group_ids: bool  # MessageGroupId = tenant on every send (fair queues)
    practices: bool  # throttling, sidelining, gates, breaker, controller
    live_max_concurrency: int  # per live mapping


def setups(config: BlueprintConfig, *, same_fleet: bool) -> dict[ConfigName, Setup]:
    fleet = config.queue_set.size * config.worker.mapping_concurrency
    single = fleet if same_fleet else config.worker.mapping_concurrency
    naive = config.model_copy(update={"mode": "naive"})
    return {
        "naive": Setup("naive", naive, 1, False, False, single),
        "fair": Setup("fair", naive, 1, True, False, single),
        "breakwater": Setup(
            "breakwater",
            config.model_copy(update={"mode": "breakwater"}),
            config.queue_set.size,
            config.queue_set.fair_queues,
            True,
            config.worker.mapping_concurrency,
        ),
    }
