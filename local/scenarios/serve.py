"""``python -m local serve``: the stack up on the embedded AWS for your own traffic, until Ctrl-C.

Three tenants are added; ``out/endpoint.json`` has the API's URL, their keys and the AWS endpoint
for tools (``bin/replay --local``, the AWS CLI with ``--endpoint-url``). The stack's alarms are
evaluated on what the server sees, and each transition is printed as it happens
(``local.scenarios.alarm_feed``).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from pathlib import Path

from local.aws_limits import AwsLimits
from local.emulator.alarms import AlarmWatch
from local.emulator.runtime import ROOT, LocalRuntime, RuntimeOptions
from local.scenarios.alarm_feed import WINDOW_PERIODS, AlarmFeed
from local.scenarios.noisy_neighbour import NAIVE_CONTEXT
from local.scenarios.tenants import create_tenants

TENANTS = ("acme", "globex", "initech")


def runtime_options(schedule_speedup: float, limits: AwsLimits | None = None) -> RuntimeOptions:
    """Light enough to leave running: four containers per function (no more for a function's mappings),
    one of each started before the first request, so the first answer does not wait for a cold start."""
    return RuntimeOptions(
        max_containers=4,
        mapping_containers=0,
        warm_containers=1,
        schedule_speedup=schedule_speedup,
        limits=limits,
    )


def serve(
    *,
    naive: bool,
    schedule_speedup: float,
    out: Path = ROOT / "out" / "endpoint.json",
    limits: AwsLimits | None = None,
) -> int:
    """Start the runtime, add the tenants, write ``out``, print how to call the API; stop on a signal."""
    context = NAIVE_CONTEXT if naive else None
    runtime = LocalRuntime(context=context, options=runtime_options(schedule_speedup, limits))
    print("synthesizing the app and creating the stack in the embedded AWS ...", flush=True)
    runtime.start()
    try:
        keys = create_tenants(runtime, list(TENANTS))
        assert runtime.api is not None
        endpoint = {"url": runtime.api.url, "tenants": keys, "aws_endpoint": runtime.aws.endpoint}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(endpoint, indent=1), encoding="utf-8")
        summary = runtime.summary()
        print(
            json.dumps(
                {k: summary[k] for k in ("functions", "mappings", "schedules", "moto_skipped")}, indent=1
            )
        )
        print(f"\nAPI: {runtime.api.url}v1/messages   (AWS endpoint for tools: {runtime.aws.endpoint})")
        for tenant, key in keys.items():
            print(f"  {tenant}: {key}")
        print(
            f"\nwrote {out}. Try:\n  curl -s -X POST {runtime.api.url}v1/messages "
            "-H 'Content-Type: application/json' -H 'Authorization: Bearer "
            f'{keys[TENANTS[0]]}\' -d \'{{"type": "hello", "payload": {{}}}}\'\nCtrl-C stops.',
            flush=True,
        )
        stopped = threading.Event()
        watch = AlarmWatch(runtime, time.time())
        longest = max((d.period_s for d in watch.definitions), default=60.0) / schedule_speedup
        feed = AlarmFeed(watch, schedule_speedup, window_s=WINDOW_PERIODS * longest)
        threading.Thread(target=feed.run, args=(stopped,), daemon=True).start()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        with contextlib.suppress(KeyboardInterrupt):
            stopped.wait()
        stopped.set()
    finally:
        runtime.stop()
    return 0
