"""``python -m local serve`` keeps the blueprint up; ``python -m local demo`` runs the demo."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "functions"))  # the runtime library (tenants), as bin/tenants does

DEMO_TENANTS = ("acme", "globex", "initech")


def serve(args: argparse.Namespace) -> int:
    from local.emulator.runtime import LocalRuntime, RuntimeOptions
    from local.scenarios.scenario import create_tenants

    context = {"breakwater": {"mode": "naive"}} if args.naive else None
    runtime = LocalRuntime(context=context, options=RuntimeOptions(schedule_speedup=args.schedule_speedup))
    print("synthesizing the app and creating the stack in the embedded AWS ...", flush=True)
    runtime.start()
    try:
        keys = create_tenants(runtime, list(DEMO_TENANTS))
        assert runtime.api is not None
        endpoint = {"url": runtime.api.url, "tenants": keys, "aws_endpoint": runtime.aws.endpoint}
        out = ROOT / "out" / "endpoint.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(endpoint, indent=1), encoding="utf-8")
        summary = runtime.summary()
        print(
            json.dumps(
                {k: summary[k] for k in ("functions", "mappings", "schedules", "moto_skipped")}, indent=1
            )
        )
        print(f"\nAPI: {runtime.api.url}v1/messages   (AWS endpoint for tools: {runtime.aws.endpoint})")
        for tenant, key in keys.items():
            print(f"  {tenant}: {key}")
        print(
            f"\nwrote {out}. Try:\n  curl -s -X POST {runtime.api.url}v1/messages -H 'Authorization: Bearer "
            f'{keys[DEMO_TENANTS[0]]}\' -d \'{{"type": "hello", "payload": {{}}}}\'\nCtrl-C stops.',
            flush=True,
        )
        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        with contextlib.suppress(KeyboardInterrupt):
            stopped.wait()
    finally:
        runtime.stop()
    return 0


def demo(args: argparse.Namespace) -> int:
    from local.scenarios import demo as demo_module
    from local.scenarios.scenario import Scenario

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
