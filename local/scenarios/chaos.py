"""``python -m local chaos``: faults injected while a keyed load runs, then a check that nothing was lost.

One run: the stack on the embedded runtime (Breakwater configuration, :data:`CHAOS_CONTEXT`), an
effects table beside it, a bounded open-loop load of uniquely keyed messages from several tenants
(``chaos_client.py``), and while it runs every fault of :class:`ChaosConfig` at its rate:

- ``kill_rate``: a worker invocation's container is SIGKILLed mid-batch (``container.py``); the
  invocation fails as a crashed Lambda's does, the pool starts a new container, and the batch's
  messages come back after their visibility timeout;
- ``transient_rate`` / ``permanent_share``: the processor fails a message's first run / every run
  (``processor_hooks.py``); the permanent ones end in a dead-letter queue and stay there;
- ``aws_throttle_rate`` / ``aws_error_rate``: an AWS call of any handler is answered with a
  throttling error / a 500 before it leaves the container (botocore ``before-send``, ``container.py``);
  botocore's retries take most, the handlers must deal with the rest;
- ``long_share``: the processor's first run of a message takes longer than the queue's visibility
  timeout (the heartbeat must keep it invisible);
- ``duplicate_rate``: the SQS mappings deliver a received message twice (``mappings.py``);
- ``lost_ack_rate``: the client acts as if a 202 never came and retries with the same key;
- ``controller_crash_rate``: a scheduled controller run's container is SIGKILLed mid-run.

The stack ties its queues' visibility timeout to at least the worker's timeout, so no handler could
ever outlive it; the run sets the consumed queues' visibility below it (``visibility_s``) after the
stack is created, as an operator's ``SetQueueAttributes`` could: it is what lets a handler run past
its visibility timeout, and it brings failed messages back soon enough for a short run.

After the load the queues are drained (no redrive: what is in a dead-letter queue stays there and
is accounted for); what the archiver parked in S3 meanwhile is replayed (the replay job, as an
operator would run it after an incident) and the queues drained again, so every acknowledged
message ends processed, dropped by policy or in a dead-letter queue. Then the runtime is quiesced,
and ``chaos_check.check`` compares the request log with the effects table, the dead-letter queues
and the worker's drops. The report goes to
``out/chaos/report.json``; the table is printed.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app import merge_context
from local.aws_limits import AwsLimits
from local.emulator.container import AWS_FAULTS_ENV, KILLS_ENV
from local.emulator.functions import Invocation
from local.emulator.mappings import DeliveryFaults
from local.emulator.processor_hooks import (
    EFFECTS_TABLE_ENV,
    FAULT_LOG_ENV,
    FAULTS_ENV,
    ChaosFaults,
    effect_key_of,
)
from local.emulator.replay import ReplayRequest
from local.emulator.runtime import ROOT, LocalRuntime, RuntimeOptions
from local.scenarios.chaos_check import Accounting, Key, Run, check, passed, table
from local.scenarios.chaos_client import ChaosClient, LoadPlan
from local.scenarios.limits_report import limits_lines, limits_section
from local.scenarios.noisy_neighbour import DEMO_CONTEXT
from local.scenarios.observations import dead_letter_messages, queue_depths
from local.scenarios.tenants import create_tenants

EFFECTS_TABLE = "breakwater-local-chaos-effects"
# A kill is armed this far into an invocation at most (a moment drawn uniformly): about a worker's
# batch here, and less than a controller run; an invocation that ends first is not killed.
WORKER_KILL_WITHIN_S = 0.3
CONTROLLER_KILL_WITHIN_S = 0.05
CRASHED = frozenset({"Runtime.ExitError", "Sandbox.Timedout"})

# The demo's compressed configuration, with room for the chaos: tiers the load stays well within
# (faults, not limits, are under test), a short worker timeout with the heartbeat every second, and
# more receives before a dead-letter queue, since a killed batch's locks hold its messages until
# the invocation's deadline and every redelivery before it is refused as in progress.
CHAOS_CONTEXT: dict[str, Any] = merge_context(
    DEMO_CONTEXT,
    {
        "breakwater_local": {"work_ms": 20},
        "breakwater": {
            "tiers": {
                "standard": {
                    "rate": 50,
                    "burst": 100,
                    "consumer_rate": 50,
                    "concurrency": 4,
                    "concurrency_floor": 1,
                }
            },
            "queue_set": {"max_receive_count": 6},
            "sideline": {"archive_depth": 100_000},
            "worker": {
                "timeout_seconds": 8,
                "visibility_timeout_multiplier": 1,
                "heartbeat_seconds": 1,
            },
        },
    },
)


@dataclass(frozen=True)
class ChaosConfig:
    """One chaos run: the load, the faults' rates (each a probability per chance it has), the drain."""

    messages: int = 1000
    tenants: int = 4
    rate: float = 40.0  # messages per second, all tenants together
    seed: int = 1
    senders: int = 8
    visibility_s: int = 3  # the consumed queues' visibility timeout, below the worker's timeout
    drain_s: float = 120.0  # at most, after the load, for the queues to empty
    kill_rate: float = 0.0  # per worker invocation
    transient_rate: float = 0.0  # per message
    permanent_share: float = 0.0  # per message
    long_share: float = 0.0  # per message
    duplicate_rate: float = 0.0  # per received message
    lost_ack_rate: float = 0.0  # per 202
    aws_throttle_rate: float = 0.0  # per AWS request of a handler
    aws_error_rate: float = 0.0  # per AWS request of a handler
    controller_crash_rate: float = 0.0  # per scheduled controller run
    replay_rate: float = 100.0  # messages/s the replay of the parked messages sends, after the load
    limits: AwsLimits | None = None  # AWS's limits in the embedded AWS (None: moto's own answers)

    def __post_init__(self) -> None:
        for name in (
            "kill_rate",
            "transient_rate",
            "permanent_share",
            "long_share",
            "duplicate_rate",
            "lost_ack_rate",
            "aws_throttle_rate",
            "aws_error_rate",
            "controller_crash_rate",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {value!r}")
        if self.aws_throttle_rate + self.aws_error_rate > 1.0:
            raise ValueError("aws_throttle_rate + aws_error_rate must not exceed 1")
        if self.messages < 1 or self.tenants < 1 or self.rate <= 0:
            raise ValueError("messages, tenants and rate must be positive")

    @property
    def tenant_ids(self) -> list[str]:
        return [f"tenant-{i:02d}" for i in range(1, self.tenants + 1)]

    @property
    def long_s(self) -> float:
        """How long a long first run takes: past the visibility timeout, within the worker's time."""
        return self.visibility_s + 1.5

    @property
    def processor_faults(self) -> ChaosFaults:
        return ChaosFaults(
            seed=self.seed,
            transient_rate=self.transient_rate,
            permanent_share=self.permanent_share,
            long_share=self.long_share,
            long_s=self.long_s,
        )

    def injected(self) -> list[str]:
        """The fault kinds this configuration turns on (the report's ``faults_injected`` keys)."""
        kinds = {
            "worker_killed": self.kill_rate,
            "processor_transient": self.transient_rate,
            "processor_permanent": self.permanent_share,
            "long_handler": self.long_share,
            "duplicate_delivery": self.duplicate_rate,
            "lost_ack": self.lost_ack_rate,
            "aws_throttle": self.aws_throttle_rate,
            "aws_server_error": self.aws_error_rate,
            "controller_crash": self.controller_crash_rate,
        }
        return [kind for kind, rate in kinds.items() if rate > 0]


def _last_own_frame(trace: list[str], code_dir: str) -> str:
    """The innermost frame of a stack trace in the function's own code: where its error got away."""
    frames = [line.strip() for line in trace if line.strip().startswith(f'File "{code_dir}')]
    return frames[-1].replace(code_dir + "/", "") if frames else ""


class _FunctionErrors:
    """Every invocation that ended in a function error, per function and error (its last frame kept)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def watch(self, pool: Any) -> None:
        invoke = pool.invoke

        def invoke_and_note(event: Any, **kwargs: Any) -> Invocation:
            invocation: Invocation = invoke(event, **kwargs)
            error = invocation.error
            if error is not None and error.get("errorType") not in CRASHED:
                where = _last_own_frame(error.get("stackTrace") or [], str(pool.spec.code_dir))
                message = str(error.get("errorMessage"))[:160]
                note = f"{pool.spec.handler}: {error.get('errorType')}: {message}"
                with self._lock:
                    self.counts[f"{note} ({where})" if where else note] += 1
            return invocation

        pool.invoke = invoke_and_note


@dataclass
class _Invocations:
    """The mappings' invocations as they end: which died (their runs were never acknowledged)."""

    crashed: set[str]
    lock: threading.Lock

    def __call__(self, _spec: Any, _batch: Any, invocation: Invocation, _at: float) -> None:
        if invocation.error and invocation.error.get("errorType") in CRASHED:
            with self.lock:
                self.crashed.add(invocation.request_id)


def create_effects_table(runtime: LocalRuntime) -> None:
    client = runtime.aws.client("dynamodb", counted=False)
    client.create_table(
        TableName=EFFECTS_TABLE,
        AttributeDefinitions=[
            {"AttributeName": "tenant", "AttributeType": "S"},
            {"AttributeName": "key", "AttributeType": "S"},
        ],
        KeySchema=[
            {"AttributeName": "tenant", "KeyType": "HASH"},
            {"AttributeName": "key", "KeyType": "RANGE"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def read_effects_table(runtime: LocalRuntime) -> tuple[dict[Key, list[Run]], dict[Key, list[Run]]]:
    """(committed effects, processor runs) per ``(tenant, key)``: ``effect_log`` and ``run_log``."""
    client = runtime.aws.client("dynamodb", counted=False)
    effects: dict[Key, list[Run]] = {}
    runs: dict[Key, list[Run]] = {}
    kwargs: dict[str, Any] = {"TableName": EFFECTS_TABLE, "ConsistentRead": True}
    while True:
        page = client.scan(**kwargs)
        for item in page.get("Items", []):
            key = (item["tenant"]["S"], item["key"]["S"])
            for attribute, found in (("effect_log", effects), ("run_log", runs)):
                logged = item.get(attribute, {}).get("SS", [])
                if logged:
                    found[key] = [Run.parse(text) for text in logged]
        if not page.get("LastEvaluatedKey"):
            return effects, runs
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def shorten_visibility(runtime: LocalRuntime, seconds: int) -> None:
    """Every queue an SQS mapping consumes gets ``seconds`` of visibility (see the module's docstring)."""
    client = runtime.aws.client("sqs", counted=False)
    for spec in runtime.mapping_specs:
        if spec.queue_url is not None:
            client.set_queue_attributes(
                QueueUrl=spec.queue_url, Attributes={"VisibilityTimeout": str(seconds)}
            )


def dead_letters(runtime: LocalRuntime) -> Counter[Key]:
    """Every message in the dead-letter queues, per ``(tenant, key)`` of its envelope (read, not removed)."""
    found: Counter[Key] = Counter()
    for message in dead_letter_messages(runtime, hide_seconds=300):
        try:
            body = json.loads(message["Body"])
            found[(str(body["tenant"]), _key_of(body))] += 1
        except (ValueError, KeyError, TypeError):
            found[("?", message["MessageId"])] += 1
    return found


def _key_of(envelope: dict[str, Any]) -> str:
    """An envelope's (as JSON) key beside its tenant, as the processor hooks record it."""
    return effect_key_of(envelope.get("dedup_key"), envelope["id"])


def archived(runtime: LocalRuntime) -> set[Key]:
    """Every envelope parked in the archive bucket (gzipped NDJSON objects), per ``(tenant, key)``."""
    bucket = (runtime.deployment.outputs if runtime.deployment else {}).get("ArchiveBucketName")
    found: set[Key] = set()
    if not bucket:
        return found
    s3 = runtime.aws.client("s3", counted=False)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for listed in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=listed["Key"])["Body"].read()
            with contextlib.suppress(OSError):
                body = gzip.decompress(body)  # unless the client already undid the Content-Encoding
            for line in body.decode("utf-8").splitlines():
                try:
                    envelope = json.loads(line)
                    found.add((str(envelope["tenant"]), _key_of(envelope)))
                except (ValueError, KeyError, TypeError):
                    continue
    return found


def policy_drops(log_path: Path, ids: dict[str, Key]) -> set[Key]:
    """Messages the workers dropped by policy (their ``dropped`` log lines), by the ids the API gave."""
    dropped: set[Key] = set()
    if not log_path.exists():
        return dropped
    with log_path.open(encoding="utf-8") as lines:
        for line in lines:
            if '"dropped"' not in line:
                continue
            _, _, text = line.partition("\t")
            try:
                entry = json.loads(text)
            except ValueError:
                continue
            if entry.get("message") == "dropped" and entry.get("envelope_id") in ids:
                dropped.add(ids[entry["envelope_id"]])
    return dropped


def injected_faults(path: Path) -> Counter[str]:
    """The faults the containers wrote down (``container.py``, ``processor_hooks.py``), by kind."""
    kinds: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                kinds[str(json.loads(line)["kind"])] += 1
            except (ValueError, KeyError):
                continue
    return kinds


def run_chaos(config: ChaosConfig, *, name: str = "chaos", progress: bool = True) -> dict[str, Any]:
    """One chaos run from synthesis to its report (:func:`chaos_check.check` and the run's figures)."""
    workdir = ROOT / "out" / "local" / name
    workdir.mkdir(parents=True, exist_ok=True)
    faults_path, fault_log = workdir / "faults.json", workdir / "faults-injected.jsonl"
    fault_log.unlink(missing_ok=True)
    switches = {"chaos": asdict(config.processor_faults)}
    faults_path.write_text(json.dumps(switches), encoding="utf-8")
    chaos_env = {FAULT_LOG_ENV: str(fault_log)}
    if config.aws_throttle_rate or config.aws_error_rate:
        chaos_env[AWS_FAULTS_ENV] = json.dumps(
            {"throttle": config.aws_throttle_rate, "server_error": config.aws_error_rate, "seed": config.seed}
        )
    kills = {
        "worker/": {"rate": config.kill_rate, "within_s": WORKER_KILL_WITHIN_S, "kind": "worker_killed"},
        "controller/": {
            "rate": config.controller_crash_rate,
            "within_s": CONTROLLER_KILL_WITHIN_S,
            "kind": "controller_crash",
        },
    }
    chaos_env[KILLS_ENV] = json.dumps(
        {prefix: {**kill, "seed": config.seed} for prefix, kill in kills.items()}
    )
    options = RuntimeOptions(
        workdir=workdir,
        max_containers=4,
        mapping_containers=8,
        warm_containers=2,
        schedule_speedup=12.0,
        extra_function_env={FAULTS_ENV: str(faults_path), EFFECTS_TABLE_ENV: EFFECTS_TABLE, **chaos_env},
        limits=config.limits,
    )
    runtime = LocalRuntime(context=CHAOS_CONTEXT, options=options)
    began = time.time()
    runtime.start()
    try:
        create_effects_table(runtime)
        shorten_visibility(runtime, config.visibility_s)
        keys = create_tenants(runtime, config.tenant_ids)
        deliveries = DeliveryFaults(config.duplicate_rate, config.seed)
        if config.duplicate_rate:
            for mapping in runtime.mappings:
                mapping.faults = deliveries
        errors = _FunctionErrors()
        for pool in runtime.pools.values():
            errors.watch(pool)
        invocations = _Invocations(set(), threading.Lock())
        runtime.on_invocation = invocations
        setup_s = time.time() - began
        plan = LoadPlan(
            api_url=runtime.api.url if runtime.api else "",
            keys=keys,
            messages=config.messages,
            rate=config.rate,
            seed=config.seed,
            drop_rate=config.lost_ack_rate,
            senders=config.senders,
        )
        client = ChaosClient(plan, workdir / "requests.jsonl")
        sqs = runtime.aws.client("sqs", counted=False)

        def tick(t: float) -> None:
            if progress:
                answered, acked = client.progress["answered"], client.progress["acknowledged"]
                sys.stdout.write(f"\r[{name}] t={t:5.1f}s answered={answered:6.0f} acknowledged={acked:6.0f}")
                sys.stdout.flush()

        started = time.time()
        attempts = client.run(started, on_tick=tick)
        load_s = time.time() - started
        drain_s = drain(runtime, sqs, config.drain_s, progress)
        runtime.last_schedule_run()
        parked = archived(runtime)  # the archiver runs only on the schedules: nothing is parked after this
        replayed = replay_parked(runtime, sqs, config, len(parked), progress)
        runtime.quiesce()
        live, sideline, _ = queue_depths(runtime, sqs)
        ids = {a.message_id: (a.tenant, a.key) for a in attempts if a.message_id}
        effects, runs = read_effects_table(runtime)
        accounting = Accounting(
            effects=effects,
            runs=runs,
            dead_letters=dead_letters(runtime),
            dropped=policy_drops(workdir / "functions.log", ids),
            archived=parked,
            still_queued=live + sideline,
        )
        faults = Counter(dict.fromkeys(config.injected(), 0))  # a kind that is on shows, even at 0
        faults.update(injected_faults(fault_log))
        if config.duplicate_rate:
            faults["duplicate_delivery"] = sum(deliveries.counts.values())
        if config.lost_ack_rate:
            faults["lost_ack"] = sum(1 for a in attempts if a.dropped)
        report = check(attempts, accounting, permanent=config.processor_faults.permanent, faults=faults)
        report.update(
            {
                "config": asdict(config),
                "setup_s": round(setup_s, 1),
                "load_s": round(load_s, 1),
                "drain_s": round(drain_s, 1),
                "replay": replayed,
                "crashed_invocations": len(invocations.crashed),
                "duplicate_deliveries_by_kind": dict(deliveries.counts),
                "function_errors": dict(errors.counts.most_common()),
                "fault_kinds_missing": [k for k in config.injected() if not report["faults_injected"].get(k)],
                "aws_limits": limits_section(runtime),
            }
        )
        return report
    finally:
        runtime.stop()


def replay_parked(
    runtime: LocalRuntime, sqs: Any, config: ChaosConfig, parked: int, progress: bool
) -> dict[str, Any]:
    """Replay the ``parked`` messages in the archive (the replay job on local[2]), then drain again;
    what it did. The schedules have had their last run (``LocalRuntime.last_schedule_run``)."""
    if parked == 0:
        return {"parked": 0}
    if progress:
        sys.stdout.write(f"\n   replaying the {parked} messages parked in S3 on local[2] ...\n")
    began = time.time()
    run = runtime.run_replay(ReplayRequest(target_rate=config.replay_rate, run_id="chaos"))
    drained_s = drain(runtime, sqs, config.drain_s, progress)
    return {
        "parked": parked,
        "replayed": run.report.get("replayed"),
        "job_report": run.report,
        "seconds": round(time.time() - began, 1),
        "drain_s": round(drained_s, 1),
    }


def drain(runtime: LocalRuntime, sqs: Any, limit_s: float, progress: bool) -> float:
    """Wait until the live and sideline queues are empty twice in a row (or ``limit_s``); seconds waited."""
    began = time.time()
    empty = 0
    while time.time() - began < limit_s:
        live, sideline, dlq = queue_depths(runtime, sqs)
        if progress:
            sys.stdout.write(
                f"\r   draining: {time.time() - began:5.1f}s "
                f"live={live:5d} sideline={sideline:5d} dlq={dlq:5d}   "
            )
            sys.stdout.flush()
        empty = empty + 1 if live + sideline == 0 else 0
        if empty >= 2:
            break
        time.sleep(1.0)
    if progress:
        sys.stdout.write("\n")
    return time.time() - began


def main(config: ChaosConfig, out: Path | None = None, progress: bool = True) -> dict[str, Any]:
    out = out or ROOT / "out" / "chaos"
    # Every injected crash is also a warning of the emulator's (a function error, a failed schedule):
    # expected here, and counted in the report instead.
    logging.getLogger("breakwater.local").setLevel(logging.ERROR)
    faults = ", ".join(config.injected()) or "none"
    print(f"== chaos: {config.messages} messages, seed {config.seed}; faults: {faults}")
    report = run_chaos(config, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    print(table(report))
    print("\n".join(limits_lines("chaos", report.get("aws_limits"))))
    print(f"\nwrote {out / 'report.json'}")
    return report


def exit_status(report: dict[str, Any]) -> int:
    return 0 if passed(report) and not report["fault_kinds_missing"] else 1
