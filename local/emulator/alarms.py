"""The stack's CloudWatch alarms evaluated on what a local run observed: which fired, when, and recovered.

Three parts, usable apart:

    definitions = alarm_definitions(template)           # every AWS::CloudWatch::Alarm of the template
    report = evaluate(definitions, store, 0.0, 90.0, time_scale=12)   # a MetricStore of datapoints
    watch = AlarmWatch(runtime, started_at=time.time())  # a LocalRuntime's metrics, collected:
    watch.sample()                                       # every few seconds while the run goes on
    watch.evaluate(end_s=90.0, time_scale=12).as_dict()  # {"fired": [...], "transitions": [...], ...}

Where the metrics come from: the ``AWS/SQS`` queue gauges from the embedded CloudWatch (moto, with the
``sqs.cloudwatch_metrics`` patch, which serves them as SQS publishes them: the oldest message's age is
in no SQS API), one ``GetMetricData`` per sample for every queue an alarm watches; the functions' own
metrics from their EMF output (``runtime.logs``), with the dimension sets each blob declares. Other
``AWS/*`` namespaces (Kinesis, Lambda) have no local source: their alarms are listed as not evaluated,
with the reason, as are metric math alarms; none is dropped silently.

CloudWatch's semantics, as far as a run of a few minutes needs them: the statistic of each period's
datapoints (``Maximum``, ``Minimum``, ``Sum``, ``Average``, ``SampleCount``, ``pNN``); ALARM when at
least ``DatapointsToAlarm`` of the last ``EvaluationPeriods`` periods breach; a period without
datapoints treated as the alarm says (``TreatMissingData``). Simplifications, each stated where it
applies: every alarm starts OK, and INSUFFICIENT_DATA (no datapoint in the window, missing data
treated as ``missing``) is reported as OK; a window partly missing under ``ignore`` or ``missing`` is
decided on the datapoints it has; the run's last, unfinished period is evaluated at the end of the run
with what it holds. Time runs faster in the demo than in AWS (its schedules run ``time_scale`` times as
often), so each alarm's period is divided by ``time_scale``; thresholds are the template's.
"""

from __future__ import annotations

import bisect
import datetime
import json
import math
import operator
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from local.emulator.moto_patches.sqs_metrics import GAUGES as SQS_GAUGES

if TYPE_CHECKING:
    from local.emulator.runtime import LocalRuntime

ALARM, OK = "ALARM", "OK"
SQS_NAMESPACE = "AWS/SQS"
TREATMENTS = ("missing", "ignore", "breaching", "notBreaching")
COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanOrEqualToThreshold": operator.ge,
    "GreaterThanThreshold": operator.gt,
    "LessThanThreshold": operator.lt,
    "LessThanOrEqualToThreshold": operator.le,
}
STATISTICS = ("Maximum", "Minimum", "Sum", "Average", "SampleCount")
PERCENTILE = re.compile(r"^p(\d{1,2}(\.\d+)?|100)$")
MAX_QUERIES = 500  # GetMetricData's limit per request

Dimensions = tuple[tuple[str, str], ...]  # (name, value), sorted by name
MetricKey = tuple[str, str, Dimensions]  # (namespace, metric name, dimensions)


def metric_key(namespace: str, name: str, dimensions: Mapping[str, str]) -> MetricKey:
    """How CloudWatch tells metrics apart: namespace, name and the exact set of dimensions."""
    return (namespace, name, tuple(sorted(dimensions.items())))


@dataclass(frozen=True)
class AlarmDefinition:
    """One ``AWS::CloudWatch::Alarm`` of the template, as the evaluator reads it.

    Dimension values that are a ``Ref`` or an ``Fn::GetAtt`` are the logical id of the resource they
    refer to (an SQS queue's ``QueueName`` is the queue's logical id). ``not_evaluated`` says why the
    alarm cannot be evaluated here (metric math, a statistic or comparison not computed locally);
    the metric fields are then what the template gave, or empty.
    """

    logical_id: str
    description: str
    namespace: str
    metric_name: str
    dimensions: Dimensions
    statistic: str  # Statistic, or ExtendedStatistic (p99, ...)
    period_s: float
    evaluation_periods: int
    datapoints_to_alarm: int
    threshold: float | None
    comparison: str
    treat_missing_data: str = "missing"
    not_evaluated: str | None = None

    @property
    def key(self) -> MetricKey:
        return (self.namespace, self.metric_name, self.dimensions)

    @property
    def dimension_map(self) -> dict[str, str]:
        return dict(self.dimensions)


def _referenced_id(value: Any) -> str | None:
    """A dimension's value: a literal, or the logical id a ``Ref`` / ``Fn::GetAtt`` points at; else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, dict) and len(value) == 1:
        if isinstance(value.get("Ref"), str):
            return str(value["Ref"])
        target = value.get("Fn::GetAtt")
        if isinstance(target, list) and target and isinstance(target[0], str):
            return target[0]
        if isinstance(target, str):
            return target.split(".", 1)[0]
    return None


def _why_not_evaluated(properties: Mapping[str, Any], statistic: str, comparison: str) -> str | None:
    if "Metrics" in properties:
        return "metric math (Metrics): the expression is not evaluated locally"
    if not properties.get("MetricName") or not properties.get("Namespace"):
        return "no MetricName and Namespace"
    if statistic not in STATISTICS and not PERCENTILE.match(statistic):
        return f"statistic {statistic or '(none)'} is not computed locally"
    if comparison not in COMPARISONS:
        return f"comparison {comparison} (anomaly detection) is not evaluated locally"
    if "Threshold" not in properties:
        return "no static Threshold"
    return None


def alarm_definitions(template: Mapping[str, Any]) -> list[AlarmDefinition]:
    """Every ``AWS::CloudWatch::Alarm`` of ``template``, in the template's order."""
    definitions = []
    for logical_id, resource in template.get("Resources", {}).items():
        if resource.get("Type") != "AWS::CloudWatch::Alarm":
            continue
        properties = resource.get("Properties", {})
        statistic = str(properties.get("Statistic") or properties.get("ExtendedStatistic") or "")
        comparison = str(properties.get("ComparisonOperator", ""))
        reason = _why_not_evaluated(properties, statistic, comparison)
        dimensions: dict[str, str] = {}
        for dimension in properties.get("Dimensions", []):
            resolved = _referenced_id(dimension.get("Value"))
            if resolved is None:
                reason = reason or (
                    f"dimension {dimension.get('Name')} is {json.dumps(dimension.get('Value'))}: "
                    "neither a value, a Ref nor a Fn::GetAtt"
                )
                resolved = json.dumps(dimension.get("Value"), sort_keys=True)
            dimensions[str(dimension.get("Name"))] = resolved
        evaluation_periods = int(properties.get("EvaluationPeriods", 1))
        treatment = str(properties.get("TreatMissingData", "missing"))
        if treatment not in TREATMENTS:
            reason = reason or f"TreatMissingData {treatment} is unknown"
        definitions.append(
            AlarmDefinition(
                logical_id=logical_id,
                description=str(properties.get("AlarmDescription", "")),
                namespace=str(properties.get("Namespace", "")),
                metric_name=str(properties.get("MetricName", "")),
                dimensions=tuple(sorted(dimensions.items())),
                statistic=statistic,
                period_s=float(properties.get("Period", 0) or 0),
                evaluation_periods=evaluation_periods,
                datapoints_to_alarm=int(properties.get("DatapointsToAlarm", evaluation_periods)),
                threshold=float(properties["Threshold"]) if "Threshold" in properties else None,
                comparison=comparison,
                treat_missing_data=treatment,
                not_evaluated=reason,
            )
        )
    return definitions


class MetricStore:
    """Datapoints ``(t seconds, value)`` per metric (:func:`metric_key`); safe to add to from another thread.

    A *gauge* is a series sampled from a level that persists between samples (a queue's depth): a
    period without a sample of its own takes the last earlier sample, as CloudWatch would have had a
    datapoint for it (SQS publishes its gauges every minute). Other series are events (EMF values):
    a period without one has no data.
    """

    def __init__(self) -> None:
        self._points: dict[MetricKey, list[tuple[float, float]]] = {}
        self._gauges: set[MetricKey] = set()
        self._lock = threading.Lock()

    def add(
        self,
        namespace: str,
        name: str,
        dimensions: Mapping[str, str],
        t: float,
        value: float,
        *,
        gauge: bool = False,
    ) -> None:
        key = metric_key(namespace, name, dimensions)
        with self._lock:
            bisect.insort(self._points.setdefault(key, []), (float(t), float(value)))
            if gauge:
                self._gauges.add(key)

    def points(self, key: MetricKey) -> list[tuple[float, float]]:
        with self._lock:
            return list(self._points.get(key, ()))

    def is_gauge(self, key: MetricKey) -> bool:
        with self._lock:
            return key in self._gauges

    def keys(self) -> list[MetricKey]:
        with self._lock:
            return list(self._points)

    def copy(self) -> MetricStore:
        other = MetricStore()
        with self._lock:
            other._points = {key: list(points) for key, points in self._points.items()}
            other._gauges = set(self._gauges)
        return other


def statistic(name: str, values: list[float]) -> float | None:
    """CloudWatch's statistic ``name`` of one period's ``values`` (None without values).

    Percentiles are nearest-rank over the raw values (CloudWatch approximates them; the local runs
    have few enough values to keep them all).
    """
    if not values:
        return None
    if name == "Maximum":
        return max(values)
    if name == "Minimum":
        return min(values)
    if name == "Sum":
        return math.fsum(values)
    if name == "Average":
        return math.fsum(values) / len(values)
    if name == "SampleCount":
        return float(len(values))
    if PERCENTILE.match(name):
        ordered = sorted(values)
        rank = math.ceil(float(name[1:]) / 100 * len(ordered))
        return ordered[min(len(ordered), max(1, rank)) - 1]
    raise ValueError(f"statistic {name} is not computed locally")


@dataclass
class AlarmReport:
    """What :func:`evaluate` found: the state changes in time order, and the alarms it could not evaluate.

    A transition: ``{"alarm": logical id, "description", "state": "ALARM" | "OK", "at_s": end of the
    period that decided it (seconds after the start), "value": that period's statistic, None when the
    period had no datapoint}``. Not evaluated: ``{"alarm", "description", "reason"}``.
    """

    transitions: list[dict[str, Any]] = field(default_factory=list)
    not_evaluated: list[dict[str, str]] = field(default_factory=list)
    evaluated: list[str] = field(default_factory=list)  # logical ids

    @property
    def fired(self) -> list[str]:
        """The alarms that went into ALARM at least once, in the order they first did."""
        return list(dict.fromkeys(t["alarm"] for t in self.transitions if t["state"] == ALARM))

    @property
    def in_alarm_at_end(self) -> list[str]:
        """The alarms still in ALARM when the evaluation ended."""
        last: dict[str, str] = {}
        for transition in self.transitions:
            last[transition["alarm"]] = transition["state"]
        return [alarm for alarm, state in last.items() if state == ALARM]

    def as_dict(self) -> dict[str, Any]:
        return {
            "fired": self.fired,
            "in_alarm_at_end": self.in_alarm_at_end,
            "transitions": self.transitions,
            "evaluated": len(self.evaluated),
            "not_evaluated": self.not_evaluated,
        }


def _period_values(
    points: list[tuple[float, float]], times: list[float], start: float, end: float, gauge: bool
) -> list[float]:
    first, last = bisect.bisect_left(times, start), bisect.bisect_left(times, end)
    if first < last:
        return [value for _, value in points[first:last]]
    if gauge and first > 0:
        return [points[first - 1][1]]  # the level last sampled holds until the next sample
    return []


def _decide(definition: AlarmDefinition, window: list[float | None], state: str) -> str:
    """The state after a period; ``window``: the statistic of each of the last N periods (None: no data)."""
    compare, threshold = COMPARISONS[definition.comparison], definition.threshold
    assert threshold is not None
    treatment = definition.treat_missing_data
    breaching = sum(1 for value in window if value is not None and compare(value, threshold))
    missing = sum(1 for value in window if value is None)
    if treatment == "breaching":
        breaching += missing
    if breaching >= definition.datapoints_to_alarm:
        return ALARM
    if missing == len(window) and treatment == "ignore":
        return state
    # notBreaching, breaching, or a window with data: OK. With no data at all under "missing",
    # CloudWatch's INSUFFICIENT_DATA, reported as OK.
    return OK


def evaluate(
    definitions: Iterable[AlarmDefinition],
    store: MetricStore,
    start_s: float,
    end_s: float,
    time_scale: float = 1.0,
    *,
    unavailable: Mapping[str, str] | None = None,
) -> AlarmReport:
    """Each alarm over ``[start_s, end_s)``: its periods (``Period / time_scale`` long, from ``start_s``)
    evaluated in turn, every change of state a transition (every alarm starts OK).

    ``unavailable``: logical id -> why the alarm's metric has no source here; such alarms, and those
    whose definition cannot be evaluated, are listed in :attr:`AlarmReport.not_evaluated`.
    """
    if time_scale <= 0:
        raise ValueError(f"time_scale must be positive, not {time_scale}")
    report = AlarmReport()
    for definition in definitions:
        reason = definition.not_evaluated or (unavailable or {}).get(definition.logical_id)
        if reason is None and definition.period_s <= 0:
            reason = "no Period"
        if reason is not None:
            report.not_evaluated.append(
                {"alarm": definition.logical_id, "description": definition.description, "reason": reason}
            )
            continue
        report.evaluated.append(definition.logical_id)
        points = store.points(definition.key)
        times = [t for t, _ in points]
        gauge = store.is_gauge(definition.key)
        period = definition.period_s / time_scale
        state = OK
        window: list[float | None] = []
        index = 0
        while start_s + index * period < end_s:
            begin = start_s + index * period
            finish = min(begin + period, end_s)
            value = statistic(definition.statistic, _period_values(points, times, begin, finish, gauge))
            window = [*window, value][-definition.evaluation_periods :]
            decided = _decide(definition, window, state)
            if decided != state:
                report.transitions.append(
                    {
                        "alarm": definition.logical_id,
                        "description": definition.description,
                        "state": decided,
                        "at_s": round(finish, 3),
                        "value": value,
                    }
                )
                state = decided
            index += 1
    report.transitions.sort(key=lambda t: (t["at_s"], t["alarm"]))
    return report


def emf_datapoints(blob: Mapping[str, Any], namespace: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(dimensions, value) of metric ``name`` in ``namespace`` in one EMF blob: one per value and per
    dimension set the blob declares for it (a dimension set with a key the blob lacks is dropped)."""
    out: list[tuple[dict[str, str], float]] = []
    if name not in blob:
        return out
    values = blob[name] if isinstance(blob[name], list) else [blob[name]]
    for directive in blob.get("_aws", {}).get("CloudWatchMetrics", []):
        if directive.get("Namespace") != namespace:
            continue
        if name not in {metric.get("Name") for metric in directive.get("Metrics", [])}:
            continue
        for dimension_set in directive.get("Dimensions") or [[]]:
            if any(key not in blob for key in dimension_set):
                continue
            dimensions = {key: str(blob[key]) for key in dimension_set}
            out.extend((dimensions, float(value)) for value in values)
    return out


class AlarmWatch:
    """The stack's alarms over a run of a :class:`~local.emulator.runtime.LocalRuntime`.

    ``started_at`` (epoch seconds) is the run's time zero: every time reported is seconds after it.
    Call :meth:`sample` every few seconds while the run goes on (a period without a sample takes the
    one before it); :meth:`evaluate` whenever a report is wanted. One ``GetMetricData`` request per
    sample, whatever the number of queues.
    """

    def __init__(self, runtime: LocalRuntime, started_at: float, *, cloudwatch: Any | None = None) -> None:
        assert runtime.assembly is not None and runtime.deployment is not None, "start the runtime first"
        self.started_at = started_at
        self.definitions = alarm_definitions(runtime.assembly.template)
        self.sqs_samples = MetricStore()
        self.samples = 0
        self._logs = runtime.logs
        self._cloudwatch = cloudwatch or runtime.aws.client("cloudwatch", counted=False)
        self._unavailable: dict[str, str] = {}
        self._emf: set[tuple[str, str]] = set()  # (namespace, metric name) read from the functions' EMF
        self._queries: list[dict[str, Any]] = []
        self._query_keys: dict[str, MetricKey] = {}  # query id -> the key its values are stored under
        self._answered = False  # any query got a value: CloudWatch serves the queue gauges
        queries: dict[MetricKey, str] = {}
        for definition in self.definitions:
            if definition.not_evaluated:
                continue
            if definition.namespace == SQS_NAMESPACE:
                reason = self._sqs_reason(definition, runtime.deployment.physical_ids)
                if reason is None and definition.key not in queries:
                    queries[definition.key] = self._add_query(
                        definition, runtime.deployment.physical_ids[definition.dimension_map["QueueName"]]
                    )
            elif definition.namespace.startswith("AWS/"):
                reason = f"{definition.namespace} metrics have no source in the local runtime"
            else:
                reason = None
                self._emf.add((definition.namespace, definition.metric_name))
            if reason is not None:
                self._unavailable[definition.logical_id] = reason

    @staticmethod
    def _sqs_reason(definition: AlarmDefinition, physical_ids: Mapping[str, str]) -> str | None:
        if definition.metric_name not in SQS_GAUGES:
            return f"AWS/SQS {definition.metric_name} is not published locally (the queue gauges are)"
        if set(definition.dimension_map) != {"QueueName"}:
            return "an AWS/SQS metric with dimensions other than QueueName"
        queue = definition.dimension_map["QueueName"]
        if queue not in physical_ids:
            return f"queue {queue} was not created in the embedded AWS"
        return None

    def _add_query(self, definition: AlarmDefinition, queue_url: str) -> str:
        query_id = f"q{len(self._queries)}"
        self._queries.append(
            {
                "Id": query_id,
                "MetricStat": {
                    "Metric": {
                        "Namespace": SQS_NAMESPACE,
                        "MetricName": definition.metric_name,
                        "Dimensions": [{"Name": "QueueName", "Value": queue_url.rsplit("/", 1)[-1]}],
                    },
                    "Period": 60,
                    "Stat": "Maximum",
                },
            }
        )
        self._query_keys[query_id] = definition.key
        return query_id

    @property
    def unavailable(self) -> dict[str, str]:
        """Logical id -> why the alarm's metric has no local source (metric math alarms aside)."""
        reasons = dict(self._unavailable)
        if self.samples and not self._answered:
            for definition in self.definitions:
                if definition.key in self._query_keys.values():
                    reasons[definition.logical_id] = (
                        "the embedded CloudWatch served no AWS/SQS gauge "
                        "(is the moto patch sqs.cloudwatch_metrics installed?)"
                    )
        return reasons

    def sample(self, now: float | None = None) -> None:
        """Record the queue gauges some alarm watches, as of ``now`` (epoch seconds; default: the clock)."""
        now = time.time() if now is None else now
        if not self._queries:
            return
        # The gauges are stamped with moto's clock at the request: a window around the present holds them.
        wall = datetime.datetime.now(datetime.UTC)
        window = datetime.timedelta(seconds=60)
        t = now - self.started_at
        for first in range(0, len(self._queries), MAX_QUERIES):
            answer = self._cloudwatch.get_metric_data(
                MetricDataQueries=self._queries[first : first + MAX_QUERIES],
                StartTime=wall - window,
                EndTime=wall + window,
            )
            for result in answer.get("MetricDataResults", []):
                values = result.get("Values") or []
                if not values:
                    continue  # the age of an empty queue: SQS publishes none
                self._answered = True
                namespace, name, dimensions = self._query_keys[result["Id"]]
                self.sqs_samples.add(namespace, name, dict(dimensions), t, max(values), gauge=True)
        self.samples += 1

    def metrics(self) -> MetricStore:
        """The queue samples so far, and every EMF value of an alarmed metric the functions printed."""
        store = self.sqs_samples.copy()
        for namespace, name in sorted(self._emf):
            for stamp_ms, _function, _value, blob in _distinct_blobs(self._logs.metric_values(name)):
                t = stamp_ms / 1000 - self.started_at
                for dimensions, value in emf_datapoints(blob, namespace, name):
                    store.add(namespace, name, dimensions, t, value)
        return store

    def evaluate(
        self, end_s: float | None = None, time_scale: float = 1.0, start_s: float = 0.0
    ) -> AlarmReport:
        """Every alarm over ``[start_s, end_s)`` seconds after ``started_at`` (default end: now)."""
        end = time.time() - self.started_at if end_s is None else end_s
        return evaluate(
            self.definitions, self.metrics(), start_s, end, time_scale, unavailable=self.unavailable
        )


def _distinct_blobs(
    rows: list[tuple[int, str, float, dict[str, Any]]],
) -> list[tuple[int, str, float, dict[str, Any]]]:
    """One row per blob: ``metric_values`` gives a row per value; :func:`emf_datapoints` reads them all."""
    seen: set[int] = set()
    out = []
    for row in rows:
        if id(row[3]) not in seen:
            seen.add(id(row[3]))
            out.append(row)
    return out
