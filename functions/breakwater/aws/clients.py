"""botocore clients with standard retries, short timeouts and the invocation's deadline.

A client built with no config uses botocore's legacy retries: up to ten attempts against DynamoDB,
each waiting up to a minute to read, which adds up to far more than the front door's timeout. The
function would then time out and API Gateway answer its own 5xx, for a request the front door could
have refused with a 503 and a Retry-After. So every client here:

- retries in botocore's standard mode (throttles and transient errors, jittered backoff, a retry quota);
- connects and reads with timeouts a call to DynamoDB, SQS or Kinesis never needs more than;
- checks, before each attempt, that the attempt can finish before the invocation's deadline
  (:class:`Deadline`, set by the handler from ``context.get_remaining_time_in_millis()``, less the
  time to answer). An attempt that cannot raises :class:`DeadlineExceededError`, a ``BotoCoreError``, so
  the adapters' usual handling of an unavailable service applies: the front door answers 503.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError

CONNECT_TIMEOUT_S = 1.0
READ_TIMEOUT_S = 2.0
MAX_ATTEMPTS = 3
ANSWER_MARGIN_S = 0.5  # left for the handler to answer once its last call is over

T = TypeVar("T")


class DeadlineExceededError(BotoCoreError):
    fmt = "no time left for {operation} before the invocation's deadline ({remaining_s:.2f} s left)"


class Deadline:
    """When the invocation in progress must have made its last AWS call (per thread: the emulator runs
    several invocations in one process; Lambda runs one). Unset: no deadline."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._local = threading.local()

    @contextmanager
    def during(self, context: object, margin_s: float = ANSWER_MARGIN_S) -> Iterator[None]:
        """The invocation's deadline while it runs: the Lambda context's remaining time less
        ``margin_s`` to answer; none after it (a context that does not tell its time: none at all)."""
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        self._local.at = self._clock() + remaining() / 1000 - margin_s if callable(remaining) else None
        try:
            yield
        finally:
            self._local.at = None

    def remaining_s(self) -> float | None:
        at = getattr(self._local, "at", None)
        return None if at is None else at - self._clock()

    def check(self, attempt_s: float, operation: str) -> None:
        """Raise :class:`DeadlineExceededError` unless an attempt of up to ``attempt_s`` ends in time."""
        remaining = self.remaining_s()
        if remaining is not None and remaining < attempt_s:
            raise DeadlineExceededError(operation=operation, remaining_s=remaining)

    def bounded(self, handler: Callable[[Any, Any], T]) -> Callable[[Any, Any], T]:
        """A Lambda handler whose every AWS call ends before its invocation's timeout (:meth:`during`)."""

        @functools.wraps(handler)
        def bounded_handler(event: Any, context: Any) -> T:
            with self.during(context):
                return handler(event, context)

        return bounded_handler


DEADLINE = Deadline()


def client_config(**overrides: Any) -> Config:
    """Standard retries and short timeouts; ``overrides`` are more of botocore's ``Config`` options."""
    options: dict[str, Any] = {
        "retries": {"mode": "standard", "max_attempts": MAX_ATTEMPTS},
        "connect_timeout": CONNECT_TIMEOUT_S,
        "read_timeout": READ_TIMEOUT_S,
    }
    options.update(overrides)
    return Config(**options)


def with_deadline(client: Any, deadline: Deadline = DEADLINE) -> Any:
    """Check ``deadline`` before every attempt of every call of ``client`` (retries included)."""
    config = client.meta.config
    attempt_s = float(config.connect_timeout or 0) + float(config.read_timeout or 0)

    def before_send(request: Any = None, event_name: str = "", **_: Any) -> None:
        deadline.check(attempt_s, event_name.rsplit(".", 1)[-1] or "an AWS call")

    # First, so it runs before any handler that answers the request itself (moto's in tests).
    client.meta.events.register_first("before-send", before_send)
    return client


def client(service: str, *, deadline: Deadline = DEADLINE, **overrides: Any) -> Any:
    """A boto3 client of ``service`` with :func:`client_config` and the invocation's deadline."""
    return with_deadline(boto3.client(service, config=client_config(**overrides)), deadline)  # type: ignore[call-overload]
