"""Logger, Tracer and Metrics, created once and imported everywhere.

Service name and metrics namespace come from ``POWERTOOLS_SERVICE_NAME`` and
``POWERTOOLS_METRICS_NAMESPACE``, which CDK sets on every function.

The Powertools ``Tracer`` is created only where it would trace: it imports the X-Ray SDK (which
builds its own botocore client) even when tracing is disabled, about 200 ms of every cold start.
Where Powertools would disable it (``POWERTOOLS_TRACE_DISABLED``, set by CDK when
``functions.tracing`` is off, or outside Lambda) a stand-in with the same decorators returns the
decorated function unchanged (docs/decisions.md, D-worker-9).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.shared import constants
from aws_lambda_powertools.shared.functions import resolve_truthy_env_var_choice

if TYPE_CHECKING:
    from aws_lambda_powertools import Tracer

F = TypeVar("F", bound=Callable[..., Any])


class DisabledTracer:
    """What a disabled Powertools ``Tracer`` does, without importing the X-Ray SDK: nothing."""

    disabled = True

    def capture_lambda_handler(
        self,
        lambda_handler: Callable[..., Any] | None = None,
        capture_response: bool | None = None,
        capture_error: bool | None = None,
    ) -> Callable[..., Any]:
        if lambda_handler is None:
            return lambda handler: handler
        return lambda_handler

    @overload
    def capture_method(self, method: F) -> F: ...

    @overload
    def capture_method(
        self, method: None = None, capture_response: bool | None = None, capture_error: bool | None = None
    ) -> Callable[[F], F]: ...

    def capture_method(
        self,
        method: F | None = None,
        capture_response: bool | None = None,
        capture_error: bool | None = None,
    ) -> F | Callable[[F], F]:
        if method is None:
            return lambda decorated: decorated
        return method

    def put_annotation(self, key: str, value: Any) -> None:
        return None

    def put_metadata(self, key: str, value: Any, namespace: str | None = None) -> None:
        return None


def tracing_disabled() -> bool:
    """Powertools' own rule (``Tracer._is_tracer_disabled``): the env var, or not running in Lambda."""
    if resolve_truthy_env_var_choice(env=os.getenv(constants.TRACER_DISABLED_ENV, "false")):
        return True
    in_lambda = bool(os.getenv(constants.LAMBDA_TASK_ROOT_ENV))
    emulated = bool(os.getenv(constants.SAM_LOCAL_ENV) or os.getenv(constants.CHALICE_LOCAL_ENV))
    return not in_lambda or emulated


def _tracer() -> Tracer | DisabledTracer:
    if tracing_disabled():
        return DisabledTracer()
    from aws_lambda_powertools import Tracer

    return Tracer()


logger = Logger()
tracer = _tracer()
metrics = Metrics()
