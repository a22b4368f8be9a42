"""The chaos checker's verdicts on request logs and effects made by hand, and the chaos run's flags."""

from __future__ import annotations

from collections import Counter

import pytest

from local.__main__ import build_parser, chaos_config
from local.emulator.mappings import DeliveryFaults
from local.emulator.processor_hooks import ChaosFaults, draw
from local.scenarios import chaos as chaos_module
from local.scenarios.chaos import ChaosConfig
from local.scenarios.chaos_check import VERDICTS, Accounting, Run, check, passed, table
from local.scenarios.chaos_client import Attempt, LoadPlan


def attempt(key: str, status: int, n: int = 1, message_id: str | None = None, **more: object) -> Attempt:
    return Attempt(t=float(n), tenant="t1", key=key, attempt=n, status=status, message_id=message_id, **more)


def run(request_id: str, started: int, ended: int, envelope_id: str = "e") -> Run:
    return Run(request_id, started, ended, envelope_id, 1)


def test_a_clean_run_passes() -> None:
    attempts = [attempt("a", 202, message_id="m1"), attempt("b", 202, message_id="m2")]
    runs = {("t1", "a"): [run("r1", 1, 2)], ("t1", "b"): [run("r1", 3, 4)]}
    report = check(attempts, Accounting(effects=runs, runs=runs))
    assert (report["attempted"], report["acknowledged"], report["processed"]) == (2, 2, 2)
    assert passed(report)
    assert "PASS" in table(report)


def test_an_acknowledged_message_nowhere_is_lost_and_a_dead_letter_is_accounted_for() -> None:
    attempts = [attempt(key, 202, message_id=key.upper()) for key in ("a", "b", "c", "d")]
    accounting = Accounting(
        effects={("t1", "a"): [run("r1", 1, 2)]},
        dead_letters=Counter({("t1", "b"): 1}),
        dropped={("t1", "c")},
    )
    report = check(attempts, accounting, permanent=lambda _tenant, key: key == "b")
    assert report["lost"] == 1 and report["samples"]["lost"] == [["t1", "d"]]
    assert (report["in_dlq"], report["in_dlq_permanent"], report["in_dlq_other"]) == (1, 1, 0)
    assert not passed(report)


def test_a_dropped_202_counts_as_acknowledged_and_its_replay_must_keep_the_id() -> None:
    attempts = [
        attempt("a", 202, 1, "m1", dropped=True),
        attempt("a", 202, 2, "m1", replayed=True),
        attempt("b", 202, 1, "m2", dropped=True),
        attempt("b", 202, 2, "m3"),  # a second message: the key did not hold
    ]
    runs = {("t1", "a"): [run("r1", 1, 2)], ("t1", "b"): [run("r1", 3, 4)]}
    report = check(attempts, Accounting(effects=runs, runs=runs))
    assert report["acknowledged"] == 2 and report["acknowledged_then_dropped"] == 2
    assert report["id_mismatches"] == 1 and report["replayed_without_flag"] == 1
    assert not passed(report)


def test_effects_of_a_refused_message_are_unexpected_unless_a_request_went_unanswered() -> None:
    attempts = [attempt("a", 503), attempt("a", 429, 2), attempt("b", 0), attempt("b", 503, 2)]
    runs = {("t1", "a"): [run("r1", 1, 2)], ("t1", "b"): [run("r2", 1, 2)]}
    report = check(attempts, Accounting(effects=runs, runs=runs))
    assert report["unexpected"] == 1 and report["samples"]["unexpected"] == [["t1", "a"]]
    assert report["stored_unanswered"] == 1
    assert report["refused_by_final_status"] == {"429": 1, "503": 1}


def test_only_503_is_an_acceptable_server_error() -> None:
    report = check([attempt("a", 503), attempt("a", 500, 2), attempt("a", 502, 3)], Accounting())
    assert report["server_errors"] == 2 and report["server_errors_by_status"] == {"500": 1, "502": 1}
    assert not passed(report)


def test_processor_runs_that_wrote_no_effect_are_reruns_not_duplicates() -> None:
    """A run that died before its commit, or that another copy beat to it, left no effect."""
    effects = {("t1", "a"): [run("ok", 40, 50)]}
    runs = {("t1", "a"): [run("dead-1", 0, 10), run("dead-2", 20, 30), run("ok", 40, 50)]}
    report = check([attempt("a", 202, message_id="m")], Accounting(effects=effects, runs=runs))
    assert report["duplicated"] == 0 and report["processed"] == 1
    assert report["processor_runs"] == 3 and report["processor_reruns"] == 2
    assert passed(report)


def test_duplicated_counts_every_extra_run() -> None:
    effects = {("t1", "a"): [run("r1", 1, 2), run("r2", 3, 4), run("r3", 5, 6)]}
    report = check([attempt("a", 202, message_id="m")], Accounting(effects=effects, runs=effects))
    assert report["duplicated"] == 2 and report["samples"]["duplicated"] == [["t1", "a", 2]]


def test_the_processor_faults_pick_the_same_messages_everywhere() -> None:
    faults = ChaosFaults(seed=7, permanent_share=0.1, transient_rate=0.2)
    keys = [f"7-t1-{n}" for n in range(2000)]
    permanent = [key for key in keys if faults.permanent("t1", key)]
    assert 140 < len(permanent) < 260
    assert permanent == [key for key in keys if draw(7, "t1", key, "permanent") < 0.1]
    assert sum(faults.transient("t1", key) for key in keys) != len(permanent)  # drawn apart per kind


def test_the_load_plan_gives_every_message_a_key_of_its_own() -> None:
    plan = LoadPlan(api_url="http://x", keys={"t2": "k2", "t1": "k1"}, messages=10, rate=1.0, seed=3)
    messages = [plan.message(n) for n in range(10)]
    assert [tenant for tenant, _ in messages[:3]] == ["t1", "t2", "t1"]
    assert len({key for _, key in messages}) == 10


def test_the_flags_describe_the_run() -> None:
    args = build_parser().parse_args(["chaos", "--messages", "50", "--kill-rate", "0.5", "--seed", "9"])
    config = chaos_config(args)
    assert (config.messages, config.kill_rate, config.seed) == (50, 0.5, 9)
    assert "worker_killed" in config.injected()
    off = chaos_config(build_parser().parse_args(["chaos", "--lost-ack-rate", "0"]))
    assert "lost_ack" not in off.injected()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kill-rate", "1.5"], "argument --kill-rate: 1.5 is outside 0 to 1"),
        (["--duplicate-rate", "often"], "argument --duplicate-rate: 'often' is not a number"),
        (["--messages", "0"], "argument --messages: 0 is outside 1 to 100000"),
        (["--visibility-seconds", "9"], "argument --visibility-seconds: 9 is outside 1 to 5"),
    ],
)
def test_a_bad_value_names_the_flag_and_the_value(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["chaos", *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_duplicate_deliveries_pick_messages_at_their_rate_in_every_way() -> None:
    batch = [{"MessageId": str(n)} for n in range(10)]
    assert not any(DeliveryFaults(0.0, 1).pick(batch).values())
    always = DeliveryFaults(1.0, 1)
    picks = [always.pick(batch) for _ in range(30)]
    assert all(sum(len(found) for found in pick.values()) == 10 for pick in picks)
    assert set(always.counts) == set(DeliveryFaults.KINDS) and sum(always.counts.values()) == 300
    with pytest.raises(ValueError, match="rate must be between 0 and 1"):
        DeliveryFaults(2.0, 1)


def test_the_demo_s_chaos_scenario_is_the_chaos_run_with_its_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[ChaosConfig] = []

    def run(config: ChaosConfig, progress: bool = True) -> dict[str, object]:
        runs.append(config)
        return {**dict.fromkeys(VERDICTS, 0), "fault_kinds_missing": []}

    monkeypatch.setattr(chaos_module, "main", run)
    args = build_parser().parse_args(["demo", "--scenario", "chaos", "--quiet"])
    assert args.func(args) == 0
    assert runs == [chaos_config(build_parser().parse_args(["chaos"]))]
    assert set(runs[0].injected()) == {
        "worker_killed", "processor_transient", "processor_permanent", "long_handler", "duplicate_delivery",
        "lost_ack", "aws_throttle", "aws_server_error", "controller_crash",
    }  # fmt: skip


def test_a_permanently_failing_message_must_end_in_a_dead_letter_queue() -> None:
    attempts = [attempt("a", 202, message_id="m1"), attempt("b", 202, message_id="m2")]
    parked = Accounting(archived={("t1", "a"), ("t1", "b")}, dead_letters=Counter({("t1", "b"): 1}))
    report = check(attempts, parked, permanent=lambda _tenant, _key: True)
    assert report["lost"] == 0  # parked is accounted for ...
    assert report["permanent_not_in_dlq"] == 1  # ... but a message that fails for good belongs in a DLQ
    assert report["archived"] == 1 and report["parked_in_archive"] == 2
    assert not passed(report)
