#!/usr/bin/env python3
"""CDK entry point: load the blueprint's config from context, build the Breakwater stack, run cdk-nag.

``python app.py`` (or ``cdk synth``) synthesizes into ``CDK_OUTDIR`` (a temporary directory when it is
not set). Tests and the embedded runtime call :func:`build_app` to synthesize in-process with
context overrides; an invalid config raises :class:`breakwater_cdk.config.ConfigError` naming key and value.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk

# The stack reads the runtime library's request models to generate the API's body schemas.
sys.path.insert(0, str(Path(__file__).resolve().parent / "functions"))

from breakwater_cdk.breakwater_stack import BreakwaterStack
from breakwater_cdk.config import CONTEXT_KEY, ConfigError, load_config
from breakwater_cdk.nag import acknowledge_findings, apply_nag_packs

ROOT = Path(__file__).resolve().parent
STACK_ID = "Breakwater"


def cdk_json_context() -> dict[str, Any]:
    """The ``context`` of cdk.json: the CLI passes it to the app, an in-process ``App()`` does not see it."""
    context = json.loads((ROOT / "cdk.json").read_text(encoding="utf-8")).get("context", {})
    return dict(context)


def merge_context(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` over ``base``: objects merge key by key; a ``None`` value removes the key."""
    merged = dict(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_context(merged[key], value)
        else:
            merged[key] = value
    return merged


def build_app(context: dict[str, Any] | None = None, outdir: str | None = None) -> cdk.App:
    """The app with the Breakwater stack.

    ``context`` is merged over cdk.json's context, e.g. ``{"breakwater": {"mode": "naive"}}``.
    """
    app = cdk.App(context=merge_context(cdk_json_context(), context or {}), outdir=outdir)
    config = load_config(app.node.try_get_context(CONTEXT_KEY))
    stack = BreakwaterStack(
        app,
        STACK_ID,
        config=config,
        description="Breakwater: multitenant async ingest that never builds insurmountable queue backlogs",
    )
    check_resource_count(stack)
    apply_nag_packs(app)
    acknowledge_findings(stack)
    return app


MAX_STACK_RESOURCES = 500  # CloudFormation's limit per stack


def check_resource_count(stack: BreakwaterStack) -> None:
    """A stack CloudFormation would refuse is a config error naming the keys that size it."""
    count = sum(1 for node in stack.node.find_all() if isinstance(node, cdk.CfnResource))
    if count > MAX_STACK_RESOURCES:
        config = stack.config
        raise ConfigError(
            f"the stack would have {count} resources; CloudFormation allows {MAX_STACK_RESOURCES} per stack. "
            f"Lower breakwater.queue_set.size ({config.queue_set.size}, each live queue adds about 8) "
            f"or breakwater.ordered.queue_count ({config.ordered.queue_count})"
        )


def main() -> int:
    try:
        app = build_app()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
