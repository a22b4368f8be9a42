"""``python -m local serve`` keeps the blueprint up; ``python -m local demo`` runs the demo;
``python -m local chaos`` injects faults under a keyed load and checks that nothing was lost."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from local.aws_limits import AwsLimits
    from local.scenarios.chaos import ChaosConfig
    from local.scenarios.noisy_neighbour import Scenario
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "functions"))  # the runtime library (tenants), as bin/tenants does


def serve(args: argparse.Namespace) -> int:
    from local.scenarios.serve import serve as serve_stack

    return serve_stack(naive=args.naive, schedule_speedup=args.schedule_speedup, limits=limits_of(args))


def demo(args: argparse.Namespace) -> int:
    from local.scenarios import demo as demo_module
    from local.scenarios.html_report import write_html_report

    if args.scenario == "chaos":  # its own run and report (out/chaos/), with its defaults
        flags = ["--quiet"] if args.quiet else []
        flags += ["--no-limits"] if args.no_limits else ["--limit-scale", str(args.limit_scale)]
        return chaos(build_parser().parse_args(["chaos", *flags]))

    configurations = configurations_of(args)
    for kind in SCENARIOS if args.scenario == "all" else (args.scenario,):
        scenario = scenario_of(args, kind)
        # The noisy scenario keeps out/report.json; another writes out/<scenario>/.
        out = ROOT / "out" if kind == "noisy" else ROOT / "out" / kind
        print(f"##### scenario: {kind} ({', '.join(configurations)})", flush=True)
        demo_module.main(
            scenario,
            out=out,
            progress=not args.quiet,
            limits=limits_of(args),
            configurations=configurations,
        )
    print(f"wrote {write_html_report(ROOT / 'out')} (every scenario run so far, side by side)")
    return 0


Kind = Literal["noisy", "slow", "outage", "poison"]
SCENARIOS: tuple[Kind, ...] = ("noisy", "slow", "outage", "poison")


def scenario_of(args: argparse.Namespace, kind: Kind | None = None) -> Scenario:
    """The scenario (``kind``, else ``--scenario``) the demo's flags describe."""
    from local.scenarios.noisy_neighbour import DEMO_CONTEXT, Scenario

    consumer_rate = DEMO_CONTEXT["breakwater"]["tiers"]["standard"]["consumer_rate"]
    kind = kind or args.scenario
    # The outage's length is its event phase; the poison scenario waits longer after the load, for its
    # last poison message's receives to run out.
    event_s = args.outage_seconds if kind == "outage" else args.burst_seconds
    scenario = Scenario(
        tenants=args.tenants,
        quiet_rate=args.quiet_rate,
        noisy_rate=args.quiet_rate,
        burst_rate=args.noisy_factor * consumer_rate,
        baseline_s=args.baseline_seconds,
        burst_s=event_s,
        after_s=args.after_seconds,
        phases=args.phases,
        phase_seed=args.phase_seed,
        kind=kind,
        slow_factor=args.slow_factor,
        poison_share=args.poison_share,
        poison_rate=consumer_rate,
        drain_s=45.0 if kind == "poison" else Scenario.drain_s,
    )
    return scenario


# The configurations a demo can run, in the order it runs them (local.scenarios.demo.CONFIGURATIONS).
CONFIGURATIONS = ("breakwater", "naive", "fair")


def configuration_names(text: str) -> tuple[str, ...]:
    """An argparse type: a comma-separated subset of naive,fair,breakwater, in the order they run."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CONFIGURATIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated subset of naive,fair,breakwater"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    return tuple(name for name in CONFIGURATIONS if name in names)


def configurations_of(args: argparse.Namespace) -> tuple[str, ...]:
    """``--configurations``, else all three for ``--scenario all`` and Breakwater and naive for one
    scenario (``make demo``'s time budget)."""
    if args.configurations is not None:
        return tuple(args.configurations)
    return CONFIGURATIONS if args.scenario == "all" else ("breakwater", "naive")


def chaos(args: argparse.Namespace) -> int:
    from local.scenarios import chaos as chaos_module

    report = chaos_module.main(chaos_config(args), progress=not args.quiet)
    return chaos_module.exit_status(report)


# The chaos run's fault flags: (flag, ChaosConfig field, default, help). The defaults are modest rates
# that still inject every kind within a thousand messages.
CHAOS_FAULTS: tuple[tuple[str, str, float, str], ...] = (
    ("--kill-rate", "kill_rate", 0.03, "share of worker invocations SIGKILLed mid-batch"),
    ("--transient-rate", "transient_rate", 0.03, "share of messages whose first processing fails"),
    ("--permanent-share", "permanent_share", 0.005, "share of messages that fail every time (end in a DLQ)"),
    (
        "--long-share",
        "long_share",
        0.005,
        "share of messages whose first run outlasts the visibility timeout",
    ),
    ("--duplicate-rate", "duplicate_rate", 0.02, "share of received messages the SQS mappings deliver twice"),
    (
        "--lost-ack-rate",
        "lost_ack_rate",
        0.03,
        "share of 202 answers the client drops (it retries, same key)",
    ),
    ("--aws-throttle-rate", "aws_throttle_rate", 0.02, "share of the handlers' AWS requests throttled"),
    ("--aws-error-rate", "aws_error_rate", 0.01, "share of the handlers' AWS requests answered with a 500"),
    ("--controller-crash-rate", "controller_crash_rate", 0.3, "share of controller runs SIGKILLed mid-run"),
)


def chaos_config(args: argparse.Namespace) -> ChaosConfig:
    """The chaos run the flags describe."""
    from local.scenarios.chaos import ChaosConfig

    return ChaosConfig(
        messages=args.messages,
        tenants=args.tenants,
        rate=args.rate,
        seed=args.seed,
        visibility_s=args.visibility_seconds,
        drain_s=args.drain_seconds,
        **{field: getattr(args, field) for _, field, _, _ in CHAOS_FAULTS},
        limits=limits_of(args),
    )


def bounded(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], int | float]:
    """An argparse type: a number in [low, high]; anything else is an error naming the flag and value."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside {low:g} to {high:g}")
        return value

    return parse


def limits_of(args: argparse.Namespace) -> AwsLimits | None:
    """The limits the flags ask for: AWS's own by default, rates divided by ``--limit-scale``, or none."""
    from local.aws_limits import AwsLimits

    return None if args.no_limits else AwsLimits(scale=args.limit_scale)


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit-scale",
        type=bounded(float, 1.0, 1_000_000.0),
        default=1.0,
        help="the embedded AWS enforces AWS's limits (DynamoDB per-item throughput and transaction "
        "conflicts, SQS batch and size limits, Kinesis shard rates) with the rates divided by N: one "
        "machine cannot reach AWS's own (default 1: AWS's figures)",
    )
    parser.add_argument(
        "--no-limits", action="store_true", help="moto's own answers: nothing throttled, no conflicts"
    )


def main() -> int:
    args = build_parser().parse_args()
    return int(args.func(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m local", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the blueprint on moto and keep it up")
    serve_parser.add_argument(
        "--naive", action="store_true", help="the naive configuration (one queue, no limits)"
    )
    serve_parser.add_argument(
        "--schedule-speedup", type=float, default=1.0, help="run schedules N times as often"
    )
    add_limit_flags(serve_parser)
    serve_parser.set_defaults(func=serve)
    demo_parser = commands.add_parser(
        "demo", help="the noisy-neighbour demo (or another scenario): Breakwater, naive and fair side by side"
    )
    demo_parser.add_argument("--quiet", action="store_true", help="no progress line")
    demo_parser.add_argument(
        "--configurations",
        type=configuration_names,
        default=None,
        help="comma-separated subset of naive,fair,breakwater (naive: one queue, nobody throttled; fair: "
        "the same with MessageGroupId = tenant, SQS fair queues alone; breakwater: the blueprint). "
        "Default: breakwater,naive for one scenario, all three for --scenario all",
    )
    demo_parser.add_argument(
        "--scenario",
        choices=(*SCENARIOS, "chaos", "all"),
        default="noisy",
        help="noisy: the first tenant sends --noisy-factor x its consumer rate in the burst; slow: it keeps "
        "its rate but its messages cost --slow-factor x the work (its downstream slowed down); outage: "
        "the processor's dependency is down for --outage-seconds after the baseline; poison: the first "
        "tenant sends at its consumer rate and --poison-share of its messages fail every time until the "
        "fix is deployed and the dead-letter queues redriven; chaos: python -m local chaos with its "
        "defaults; all: each in turn (chaos aside)",
    )
    demo_parser.add_argument(
        "--outage-seconds",
        type=bounded(float, 1.0, 600.0),
        default=30.0,
        help="how long the processor's dependency is down (outage scenario)",
    )
    demo_parser.add_argument(
        "--poison-share",
        type=bounded(float, 0.001, 0.5),
        default=0.02,
        help="share of the poison tenant's messages that fail every time (poison scenario)",
    )
    demo_parser.add_argument(
        "--slow-factor",
        type=bounded(float, 1.0, 100.0),
        default=20.0,
        help="how much more each of the slow tenant's messages costs during the burst (slow scenario)",
    )
    demo_parser.add_argument(
        "--phases",
        choices=("together", "spread"),
        default="together",
        help="tenants' first sends: all at t=0 (default, in phase) or spread at random over a period",
    )
    demo_parser.add_argument("--phase-seed", type=int, default=1, help="the seed of --phases spread")
    demo_parser.add_argument(
        "--tenants", type=bounded(int, 2, 100), default=20, help="tenants, the first one noisy (2 to 100)"
    )
    demo_parser.add_argument(
        "--quiet-rate",
        type=bounded(float, 0.01, 5.0),
        default=0.5,
        help="messages/s of each quiet tenant (the noisy one outside its burst too)",
    )
    demo_parser.add_argument(
        "--noisy-factor",
        type=bounded(float, 1.0, 50.0),
        default=10.0,
        help="the noisy tenant's burst, as a multiple of the tier's consumer rate",
    )
    for phase, default in (("baseline", 15.0), ("burst", 20.0), ("after", 25.0)):
        demo_parser.add_argument(
            f"--{phase}-seconds",
            type=bounded(float, 1.0, 600.0),
            default=default,
            help=f"length of the {phase} phase",
        )
    add_limit_flags(demo_parser)
    demo_parser.set_defaults(func=demo)
    add_chaos_parser(commands)
    return parser


def add_chaos_parser(commands: Any) -> None:
    chaos_parser = commands.add_parser(
        "chaos",
        help="faults injected under a keyed load; checks nothing was lost, done twice or unexpected",
        description="Every fault kind at its rate (0 turns it off) while a bounded open-loop load of "
        "uniquely keyed messages runs; then a drain and a check of the request log against the "
        "processor's effects and the dead-letter queues. Report: out/chaos/report.json. Exit status 1 "
        "when the check fails or a fault kind that was on was never injected.",
    )
    chaos_parser.add_argument("--quiet", action="store_true", help="no progress line")
    chaos_parser.add_argument(
        "--messages", type=bounded(int, 1, 100_000), default=1000, help="messages to send (each its key)"
    )
    chaos_parser.add_argument("--tenants", type=bounded(int, 1, 100), default=4, help="tenants sending")
    chaos_parser.add_argument(
        "--rate", type=bounded(float, 0.1, 500.0), default=40.0, help="messages/s, all tenants together"
    )
    chaos_parser.add_argument(
        "--seed", type=int, default=1, help="which messages and answers the faults pick"
    )
    chaos_parser.add_argument(
        "--visibility-seconds",
        type=bounded(int, 1, 5),
        default=3,
        help="the consumed queues' visibility timeout, below the worker's 8 s timeout",
    )
    chaos_parser.add_argument(
        "--drain-seconds",
        type=bounded(float, 1.0, 3600.0),
        default=120.0,
        help="at most this long after the load for the queues to empty",
    )
    for flag, field, default, text in CHAOS_FAULTS:
        chaos_parser.add_argument(
            flag, dest=field, type=bounded(float, 0.0, 1.0), default=default, help=f"{text} (0 to 1)"
        )
    add_limit_flags(chaos_parser)
    chaos_parser.set_defaults(func=chaos)


if __name__ == "__main__":
    sys.exit(main())
