"""Worker: live queues and surge (WORKER_MODE=live), or spillover and backlog (WORKER_MODE=sideline).

Thin: the environment is validated at cold start, the batch goes to :class:`breakwater.worker.Worker`
(sidelining policy, moves, heartbeat, idempotent processing, aggregates).
"""

from __future__ import annotations

from typing import Any

# First, before anything imports pydantic: Powertools' batch module then types its ``model``
# argument without importing every parser model it ships (a large share of a cold start).
import aws_lambda_powertools.utilities.batch  # noqa: F401
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater import processor
from breakwater.aws.shutdown_signal import flush_in_the_background
from breakwater.aws.worker_ports import build_worker_ports
from breakwater.observability import logger, metrics, tracer
from breakwater.settings import WorkerSettings
from breakwater.worker import Worker, WorkerOptions
from breakwater.worker.settlement import FLUSH_S

settings = WorkerSettings.from_env()
if settings.processor_handler:  # the user's processor, bundled beside this handler
    processor.deploy(settings.processor_handler)
worker = Worker(
    WorkerOptions.from_settings(settings),
    # Looked up at call time, so the local tools' hooks (or a test) that wrap breakwater.processor.process
    # are honoured.
    build_worker_ports(settings, lambda envelope, work: processor.process(envelope, work)),
)
# Counters kept for a later write go out once due even if no batch comes, and all of them at shutdown;
# set this to stop the thread (a test that imports this module again stops the old one)
FLUSH_STOP = flush_in_the_background(worker.flush_kept_counters, FLUSH_S, name="counters-flush")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return worker.handle(event, context)
