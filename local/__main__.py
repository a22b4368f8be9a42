"""``python -m local serve`` keeps the blueprint up; ``python -m local demo`` runs the demo."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "functions"))  # the runtime library (tenants), as bin/tenants does


def serve(args: argparse.Namespace) -> int:
    from local.scenarios.serve import serve as serve_stack

    return serve_stack(naive=args.naive, schedule_speedup=args.schedule_speedup)


def demo(args: argparse.Namespace) -> int:
    from local.scenarios import demo as demo_module
    from local.scenarios.noisy_neighbour import Scenario

    demo_module.main(Scenario(phases=args.phases, phase_seed=args.phase_seed), progress=not args.quiet)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m local", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the blueprint on moto and keep it up")
    serve_parser.add_argument(
        "--naive", action="store_true", help="the naive configuration (one queue, no limits)"
    )
    serve_parser.add_argument(
        "--schedule-speedup", type=float, default=1.0, help="run schedules N times as often"
    )
    serve_parser.set_defaults(func=serve)
    demo_parser = commands.add_parser("demo", help="the noisy-neighbour demo, Breakwater vs naive")
    demo_parser.add_argument("--quiet", action="store_true", help="no progress line")
    demo_parser.add_argument(
        "--phases",
        choices=("together", "spread"),
        default="together",
        help="tenants' first sends: all at t=0 (default, in phase) or spread at random over a period",
    )
    demo_parser.add_argument("--phase-seed", type=int, default=1, help="the seed of --phases spread")
    demo_parser.set_defaults(func=demo)
    args = parser.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
