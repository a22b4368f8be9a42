"""The demo's clients in a process of their own, at a lower CPU priority than the system they load.

In AWS the clients run on other machines; here they share the two cores with the emulated system
(API, functions, moto). Inside the runtime's process, the load generator's twelve sender threads
(HTTP requests and responses, 50 a second in the burst) also took that process's GIL from the API
server and the mapping pollers. :class:`ClientProcess` runs the same :class:`~local.scenario.LoadGenerator`
(same schedule, same senders) in a child process started with ``nice`` :data:`CLIENT_NICE`, and streams
each answer back as one JSON line, so the parent's :class:`~local.scenario.Observations` fill as
before (the progress display reads them while the load runs). Measured effect: docs/performance.md,
Demo, and docs/decisions.md D-local-11.

The child is started, and its imports paid, before the load's clock starts (it says when it is ready):
:meth:`ClientProcess.run` only hands it the start time.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import asdict
from typing import IO, Any

from local.emulator.child_process import ROOT, start_module
from local.scenarios.scenario import LoadGenerator, Observations, Scenario

CLIENT_NICE = 10  # added to the runtime's own niceness: the system under test comes first
READY = "ready"


class _Summary:
    """What the parent keeps of the child's :class:`~local.stream_load.EventTraffic` after the run."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self._summary = summary

    def summary(self) -> dict[str, Any]:
        return self._summary


class ClientProcess:
    """:class:`~local.scenario.LoadGenerator`'s interface, with the senders in a child process."""

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
        self._child = start_module(
            "local.scenarios.load_client", {**os.environ, "PYTHONPATH": str(ROOT / "functions")}
        )
        assert self._child.stdout is not None
        if self._child.stdout.readline().strip() != READY:  # its imports done: the load can start on time
            self._child.kill()
            status = self._child.wait()
            raise RuntimeError(f"the load generator's process did not start (exit status {status})")

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
            t, tenant, status = answer
            self.obs.record(tenant, int(status), float(t))


class _StreamingGenerator(LoadGenerator):
    """In the child: each answer goes to stdout as ``[t, tenant, status]`` instead of into observations."""

    def __init__(self, *args: Any, out: IO[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._out = out
        self._out_lock = threading.Lock()

    def _answered(self, tenant: str, status: int) -> None:
        line = json.dumps([round(time.time() - self.obs.started, 4), tenant, status])
        with self._out_lock:
            self._out.write(line + "\n")
            self._out.flush()


def main() -> int:
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    request = json.loads(sys.stdin.readline())
    if request.get("nice"):
        os.nice(int(request["nice"]))
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
