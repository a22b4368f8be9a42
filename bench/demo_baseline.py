"""Where a quiet message waits during the demo's baseline: per-batch timings of the live workers.

    .venv/bin/python bench/demo_baseline.py [--seconds 15] [--rate 1] [--containers 6] [--naive]
                                            [--work-ms N] [--window S] [--in-process-moto]

Starts the runtime with the demo's context (``local.scenarios.noisy_neighbour.DEMO_CONTEXT``) and
``RuntimeOptions`` like the demo's (``--containers`` execution environments per function, the live
worker's included, which the demo gives more; all started before the load; the schedules twelve
times as often), creates the 20 tenants and sends only the baseline load (every tenant at ``--rate``
messages/s, no burst). Per batch of a live-worker mapping it records: the age of the oldest message
when the mapping received it (enqueue -> receive), the wait for a container (receive -> start),
the handler's duration, the records admitted and processed (each costs ``breakwater_local.work_ms`` of
sequential work) and the AWS requests the handler made. Prints one summary per mapping and for
all, then the consumer capacity the configuration implies.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "functions"))

from app import merge_context  # noqa: E402
from local.emulator import functions as local_functions  # noqa: E402
from local.emulator import mappings as local_mappings  # noqa: E402
from local.emulator import moto_process  # noqa: E402
from local.emulator.runtime import LocalRuntime, RuntimeOptions  # noqa: E402
from local.scenarios.load_client import LoadGenerator  # noqa: E402
from local.scenarios.noisy_neighbour import DEMO_CONTEXT, NAIVE_CONTEXT, Scenario  # noqa: E402
from local.scenarios.observations import Observations  # noqa: E402
from local.scenarios.tenants import create_tenants  # noqa: E402

_local = threading.local()
ROWS: list[dict[str, Any]] = []
ROWS_LOCK = threading.Lock()


SERVER: dict[str, list[float]] = defaultdict(list)  # moto backend method -> seconds per call


def time_backends() -> None:
    """Server-side time of moto's DynamoDB and SQS backend methods (wrapped over the runtime's patches)."""
    from moto.dynamodb import models as dynamodb_models
    from moto.sqs import models as sqs_models

    def timed(name: str, original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            table = kwargs.get("table_name") or ""
            if not table and len(args) > 1 and isinstance(args[1], str):
                table = args[1]
            key = f"{name} {table.split('-')[1] if '-' in table else table}" if table else name
            try:
                return original(*args, **kwargs)
            finally:
                SERVER[key].append(time.perf_counter() - began)

        return wrapper

    for cls, names in (
        (
            dynamodb_models.DynamoDBBackend,
            (
                "transact_write_items",
                "put_item",
                "update_item",
                "delete_item",
                "get_item",
                "query",
                "batch_get_item",
            ),
        ),
        (
            sqs_models.SQSBackend,
            ("send_message", "send_message_batch", "receive_message", "delete_message_batch"),
        ),
    ):
        for name in names:
            if hasattr(cls, name):
                setattr(cls, name, timed(f"{cls.__name__[:-7]}.{name}", getattr(cls, name)))


def patch() -> None:
    receive = local_mappings.SqsMapping._receive
    invoke = local_mappings.SqsMapping._invoke
    pool_invoke = local_functions.FunctionPool.invoke

    def timed_receive(self: Any, state: Any) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = receive(self, state)
        now = time.time()
        for message in batch:
            message["_bench_received"] = now
        return batch

    def timed_invoke(self: Any, batch: list[dict[str, Any]], report_failures: bool) -> None:
        _local.row = row = {"mapping": self.spec.source_arn.rsplit(":", 1)[-1], "size": len(batch)}
        received = batch[0].get("_bench_received", time.time()) if batch else time.time()
        ages = []
        for message in batch:
            with contextlib.suppress(ValueError, KeyError):
                ages.append(received * 1000 - json.loads(message["Body"])["enqueued_at"])
        row["queue_ms"] = max(ages) if ages else 0.0
        row["executor_ms"] = (time.time() - received) * 1000
        invoke(self, batch, report_failures)
        row["done"] = time.time()
        with ROWS_LOCK:
            ROWS.append(row)

    local_mappings.SqsMapping._receive = timed_receive  # type: ignore[method-assign]
    local_mappings.SqsMapping._invoke = timed_invoke  # type: ignore[method-assign]
    local_functions.FunctionPool.invoke = _pool_invoke_timed(pool_invoke)  # type: ignore[method-assign]


def _pool_invoke_timed(pool_invoke: Any) -> Any:
    """FunctionPool.invoke with the container wait measured (the semaphore acquired here, then held)."""

    def wrapped(self: Any, event: Any, *, trace_id: str | None = None) -> Any:
        asked = time.time()
        self._slots.acquire()
        waited_ms = (time.time() - asked) * 1000
        self._slots.release()  # pool_invoke re-acquires it; a race here only moves the wait, rarely
        invocation = pool_invoke(self, event, trace_id=trace_id)
        row = getattr(_local, "row", None)
        if row is not None:
            total_ms = (time.time() - asked) * 1000
            row["container_wait_ms"] = max(waited_ms, total_ms - invocation.duration_ms)
            row["handler_ms"] = invocation.duration_ms
            row["requests"] = sum(invocation.requests.values())
        return invocation

    return wrapped


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all cores, from /proc/stat (0, 0 where there is none)."""
    try:
        fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def summary(rows: list[dict[str, Any]], seconds: float) -> str:
    def p(values: list[float], q: float) -> float:
        if not values:
            return 0.0
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]

    queue = [r["queue_ms"] for r in rows]
    wait = [r.get("container_wait_ms", 0.0) for r in rows]
    handler = [r.get("handler_ms", 0.0) for r in rows]
    sizes = [r["size"] for r in rows]
    requests = [r.get("requests", 0) for r in rows]
    mean_size = statistics.fmean(sizes or [0])
    mean_handler = statistics.fmean(handler or [0])
    return (
        f"batches {len(rows):4d} ({len(rows) / seconds:5.2f}/s) size mean {mean_size:4.1f} | "
        f"queue p50 {p(queue, 50):6.0f} p99 {p(queue, 99):6.0f} ms | "
        f"container wait p50 {p(wait, 50):5.0f} p99 {p(wait, 99):5.0f} ms | "
        f"handler p50 {p(handler, 50):5.0f} p99 {p(handler, 99):5.0f} ms mean {mean_handler:5.0f} | "
        f"requests/batch {statistics.fmean(requests or [0]):4.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--naive", action="store_true")
    parser.add_argument("--work-ms", type=int, default=None, help="override breakwater_local.work_ms")
    parser.add_argument("--containers", type=int, default=6)
    parser.add_argument("--rate", type=float, default=1.0, help="msg/s per tenant")
    parser.add_argument("--window", type=float, default=None, help="override worker.batching_window_seconds")
    parser.add_argument(
        "--in-process-moto",
        action="store_true",
        help="moto's server in this process, not its own, and time its backend methods",
    )
    args = parser.parse_args()
    patch()
    context = merge_context({}, DEMO_CONTEXT)
    if args.work_ms is not None:
        context = merge_context(context, {"breakwater_local": {"work_ms": args.work_ms}})
    if args.window is not None:
        context = merge_context(context, {"breakwater": {"worker": {"batching_window_seconds": args.window}}})
    if args.naive:
        context = merge_context(context, NAIVE_CONTEXT)
    options = RuntimeOptions(
        workdir=ROOT / "out" / "local" / "bench-baseline",
        max_containers=args.containers,
        mapping_containers=0,
        warm_containers=args.containers,
        schedule_speedup=12.0,
        moto_in_process=args.in_process_moto,
    )
    scenario = Scenario(
        baseline_s=args.seconds, burst_s=0.0, after_s=0.0, quiet_rate=args.rate, noisy_rate=args.rate
    )
    runtime = LocalRuntime(context=context, options=options)
    if args.in_process_moto:
        moto_process.apply_patches()  # the runtime's own (idempotent), so the timing wraps them
        time_backends()
    runtime.start()
    try:
        keys = create_tenants(runtime, scenario.tenant_ids)
        obs = Observations()
        obs.started = time.time()
        cpu_before = cpu_times()
        process_before = time.process_time()
        SERVER.clear()
        assert runtime.api is not None
        LoadGenerator(runtime.api.url, keys, scenario, obs).run()
        cpu_after = cpu_times()
        process_cpu = time.process_time() - process_before
        server = {name: list(values) for name, values in SERVER.items()}
        time.sleep(3.0)
        with ROWS_LOCK:
            rows = [r for r in ROWS if r["done"] <= obs.started + args.seconds]
        worker_rows = [r for r in rows if "dlq" not in r["mapping"].lower()]
        by_mapping: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in worker_rows:
            by_mapping[row["mapping"]].append(row)
        print(f"accepted {sum(obs.accepted.values())} in {args.seconds:.0f} s, containers {args.containers}")
        for name in sorted(by_mapping):
            print(f"{name[-40:]:40s} {summary(by_mapping[name], args.seconds)}")
        print(f"{'all':40s} {summary(worker_rows, args.seconds)}")
        busy = sum(r.get("handler_ms", 0.0) for r in worker_rows) / 1000
        print(f"container-seconds busy per second: {busy / args.seconds:.2f} (of {args.containers})")
        total = cpu_after[1] - cpu_before[1]
        if total > 0:
            print(f"host CPU busy during the load: {100 * (cpu_after[0] - cpu_before[0]) / total:.0f}%")
        serving = "moto server, mappings, API, load" if args.in_process_moto else "mappings, API, load"
        print(f"runtime process ({serving}): {process_cpu / args.seconds:.2f} CPU-s/s")
        for name, values in sorted(server.items(), key=lambda kv: -sum(kv[1])):
            print(
                f"  moto {name:36s} {len(values):5d} calls {len(values) / args.seconds:6.1f}/s "
                f"mean {1000 * statistics.fmean(values):6.1f} ms total {sum(values) / args.seconds:5.2f} s/s"
            )
    finally:
        runtime.stop()


if __name__ == "__main__":
    main()
