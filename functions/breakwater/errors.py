"""The errors ingest answers with: each one a status, a stable code and a message that names the problem.

Every rejection is a 4xx the client can act on; a failure to store a message is a 503 the client
can retry. Every error answer of the API, the handlers' and the gateway's own alike, is an RFC 9457
problem details object (:func:`problem`, served as ``application/problem+json``): ``type`` (a URI
naming the problem, :data:`PROBLEM_TYPE_BASE` + code), ``title`` (the same for every occurrence),
``status``, ``detail`` (this occurrence, naming what was wrong) and the extension member ``code``,
the stable machine code clients branch on; some problems add members of their own.
"""

from __future__ import annotations

import json
from typing import Any

from breakwater.fairness import retry_after_header

PROBLEM_MEDIA_TYPE = "application/problem+json"
# Problem type URIs identify a problem; they are not fetched. A fork that publishes its own problem
# pages changes this base (the stack's gateway responses and the OpenAPI document read it too).
PROBLEM_TYPE_BASE = "https://breakwater.dev/problems/"


def problem_title(code: str) -> str:
    """The problem type's title: the code in words (``idempotency_key_in_use``: "Idempotency key in use")."""
    return code.replace("_", " ").capitalize()


def problem(status: int, code: str, detail: str, **extensions: Any) -> dict[str, Any]:
    """An RFC 9457 problem details object for ``code`` with its ``detail`` and extension members."""
    return {
        "type": PROBLEM_TYPE_BASE + code,
        "title": problem_title(code),
        "status": status,
        "detail": detail,
        "code": code,
        **extensions,
    }


class ApiError(Exception):
    """An HTTP error answer. ``headers`` carries e.g. ``Retry-After``."""

    status: int = 500
    code: str = "internal_error"

    def __init__(
        self, message: str, *, code: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return problem(self.status, self.code, self.message)

    def body_json(self) -> str:
        return json.dumps(self.body(), separators=(",", ":"))


class BadRequestError(ApiError):
    status = 400
    code = "bad_request"


class UnauthenticatedError(ApiError):
    status = 401
    code = "unauthorized"


class RouteNotFoundError(ApiError):
    status = 404
    code = "not_found"


class PayloadTooLargeError(ApiError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaTypeError(ApiError):
    """The body is not declared as JSON: it is never parsed as JSON on a guess."""

    status = 415
    code = "unsupported_media_type"


class ThrottledError(ApiError):
    """Over the tenant's rate: come back after ``retry_after`` seconds (the header is whole seconds)."""

    status = 429
    code = "throttled"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message, headers={"Retry-After": retry_after_header(retry_after)})
        self.retry_after = retry_after


class IdempotencyConflictError(ApiError):
    """A request with the same idempotency key is still being stored: retry after ``retry_after`` seconds."""

    status = 409
    code = "idempotency_key_in_use"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message, headers={"Retry-After": retry_after_header(retry_after)})
        self.retry_after = retry_after


class IdempotencyKeyReusedError(ApiError):
    """The idempotency key was used for a different request within its window."""

    status = 422
    code = "idempotency_key_reused"


class UnavailableError(ApiError):
    """The message was not stored; the client should retry it (never a 202 for a message that was lost)."""

    status = 503
    code = "enqueue_failed"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message, headers={"Retry-After": retry_after_header(retry_after)})
        self.retry_after = retry_after
