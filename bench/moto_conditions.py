"""moto's DynamoDB condition parse: each time (moto 5.2.5) against cached by text (its patch).

    .venv/bin/python bench/moto_conditions.py [--calls 3000]

Parses the conditions the runtime's token buckets and leases send, each call with new values (as a
request brings them), through ``moto.dynamodb.comparisons.get_filter_expression``: what moto runs
for every ``ConditionExpression`` and ``FilterExpression``. Prints one figure per line: the best of
three rounds, in microseconds per parse, and whether both ways built the same condition.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONDITIONS_PATCH = "dynamodb.conditions_parsed_once"
sys.path[:0] = [str(ROOT)]

CONDITIONS: tuple[tuple[str, dict[str, str]], ...] = (
    (
        "attribute_exists(pk) AND full_at BETWEEN :now AND :latest AND #m = :mult AND version = :v",
        {"#m": "m"},
    ),
    ("attribute_not_exists(version)", {}),
    ("attribute_not_exists(pk) OR (expires_at < :now AND holder <> :me)", {}),
)


def values(expression: str, call: int) -> dict[str, dict[str, str]]:
    """The values ``expression`` uses, new for each ``call`` (as each request brings its own)."""
    every = {
        ":now": {"N": str(1_767_225_600_000 + call)},
        ":latest": {"N": str(1_767_225_601_000 + call)},
        ":mult": {"N": "1"},
        ":v": {"N": str(call)},
        ":me": {"S": f"container-{call % 6}"},
    }
    return {name: value for name, value in every.items() if name in expression}


def per_parse_us(calls: int) -> float:
    from moto.dynamodb.comparisons import get_filter_expression

    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for call in range(calls):
            expression, names = CONDITIONS[call % len(CONDITIONS)]
            get_filter_expression(expression, names, values(expression, call))
        best = min(best, (time.perf_counter() - started) / calls * 1e6)
    return best


def built(expression: str, names: dict[str, str], call: int) -> str:
    from moto.dynamodb.comparisons import get_filter_expression

    return repr(get_filter_expression(expression, names, values(expression, call)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    from local.emulator import moto_patches

    moto_patches.uninstall(names={CONDITIONS_PATCH})
    each_time = per_parse_us(args.calls)
    reference: list[Any] = [built(e, n, call) for call in range(5) for e, n in CONDITIONS]
    moto_patches.install(names={CONDITIONS_PATCH})
    cached = per_parse_us(args.calls)
    same = reference == [built(e, n, call) for call in range(5) for e, n in CONDITIONS]
    print(f"moto_conditions.each_time_us_per_parse = {each_time:.1f}")
    print(f"moto_conditions.cached_us_per_parse = {cached:.1f}")
    print(f"moto_conditions.speedup = {each_time / cached:.1f}")
    print(f"moto_conditions.same_conditions_built = {same}")


if __name__ == "__main__":
    main()
