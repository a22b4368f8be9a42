"""moto's server in a process of its own, patched: ``python -m local.emulator.moto_process``.

The runtime process is busy: the emulated API, the mappings' pollers, the log reader. With moto's
server in the same process, every AWS request of every function container waited for that
process's one GIL, far longer than moto's backend took to answer it. Here the server has a core's
worth of GIL to itself.

Protocol with the parent (:class:`local.emulator.embedded_aws.EmbeddedAws`): the child prints one JSON line
``{"port": N}`` on stdout once it listens on 127.0.0.1, and exits when its stdin closes (the parent
stopped or died). Lambda ``Invoke`` (the controller starting the archiver) is handed to the parent
over HTTP: ``POST <BREAKWATER_LOCAL_INVOKE_URL>`` with the function name and invocation type in
headers and the payload as the body; the answer's body is the invocation's response payload.
The parent may write ``freeze`` on a line of stdin once it has deployed (see
:func:`freeze_startup_objects`). With ``BREAKWATER_LOCAL_FORWARD_DYNAMODB`` set to another moto
server's URL (the DynamoDB process), every DynamoDB request this server gets is passed to
that server and its answer returned (:class:`ForwardService`). With ``BREAKWATER_LOCAL_LIMIT_SCALE``
set (:meth:`local.aws_limits.AwsLimits.from_env`), the server enforces AWS's limits
(:mod:`local.emulator.moto_patches.limits`), and ``GET /breakwater/limits`` answers what they refused
so far (:meth:`~local.emulator.moto_patches.limits.Enforcement.report`; ``{}`` without limits).
"""

from __future__ import annotations

import gc
import http.client
import json
import logging
import os
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server import threaded_moto_server
from moto.server import ThreadedMotoServer

from local.aws_limits import AwsLimits
from local.emulator import cfn_models, moto_patches

INVOKE_URL_ENV = "BREAKWATER_LOCAL_INVOKE_URL"
FUNCTION_HEADER = "X-Breakwater-Function"
INVOCATION_TYPE_HEADER = "X-Breakwater-Invocation-Type"
FREEZE_COMMAND = "freeze"  # a line on stdin: keep collections off what the process holds now
FORWARD_DYNAMODB_ENV = "BREAKWATER_LOCAL_FORWARD_DYNAMODB"
DYNAMODB_TARGET_PREFIX = "DynamoDB_20120810."  # X-Amz-Target of every DynamoDB API request
LIMITS_PATH = "/breakwater/limits"  # what the limits refused, as JSON
# Headers of one hop, not of the request or the answer (RFC 9110 7.6.1), and what werkzeug sets itself.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
)


def apply_patches(limits: AwsLimits | None = None) -> None:
    """Everything the runtime needs of moto, in whichever process serves it; AWS's limits if given."""
    moto_patches.install()
    cfn_models.register()
    if limits is not None:
        from local.emulator.moto_patches import limits as moto_limits  # after install's version check

        moto_limits.enforce(limits)


def limits_report() -> dict[str, Any]:
    """What this process's limits refused so far ({} when it enforces none)."""
    from local.emulator.moto_patches import limits as moto_limits

    enforcement = moto_limits.active()
    return enforcement.report() if enforcement is not None else {}


class LimitsReportService:
    """WSGI: ``GET`` :data:`LIMITS_PATH` answers :func:`limits_report`; anything else goes to ``app``."""

    def __init__(self, app: Any) -> None:
        self._app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != LIMITS_PATH or environ.get("HTTP_X_AMZ_TARGET"):
            return self._app(environ, start_response)
        body = json.dumps(limits_report()).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]


def forward_invocations(invoke_url: str) -> None:
    """Route Lambda ``Invoke`` to the parent's containers through its invoke endpoint."""

    def dispatch(function_name: str, payload: bytes, invocation_type: str) -> bytes:
        request = urllib.request.Request(  # noqa: S310 - the parent's loopback endpoint
            invoke_url,
            data=payload,
            method="POST",
            headers={FUNCTION_HEADER: function_name, INVOCATION_TYPE_HEADER: invocation_type},
        )
        try:
            with urllib.request.urlopen(request, timeout=900) as response:  # noqa: S310 - loopback
                return bytes(response.read())
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"local invoke of {function_name} failed: {error.read().decode()}") from error

    from local.emulator.moto_patches import lambda_ as lambda_patches  # after install's version check

    lambda_patches.route_invocations(dispatch)


class ForwardService:
    """WSGI: a request whose ``X-Amz-Target`` starts with ``prefix`` goes to the server at ``url``; the
    rest to ``app``. One kept-alive connection per serving thread; the answer is passed back whole."""

    def __init__(self, app: Any, prefix: str, url: str) -> None:
        self._app, self._prefix = app, prefix
        parts = urllib.parse.urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._connections = threading.local()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not str(environ.get("HTTP_X_AMZ_TARGET", "")).startswith(self._prefix):
            return self._app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        headers = {
            name[5:].replace("_", "-").title(): str(value)
            for name, value in environ.items()
            if name.startswith("HTTP_") and name[5:].replace("_", "-").lower() not in _HOP_BY_HOP
        }
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = str(environ["CONTENT_TYPE"])
        headers["Content-Length"] = str(len(body))
        path = urllib.parse.quote(str(environ.get("PATH_INFO") or "/"))
        if environ.get("QUERY_STRING"):
            path += "?" + str(environ["QUERY_STRING"])
        response, data = self._exchange(str(environ["REQUEST_METHOD"]), path, body, headers)
        start_response(
            f"{response.status} {response.reason}",
            [(name, value) for name, value in response.getheaders() if name.lower() not in _HOP_BY_HOP],
        )
        return [data]

    def _exchange(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[http.client.HTTPResponse, bytes]:
        connection: http.client.HTTPConnection | None = getattr(self._connections, "connection", None)
        reused = connection is not None
        if connection is None:
            connection = self._connections.connection = http.client.HTTPConnection(self._host, self._port)
        try:
            connection.request(method, path, body, headers)
            response = connection.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            connection.close()
            if not reused:
                raise
            # The server closed a connection idle since the last request, before reading this one:
            # nothing was done, so it is sent once more on a new connection.
            connection = self._connections.connection = http.client.HTTPConnection(self._host, self._port)
            connection.request(method, path, body, headers)
            response = connection.getresponse()
        return response, response.read()


class _BreakwaterMotoServer(ThreadedMotoServer):
    """moto's threaded server that answers :data:`LIMITS_PATH` and, given a ``url``, forwards one
    service's requests there (:class:`ForwardService`)."""

    def __init__(
        self, *, prefix: str = DYNAMODB_TARGET_PREFIX, url: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._prefix, self._url = prefix, url

    def _server_entry(self) -> None:
        app: Any = threaded_moto_server.DomainDispatcherApplication(threaded_moto_server.create_backend_app)
        if self._url:
            app = ForwardService(app, self._prefix, self._url)
        app = LimitsReportService(app)
        self._server = threaded_moto_server.make_server(
            self._ip_address,
            self._port,
            app,
            True,
            request_handler=threaded_moto_server.MotoRequestHandler,
        )
        self._server_ready_event.set()
        self._server.serve_forever()


def _not_cloudformation_noise(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("No Moto CloudFormation support")


def start_server(
    forward_dynamodb_to: str | None = None, limits: AwsLimits | None = None
) -> ThreadedMotoServer:
    """The patched, quiet server on a free loopback port, started in this process.

    ``forward_dynamodb_to``: the URL of the server that answers this one's DynamoDB requests.
    ``limits``: AWS's limits, enforced from the first request (None: moto's own answers).
    """
    apply_patches(limits)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    # "No Moto CloudFormation support for <type>" (a log line and a warning per resource): the
    # runtime reports what moto skipped, by type, once (``Deployment.skipped``).
    moto_logger = logging.getLogger("moto")
    if _not_cloudformation_noise not in moto_logger.filters:
        moto_logger.addFilter(_not_cloudformation_noise)
    warnings.filterwarnings("ignore", message="Tried to parse .* not supported by moto")
    server = _BreakwaterMotoServer(url=forward_dynamodb_to, ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    return server


def freeze_heap() -> None:
    """Collect once, then keep later full collections off every object this process holds now."""
    gc.collect()
    gc.freeze()


def freeze_startup_objects() -> None:
    """Keep the garbage collector's full collections off everything imported at start.

    The process holds hundreds of thousands of objects after moto's imports (CloudFormation's parser
    imports most of its backends); CPython's full (generation 2) collection walks all of them,
    holding the GIL while it does, and runs again whenever the objects that survived since the last
    one reach a quarter of that number: under load, every few seconds, stalling every request in
    flight at once. ``gc.freeze()`` moves what exists now to the permanent generation,
    which collections skip; those objects are still freed by reference counting, only cycles among
    them are never collected (modules and classes, which live as long as the process anyway).
    """
    import moto.cloudformation.parsing  # noqa: F401 - imported by the first CreateStack otherwise

    freeze_heap()


def main() -> None:
    invoke_url = os.environ.get(INVOKE_URL_ENV)
    server = start_server(os.environ.get(FORWARD_DYNAMODB_ENV) or None, AwsLimits.from_env())
    if invoke_url:
        forward_invocations(invoke_url)
    freeze_startup_objects()
    _, port = server.get_host_and_port()
    sys.stdout.write(json.dumps({"port": port}) + "\n")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads the pipe after the port line
    watcher = threading.Thread(target=_watch_parent, name="parent-watch", daemon=True)
    watcher.start()
    watcher.join()  # stdin closed: the parent is gone; moto's state dies with the process
    os._exit(0)


def _watch_parent() -> None:
    """Serve the parent's lines on stdin until it closes: ``freeze`` (after its deployment) freezes
    what the process holds now, the stack's resources included (:func:`freeze_startup_objects`)."""
    for line in sys.stdin:
        if line.strip() == FREEZE_COMMAND:
            freeze_heap()


if __name__ == "__main__":
    main()
