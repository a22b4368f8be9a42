"""The embedded AWS: moto's server on 127.0.0.1 (a free port), with the SQS hot-path patch applied.

Every client of the local runtime, and every function it runs, reaches it through
``AWS_ENDPOINT_URL``; the credentials are fake, so nothing can reach a real account.
"""

from __future__ import annotations

import logging
import threading
import urllib.request
from collections import Counter
from typing import Any

import boto3
import botocore.config
from moto.server import ThreadedMotoServer

from local import moto_patches

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


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


class EmbeddedAws:
    """moto's ThreadedMotoServer, patched, plus boto3 clients pointed at it."""

    def __init__(self) -> None:
        moto_patches.apply()
        moto_patches.disable_inline_event_source_delivery()
        moto_patches.kinesis_resharding_as_aws()
        moto_patches.serialize_dynamodb_writes()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._started = False
        self.requests = RequestCounter()
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
        if not self._started:
            self._server.start()
            self._started = True
            reset = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")  # noqa: S310 - http://127.0.0.1
            with urllib.request.urlopen(reset, timeout=30) as response:  # noqa: S310 - our own local server
                response.read()
        return self

    def stop(self) -> None:
        if self._started:
            self._server.stop()
            self._started = False

    @property
    def endpoint(self) -> str:
        host, port = self._server.get_host_and_port()
        return f"http://{host}:{port}"

    def client(self, service: str, *, counted: bool = True) -> Any:
        """A boto3 client for the embedded AWS; counted in :attr:`requests` unless ``counted`` is False."""
        client = self._session.client(service, endpoint_url=self.endpoint, config=self._config)  # type: ignore[call-overload]
        if counted:
            self.requests.attach(client)
        return client

    def environment(self) -> dict[str, str]:
        """What a function (or a tool) needs in its environment to reach this AWS and nothing else."""
        return {
            **FAKE_CREDENTIALS,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
        }
