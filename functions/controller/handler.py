"""Controller (EventBridge, every minute): backpressure, organic growth, sideline drainers on live health,
and the archiver started for a sideline queue past its archive budget."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.aws.controller_ports import build_controller_ports
from breakwater.controller import ControllerConfig, run_controller
from breakwater.observability import logger, metrics, tracer
from breakwater.settings import ControllerSettings

settings = ControllerSettings.from_env()
config = ControllerConfig.from_settings(settings)
ports = build_controller_ports(settings)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = run_controller(config, ports)
    return {
        "multipliers": report.multipliers,
        "backlogs": report.backlogs,
        "sideline_enabled": report.sideline_enabled,
        "mappings_changed": report.mappings_changed,
        "archiving": [{"queue_url": due.queue_url, "reason": due.reason.value} for due in report.archiving],
    }
