"""The demo's load: open-loop senders, run in a process of their own at a lower CPU priority.

:class:`LoadGenerator` sends each tenant's requests on the scenario's schedule, whatever happened to
earlier ones, over a pool of keep-alive connections. In AWS the clients run on other machines; here
they share the machine's cores with the emulated system (API, functions, moto), and inside the
runtime's process their sender threads would also take that process's GIL from the API server and
the mapping pollers. So :class:`ClientProcess` runs the same generator (the same schedule, the same
senders) in a child process started with ``nice`` :data:`CLIENT_NICE`, and streams each answer back
as one JSON line: the parent's :class:`~local.scenarios.observations.Observations` fill as if the
senders ran there (the progress display reads them while the load runs).

The child is started, and its imports paid, before the load's clock starts (it says when it is ready):
:meth:`ClientProcess.run` only hands it the start time.
"""

from __future__ import annotations

import http.client
import json
import queue
import sys
import threading
import time
from dataclasses import asdict
from typing import IO, Any
from urllib.parse import urlsplit

from local.emulator.child_process import read_request, start_ready_child
from local.scenarios.noisy_neighbour import Scenario
from local.scenarios.observations import Observations
from local.scenarios.stream_load import EventTraffic

CLIENT_NICE = 10  # added to the runtime's own niceness: the system under test comes first


class LoadGenerator:
    """Open-loop senders: one schedule per tenant, a pool of keep-alive HTTP connections to the API."""

    def __init__(
        self, api_url: str, keys: dict[str, str], scenario: Scenario, observations: Observations
    ) -> None:
        self.url = urlsplit(api_url)
        self.host = self.url.hostname or "127.0.0.1"
        self.keys = keys
        self.scenario = scenario
        self.obs = observations
        self._work: queue.Queue[tuple[str, float] | None] = queue.Queue()
        self.events = EventTraffic(api_url, keys)  # a share of each tenant's requests, as events

    def _sender(self) -> None:
        connection = http.client.HTTPConnection(self.host, self.url.port, timeout=30)
        path = self.url.path.rstrip("/") + "/v1/messages"
        while True:
            item = self._work.get()
            if item is None:
                return
            tenant, at = item
            if self.events.divert(tenant):
                continue
            payload = self.scenario.payload(tenant, at)
            tag = "poison" if payload.get("poison") else ""
            body = json.dumps({"type": "demo", "payload": payload})
            headers = {"Authorization": f"Bearer {self.keys[tenant]}", "Content-Type": "application/json"}
            try:
                connection.request("POST", path, body=body, headers=headers)
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = http.client.HTTPConnection(self.host, self.url.port, timeout=30)
                status = 0
            self._answered(tenant, status, tag)

    def _answered(self, tenant: str, status: int, tag: str = "") -> None:
        self.obs.record(tenant, status, time.time() - self.obs.started, tag)

    def run(self, on_tick: Any = None) -> None:
        senders = [threading.Thread(target=self._sender, daemon=True) for _ in range(self.scenario.senders)]
        for thread in senders:
            thread.start()
        next_send = self.scenario.first_sends()
        start = self.obs.started
        last_tick = 0.0
        while True:
            t = time.time() - start
            if t >= self.scenario.duration_s:
                break
            for tenant in self.scenario.tenant_ids:
                while next_send[tenant] <= t:
                    self._work.put((tenant, next_send[tenant]))
                    next_send[tenant] += 1.0 / self.scenario.rate(tenant, next_send[tenant])
            if on_tick is not None and t - last_tick >= 1.0:
                last_tick = t
                on_tick(t)
            time.sleep(0.01)
        for _ in senders:
            self._work.put(None)
        for thread in senders:
            thread.join(30)


class _Summary:
    """What the parent keeps of the child's :class:`~local.scenarios.stream_load.EventTraffic`."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self._summary = summary

    def summary(self) -> dict[str, Any]:
        return self._summary


class ClientProcess:
    """:class:`LoadGenerator`'s interface, with the senders in a child process."""

    def __init__(
        self,
        api_url: str,
        keys: dict[str, str],
        scenario: Scenario,
        observations: Observations,
        *,
        nice: int = CLIENT_NICE,
    ) -> None:
        self.obs = observations
        self.events = _Summary({})
        self._request = {"api_url": api_url, "keys": keys, "scenario": asdict(scenario), "nice": nice}
        self._child = start_ready_child("local.scenarios.load_client", "the load generator's process")

    def run(self, on_tick: Any = None) -> None:
        """Start the load at ``observations.started`` and return when the child has sent everything."""
        child = self._child
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps({**self._request, "started": self.obs.started}) + "\n")
        child.stdin.close()
        final: dict[str, Any] = {}
        reader = threading.Thread(target=self._read, args=(child.stdout, final), daemon=True)
        reader.start()
        last_tick = 0.0
        while reader.is_alive():
            t = time.time() - self.obs.started
            if on_tick is not None and t - last_tick >= 1.0:
                last_tick = t
                on_tick(t)
            reader.join(0.05)
        if child.wait() != 0 or "events" not in final:
            raise RuntimeError(f"the load generator's process failed (exit status {child.returncode})")
        self.events = _Summary(final["events"])

    def _read(self, lines: IO[str], final: dict[str, Any]) -> None:
        for line in lines:
            answer = json.loads(line)
            if isinstance(answer, dict):  # the last line: the event traffic's summary
                final.update(answer)
                continue
            t, tenant, status, tag = answer
            self.obs.record(tenant, int(status), float(t), tag)


class _StreamingGenerator(LoadGenerator):
    """In the child: each answer goes to stdout as ``[t, tenant, status]`` instead of into observations."""

    def __init__(self, *args: Any, out: IO[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._out = out
        self._out_lock = threading.Lock()

    def _answered(self, tenant: str, status: int, tag: str = "") -> None:
        line = json.dumps([round(time.time() - self.obs.started, 4), tenant, status, tag])
        with self._out_lock:
            self._out.write(line + "\n")
            self._out.flush()


def main() -> int:
    request = read_request()
    observations = Observations(started=float(request["started"]))
    generator = _StreamingGenerator(
        request["api_url"], request["keys"], Scenario(**request["scenario"]), observations, out=sys.stdout
    )
    generator.run()
    sys.stdout.write(json.dumps({"events": generator.events.summary()}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
