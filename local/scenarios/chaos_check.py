"""The chaos run's checker: what the clients were told, against what the processor did and what is left.

In the spirit of a total-queue check: every message has a key of its own, so each ``(tenant, key)``
can be followed from the client's request log to the processor's effects table and the dead-letter
queues. The verdicts:

- ``lost``: acknowledged (the API answered 202, even if the client then dropped the answer) and
  neither processed nor accounted for (dropped by the worker's policy, in a dead-letter queue,
  parked in the archive);
- ``duplicated``: effects recorded more than once for one ``(tenant, key)``. The processor writes its
  effect through ``work.add_effect``, so the effect and the message's idempotency record commit in
  one transaction; a run of the processor that another run beat to that commit, or that died before
  it, wrote none (``processor_reruns``: counted apart, from the runs each processor call logs);
- ``unexpected``: effects (or dead letters) of a key the API never acknowledged, unless one of its
  requests went unanswered (then it may have been stored: ``stored_unanswered``);
- ``server_errors``: 5xx answers other than 503 (a 503 is how the API refuses with nothing stored).

Pure: the chaos runner (``local.scenarios.chaos``) gathers the inputs, tests can make them by hand.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from local.scenarios.chaos_client import Attempt

Key = tuple[str, str]  # (tenant, idempotency key)
SAMPLE = 10  # keys listed per verdict in the report


@dataclass(frozen=True)
class Run:
    """One run of the processor that finished (the effects table's ``run_log``), or one committed effect
    (its ``effect_log``: the same fields, written in the transaction with the idempotency record)."""

    request_id: str
    started_ms: int
    ended_ms: int
    envelope_id: str
    pid: int

    @classmethod
    def parse(cls, text: str) -> Run:
        request_id, started, ended, envelope_id, pid = text.split("|")
        return cls(request_id, int(started), int(ended), envelope_id, int(pid))


@dataclass
class Accounting:
    """Where the messages are at the end, beside the processor's runs."""

    effects: dict[Key, list[Run]] = field(default_factory=dict)  # committed, with the idempotency record
    runs: dict[Key, list[Run]] = field(default_factory=dict)  # every run of the processor that returned
    dead_letters: Counter[Key] = field(default_factory=Counter)  # copies in the DLQs, per key
    dropped: set[Key] = field(default_factory=set)  # by the worker's policy (expired)
    archived: set[Key] = field(default_factory=set)  # parked in S3 and not replayed
    still_queued: int = 0  # messages left in live and sideline queues after the drain


def check(
    attempts: Iterable[Attempt],
    accounting: Accounting,
    *,
    permanent: Callable[[str, str], bool] = lambda _tenant, _key: False,
    faults: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The verdicts and the figures behind them (the report's body)."""
    answers: dict[Key, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        answers[(attempt.tenant, attempt.key)].append(attempt)
    acknowledged = {key for key, tries in answers.items() if any(a.status == 202 for a in tries)}
    unanswered = {key for key, tries in answers.items() if any(a.status == 0 for a in tries)}
    statuses = Counter(a.status for tries in answers.values() for a in tries)
    final_refusals = Counter(tries[-1].status for key, tries in answers.items() if key not in acknowledged)
    ids = {key: {a.message_id for a in tries if a.status == 202} for key, tries in answers.items()}
    id_mismatches = sorted(key for key, seen in ids.items() if len(seen) > 1)
    replayed_without_flag = sum(
        1
        for tries in answers.values()
        for index, a in enumerate(tries)
        if a.status == 202 and not a.replayed and any(b.status == 202 for b in tries[:index])
    )

    effects = {key: list(found) for key, found in accounting.effects.items() if found}
    processed = set(effects)
    in_dlq = set(accounting.dead_letters)
    accounted = processed | in_dlq | accounting.dropped | accounting.archived
    lost = sorted(acknowledged - accounted)
    stored = processed | in_dlq
    unexpected = sorted(stored - acknowledged - unanswered)
    stored_unanswered = sorted((stored - acknowledged) & unanswered)

    duplicated = {key: len(found) - 1 for key, found in effects.items() if len(found) > 1}
    runs = sum(len(found) for found in accounting.runs.values())
    permanent_keys = {key for key in acknowledged if permanent(*key)}
    server_errors = {status: count for status, count in statuses.items() if status >= 500 and status != 503}
    return {
        "attempted": len(answers),
        "requests": sum(statuses.values()),
        "acknowledged": len(acknowledged),
        "acknowledged_then_dropped": sum(
            1 for tries in answers.values() for a in tries if a.status == 202 and a.dropped
        ),
        "refused": len(answers) - len(acknowledged),
        "refused_by_final_status": {str(s): c for s, c in sorted(final_refusals.items())},
        "answers_by_status": {str(s): c for s, c in sorted(statuses.items())},
        "processed": len(processed),
        "effects": sum(len(found) for found in effects.values()),
        "processor_runs": runs,
        "processor_reruns": max(0, runs - len(processed)),
        "in_dlq": len(in_dlq),
        "in_dlq_permanent": len(in_dlq & permanent_keys),
        "in_dlq_other": len(in_dlq - permanent_keys),
        "dead_letter_copies": sum(accounting.dead_letters.values()),
        "permanent_failures": len(permanent_keys),
        "permanent_processed": len(processed & permanent_keys),
        # acknowledged, failing for good, and not in a dead-letter queue (parked and never replayed)
        "permanent_not_in_dlq": len(permanent_keys - in_dlq - processed),
        "dropped": len(accounting.dropped),
        "archived": len(accounting.archived - processed - in_dlq),  # parked, and not replayed since
        "parked_in_archive": len(accounting.archived),
        "still_queued": accounting.still_queued,
        "lost": len(lost),
        "duplicated": sum(duplicated.values()),
        "unexpected": len(unexpected),
        "stored_unanswered": len(stored_unanswered),
        "server_errors": sum(server_errors.values()),
        "server_errors_by_status": {str(s): c for s, c in sorted(server_errors.items())},
        "id_mismatches": len(id_mismatches),
        "replayed_without_flag": replayed_without_flag,
        "faults_injected": dict(sorted((faults or {}).items())),
        "samples": {
            "lost": [list(key) for key in lost[:SAMPLE]],
            "duplicated": [[*key, extra] for key, extra in sorted(duplicated.items())[:SAMPLE]],
            "unexpected": [list(key) for key in unexpected[:SAMPLE]],
            "id_mismatches": [list(key) for key in id_mismatches[:SAMPLE]],
        },
    }


VERDICTS = ("lost", "duplicated", "unexpected", "server_errors", "id_mismatches", "permanent_not_in_dlq")


def passed(report: Mapping[str, Any]) -> bool:
    """Nothing lost, nothing done twice, nothing unexpected, no 5xx but 503, every replay the same id."""
    return all(report[name] == 0 for name in VERDICTS)


def table(report: Mapping[str, Any]) -> str:
    """The report as a few aligned lines (what ``python -m local chaos`` prints)."""
    rows = [
        ("attempted", report["attempted"], f"{report['requests']} requests"),
        ("acknowledged", report["acknowledged"], f"{report['acknowledged_then_dropped']} answers dropped"),
        ("refused", report["refused"], str(report["refused_by_final_status"] or "")),
        (
            "processed",
            report["processed"],
            f"{report['effects']} effects, {report['processor_runs']} processor runs",
        ),
        (
            "in_dlq",
            report["in_dlq"],
            f"{report['in_dlq_permanent']} of {report['permanent_failures']} meant to fail for good, "
            f"{report['in_dlq_other']} others",
        ),
        ("dropped/archived", report["dropped"] + report["archived"], ""),
        ("still_queued", report["still_queued"], ""),
        ("lost", report["lost"], _sample(report, "lost")),
        ("duplicated", report["duplicated"], _sample(report, "duplicated")),
        (
            "processor_reruns",
            report["processor_reruns"],
            "runs whose effect was not written again (another copy committed it first, or the run's "
            "invocation died before its commit)",
        ),
        ("unexpected", report["unexpected"], _sample(report, "unexpected")),
        ("server_errors", report["server_errors"], str(report["server_errors_by_status"] or "")),
        ("id_mismatches", report["id_mismatches"], ""),
        ("permanent_not_in_dlq", report["permanent_not_in_dlq"], "failing for good, yet in no DLQ"),
    ]
    lines = [f"  {name:20s} {value:7d}  {note}".rstrip() for name, value, note in rows]
    faults = report["faults_injected"]
    lines.append("  faults injected      " + (", ".join(f"{k}={v}" for k, v in faults.items()) or "none"))
    lines.append(f"  verdict              {'PASS' if passed(report) else 'FAIL'}")
    return "\n".join(lines)


def _sample(report: Mapping[str, Any], name: str) -> str:
    keys = report["samples"][name]
    return " ".join("/".join(str(part) for part in key) for key in keys[:3])
