"""Lambda: ``Invoke`` handed to the emulator's containers instead of moto's Docker runner."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from moto.awslambda import models as lambda_models

from local.emulator.moto_patches.patch import Kind, Patch, Replacement

# (function name, payload bytes, invocation type) -> the response payload (b"" for an Event).
LambdaDispatch = Callable[[str, bytes, str], bytes]

_lock = threading.Lock()
_dispatch: LambdaDispatch | None = None


def route_invocations(dispatch: LambdaDispatch | None) -> LambdaDispatch | None:
    """Send every Lambda ``Invoke`` to ``dispatch`` (None: to moto's own runner); the previous one.

    Takes effect while ``lambda.route_invocations`` is installed (``moto_patches.install``).
    """
    global _dispatch
    with _lock:
        previous, _dispatch = _dispatch, dispatch
    return previous


def _routed(original: Any) -> Any:
    def invoke(
        self: lambda_models.LambdaBackend,
        function_name: str,
        qualifier: str | None,
        body: Any,
        headers: Any,
        response_headers: Any,
    ) -> Any:
        """The function resolved as moto does (name, ARN or qualifier, moto's errors for unknown
        ones), then the payload handed to the dispatcher; an ``Event`` dispatcher returns at once."""
        dispatch = _dispatch
        if dispatch is None:
            return original(self, function_name, qualifier, body, headers, response_headers)
        function = self.get_function(function_name, qualifier)
        invocation_type = headers.get("X-Amz-Invocation-Type") or headers.get("x-amz-invocation-type")
        payload = body if isinstance(body, bytes) else (body or "").encode()
        return bytes(dispatch(function.function_name, payload, invocation_type or "RequestResponse"))

    return invoke


PATCHES = (
    Patch(
        name="lambda.route_invocations",
        kind=Kind.CORRECTNESS,
        corrects="LambdaBackend.invoke runs the function in Docker, synchronously even for "
        "InvocationType=Event (the controller starting the archiver). The emulator runs functions in "
        "its own containers: with a dispatcher routed (route_invocations), Invoke reaches them.",
        replaces=(Replacement(lambda_models.LambdaBackend, "invoke", _routed),),
    ),
)
