"""Controller benchmark: 100,000 tenants, all changed (worst) and 1 % changed (steady), against the timeout.

    .venv/bin/python bench/controller.py
    .venv/bin/python bench/controller.py --tenants 20000 --invocations 1 2 4

moto is too slow for this size (its index Query walks the whole table on every call), so the
controller runs on in-memory ports (:class:`MemoryStore`, the same ports the unit tests use) that
count every AWS call the real ports would make. Each invocation's time is what its Python measurably
took here plus the AWS round trips it would wait for, at the per-call latencies of :data:`LATENCY_MS`
(stated, not measured: there is no AWS here), with the parallelism the real ports use (shards of an
invocation side by side, a page's tenant writes ``WRITE_THREADS`` at a time) and the Python time
stretched to the share of a CPU the controller's Lambda gets. The scheduled run also
holds the sideline gate, the reconciliation and one Lambda invoke per other group, and waits for the
slowest group. Prints one figure per line; the latest are recorded in docs/performance.md.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

from breakwater.aws.controller_ports import WRITE_THREADS  # noqa: E402
from breakwater.backlog import (  # noqa: E402
    DIRTY_SHARDS,
    Ledger,
    RunState,
    shard_groups,
    shard_key,
    shard_of,
)
from breakwater.backpressure import BackpressurePolicy  # noqa: E402
from breakwater.controller import (  # noqa: E402
    PAGE_SIZE,
    ControllerConfig,
    ControllerPorts,
    ControllerReport,
    ShardReport,
    ShardRequest,
    ShardState,
    TenantSnapshot,
    TenantWrite,
    _gate_sideline,
    _reconcile,
    run_shards,
)
from breakwater.observability import logger  # noqa: E402
from breakwater.settings import TierLimits  # noqa: E402

TIMEOUT_S = 50  # breakwater_cdk/control.py CONTROLLER_TIMEOUT_SECONDS
HANDLER_MARGIN_S = 5  # functions/controller/handler.py SAFETY_MARGIN_MS
LATENCY_MS = {
    "Query": 15.0,
    "BatchGetItem": 25.0,  # up to 100 keys
    "GetItem": 8.0,
    "UpdateItem": 10.0,
    "GetQueueAttributes": 20.0,
    "UpdateEventSourceMapping": 50.0,
    "Invoke": 100.0,  # a synchronous invocation's own overhead (warm), on top of its run
}
MEMORY_MB = 1769  # breakwater_cdk/control.py CONTROLLER_MEMORY_MB
# Lambda gives a function CPU in proportion to its memory, one vCPU at 1,769 MB: Python time measured
# here on a whole core is stretched by this much (an upper bound: this machine's core may be slower).
CPU_FACTOR = 1769 / MEMORY_MB
LIMITS = TierLimits(rate=50, burst=100, consumer_rate=50, concurrency=10, concurrency_floor=2)
CONFIG = ControllerConfig(
    backpressure=BackpressurePolicy(
        backlog_target=1000, min_multiplier=0.1, growth_step=0.1, max_multiplier=2.0
    ),
    healthy_age_s=300,
)


@dataclass
class Meter:
    """AWS calls by operation, and the time an invocation would wait on them, per shard."""

    calls: Counter[str] = field(default_factory=Counter)
    wait_ms: dict[int | None, float] = field(default_factory=lambda: defaultdict(float))

    def call(self, operation: str, shard: int | None = None, count: int = 1, parallel: int = 1) -> None:
        self.calls[operation] += count
        self.wait_ms[shard] += LATENCY_MS[operation] * math.ceil(count / parallel)


class MemoryStore:
    """The state table, the tenants' limits and the queues in memory, behind the controller's ports.

    ``write`` is what ingest and the workers do (ADD counters, mark the tenant); ``depth`` is what the
    queues hold. Every port call is metered as the AWS calls the real ports would make.
    """

    def __init__(self, clock: Any = None) -> None:
        self.counters: dict[str, dict[str, Any]] = {}
        self.buckets: dict[str, float] = {}
        self.limits: dict[str, TierLimits | None] = {}
        self.ledgers: dict[int, dict[str, Any]] = defaultdict(dict)
        self.scale = RunState()
        self.depth = 0
        self.live_depth = 0
        self.live_oldest: tuple[int | None, int | None] = (None, None)
        self.sideline_enabled = False
        self.dependency_down_until: int | None = None  # what the workers' breakers last reported
        self.meter = Meter()
        self.now_ms = 1_767_225_600_000
        self.clock = clock or (lambda: self.now_ms)
        self.lock = threading.RLock()
        self.fail_writes: set[str] = set()  # tenants whose counters write raises
        self.index: dict[str, set[str]] = defaultdict(set)  # the sparse index: shard -> marked tenants

    # -- what the writers do

    def write(self, tenant: str, deltas: Mapping[str, float]) -> None:
        with self.lock:
            item = self.counters.setdefault(tenant, {})
            for name, value in deltas.items():
                item[name] = item.get(name, 0) + value
            item["writes"] = item.get("writes", 0) + 1
            item["dirty_shard"] = shard_key(shard_of(tenant))
            self.index[item["dirty_shard"]].add(tenant)
            self.limits.setdefault(tenant, LIMITS)

    def estimate(self, tenant: str) -> float:
        """The tenant's stored estimate carried to the current scale (what the ledger counts for it)."""
        item = self.counters.get(tenant, {})
        return Ledger(float(item.get("estimate", 0)), float(item.get("estimate_mark", 0))).at(
            self.scale.scale_log
        )

    def ledger_total(self) -> float:
        return sum(
            Ledger(float(item.get("total", 0)), float(item.get("mark", 0))).at(self.scale.scale_log)
            for item in self.ledgers.values()
        )

    # -- the ports

    def ports(self) -> ControllerPorts:
        return ControllerPorts(
            live_depth=self._live_depth,
            live_oldest=self._live_oldest,
            set_sideline_enabled=self._set_sideline_enabled,
            observed_depth=self._observed_depth,
            read_run_state=self._read_run_state,
            write_run_state=self._write_run_state,
            claim_shard=self.claim_shard,
            dirty_tenants=self.dirty_tenants,
            read_tenants=self.read_tenants,
            commit=self.commit,
            release_shard=self.release_shard,
            read_ledgers=self.read_ledgers,
            dependency_down_until=self._dependency_down_until,
            clock_ms=self.clock,
        )

    def _live_depth(self) -> int:
        self.meter.call("GetQueueAttributes")
        return self.live_depth

    def _live_oldest(self) -> tuple[int | None, int | None]:
        self.meter.call("GetItem")
        return self.live_oldest

    def _dependency_down_until(self) -> int | None:
        self.meter.call("GetItem")
        return self.dependency_down_until

    def _set_sideline_enabled(self, enabled: bool, held: frozenset[str]) -> Iterable[str]:
        changed = enabled != self.sideline_enabled
        self.sideline_enabled = enabled
        self.meter.call("UpdateEventSourceMapping", count=int(changed))
        return ["sideline"] if changed else []

    def _observed_depth(self) -> int:
        self.meter.call("GetQueueAttributes", count=4)  # live, surge, spillover, backlog
        return self.depth

    def _read_run_state(self) -> RunState:
        self.meter.call("GetItem")
        return self.scale

    def _write_run_state(self, state: RunState) -> None:
        self.meter.call("UpdateItem")
        self.scale = state

    def claim_shard(self, shard: int, now_ms: int, until_ms: int) -> ShardState | None:
        self.meter.call("UpdateItem", shard)
        with self.lock:
            ledger = self.ledgers[shard]
            if ledger.get("lease_until", 0) > now_ms:
                return None
            ledger["lease_until"] = until_ms
            ledger["version"] = ledger.get("version", 0) + 1
            intent = ledger.pop("intent", None)
            if intent is not None:  # a page left half-written: the writes that landed carry its version
                landed = sum(
                    delta
                    for tenant, delta in intent["deltas"].items()
                    if self.counters.get(tenant, {}).get("ledger_version") == intent["version"]
                )
                ledger.update(total=intent["base"] + landed, mark=intent["mark"])
            return ShardState(
                shard,
                Ledger(ledger.get("total", 0.0), ledger.get("mark", 0.0)),
                ledger["version"],
                ledger.get("cursor"),
            )

    def dirty_tenants(self, shard: int, cursor: str | None, limit: int) -> tuple[list[str], str | None]:
        self.meter.call("Query", shard)
        with self.lock:
            marked = sorted(t for t in self.index[shard_key(shard)] if t > (cursor or ""))
        page = marked[:limit]
        return page, (page[-1] if len(page) == limit else None)

    def read_tenants(self, tenants: Sequence[str]) -> list[TenantSnapshot]:
        shard = shard_of(tenants[0]) if tenants else None
        self.meter.call("BatchGetItem", shard, count=math.ceil(len(tenants) / 100))  # counters
        self.meter.call("BatchGetItem", shard, count=math.ceil(len(tenants) / 100))  # tenant records
        with self.lock:
            items = {t: dict(self.counters[t]) for t in tenants if "dirty_shard" in self.counters.get(t, {})}
        unknown = [t for t, item in items.items() if "multiplier" not in item]
        if unknown:
            self.meter.call("BatchGetItem", shard, count=math.ceil(len(unknown) / 100))  # ingest buckets
        return [
            TenantSnapshot(
                tenant,
                self.limits.get(tenant),
                item,
                float(item["multiplier"]) if "multiplier" in item else self.buckets.get(tenant, 1.0),
            )
            for tenant, item in items.items()
        ]

    def commit(self, state: ShardState, writes: Sequence[TenantWrite]) -> ShardState | None:
        self.meter.call("UpdateItem", state.shard)  # the intent
        with self.lock:
            ledger = self.ledgers[state.shard]
            if ledger.get("version") != state.version:
                return None
            ledger["version"] += 1
            version = ledger["version"]
            ledger["intent"] = {
                "version": version,
                "base": state.ledger.total,
                "mark": state.ledger.mark,
                "deltas": {write.tenant: write.ledger_delta for write in writes},
            }
        tenant_calls = 0
        for write in writes:
            tenant_calls += self._write_tenant(write, version)
        self.meter.call("UpdateItem", state.shard, count=tenant_calls, parallel=WRITE_THREADS)
        self.meter.call("UpdateItem", state.shard)  # the ledger, intent dropped
        total = state.ledger.total + sum(write.ledger_delta for write in writes)
        with self.lock:
            if ledger.get("version") != version:
                return None
            ledger.update(total=total, mark=state.ledger.mark, version=version + 1)
            ledger.pop("intent", None)
        return replace(state, ledger=Ledger(total, state.ledger.mark), version=version + 1)

    def _write_tenant(self, write: TenantWrite, version: int) -> int:
        calls = 1
        with self.lock:
            if write.tenant in self.fail_writes:
                raise RuntimeError(f"counters write of {write.tenant} failed")
            if write.multiplier_changed:
                self.buckets[write.tenant] = write.multiplier
                calls += 1
            item = self.counters[write.tenant]
            item.update(
                seen_accepted=write.seen["accepted"],
                seen_throttled=write.seen["throttled"],
                seen_at=write.seen["at"],
                estimate=write.stored.estimate,
                estimate_mark=write.stored.mark,
                backlog_offset=write.stored.offset,
                multiplier=write.multiplier,
                ledger_version=version,
            )
            if not write.keep_dirty:
                if item.get("writes") == write.writes:
                    self.index[item.pop("dirty_shard")].discard(write.tenant)
                else:
                    calls += 1  # refused by its condition, written again without clearing the mark
        return calls

    def release_shard(self, state: ShardState, cursor: str | None) -> None:
        self.meter.call("UpdateItem", state.shard)
        with self.lock:
            ledger = self.ledgers[state.shard]
            if ledger.get("version") == state.version:
                ledger.update(lease_until=0, cursor=cursor)

    def read_ledgers(self, shards: Sequence[int]) -> dict[int, Ledger]:
        self.meter.call("BatchGetItem")
        with self.lock:
            return {
                s: Ledger(self.ledgers[s].get("total", 0.0), self.ledgers[s].get("mark", 0.0)) for s in shards
            }


# -- the bench


def _lanes(shard_ms: Sequence[float], lanes: int) -> float:
    """When the last of the shards ends, ``lanes`` at a time, each taken by the first lane free."""
    ends = [0.0] * max(1, lanes)
    for ms in shard_ms:
        first = min(range(len(ends)), key=ends.__getitem__)
        ends[first] += ms
    return max(ends)


def populate(store: MemoryStore, tenants: int, changed: float) -> None:
    """``tenants`` seen once already (clean, unthrottled), then ``changed`` of them written to again.

    A changed tenant's backlog passes the target, so every one of them is throttled (its multiplier
    changes: two writes), and the queues hold what the changed tenants hold.
    """
    for i in range(tenants):
        name = f"tenant-{i:06d}"
        store.counters[name] = {
            "accepted": 100.0,
            "processed": 100.0,
            "writes": 1,
            "estimate": 0.0,
            "estimate_mark": 0.0,
            "backlog_offset": 0.0,
            "multiplier": 1.0,
            "seen_accepted": 100.0,
            "seen_throttled": 0.0,
            "seen_at": store.now_ms - 60_000,
        }
        store.limits[name] = LIMITS
    step = max(1, round(1 / changed)) if changed > 0 else 0
    for i in range(0, tenants, step or tenants + 1):
        store.write(f"tenant-{i:06d}", {"accepted": 2000})
        store.depth += 2000


def bench(tenants: int, changed: float, invocations: int, config: ControllerConfig) -> dict[str, Any]:
    store = MemoryStore()
    populate(store, tenants, changed)
    marked = sum(len(tenants) for tenants in store.index.values())
    store.now_ms += 60_000
    config = replace(config, invocations=invocations)
    request = ShardRequest(
        depth=store.depth, scale_log=0.0, now_ms=store.now_ms, deadline_ms=store.now_ms + 3_600_000
    )
    groups = shard_groups(invocations)
    ports = store.ports()
    group_s: list[float] = []
    evaluated = 0
    for group in groups:
        store.meter.wait_ms.clear()
        started = time.perf_counter()
        # One shard at a time here, so the Python time is this group's alone; the waits are laid out
        # as the invocation's parallel shards would overlap them.
        report: ShardReport = run_shards(replace(config, parallel_shards=1), ports, group, request)
        python_s = (time.perf_counter() - started) * CPU_FACTOR
        evaluated += report.evaluated
        wait_ms = _lanes([store.meter.wait_ms.get(shard, 0.0) for shard in group], config.parallel_shards)
        group_s.append(python_s + wait_ms / 1000)
    calls = Counter(store.meter.calls)
    # The scheduled run's own part (sideline gate, depth, scale, reconciliation): the same calls
    # whatever the number of tenants.
    fixed = MemoryStore()
    fixed_ports = fixed.ports()
    started = time.perf_counter()
    _gate_sideline(config, fixed_ports, fixed.now_ms, ControllerReport())
    fixed_ports.observed_depth()
    _reconcile(config, fixed_ports, request, fixed_ports.read_run_state())
    own_s = (time.perf_counter() - started) * CPU_FACTOR + sum(fixed.meter.wait_ms.values()) / 1000
    invoke_s = LATENCY_MS["Invoke"] / 1000 if len(groups) > 1 else 0.0
    calls += fixed.meter.calls + Counter({"Invoke": len(groups) - 1})
    return {
        "tenants": tenants,
        "changed": marked,
        "evaluated": evaluated,
        "invocations": len(groups),
        "slowest_group_s": max(group_s),
        "scheduled_run_s": own_s + invoke_s + max(group_s),
        "calls": sum(calls.values()),
        "calls_per_changed_tenant": sum(calls.values()) / max(1, marked),
        "calls_by_operation": dict(sorted(calls.items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=100_000)
    parser.add_argument("--invocations", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--parallel-shards", type=int, default=CONFIG.parallel_shards)
    args = parser.parse_args()
    config = replace(CONFIG, parallel_shards=args.parallel_shards)
    # Every decision is still logged (its cost is part of the run), to nowhere.
    sink = Path(os.devnull).open("w")  # noqa: SIM115
    for handler in logger.handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sink)
    budget = TIMEOUT_S - HANDLER_MARGIN_S
    print(f"latency model, ms per call: {LATENCY_MS}")
    print(
        f"shards={DIRTY_SHARDS} page={PAGE_SIZE} tenant_writes_at_once={WRITE_THREADS} "
        f"shards_at_once={config.parallel_shards} "
        f"python_time_x{CPU_FACTOR:.2f} (a {MEMORY_MB} MB Lambda's share of a CPU)"
    )
    for case, share in (("worst (all changed)", 1.0), ("steady (1% changed)", 0.01)):
        for invocations in args.invocations:
            result = bench(args.tenants, share, invocations, config)
            fits = "fits" if result["scheduled_run_s"] <= budget else "does NOT fit"
            print(
                f"{case}: tenants={result['tenants']} changed={result['changed']} "
                f"evaluated={result['evaluated']} invocations={result['invocations']} "
                f"slowest_shard_invocation_s={result['slowest_group_s']:.1f} "
                f"scheduled_run_s={result['scheduled_run_s']:.1f} vs timeout {TIMEOUT_S} s "
                f"({budget} s before the handler's margin): {fits}; calls={result['calls']} "
                f"calls_per_changed_tenant={result['calls_per_changed_tenant']:.3f}"
            )
            print(f"    calls by operation: {result['calls_by_operation']}")


if __name__ == "__main__":
    main()
