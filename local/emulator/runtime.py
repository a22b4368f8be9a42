"""The embedded default: the synthesized stack created in moto, with its functions, mappings, API, schedules.

    with LocalRuntime(context={"breakwater": {"mode": "naive"}}) as runtime:
        runtime.api.url, runtime.invoke("IngestFunction...", event), runtime.logs

Order: synthesize -> start moto -> upload assets and CreateStack -> discover ->
start the functions' containers, the SQS mappings, the API and the schedules.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from local.aws_limits import AwsLimits
from local.emulator import discovery
from local.emulator.api import LocalApi
from local.emulator.assembly import CloudAssembly, synthesize
from local.emulator.deploy import Deployment, create_stack
from local.emulator.discovery import MappingSpec, ScheduleSpec
from local.emulator.embedded_aws import EmbeddedAws
from local.emulator.functions import FunctionPool, FunctionSpec, Invocation
from local.emulator.kinesis_mapping import KinesisMapping
from local.emulator.mappings import MappingConfigs, SqsMapping
from local.emulator.moto_process import freeze_heap
from local.emulator.processor_hooks import DEFAULT_WORK_MS, WORK_MS_ENV
from local.emulator.replay import LocalRun, ReplayRequest, discover_target, run_local

log = logging.getLogger("breakwater.local")

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FunctionLogs:
    """Every line the functions printed; EMF blobs (``_aws`` key) parsed, in arrival order."""

    path: Path | None = None
    emf: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lines: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _file: Any = None

    def __call__(self, function: str, line: str) -> None:
        blob = None
        if line.startswith("{") and '"_aws"' in line:
            try:
                blob = json.loads(line)
            except ValueError:
                blob = None
        with self._lock:
            self.lines += 1
            if blob is not None and isinstance(blob.get("_aws"), dict):
                self.emf.append((function, blob))
            if self._file is not None:
                self._file.write(f"{function}\t{line}\n")

    def open(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("w", encoding="utf-8", buffering=1 << 16)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def blobs(self) -> list[tuple[str, dict[str, Any]]]:
        """(function, EMF blob) for every blob so far, in arrival order."""
        with self._lock:
            return list(self.emf)

    def metric_values(self, name: str) -> list[tuple[int, str, float, dict[str, Any]]]:
        """(timestamp ms, function, value, blob) for every value of metric ``name``."""
        out: list[tuple[int, str, float, dict[str, Any]]] = []
        with self._lock:
            blobs = list(self.emf)
        for function, blob in blobs:
            if name not in blob:
                continue
            stamp = int(blob["_aws"].get("Timestamp", 0))
            values = blob[name] if isinstance(blob[name], list) else [blob[name]]
            out.extend((stamp, function, float(v), blob) for v in values)
        return out


@dataclass
class RuntimeOptions:
    """How the emulator runs the stack. The defaults behave as Lambda and EventBridge do, as far as one
    machine allows: schedules at their rate, no execution environment started before an invocation
    needs it, and a function with SQS mappings run in as many environments as they allow at once."""

    workdir: Path = ROOT / "out" / "local"
    # Execution environments per function whose concurrency nothing in the template bounds (the API's
    # functions, the scheduled ones): one machine cannot run what Lambda would start for them.
    max_containers: int = 4
    # A function whose SQS mappings allow more invocations at once (the sum of their MaximumConcurrency)
    # gets that many, up to this cap; None: no cap, as in Lambda. 0: never more than max_containers.
    mapping_containers: int | None = None
    warm_containers: int = 0  # per function, started before the first invocation (Lambda starts none)
    # Started instead for a function that serves no SQS mapping and no API route (a scheduled or
    # invoked one: the controller, the archiver, the redrive; a stream's consumer, one invocation per
    # shard), which runs one invocation at a time or seldom; None: ``warm_containers`` as for the
    # others. Each start costs about a second of a core.
    warm_others: int | None = None
    schedule_speedup: float = 1.0  # rate(1 minute) runs every 60 / speedup seconds
    extra_function_env: dict[str, str] = field(default_factory=dict)
    start_api: bool = True
    start_mappings: bool = True
    start_schedules: bool = True
    # moto's server in this process (tests and benches that reach into its backends) instead of its own.
    moto_in_process: bool = False
    # AWS's limits in the embedded AWS (None: moto's own answers); the scenarios' commands turn them on
    limits: AwsLimits | None = None


PROCESSOR_HANDLER = "PROCESSOR_HANDLER"  # set on the functions that run the user's processor
LOCAL_KEY = "breakwater_local"  # the context's settings for the emulator alone: never synthesized


def local_settings(context: dict[str, Any]) -> dict[str, Any]:
    """The context's ``breakwater_local`` object: ``work_ms`` (the demo's simulated work per message,
    ``processor_hooks``) and ``processor_environment`` (see :func:`with_local_processor_environment`)."""
    settings = context.get(LOCAL_KEY) or {}
    if not isinstance(settings, dict):
        raise ValueError(f"context {LOCAL_KEY} must be an object, not {settings!r}")
    return settings


def with_local_processor_environment(
    functions: dict[str, FunctionSpec], context: dict[str, Any]
) -> dict[str, FunctionSpec]:
    """The functions that run the processor, with ``breakwater_local.processor_environment`` over their
    variables: the hook that points a user's processor at a local stub of its downstream (its URL on
    127.0.0.1) instead of the real one the stack was synthesized with."""
    overrides = {
        str(k): str(v) for k, v in (local_settings(context).get("processor_environment") or {}).items()
    }
    if not overrides:
        return functions
    return {
        logical_id: replace(spec, environment={**spec.environment, **overrides})
        if PROCESSOR_HANDLER in spec.environment
        else spec
        for logical_id, spec in functions.items()
    }


def container_cap(options: RuntimeOptions, mapping_concurrency: int) -> int:
    """A function's execution environments: ``max_containers``, or more for its mappings' concurrency.

    Lambda runs as many invocations as a function's mappings allow (``mapping_concurrency``); the
    emulator runs that many, up to ``mapping_containers``, and never fewer than ``max_containers``.
    """
    allowed = mapping_concurrency
    if options.mapping_containers is not None:
        allowed = min(allowed, options.mapping_containers)
    return max(options.max_containers, allowed)


def serving_functions(mapping_concurrency: dict[str, int], api: discovery.ApiSpec | None) -> set[str]:
    """The functions (logical ids) that SQS mappings or the API's routes and authorizers invoke."""
    busy = set(mapping_concurrency)
    for route in api.routes if api is not None else []:
        busy.add(route.function_logical_id)
        if route.authorizer is not None:
            busy.add(route.authorizer.function_logical_id)
    return busy


def warm_count(options: RuntimeOptions, logical_id: str, busy: set[str]) -> int:
    """Environments to start for a function before the first invocation (``busy``: what
    :func:`serving_functions` returned)."""
    others = options.warm_others
    return options.warm_containers if logical_id in busy or others is None else others


class LocalRuntime:
    def __init__(
        self,
        context: dict[str, Any] | None = None,
        options: RuntimeOptions | None = None,
        *,
        assembly: CloudAssembly | None = None,
    ) -> None:
        self.context = context or {}
        self.options = options or RuntimeOptions()
        self.assembly = assembly
        self.aws = EmbeddedAws(in_process=self.options.moto_in_process, limits=self.options.limits)
        self.logs = FunctionLogs()
        self.deployment: Deployment | None = None
        self.functions: dict[str, FunctionSpec] = {}
        self.pools: dict[str, FunctionPool] = {}
        self.mapping_specs: list[MappingSpec] = []
        self.mappings: list[SqsMapping] = []
        self._mapping_configs: MappingConfigs | None = None
        self.kinesis_mappings: list[KinesisMapping] = []
        self.schedule_specs: list[ScheduleSpec] = []
        self.api: LocalApi | None = None
        self.api_spec: discovery.ApiSpec | None = None
        self.not_emulated: list[str] = []
        # Called after each mapping invocation with the batch and when it was handed to the function.
        self.on_invocation: Callable[[MappingSpec, list[dict[str, Any]], Invocation, float], None] | None = (
            None
        )
        self._executor = ThreadPoolExecutor(max_workers=64, thread_name_prefix="invoke")
        self._stop = threading.Event()
        self._schedules_stop = threading.Event()  # set alone by stop_schedules, with _stop by quiesce/stop
        self._threads: list[threading.Thread] = []
        self.async_invocations: list[Future[Invocation]] = []

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> LocalRuntime:
        workdir = self.options.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        if self.assembly is None:
            self.assembly = synthesize(workdir / "cdk.out", self.context)
        self.aws.start()
        self.deployment = create_stack(self.aws, self.assembly)
        code_root = workdir / "code"
        shutil.rmtree(code_root, ignore_errors=True)
        self.functions = with_local_processor_environment(
            discovery.functions(self.aws, self.assembly, self.deployment, code_root), self.context
        )
        self.logs.open(workdir / "functions.log")
        runtime_env = {
            **self.aws.environment(),
            "POWERTOOLS_TRACE_DISABLED": "true",  # no X-Ray daemon here
            WORK_MS_ENV: str(local_settings(self.context).get("work_ms", DEFAULT_WORK_MS)),
            **self.options.extra_function_env,
        }
        concurrency = discovery.mapping_concurrency(self.assembly)
        for logical_id, spec in self.functions.items():
            env = {
                **runtime_env,
                "AWS_LAMBDA_FUNCTION_NAME": spec.name,
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
                "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
                "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.name}",
                "LAMBDA_TASK_ROOT": str(spec.code_dir),
                "_HANDLER": spec.handler,
            }
            cap = container_cap(self.options, concurrency.get(logical_id, 0))
            self.pools[logical_id] = FunctionPool(spec, env, self.logs, cap)
        # Lambda Invoke (the controller starting the archiver) runs in these containers, not in Docker.
        self.aws.route_invocations(self._dispatch_invoke)
        self.api_spec = discovery.api(self.assembly, self.deployment)
        if self.options.warm_containers:
            busy = serving_functions(concurrency, self.api_spec)
            warmers = [
                threading.Thread(target=pool.warm, args=(warm_count(self.options, logical_id, busy),))
                for logical_id, pool in self.pools.items()
            ]
            for thread in warmers:
                thread.start()
            for thread in warmers:
                thread.join()
        self.mapping_specs = discovery.mappings(self.aws, self.assembly, self.deployment)
        self.schedule_specs = discovery.schedules(self.assembly)
        if self.options.start_mappings:
            self.start_mappings()
        if self.options.start_api and self.api_spec is not None:
            self.api = LocalApi(
                self.api_spec, self.pools, apigateway=self.aws.client("apigateway", counted=False)
            ).start()
        if self.options.start_schedules:
            for schedule in self.schedule_specs:
                self._start_schedule(schedule)
        # The synthesis (jsii), boto3's models and the deployment leave a large heap in this process,
        # which runs the API, the pollers and whatever drives them: a full garbage collection walking it
        # stalls them all at once (as in the moto process, ``moto_process.py``). Collect it once
        # now and keep later collections off it; the moto process does the same with the stack.
        self.aws.freeze_heap()
        freeze_heap()
        return self

    def start_mappings(self) -> None:
        self._mapping_configs = MappingConfigs(self.aws)  # one read a second serves every poller
        for spec in self.mapping_specs:
            if ":kinesis:" in spec.source_arn:
                self._start_kinesis_mapping(spec)
                continue
            if spec.queue_url is None:
                self.not_emulated.append(f"event source mapping {spec.uuid} ({spec.source_arn}): not SQS")
                continue
            pool = self.pools[spec.function_logical_id]
            mapping = SqsMapping(
                spec,
                pool,
                self.aws,
                self._executor,
                default_max_concurrency=pool.max_containers,
                on_invocation=self._mapping_invoked,
                configs=self._mapping_configs,
            )
            self.mappings.append(mapping.start())

    def _start_kinesis_mapping(self, spec: MappingSpec) -> None:
        assert self.assembly is not None and self.deployment is not None
        properties = next(  # the template's settings, for any that GetEventSourceMapping leaves out
            (
                resource["Properties"]
                for logical_id, resource in self.assembly.resources("AWS::Lambda::EventSourceMapping").items()
                if self.deployment.physical_ids.get(logical_id) == spec.uuid
            ),
            None,
        )
        mapping = KinesisMapping(
            spec,
            self.pools[spec.function_logical_id],
            self.aws,
            template_properties=properties,
            configs=self._mapping_configs,
        )
        self.kinesis_mappings.append(mapping.start())

    def _mapping_invoked(
        self, spec: MappingSpec, batch: list[dict[str, Any]], invocation: Invocation, delivered_at: float
    ) -> None:
        if self.on_invocation is not None:
            self.on_invocation(spec, batch, invocation, delivered_at)

    def _start_schedule(self, schedule: ScheduleSpec) -> None:
        if schedule.period_seconds is None or not schedule.enabled:
            self.not_emulated.append(
                f"schedule {schedule.rule_logical_id} ({schedule.expression}): not a rate()"
            )
            return
        period = schedule.period_seconds / self.options.schedule_speedup

        def run() -> None:
            while not self._schedules_stop.wait(period):
                self._fire(schedule)

        thread = threading.Thread(target=run, name=f"schedule-{schedule.rule_logical_id}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _dispatch_invoke(self, function_name: str, payload: bytes, invocation_type: str) -> bytes:
        """moto's Lambda ``Invoke``: ``Event`` runs in the background (202 at once), others wait."""
        pool = next((p for p in self.pools.values() if p.spec.name == function_name), None)
        if pool is None:
            raise KeyError(f"no local container pool for function {function_name}")
        event = json.loads(payload or b"{}")
        if invocation_type == "Event":
            self.async_invocations.append(self._executor.submit(self._invoke_event, pool, event))
            return b""
        invocation = pool.invoke(event)
        return json.dumps(invocation.result if invocation.ok else {"errorMessage": invocation.error}).encode()

    def _invoke_event(self, pool: FunctionPool, event: Any) -> Invocation:
        invocation = pool.invoke(event)
        if not invocation.ok:
            log.warning("async invocation of %s failed: %s", pool.spec.name, invocation.error)
        return invocation

    def run_replay(self, request: ReplayRequest | None = None) -> LocalRun:
        """Emulate ``StartJobRun`` of the replay job (moto creates no Glue job): run it on local[2]."""
        assert self.assembly is not None
        target = discover_target(
            self.aws.client("cloudformation", counted=False),
            self.aws.client("lambda", counted=False),
            self.assembly.stack_name,
            self.aws.endpoint,
        )
        return run_local(
            target,
            request or ReplayRequest(),
            self.options.workdir / "replay",
            s3=self.aws.client("s3", counted=False),
            env=self.aws.environment(),
        )

    def _fire(self, schedule: ScheduleSpec) -> None:
        """One EventBridge scheduled event to each of the rule's targets, as the rule would send it."""
        for target in schedule.function_logical_ids:
            event = {
                "version": "0",
                "id": str(time.time_ns()),
                "detail-type": "Scheduled Event",
                "source": "aws.events",
                "account": "123456789012",
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "region": "us-east-1",
                "resources": [f"arn:aws:events:us-east-1:123456789012:rule/{schedule.rule_logical_id}"],
                "detail": {},
            }
            invocation = self.pools[target].invoke(event)
            if not invocation.ok:
                log.warning("schedule %s: %s failed: %s", schedule.rule_logical_id, target, invocation.error)

    def run_schedules_once(self) -> None:
        """Fire every emulated schedule once, now, and wait for its targets (not for what they start)."""
        for schedule in self.schedule_specs:
            if schedule.period_seconds is not None and schedule.enabled:
                self._fire(schedule)

    def quiesce(self, timeout: float = 30.0) -> None:
        """Stop the schedules and the mappings' polling, wait for every invocation in flight, then shut
        the functions' environments down (SIGTERM first, as Lambda does: a worker writes the counters
        it kept, ingest its tallies).

        Afterwards nothing moves a message any more (the API aside), so the queues' depths and the
        workers' counters read afterwards describe one consistent point: a consumed message is
        either counted by the worker that finished it or still in its queue, never both or neither.
        An invocation after this starts a new environment.
        """
        self._stop.set()
        self._schedules_stop.set()
        for mapping in self.mappings:
            mapping.stop()
        for mapping in self.mappings:
            mapping.drain(timeout)
        for thread in self._threads:
            thread.join(timeout)
        self.wait_async(timeout)  # the archiver runs the controller started: they move messages too
        for pool in self.pools.values():
            pool.stop()

    def stop_schedules(self, timeout: float = 30.0) -> None:
        """Stop the schedules (the controller) and wait for their runs and the invocations they started.

        The mappings keep polling: the queues drain with the drainers as the controller last set them.
        """
        self._schedules_stop.set()
        for thread in self._threads:
            if thread.name.startswith("schedule-"):
                thread.join(timeout)
        self.wait_async(timeout)

    def last_schedule_run(self, timeout: float = 120.0) -> list[Invocation]:
        """Stop the schedules, fire each once more, and wait for the invocations that run started.

        A sideline queue the controller held for the archiver is then parked, or under budget again
        and drained; the finished ``Event`` invocations' outcomes (the archiver's runs among them).
        """
        self.stop_schedules()
        self.run_schedules_once()
        return self.wait_async(timeout)

    def wait_async(self, timeout: float = 30.0) -> list[Invocation]:
        """Wait for the ``Event`` invocations started so far; the finished ones' outcomes."""
        done, pending = wait(list(self.async_invocations), timeout)
        if pending:
            log.warning("%d asynchronous invocations still running after %.0f s", len(pending), timeout)
        return [future.result() for future in done]

    def stop(self) -> None:
        self._stop.set()
        self._schedules_stop.set()
        for mapping in self.mappings:
            mapping.stop()
        for kinesis_mapping in self.kinesis_mappings:
            kinesis_mapping.stop()
        if self.api is not None:
            self.api.stop()
        self.aws.unroute_invocations()
        self._executor.shutdown(wait=True, cancel_futures=True)
        for pool in self.pools.values():
            pool.stop()
        self.logs.close()
        self.aws.stop()

    def __enter__(self) -> LocalRuntime:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- helpers ---------------------------------------------------------------------------------------------
    def function_id(self, handler_prefix: str, *, mode: str | None = None) -> str:
        """The logical id of the function whose handler starts with ``handler_prefix`` (e.g. ``ingest/``)."""
        for logical_id, spec in self.functions.items():
            if spec.handler.startswith(handler_prefix) and (
                mode is None or spec.environment.get("WORKER_MODE") == mode
            ):
                return logical_id
        raise KeyError(f"no function with handler {handler_prefix!r} (mode {mode})")

    def invoke(self, logical_id: str, event: Any) -> Invocation:
        return self.pools[logical_id].invoke(event)

    def output(self, key: str) -> str:
        assert self.deployment is not None
        return self.deployment.outputs[key]

    def summary(self) -> dict[str, Any]:
        """What runs here and what does not: the report the runtime prints at start."""
        assert self.deployment is not None
        return {
            "endpoint": self.aws.endpoint,
            "dynamodb_endpoint": self.aws.endpoint_for("dynamodb"),  # the main endpoint forwards to it too
            "api": self.api.url if self.api else None,
            "functions": {lid: spec.handler for lid, spec in self.functions.items()},
            "mappings": [
                f"{spec.function_logical_id} <- {spec.source_arn.rsplit(':', 1)[-1]}"
                for spec in [m.spec for m in self.mappings] + [k.spec for k in self.kinesis_mappings]
            ],
            "schedules": [
                f"{s.expression} -> {', '.join(s.function_logical_ids)}" for s in self.schedule_specs
            ],
            "moto_skipped": self.deployment.skipped,
            "aws_limits": self.options.limits.describe()
            if self.options.limits
            else "off (moto's own answers)",
            "emulated_from_template": [
                "AWS::ApiGateway::Stage (routes, throttle)",
                "AWS::ApiGateway::UsagePlan (per-key throttle of the keys onboarding enrolled)",
                "AWS::ApiGateway::Authorizer (REQUEST, TTL cache)",
                "AWS::ApiGateway::RequestValidator + Model (body schema)",
                "AWS::ApiGateway::GatewayResponse (error bodies)",
                "AWS::Lambda::EventSourceMapping (SQS polling, Kinesis shards in lineage order)",
                "AWS::Events::Rule (rate schedules)",
                "Lambda Invoke (RequestResponse and Event) in the local containers",
                "AWS::Glue::Job (run_replay: the job's entry point on local[2], archive staged from S3)",
            ],
            "not_emulated": self.not_emulated,
            "layer_stand_ins": self.deployment.layer_stand_ins,
        }
