"""Logger, Tracer and Metrics, created once and imported everywhere.

Service name and metrics namespace come from ``POWERTOOLS_SERVICE_NAME`` and
``POWERTOOLS_METRICS_NAMESPACE``, which CDK sets on every function. The Powertools switches the
package reads itself (tracing, idempotency) come from :class:`PowertoolsSettings`.

The Powertools ``Tracer`` is created only where it would trace: it imports the X-Ray SDK (which
builds its own botocore client) even when tracing is disabled, a large share of every cold start.
Where Powertools would disable it (``POWERTOOLS_TRACE_DISABLED``, set by CDK when
``functions.tracing`` is off, or outside Lambda) a stand-in with the same decorators returns the
decorated function unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, overload

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.shared import constants
from pydantic import BaseModel, ConfigDict

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


class PowertoolsSettings(BaseModel):
    """The Powertools switches this package reads itself: read from the environment in one place.

    Powertools reads each of them too, in the utility it belongs to; the package follows Powertools'
    own rules for them, so the stand-in tracer and the batch's idempotency locks agree with what
    Powertools itself does. The flags are parsed as Powertools' ``strtobool`` parses them
    (pydantic's booleans take the same words); a bad value fails the cold start loudly.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace_disabled: bool = False  # POWERTOOLS_TRACE_DISABLED
    in_lambda: bool = False  # LAMBDA_TASK_ROOT set
    emulated: bool = False  # AWS_SAM_LOCAL or AWS_CHALICE_CLI_MODE set
    idempotency_disabled: bool = False  # POWERTOOLS_IDEMPOTENCY_DISABLED

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PowertoolsSettings:
        """The settings of ``environ`` (the process environment when None)."""
        env = os.environ if environ is None else environ
        return cls.model_validate(
            {
                "trace_disabled": env.get(constants.TRACER_DISABLED_ENV) or "false",
                "in_lambda": bool(env.get(constants.LAMBDA_TASK_ROOT_ENV)),
                "emulated": bool(env.get(constants.SAM_LOCAL_ENV) or env.get(constants.CHALICE_LOCAL_ENV)),
                "idempotency_disabled": env.get(constants.IDEMPOTENCY_DISABLED_ENV) or "false",
            }
        )

    @property
    def tracing_disabled(self) -> bool:
        """Powertools' own rule (``Tracer._is_tracer_disabled``): the switch, or not running in Lambda."""
        return self.trace_disabled or not self.in_lambda or self.emulated


def tracing_disabled(settings: PowertoolsSettings | None = None) -> bool:
    """Whether Powertools would disable its tracer (``settings`` read from the environment when None)."""
    return (settings or PowertoolsSettings.from_env()).tracing_disabled


def _tracer(settings: PowertoolsSettings) -> Tracer | DisabledTracer:
    if settings.tracing_disabled:
        return DisabledTracer()
    from aws_lambda_powertools import Tracer

    return Tracer()


logger = Logger()
tracer = _tracer(PowertoolsSettings.from_env())
metrics = Metrics()
