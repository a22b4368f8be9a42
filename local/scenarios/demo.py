"""``python -m local demo``: a scenario (noisy neighbour by default) on Breakwater, naive and fair, reported.

The configurations (:data:`CONFIGURATIONS`): ``breakwater``, the blueprint; ``naive``, one standard
queue, nobody throttled or set aside; ``fair``, the same stack with ``MessageGroupId`` = tenant, so the
embedded SQS orders its receives as fair queues do (SQS fair queues alone). A single scenario runs the
first two unless told otherwise (:data:`DEFAULT_CONFIGURATIONS`).

Each configuration gets a runtime of its own: the stack synthesized and created in the embedded AWS,
the scenario's tenants added, the load sent through the emulated API from a client process, the
queues sampled while it runs and drained after it. In the Breakwater run, what the archiver parked
in S3 during the burst is replayed after the load (``LocalRuntime.run_replay``: the Glue job's entry
point on local[2]); its first attempts are reported apart from the scenario's ages. The report
(``local.scenarios.report``) is written to ``out/report.json``, plotted to ``out/age_by_tenant.png``
and printed as a table.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from app import merge_context
from local.aws_limits import AwsLimits
from local.emulator.alarms import AlarmWatch
from local.emulator.processor_hooks import EFFECTS_ENV, FAULTS_ENV
from local.emulator.replay import ReplayRequest
from local.emulator.runtime import ROOT, LocalRuntime
from local.scenarios.limits_report import limits_section
from local.scenarios.load_client import ClientProcess
from local.scenarios.measures import comparison
from local.scenarios.noisy_neighbour import (
    DEMO_CONTEXT,
    FAIR_CONTEXT,
    NAIVE_CONTEXT,
    Scenario,
    runtime_options,
    scenario_context,
)
from local.scenarios.observations import (
    Observations,
    aws_requests,
    aws_requests_by_function,
    cost_section,
    dead_letter_messages,
    emf_first_attempts,
    observe_deliveries,
    queue_depths,
    tenant_counters,
    usage_between,
    usage_snapshot,
)
from local.scenarios.outcomes import FaultSwitches, duplicated, outage_figures, read_effects
from local.scenarios.plots import plot_scenario
from local.scenarios.report import percentile, plot, summarize, table
from local.scenarios.stream_load import consumed_events
from local.scenarios.tenants import create_tenants


def run_config(
    name: str,
    context: dict[str, Any],
    scenario: Scenario,
    progress: bool = True,
    limits: AwsLimits | None = None,
) -> dict[str, Any]:
    """One configuration (``context``) of the scenario, from synthesis to its report (:func:`summarize`);
    ``limits``: AWS's limits in the embedded AWS (None: moto's own answers)."""
    workdir = ROOT / "out" / "local" / name
    workdir.mkdir(parents=True, exist_ok=True)
    # The processor hooks: the scenario's faults, and a line per message the processor ran.
    faults_path, effects_path = workdir / "faults.json", workdir / "effects.jsonl"
    effects_path.unlink(missing_ok=True)
    switches = FaultSwitches(faults_path)
    options = replace(
        runtime_options(workdir),
        extra_function_env={FAULTS_ENV: str(faults_path), EFFECTS_ENV: str(effects_path)},
        limits=limits,
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
                if samples % 5 == 1:  # the alarms' metrics: one GetMetricData for every alarmed queue
                    alarms.sample()

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

        # The clients' process starts (and imports) before the load's clock does (load_client.py).
        generator = ClientProcess(runtime.api.url if runtime.api else "", keys, scenario, obs)
        by_function_before = aws_requests_by_function(runtime)
        requests_before = aws_requests(runtime, by_function_before)
        usage_before = usage_snapshot(runtime)
        obs.started = time.time()
        alarms = AlarmWatch(runtime, obs.started)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        outage = threading.Thread(
            target=run_outage, args=(scenario, switches, obs.started, stop_sampling), daemon=True
        )
        if scenario.kind == "outage":
            outage.start()
        generator.run(on_tick=tick)
        events_read_at = time.time() + 1.0  # the Kinesis mapping's last batches, a second after the load
        drain_until = time.time() + scenario.drain_s
        replay_follows = scenario.replay and any(  # only the Breakwater configuration sidelines
            spec.environment.get("SIDELINING_ENABLED") == "true" for spec in runtime.functions.values()
        )
        while workers_deployed and time.time() < drain_until:
            with obs.lock:
                live, sideline = (obs.depths[-1][1], obs.depths[-1][2]) if obs.depths else (1, 1)
            # With a replay to come, the sideline queues keep draining (or are parked) meanwhile. Before
            # the poison scenario's operator inspects the dead-letter queues, they drain too: poison
            # deferred there has yet to fail its last receive.
            if live == 0 and (sideline == 0 or (replay_follows and scenario.kind != "poison")):
                break
            tick(time.time() - obs.started)
            time.sleep(0.5)
        parked = None
        if scenario.replay and any(s.handler.startswith("archiver/") for s in runtime.functions.values()):
            parked = park_and_replay(runtime, scenario, obs, progress, tick)
        live_effects = read_effects(effects_path)  # before the fix and the redrive
        poison = None
        if scenario.kind == "poison":
            poison = fix_and_redrive(runtime, switches, obs, effects_path, progress, tick)
        stop_sampling.set()
        sampler.join(5)
        # The alarms' last reading: a gauge holds its last sample, so without one taken after the
        # redrive emptied the DLQs, their alarms would end the run in ALARM on a stale reading.
        alarms.sample()
        last_alarm_sample = time.time()
        time.sleep(max(0.0, events_read_at - time.time()))
        events = {**generator.events.summary(), "consumed": consumed_events(runtime)}
        if progress:
            sys.stdout.write("\n")
        # A consistent point for the accounting: no poller receives and no worker runs any more, so a
        # message is either counted by the worker that finished with it or still in a queue.
        runtime.quiesce()
        by_function_after = aws_requests_by_function(runtime)
        requests = aws_requests(runtime, by_function_after) - requests_before
        usage = usage_between(usage_snapshot(runtime), usage_before)
        ended = time.time()
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
            # Replayed envelopes are old by design: the workers measure them under their own role, and
            # the report gives them on their own; the live figures end where the replay starts.
            cut = parked["replay_started_t"]
            replayed_ages = [age for (_, _, age, role) in first_attempts if role == "replay"]
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
        report["cost"] = cost_section(
            runtime,
            usage,
            delivered=report["accounting"]["processed"],
            started=obs.started,
            ended=ended,
            requests=sum(requests.values()),
        )
        report["aws_requests_by_function"] = {name: counts for name, counts in by_function.items() if counts}
        # One more reading a whole (compressed) period after that one, so the last period holds only
        # readings of the queues as they are at the end, not a sample taken before it mixed in.
        alarm_period_s = 60.0 / runtime.options.schedule_speedup
        time.sleep(max(0.0, last_alarm_sample + alarm_period_s - time.time()))
        alarms.sample()
        # The template's alarms on what the run observed; their periods compressed like the schedules.
        alarm_report = alarms.evaluate(time.time() - obs.started, time_scale=runtime.options.schedule_speedup)
        report["alarms_fired"] = alarm_report.transitions
        report["alarms"] = alarm_report.as_dict()
        effects = read_effects(effects_path)
        report["processed_twice"] = duplicated(effects)
        report["aws_limits"] = limits_section(runtime)
        if scenario.kind == "outage":
            cut = parked["replay_started_t"] if parked and parked["replay_started_t"] is not None else None
            served = [e for e in live_effects if cut is None or e["at"] / 1000 - obs.started < cut]
            report.update(
                outage_figures(scenario, obs.started, served, obs.accepted_at, obs.depths, first_attempts)
            )
        report.update(
            comparison(
                scenario,
                obs,
                first_attempts,
                effects,
                in_dlq=report["accounting"]["in_dlq"],
                cost=report["cost"],
                ended_t=ended - obs.started,
            )
        )
        if poison is not None:
            poison_runs = {e["id"] for e in effects if e["poison"]}
            report.update(
                {
                    **poison,
                    "poison_sent": obs.accepted_tagged["poison"],
                    "redriven_processed": len(poison_runs),
                }
            )
        return report
    finally:
        runtime.stop()


def run_outage(scenario: Scenario, switches: FaultSwitches, started: float, stop: threading.Event) -> None:
    """The processor's dependency goes down for the burst phase, then comes back (whatever happens)."""
    if stop.wait(max(0.0, started + scenario.baseline_s - time.time())):
        return
    switches.set(dependency_down=True)
    try:
        stop.wait(max(0.0, started + scenario.baseline_s + scenario.burst_s - time.time()))
    finally:
        switches.set(dependency_down=False)


def fix_and_redrive(
    runtime: LocalRuntime,
    switches: FaultSwitches,
    obs: Observations,
    effects_path: Path,
    progress: bool,
    tick: Any,
) -> dict[str, Any]:
    """The operator's part of the poison scenario: inspect the dead-letter queues, deploy the fix, redrive.

    The inspection reads each DLQ's messages (hiding them for a few seconds, long enough to count them
    once) and sorts them into poison and other; the redrive function then moves every one back to its
    source queue, where the workers process it like any other message.
    """
    inspected: Counter[str] = Counter()
    for message in dead_letter_messages(runtime, hide_seconds=5):
        payload = json.loads(message["Body"]).get("payload")
        inspected["poison" if isinstance(payload, dict) and payload.get("poison") else "other"] += 1
    in_dlq = sum(inspected.values())
    if progress:
        sys.stdout.write(
            f"\n   {in_dlq} messages in the dead-letter queues ({inspected['poison']} poison); "
            "fix deployed, redriving ...\n"
        )
    switches.set(poison_fixed=True)
    fixed_at = time.time() - obs.started
    time.sleep(5.5)  # the inspection's receives have timed out: the redrive sees every message
    moved = failed = 0
    try:
        function = runtime.function_id("redrive/")
    except KeyError:
        function = None
    if function is not None:
        invocation = runtime.invoke(function, {"use_move_task": False})
        for result in (invocation.result or {}).get("results", []) if invocation.ok else []:
            moved += int(result.get("moved", 0))
            failed += int(result.get("failed", 0))
    deadline = time.time() + 30.0
    while time.time() < deadline:
        runs = {e["id"] for e in read_effects(effects_path) if e["poison"]}
        if len(runs) >= inspected["poison"]:
            break
        tick(time.time() - obs.started)
        time.sleep(0.5)
    return {
        "in_dlq": in_dlq,
        "in_dlq_poison": inspected["poison"],
        "in_dlq_other": inspected["other"],
        "fix_deployed_at_s": fixed_at,
        "redrive_moved": moved,
        "redrive_failed": failed,
        "redrive_function": function,
    }


def park_and_replay(
    runtime: LocalRuntime, scenario: Scenario, obs: Observations, progress: bool, tick: Any
) -> dict[str, Any]:
    """What the archiver parked during the run, then the replay job run on it (if anything was parked).

    The controller's schedule stops first, then runs once more: a sideline queue it held for the
    archiver (its drainer off) is under budget again, so the drainer takes what the archiver left (or
    that last run parks what is still past the budget). The archiver runs finish; the mappings keep
    draining, so the replayed envelopes are worked like any live message.
    """
    runs = [inv.result for inv in runtime.last_schedule_run() if inv.ok and isinstance(inv.result, dict)]
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


# The run order, whatever order a flag names them in: Breakwater first (its half is what `make demo`'s
# goal reads), then the naive single queue, then SQS fair queues alone (the naive stack with
# MessageGroupId = tenant on its one standard queue).
CONFIGURATIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("breakwater", {}),
    ("naive", NAIVE_CONTEXT),
    ("fair", FAIR_CONTEXT),
)
CONFIGURATION_NAMES = tuple(name for name, _ in CONFIGURATIONS)
# What a single scenario runs unless told otherwise (`make demo`'s time budget); `--scenario all` runs all.
DEFAULT_CONFIGURATIONS = ("breakwater", "naive")


def configuration_context(
    scenario: Scenario, extra: dict[str, Any], base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The context of one configuration: ``base`` (the demo's), the scenario's keys, then ``extra``."""
    return merge_context(merge_context(base or DEMO_CONTEXT, scenario_context(scenario.kind)), extra)


def main(
    scenario: Scenario | None = None,
    out: Path | None = None,
    progress: bool = True,
    limits: AwsLimits | None = None,
    configurations: tuple[str, ...] = DEFAULT_CONFIGURATIONS,
) -> list[dict[str, Any]]:
    """Run ``configurations`` (names in :data:`CONFIGURATIONS`, run in its order) of ``scenario``; write
    the report under ``out``, print its tables; return the configurations' reports."""
    scenario = scenario or Scenario()
    out = out or ROOT / "out"
    unknown = set(configurations) - set(CONFIGURATION_NAMES)
    if unknown or not configurations:
        raise ValueError(
            f"configurations must be some of {', '.join(CONFIGURATION_NAMES)}, "
            f"not {', '.join(configurations) or 'none'}"
        )
    results = []
    for name, extra in CONFIGURATIONS:
        if name not in configurations:
            continue
        print(f"== {name}: synthesizing, creating the stack in moto, starting the functions ...", flush=True)
        context = configuration_context(scenario, extra)
        result = run_config(name, context, scenario, progress=progress, limits=limits)
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
    plot_scenario(results, out / "timeline.png")
    print(table(results))
    print(f"\nwrote {out / 'report.json'}, {out / 'age_by_tenant.png'} and {out / 'timeline.png'}")
    if "fair" not in configurations:
        print(
            "SQS fair queues alone (MessageGroupId = tenant on the naive stack's one queue) were not run: "
            "add them with --configurations naive,fair,breakwater"
        )
    return results
