"""Controller (EventBridge, every minute): backpressure, organic growth, sideline drainers on live health,
and the archiver started for a sideline queue past its archive budget.

Event: ``{}`` from the schedule (a whole run); ``{"shards": [...], "depth": ..., "scale_log": ...,
"now_ms": ..., "deadline_ms": ...}`` from a scheduled run that split its shards over invocations
(``CONTROLLER_INVOCATIONS``): only those shards' changed tenants, and their counts back.
"""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.aws.controller_ports import build_controller_ports
from breakwater.controller import ControllerConfig, ShardRequest, run_controller, run_shards
from breakwater.observability import logger, metrics, tracer
from breakwater.settings import ControllerSettings

# Left before Lambda's own timeout: the shards still release their cursors and the run reports.
SAFETY_MARGIN_MS = 5_000

settings = ControllerSettings.from_env()
config = ControllerConfig.from_settings(settings)
ports = build_controller_ports(settings)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    deadline_ms = int(time.time() * 1000) + context.get_remaining_time_in_millis() - SAFETY_MARGIN_MS
    if "shards" in event:
        shards = [int(shard) for shard in event["shards"]]
        return run_shards(config, ports, shards, ShardRequest.from_event(event, deadline_ms)).summary()
    report = run_controller(config, ports, deadline_ms)
    return {
        "multipliers": report.multipliers,
        "backlogs": report.backlogs,
        "sideline_enabled": report.sideline_enabled,
        "mappings_changed": report.mappings_changed,
        "archiving": [{"queue_url": due.queue_url, "reason": due.reason.value} for due in report.archiving],
        "shards": report.shards.summary(),
        "scaled": report.reconciliation.scale if report.reconciliation else 1.0,
    }
