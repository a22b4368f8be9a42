"""The demo's event traffic: a share of each tenant's requests goes to ``POST /v1/events`` (Kinesis).

The load generator (:class:`~local.scenarios.load_client.LoadGenerator`) calls
:meth:`EventTraffic.divert` for each request it is about to send; every ``1/share``-th request of a
tenant is sent here as one event instead of a message, so the streaming path (API -> events
function -> Kinesis -> the runtime's Kinesis mapping -> stream consumer -> aggregates) carries load
during the demo. :func:`consumed_events` reads what the consumer aggregated, for the report.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from local.emulator.runtime import LocalRuntime

EVENT_TYPE = "demo"


class EventTraffic:
    """Diverts ``share`` of each tenant's requests to ``POST /v1/events``; counts the answers per tenant."""

    def __init__(self, api_url: str, keys: dict[str, str], share: float = 0.1) -> None:
        self.url = urlsplit(api_url)
        self.path = self.url.path.rstrip("/") + "/v1/events"
        self.keys = keys
        self.every = max(1, round(1 / share)) if share > 0 else 0
        self._seen: Counter[str] = Counter()
        self.answers: dict[str, Counter[int]] = defaultdict(Counter)  # tenant -> HTTP status -> count
        self._lock = threading.Lock()
        self._local = threading.local()

    def divert(self, tenant: str) -> bool:
        """Send this request of ``tenant`` as an event (True) or leave it to the caller (False)."""
        if not self.every:
            return False
        with self._lock:
            self._seen[tenant] += 1
            if self._seen[tenant] % self.every:
                return False
        status = self._send(tenant)
        with self._lock:
            self.answers[tenant][status] += 1
        return True

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            host = self.url.hostname or "127.0.0.1"
            connection = http.client.HTTPConnection(host, self.url.port, timeout=30)
            self._local.connection = connection
        return connection

    def _send(self, tenant: str) -> int:
        body = json.dumps({"type": EVENT_TYPE, "value": 1})
        headers = {"Authorization": f"Bearer {self.keys[tenant]}", "Content-Type": "application/json"}
        connection = self._connection()
        try:
            connection.request("POST", self.path, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException):
            connection.close()
            self._local.connection = None
            return 0

    def summary(self) -> dict[str, Any]:
        """Events sent and accepted (202) per tenant, and in total."""
        with self._lock:
            sent = {tenant: sum(answers.values()) for tenant, answers in self.answers.items()}
            accepted = {tenant: answers[202] for tenant, answers in self.answers.items()}
        return {
            "share": 1 / self.every if self.every else 0.0,
            "sent": sum(sent.values()),
            "accepted": sum(accepted.values()),
            "sent_by_tenant": sent,
            "accepted_by_tenant": accepted,
        }


def consumed_events(runtime: LocalRuntime) -> dict[str, int]:
    """Events the stream consumer aggregated, per partition key (the tenant): the aggregates' counts."""
    table = next(
        (
            spec.environment["AGGREGATES_TABLE_NAME"]
            for spec in runtime.functions.values()
            if spec.handler.startswith("stream_consumer/")
        ),
        None,
    )
    if table is None:
        return {}
    dynamodb = runtime.aws.client("dynamodb", counted=False)
    counts: Counter[str] = Counter()
    for page in dynamodb.get_paginator("scan").paginate(TableName=table):
        for item in page["Items"]:
            if item.get("sk", {}).get("S") == EVENT_TYPE:
                counts[item["pk"]["S"]] += int(item.get("count", {}).get("N", "0"))
    return dict(counts)
