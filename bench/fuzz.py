"""The long fuzzing run of the front door: Schemathesis against the emulated API, thousands of requests.

It runs the test suite's own Schemathesis test (``tests/local/test_api_fuzz.py``: the published OpenAPI
document, the real authorizer and handlers behind the emulated API Gateway) with more examples per
route and generation mode, counts every generated request's answer by route and status, and prints
them. The goal: at least 2,000 generated requests and no failure (no 5xx, every 4xx a JSON body naming
the problem, every answer as the document says).

    python bench/fuzz.py                      # 800 examples per route and mode
    python bench/fuzz.py --max-examples 1000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "out" / "bench" / "fuzz.json"
GOAL_REQUESTS = 2000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-examples", type=int, default=800, help="per route and generation mode")
    args = parser.parse_args(argv)
    if args.max_examples < 1:
        parser.error(f"--max-examples must be at least 1, not {args.max_examples}")

    OUT.parent.mkdir(parents=True, exist_ok=True)
    answers_file = OUT.with_name("fuzz-answers.json")
    answers_file.unlink(missing_ok=True)
    env = {
        **os.environ,
        "BREAKWATER_FUZZ_MAX_EXAMPLES": str(args.max_examples),
        "BREAKWATER_FUZZ_ANSWERS": str(answers_file),
        "PYTHONPATH": os.pathsep.join(filter(None, ["functions", ".", os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/local/test_api_fuzz.py",
        "-k",
        "generated",
    ]
    started = time.time()
    result = subprocess.run(command, cwd=ROOT, env=env, check=False)  # noqa: S603 - our own test run
    wall_s = time.time() - started
    answers: Counter[str] = Counter(json.loads(answers_file.read_text()) if answers_file.exists() else {})
    requests = sum(answers.values())
    by_status: Counter[str] = Counter()
    for key, count in answers.items():
        by_status[key.rsplit(" ", 1)[1]] += count
    server_errors = sum(count for status, count in by_status.items() if status.startswith("5"))
    met = result.returncode == 0 and requests >= GOAL_REQUESTS and server_errors == 0
    report = {
        "max_examples": args.max_examples,
        "generated_requests": requests,
        "answers_by_status": dict(sorted(by_status.items())),
        "answers_by_route_and_status": dict(sorted(answers.items())),
        "server_errors": server_errors,
        "test_failed": result.returncode != 0,
        "wall_s": round(wall_s, 1),
        "goal": f">= {GOAL_REQUESTS} generated requests, no failure",
        "met": met,
    }
    OUT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    statuses = dict(sorted(by_status.items()))
    print(f"\ngenerated requests: {requests} in {wall_s:.0f} s; answers by status: {statuses}")
    failures = "yes (see the pytest output above)" if result.returncode else "none"
    print(f"failures: {failures}; 5xx: {server_errors}")
    print(f"goal ({report['goal']}): {'met' if met else 'NOT met'}; report: {OUT.relative_to(ROOT)}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
