"""Logger, Tracer and Metrics, created once and imported everywhere.

Service name and metrics namespace come from ``POWERTOOLS_SERVICE_NAME`` and
``POWERTOOLS_METRICS_NAMESPACE``, which CDK sets on every function.
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger()
tracer = Tracer()
metrics = Metrics()
