"""The embedded AWS: moto's server on 127.0.0.1 (a free port), with the runtime's moto patches.

By default the server runs in a child process of its own (``moto_process.py``), so
the functions' AWS requests do not wait on the runtime process's GIL; ``in_process=True`` keeps it
in this process (tests and benches that reach into moto's backends). Every client of the local
runtime, and every function it runs, reaches it through ``AWS_ENDPOINT_URL``; the credentials are
fake, so nothing can reach a real account.

DynamoDB has a second child process of its own: under load the functions' item writes took most of
the one server's GIL, and every other request waited behind them. The stack is
deployed into both processes through CloudFormation, from the same random seed, so both hold the same
tables under the same names (``deploy.py`` checks). Functions and the runtime's clients reach
the DynamoDB process through ``AWS_ENDPOINT_URL_DYNAMODB``; the main server forwards any DynamoDB
request it gets there too, so a tool given the one ``AWS_ENDPOINT_URL`` sees the same tables.

``limits`` (:class:`local.aws_limits.AwsLimits`): both processes enforce AWS's limits
(``moto_patches/limits.py``); DynamoDB's are metered where DynamoDB is served, SQS's and Kinesis's in
the main process. :meth:`EmbeddedAws.limits_report` gathers what they refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import boto3
import botocore.config

from local.aws_limits import SCALE_ENV, AwsLimits
from local.emulator import moto_process
from local.emulator.child_process import start_module
from local.pricing.usage import UsageMeter

if TYPE_CHECKING:  # the patches import moto's internals, after the version check
    from local.emulator.moto_patches.lambda_ import LambdaDispatch

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}
ROOT = Path(__file__).resolve().parents[2]


class AwsClients(Protocol):
    """Where the emulator's parts get their AWS clients (:meth:`EmbeddedAws.client`)."""

    def client(self, service: str, *, counted: bool = True) -> Any: ...


class RequestCounter:
    """AWS API requests of this process's clients, counted client-side (botocore events), per operation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def __call__(self, model: Any = None, **_: Any) -> None:
        name = f"{model.service_model.service_name}.{model.name}" if model is not None else "unknown"
        with self._lock:
            self.counts[name] += 1

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-call.*.*", self)


class _InvokeBridge:
    """The parent's end of Lambda ``Invoke``: the moto process POSTs each one here (loopback only)."""

    def __init__(self) -> None:
        self.dispatch: LambdaDispatch | None = None
        bridge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                payload = self.rfile.read(length)
                name = self.headers.get(moto_process.FUNCTION_HEADER, "")
                kind = self.headers.get(moto_process.INVOCATION_TYPE_HEADER, "RequestResponse")
                try:
                    if bridge.dispatch is None:
                        raise LookupError("the local runtime routes no Lambda invocations")
                    body, status = bridge.dispatch(name, payload, kind), 200
                except Exception as exc:  # the moto process turns it into an error response
                    body, status = json.dumps({"errorMessage": str(exc)}).encode(), 500
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="invoke-bridge", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/invoke"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class EmbeddedAws:
    """moto's server (a child process by default, or ThreadedMotoServer here), patched, and clients for it.

    ``split_dynamodb`` (child processes only): DynamoDB in a second moto process.
    ``routes_invocations``: Lambda ``Invoke`` reaches the runtime's containers (not in the DynamoDB
    process, which gets none). ``limits``: AWS's limits enforced (None: moto's own answers).
    """

    def __init__(
        self,
        *,
        in_process: bool = False,
        split_dynamodb: bool = True,
        routes_invocations: bool = True,
        limits: AwsLimits | None = None,
    ) -> None:
        self.in_process = in_process
        self.routes_invocations = routes_invocations
        self.limits = limits
        self.dynamodb: EmbeddedAws | None = (
            None
            if in_process or not split_dynamodb
            else EmbeddedAws(split_dynamodb=False, routes_invocations=False, limits=limits)
        )
        self._server: Any = None
        self._process: subprocess.Popen[str] | None = None
        self._bridge: _InvokeBridge | None = None
        self._port = 0
        self._started = False
        self.requests = RequestCounter()
        # The billed units of the same requests (SQS chunks, DynamoDB request units, ...): the Lambda
        # service's SQS pollers are billed to the queues' account as SQS requests.
        self.usage = UsageMeter()
        self._session = boto3.session.Session(
            aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=FAKE_CREDENTIALS["AWS_SESSION_TOKEN"],
            region_name=REGION,
        )
        self._config = botocore.config.Config(
            retries={"max_attempts": 2, "mode": "standard"}, max_pool_connections=50
        )

    def start(self) -> EmbeddedAws:
        """Start with empty backends: moto's state is process-wide; a new runtime must not see the old."""
        if self._started:
            return self
        if self.dynamodb is not None:
            self.dynamodb.start()
        if self.in_process:
            self._server = moto_process.start_server(limits=self.limits)
            self._port = int(self._server.get_host_and_port()[1])
        else:
            self._start_process()
        self._started = True
        self._moto_api("reset")
        return self

    def _moto_api(self, action: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/moto-api/{action}", method="POST")  # noqa: S310 - http://127.0.0.1
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - our own local server
            response.read()

    def seed_random(self, value: int) -> None:
        """Seed this server's random (resource names and ids): the same calls then make the same names."""
        self._moto_api(f"seed?a={int(value)}")

    def processes(self) -> list[EmbeddedAws]:
        """This server and the one serving DynamoDB: each deploys the stack."""
        return [self] if self.dynamodb is None else [self, self.dynamodb]

    def _start_process(self) -> None:
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in {moto_process.INVOKE_URL_ENV, moto_process.FORWARD_DYNAMODB_ENV}
        }
        if self.routes_invocations:
            self._bridge = _InvokeBridge()
            env[moto_process.INVOKE_URL_ENV] = self._bridge.url
        if self.dynamodb is not None:
            env[moto_process.FORWARD_DYNAMODB_ENV] = self.dynamodb.endpoint
        env.update(self.limits.to_env() if self.limits is not None else {SCALE_ENV: "off"})
        self._process = start_module("local.emulator.moto_process", env)
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            code = self._process.wait(10)
            raise RuntimeError(f"the moto server process exited ({code}) before it listened")
        self._port = int(json.loads(line)["port"])

    def freeze_heap(self) -> None:
        """Ask the server's process to keep its garbage collections off what it holds now (after a
        deployment): a full collection walking moto's imports and the stack stalls every request."""
        if self.dynamodb is not None:
            self.dynamodb.freeze_heap()
        if self._process is not None and self._process.stdin is not None:
            self._process.stdin.write(moto_process.FREEZE_COMMAND + "\n")
            self._process.stdin.flush()

    @property
    def server_pid(self) -> int | None:
        """The moto server's process (None when it runs in this one)."""
        return self._process.pid if self._process is not None else None

    def route_invocations(self, dispatch: LambdaDispatch) -> None:
        """Hand every Lambda ``Invoke`` to ``dispatch`` (the runtime's containers), not moto's Docker."""
        if self.in_process:
            from local.emulator.moto_patches import lambda_ as lambda_patches

            lambda_patches.route_invocations(dispatch)
        elif self._bridge is not None:
            self._bridge.dispatch = dispatch

    def unroute_invocations(self) -> None:
        if self.in_process:
            from local.emulator.moto_patches import lambda_ as lambda_patches

            lambda_patches.route_invocations(None)
        elif self._bridge is not None:
            self._bridge.dispatch = None

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._server is not None:
            self._server.stop()
            self._server = None
            if self.limits is not None:  # in this process: the next server starts without them
                from local.emulator.moto_patches import limits as moto_limits

                moto_limits.stop_enforcing()
        if self._process is not None:
            assert self._process.stdin is not None
            self._process.stdin.close()  # the child exits when its stdin closes
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
            self._process = None
        if self._bridge is not None:
            self._bridge.close()
            self._bridge = None
        if self.dynamodb is not None:
            self.dynamodb.stop()

    def limits_report(self) -> dict[str, Any]:
        """What the limits refused so far, from the process that served each service ({} without limits).

        DynamoDB's figures come from the DynamoDB process when there is one; refusals add up.
        """
        if self.limits is None or not self._started:
            return {}
        if self.in_process:
            return moto_process.limits_report()
        reports = [_fetch_limits(server.endpoint) for server in self.processes()]
        report = dict(reports[-1])  # the DynamoDB process's, when split: its DynamoDB figures
        report["kinesis_throttled_records"] = sum(r.get("kinesis_throttled_records", 0) for r in reports)
        refused: Counter[str] = Counter()
        for each in reports:
            refused.update(each.get("refused") or {})
        report["refused"] = dict(sorted(refused.items()))
        return report

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def endpoint_for(self, service: str) -> str:
        """Where a client of ``service`` goes: the DynamoDB process for DynamoDB, else :attr:`endpoint`."""
        if service == "dynamodb" and self.dynamodb is not None:
            return self.dynamodb.endpoint
        return self.endpoint

    def client(self, service: str, *, counted: bool = True) -> Any:
        """A boto3 client for the embedded AWS; counted in :attr:`requests` and :attr:`usage` unless
        ``counted`` is False."""
        client = self._session.client(service, endpoint_url=self.endpoint_for(service), config=self._config)  # type: ignore[call-overload]
        if counted:
            self.requests.attach(client)
            self.usage.attach(client.meta.events)
        return client

    def environment(self) -> dict[str, str]:
        """What a function (or a tool) needs in its environment to reach this AWS and nothing else."""
        environment = {
            **FAKE_CREDENTIALS,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
        }
        if self.dynamodb is not None:  # botocore's per-service variable: handlers are unchanged
            environment["AWS_ENDPOINT_URL_DYNAMODB"] = self.dynamodb.endpoint
        return environment


def _fetch_limits(endpoint: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{endpoint}{moto_process.LIMITS_PATH}", timeout=30) as response:  # noqa: S310 - our own local server
        answer = json.loads(response.read())
    return answer if isinstance(answer, dict) else {}
