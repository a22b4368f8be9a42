"""``python -m local demo``: the noisy-neighbour scenario, Breakwater configuration then naive, with a report.

Per tenant group (noisy / quiet): p50 and p99 AgeOfFirstAttempt on the live queues (from the
workers' EMF output: the per-tenant property beside the metric), peak live
backlog, recovery time after the burst, the workers' dropped / sidelined / spilled / deferred
counts, and AWS API requests per delivered message (botocore ``before-call`` events, counted in
every function container and in the mapping pollers). In the Breakwater run, what the archiver
parked in S3 during the burst is replayed after the load (``LocalRuntime.run_replay``: the Glue job's
entry point on local[2]); its first attempts are reported apart from the scenario's ages. Written
to ``out/report.json``, plotted to ``out/age_by_tenant.png``, printed as a table.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from local.emulator.replay import ReplayRequest
from local.emulator.runtime import ROOT, LocalRuntime, RuntimeOptions
from local.scenarios.load_client import ClientProcess
from local.scenarios.scenario import (
    DEMO_CONTEXT,
    Observations,
    Scenario,
    create_tenants,
    observe_deliveries,
    queue_depths,
)
from local.scenarios.stream_load import consumed_events

FIRST_ATTEMPT_PROPERTY = "AgeOfFirstAttemptByTenant"  # breakwater.worker.FIRST_ATTEMPT_PROPERTY
COUNTER_NAMES = ("processed", "dropped", "sidelined", "spilled", "deferred", "failed")


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def tenant_counters(runtime: LocalRuntime, tenants: list[str]) -> dict[str, dict[str, int]]:
    """The per-tenant counters the workers flush to the state table (``tenant#<id>`` / ``counters``)."""
    client = runtime.aws.client("dynamodb", counted=False)
    table = runtime.output("StateTableName")
    out: dict[str, dict[str, int]] = {}
    for tenant in tenants:
        item = client.get_item(
            TableName=table,
            Key={"pk": {"S": f"tenant#{tenant}"}, "sk": {"S": "counters"}},
            ConsistentRead=True,
        ).get("Item", {})
        out[tenant] = {name: int(item[name]["N"]) for name in COUNTER_NAMES if name in item}
    return out


def run_config(
    name: str, context: dict[str, Any], scenario: Scenario, progress: bool = True
) -> dict[str, Any]:
    workdir = ROOT / "out" / "local" / name
    # 6 execution environments per function, all started before the load: cold starts are not a queue
    # effect, and more containers than the 2 cores can serve only move the wait into moto. A function
    # whose SQS mappings may run more at once gets up to 10: the live worker, whose 9 mappings of the
    # Breakwater template allow 18 (D-local-14).
    options = RuntimeOptions(
        workdir=workdir, max_containers=6, mapping_containers=10, warm_containers=10, schedule_speedup=12.0
    )
    runtime = LocalRuntime(context=context, options=options)
    began = time.time()
    runtime.start()
    setup_s = time.time() - began
    try:
        keys = create_tenants(runtime, scenario.tenant_ids)
        obs = Observations()
        runtime.on_invocation = observe_deliveries(obs)
        sampler_client = runtime.aws.client("sqs", counted=False)
        stop_sampling = threading.Event()
        workers_deployed = any(spec.handler.startswith("worker/") for spec in runtime.functions.values())

        def sample() -> None:
            samples, last_dlq = 0, 0
            while not stop_sampling.wait(scenario.sample_s):
                # DLQs every fifth sample: each queue asked is a request to the one moto process.
                depths = queue_depths(runtime, sampler_client, last_dlq=last_dlq if samples % 5 else None)
                samples, last_dlq = samples + 1, depths[2]
                with obs.lock:
                    obs.depths.append((time.time() - obs.started, *depths))

        def tick(t: float) -> None:
            if not progress:
                return
            with obs.lock:
                accepted, throttled = sum(obs.accepted.values()), sum(obs.throttled.values())
                ages = [
                    a
                    for (_, tenant, a, role) in obs.first_attempts[-400:]
                    if role == "live" and tenant != scenario.noisy
                ]
                live = obs.depths[-1][1] if obs.depths else 0
            p99 = percentile(ages, 99)
            line = (
                f"\r[{name:10s}] t={t:5.1f}s {scenario.phase(t):8s} "
                f"accepted={accepted:6d} throttled={throttled:6d} "
                f"live backlog={live:6d} quiet p99 age={'-' if p99 is None else f'{p99:7.0f}ms'}"
            )
            sys.stdout.write(line)
            sys.stdout.flush()

        # The clients' process starts (and imports) before the load's clock does (local/load_client.py).
        generator = ClientProcess(runtime.api.url if runtime.api else "", keys, scenario, obs)
        by_function_before = _requests_by_function(runtime)
        requests_before = _requests(runtime, by_function_before)
        obs.started = time.time()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        generator.run(on_tick=tick)
        events_read_at = time.time() + 1.0  # the Kinesis mapping's last batches, a second after the load
        drain_until = time.time() + scenario.drain_s
        replay_follows = scenario.replay and any(  # only the Breakwater configuration sidelines
            spec.environment.get("SIDELINING_ENABLED") == "true" for spec in runtime.functions.values()
        )
        while workers_deployed and time.time() < drain_until:
            with obs.lock:
                live, sideline = (obs.depths[-1][1], obs.depths[-1][2]) if obs.depths else (1, 1)
            # With a replay to come, the sideline queues keep draining (or are parked) meanwhile.
            if live == 0 and (sideline == 0 or replay_follows):
                break
            tick(time.time() - obs.started)
            time.sleep(0.5)
        parked = None
        if scenario.replay and any(s.handler.startswith("archiver/") for s in runtime.functions.values()):
            parked = park_and_replay(runtime, scenario, obs, progress, tick)
        stop_sampling.set()
        sampler.join(5)
        time.sleep(max(0.0, events_read_at - time.time()))
        events = {**generator.events.summary(), "consumed": consumed_events(runtime)}
        if progress:
            sys.stdout.write("\n")
        # A consistent point for the accounting: no poller receives and no worker runs any more, so a
        # message is either counted by the worker that finished with it or still in a queue.
        runtime.quiesce()
        by_function_after = _requests_by_function(runtime)
        requests = _requests(runtime, by_function_after) - requests_before
        by_function = {
            name: dict(counts - by_function_before.get(name, Counter()))
            for name, counts in by_function_after.items()
        }
        final_depths = queue_depths(runtime, sampler_client)
        counters = tenant_counters(runtime, scenario.tenant_ids)
        emf_ages = [
            v
            for (_, _, v, blob) in runtime.logs.metric_values("AgeOfFirstAttempt")
            if blob.get("QueueRole") == "live"
        ]
        first_attempts = emf_first_attempts(runtime, obs.started)
        if parked is not None and parked["replay_started_t"] is not None:
            # Replayed envelopes are old by design: their first attempts are reported on their own.
            cut = parked["replay_started_t"]
            replayed_ages = [age for (t, _, age, role) in first_attempts if t >= cut and role == "live"]
            parked["replayed_first_attempts"] = len(replayed_ages)
            parked["replayed_age_p50_ms"] = percentile(replayed_ages, 50)
            first_attempts = [row for row in first_attempts if row[0] < cut]
            obs.first_attempts = [row for row in obs.first_attempts if row[0] < cut]
            parked["peak_live_depth_during_replay"] = max(
                (d[1] for d in obs.depths if d[0] >= cut), default=0
            )
            obs.depths = [row for row in obs.depths if row[0] < cut]
        report = summarize(
            name,
            scenario,
            obs,
            first_attempts,
            counters,
            requests,
            final_depths,
            emf_ages,
            runtime.summary(),
            setup_s,
            workers_deployed,
            parked,
        )
        report["events"] = events
        report["aws_requests_by_function"] = {name: counts for name, counts in by_function.items() if counts}
        return report
    finally:
        runtime.stop()


def emf_first_attempts(runtime: LocalRuntime, started: float) -> list[tuple[float, str, float, str]]:
    """(t, tenant, age ms, queue role) per first attempt, from the workers' EMF output.

    The worker puts the batch's first-attempt ages per tenant in each blob as the property
    ``AgeOfFirstAttemptByTenant`` (``breakwater.worker.FIRST_ATTEMPT_PROPERTY``), beside the
    ``AgeOfFirstAttempt`` metric values; ``t`` is the blob's timestamp (the end of the batch).
    """
    rows: list[tuple[float, str, float, str]] = []
    for _function, blob in runtime.logs.blobs():
        by_tenant = blob.get(FIRST_ATTEMPT_PROPERTY)
        if not isinstance(by_tenant, dict):
            continue
        t = int(blob["_aws"].get("Timestamp", 0)) / 1000 - started
        role = str(blob.get("QueueRole", "live"))
        for tenant, ages in by_tenant.items():
            rows.extend((t, str(tenant), float(age), role) for age in ages)
    rows.sort()
    return rows


def _requests(runtime: LocalRuntime, by_function: dict[str, Counter[str]]) -> Counter[str]:
    """The runtime's own clients' requests plus the functions' (one snapshot of the pools)."""
    total = runtime.aws.requests.snapshot()
    for counts in by_function.values():
        total.update(counts)
    return total


def _requests_by_function(runtime: LocalRuntime) -> dict[str, Counter[str]]:
    """The requests each function's containers made (the runtime's own clients are not in here)."""
    return {pool.spec.name: Counter(pool.requests) for pool in runtime.pools.values()}


def park_and_replay(
    runtime: LocalRuntime, scenario: Scenario, obs: Observations, progress: bool, tick: Any
) -> dict[str, Any]:
    """What the archiver parked during the run, then the replay job run on it (if anything was parked).

    The controller's schedule stops first, then runs once more: a sideline queue it held for the
    archiver (its drainer off) is under budget again, so the drainer takes what the archiver left (or
    that last run parks what is still past the budget). The archiver runs finish; the mappings keep
    draining, so the replayed envelopes are worked like any live message.
    """
    runtime.stop_schedules()
    runtime.run_schedules_once()
    runs = [inv.result for inv in runtime.wait_async(120.0) if inv.ok and isinstance(inv.result, dict)]
    results = [r for run in runs for r in run.get("results", [])]
    parked: dict[str, Any] = {
        "archiver_runs": len(runtime.async_invocations),
        "archived": sum(int(r.get("deleted", 0)) for r in results),  # archived and gone from the queue
        "archived_objects": sum(len(r.get("objects", [])) for r in results),
        "replay": None,
        "replay_started_t": None,
    }
    if parked["archived"] == 0:
        return parked
    if progress:
        sys.stdout.write(f"\n   parked {parked['archived']} messages in S3; replaying them on local[2] ...\n")
    parked["replay_started_t"] = time.time() - obs.started
    run = runtime.run_replay(ReplayRequest(target_rate=scenario.replay_rate, run_id="demo"))
    parked["replay"] = {**run.report, "staged_objects": run.staged_objects, "job_seconds": run.seconds}
    drain_until = time.time() + scenario.replay_drain_s
    while time.time() < drain_until:
        time.sleep(0.5)
        with obs.lock:
            live, sideline = (obs.depths[-1][1], obs.depths[-1][2]) if obs.depths else (1, 1)
        if live == 0 and sideline == 0:
            break
        tick(time.time() - obs.started)
    return parked


def summarize(
    name: str,
    scenario: Scenario,
    obs: Observations,
    first_attempts: list[tuple[float, str, float, str]],
    counters: dict[str, dict[str, int]],
    requests: Counter[str],
    final_depths: tuple[int, int, int],
    emf_ages: list[float],
    runtime_summary: dict[str, Any],
    setup_s: float,
    workers_deployed: bool,
    parked: dict[str, Any] | None = None,
) -> dict[str, Any]:
    burst_start, burst_end = scenario.baseline_s, scenario.baseline_s + scenario.burst_s
    groups = {"noisy": {scenario.noisy}, "quiet": set(scenario.tenant_ids) - {scenario.noisy}}
    live_first = [row for row in first_attempts if row[3] == "live"]
    hook_first = [row for row in obs.first_attempts if row[3] == "live"]
    result: dict[str, Any] = {"config": name, "groups": {}}
    for group, members in groups.items():
        ages = [age for (_, tenant, age, _) in live_first if tenant in members]
        before = [age for (t, tenant, age, _) in live_first if tenant in members and t < burst_start]
        during = [
            age
            for (t, tenant, age, _) in live_first
            if tenant in members and burst_start <= t < burst_end + 10
        ]
        totals = Counter[str]()
        for tenant in members:
            totals.update(counters.get(tenant, {}))
        accepted = sum(obs.accepted[t] for t in members)
        first_attempted = sum(1 for (_, tenant, _, _) in live_first if tenant in members)
        result["groups"][group] = {
            "tenants": len(members),
            "accepted": accepted,
            "throttled": sum(obs.throttled[t] for t in members),
            "rejected": sum(obs.rejected[t] for t in members),
            "first_attempts_live": first_attempted,
            "age_p50_ms": percentile(ages, 50),
            "age_p99_ms": percentile(ages, 99),
            "age_p99_before_burst_ms": percentile(before, 99),
            "age_p99_during_burst_ms": percentile(during, 99),
            # the same ages measured where the mapping hands the batch over: a cross-check of the EMF
            "delivery_hook_age_p99_ms": percentile(
                [age for (_, tenant, age, _) in hook_first if tenant in members], 99
            ),
            "peak_live_backlog": _peak_backlog(obs, members, live_first),
            **{name: totals.get(name, 0) for name in COUNTER_NAMES},
        }
    quiet = result["groups"]["quiet"]
    ratio = None
    if quiet["age_p99_before_burst_ms"] and quiet["age_p99_during_burst_ms"] is not None:
        ratio = quiet["age_p99_during_burst_ms"] / max(quiet["age_p99_before_burst_ms"], 1.0)
    baseline_depth = max((d[1] for d in obs.depths if d[0] < burst_start), default=0)
    recovery = None
    for t, live, _, _ in obs.depths:
        if t >= burst_end and live <= baseline_depth + 10:
            recovery = t - burst_end
            break
    delivered = sum(g["processed"] for g in result["groups"].values())
    accepted_total = sum(g["accepted"] for g in result["groups"].values())
    dropped_total = sum(g["dropped"] for g in result["groups"].values())
    live_left, sideline_left, dlq = final_depths
    # Left the queues for S3 (deleted once archived), and came back by the replay.
    archived = parked["archived"] if parked else 0
    replayed = parked["replay"]["replayed"] if parked and parked["replay"] else 0
    result.update(
        {
            "quiet_p99_ratio_burst_vs_baseline": ratio,
            "recovery_s_after_burst": recovery,
            "peak_live_depth": max((d[1] for d in obs.depths), default=0),
            "peak_sideline_depth": max((d[2] for d in obs.depths), default=0),
            "aws_requests": sum(requests.values()),
            "aws_requests_by_operation": dict(requests.most_common()),
            "aws_requests_per_delivered_message": (sum(requests.values()) / delivered) if delivered else None,
            "emf_age_of_first_attempt_live": {
                "count": len(emf_ages),
                "p50_ms": percentile(emf_ages, 50),
                "p99_ms": percentile(emf_ages, 99),
            },
            "accounting": {
                "accepted": accepted_total,
                "processed": delivered,
                "dropped_expired": dropped_total,
                "queued": live_left + sideline_left,
                "waiting_in_live_queues": live_left,
                "waiting_in_sideline_queues": sideline_left,
                "in_dlq": dlq,
                "archived": archived,
                "replayed": replayed,
                "parked_in_archive": archived - replayed,
                "unaccounted": accepted_total
                - delivered
                - dropped_total
                - live_left
                - sideline_left
                - dlq
                - (archived - replayed),
            },
            "archive_and_replay": parked,
            "workers_deployed": workers_deployed,
            "setup_s": setup_s,
            "scenario": asdict(scenario),
            "runtime": runtime_summary,
            "series": {
                "first_attempts": [
                    (round(t, 3), tenant, round(age, 1), role) for (t, tenant, age, role) in first_attempts
                ],
                "depths": obs.depths,
            },
        }
    )
    return result


def _peak_backlog(
    obs: Observations, members: set[str], live_first: list[tuple[float, str, float, str]]
) -> int:
    """The group's messages accepted but not yet attempted on a live queue, at its worst (per sample)."""
    accepted = sorted(t for (t, tenant) in obs.accepted_at if tenant in members)
    attempted = sorted(t for (t, tenant, _, _) in live_first if tenant in members)
    peak = a = b = 0
    for t, *_ in obs.depths:
        while a < len(accepted) and accepted[a] <= t:
            a += 1
        while b < len(attempted) and attempted[b] <= t:
            b += 1
        peak = max(peak, a - b)
    return peak


def table(results: list[dict[str, Any]]) -> str:
    """The headline figures, one row per configuration and tenant group."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    header = (
        f"{'config':10s} {'group':6s} {'accepted':>8s} {'429s':>6s} {'p50 age ms':>10s} {'p99 age ms':>10s} "
        f"{'p99 pre':>8s} {'p99 burst':>9s} {'peak backlog':>12s} {'processed':>9s} {'dropped':>7s} "
        f"{'sidelined':>9s} {'spilled':>7s} {'deferred':>8s}"
    )
    lines = [header, "-" * len(header)]
    for result in results:
        for group, g in result["groups"].items():
            lines.append(
                f"{result['config']:10s} {group:6s} {g['accepted']:8d} {g['throttled']:6d} "
                f"{ms(g['age_p50_ms']):>10s} "
                f"{ms(g['age_p99_ms']):>10s} {ms(g['age_p99_before_burst_ms']):>8s} "
                f"{ms(g['age_p99_during_burst_ms']):>9s} {g['peak_live_backlog']:12d} {g['processed']:9d} "
                f"{g['dropped']:7d} {g['sidelined']:9d} {g['spilled']:7d} {g['deferred']:8d}"
            )
    lines.append("")
    for result in results:
        ratio = result["quiet_p99_ratio_burst_vs_baseline"]
        per_message = result["aws_requests_per_delivered_message"]
        recovery = result["recovery_s_after_burst"]
        lines.append(
            f"{result['config']:10s} quiet p99 burst/baseline = {'-' if ratio is None else f'{ratio:.2f}x'}; "
            f"recovery after burst = {'not within the run' if recovery is None else f'{recovery:.0f} s'}; "
            f"AWS requests per delivered message = {'-' if per_message is None else f'{per_message:.1f}'}; "
            f"unaccounted = {result['accounting']['unaccounted']}"
        )
        parked = result.get("archive_and_replay")
        if parked and parked["archiver_runs"]:
            replay = parked["replay"] or {}
            lines.append(
                f"{result['config']:10s} archived (in S3, {parked['archiver_runs']} archiver runs) = "
                f"{parked['archived']}; replayed after the load = {replay.get('replayed', 0)} "
                f"(read {replay.get('read', 0)}, deduplicated {replay.get('deduplicated', 0)}, "
                f"expired {replay.get('expired', 0)}, failed {replay.get('failed', 0)}; "
                f"job {replay.get('job_seconds', 0):.0f} s on local[2])"
            )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Age of first attempt over time, quiet vs noisy, one panel per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), sharey=True, squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        scenario = result["scenario"]
        noisy = "tenant-01"
        rows = [r for r in result["series"]["first_attempts"] if r[3] == "live"]
        for group, colour in (("quiet", "tab:blue"), ("noisy", "tab:red")):
            points = [(t, age) for (t, tenant, age, _) in rows if (tenant == noisy) == (group == "noisy")]
            if points:
                ax.scatter(
                    [p[0] for p in points],
                    [max(p[1], 1.0) for p in points],
                    s=3,
                    alpha=0.4,
                    c=colour,
                    label=group,
                )
        ax.axvspan(
            scenario["baseline_s"],
            scenario["baseline_s"] + scenario["burst_s"],
            color="grey",
            alpha=0.15,
            label="burst",
        )
        ax.set_yscale("log")
        ax.set_title(f"{result['config']}: age of first attempt (live queues)")
        ax.set_xlabel("seconds since the load started")
        ax.legend(loc="upper left")
    axes[0][0].set_ylabel("ms")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(
    scenario: Scenario | None = None, out: Path | None = None, progress: bool = True
) -> list[dict[str, Any]]:
    scenario = scenario or Scenario()
    out = out or ROOT / "out"
    results = []
    for name, extra in (("breakwater", {}), ("naive", {"breakwater": {"mode": "naive"}})):
        print(f"== {name}: synthesizing, creating the stack in moto, starting the functions ...", flush=True)
        result = run_config(name, merge(DEMO_CONTEXT, extra), scenario, progress=progress)
        print(
            f"   ready in {result['setup_s']:.0f}s; not created by moto (emulated or reported): "
            f"{', '.join(result['runtime']['moto_skipped'])}"
        )
        if not result["workers_deployed"]:
            print("   note: the stack has no worker function yet; nothing consumes the live queues")
        results.append(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    plot(results, out / "age_by_tenant.png")
    print(table(results))
    print(f"\nwrote {out / 'report.json'} and {out / 'age_by_tenant.png'}")
    return results
