#!/usr/bin/env python3
"""The example app: one stack per stage of cdk.json, each holding one ``Breakwater`` construct.

cdk.json's ``breakwater`` object holds the settings every stage shares; ``breakwater_stages`` lists
the stages (``dev``, ``prod``, or any list), each with the settings it changes on top of them.
``python app.py`` (or ``cdk synth``) synthesizes every stage into ``CDK_OUTDIR``; ``-c stage=prod``
only that one. Tests and the embedded runtime call :func:`build_app` in-process with context
overrides and the stages they want; an invalid config raises
:class:`breakwater_cdk.config.ConfigError` naming key and value.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aws_cdk as cdk

from breakwater_cdk import Breakwater, Processor
from breakwater_cdk.config import CONTEXT_KEY, ConfigError, load_config
from breakwater_cdk.nag import apply_nag_packs

ROOT = Path(__file__).resolve().parent
STAGES_KEY = "breakwater_stages"
DEFAULT_STAGE = "dev"  # what the embedded AWS deploys and the tests synthesize
# The example's processor: its own directory, outside the construct library (processor/sample.py).
PROCESSOR = Processor(directory=ROOT / "processor", handler="sample.process")


def stack_id(stage: str) -> str:
    return f"Breakwater-{stage}"


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


def stage_settings(app: cdk.App) -> dict[str, dict[str, Any]]:
    """Each stage's settings: its own ``breakwater_stages`` entry merged over the shared ``breakwater``."""
    shared = app.node.try_get_context(CONTEXT_KEY) or {}
    stages = app.node.try_get_context(STAGES_KEY) or {DEFAULT_STAGE: {}}
    if not isinstance(stages, dict) or not all(isinstance(value, dict) for value in stages.values()):
        raise ConfigError(f"{STAGES_KEY} must map each stage's name to its settings, not {stages!r}")
    return {stage: merge_context(shared, overrides) for stage, overrides in stages.items()}


def build_app(
    context: dict[str, Any] | None = None, outdir: str | None = None, stages: Sequence[str] | None = None
) -> cdk.App:
    """The app with one stack per stage: ``stages``, else the context's ``stage``, else every stage.

    ``context`` is merged over cdk.json's context, e.g. ``{"breakwater": {"mode": "naive"}}``.
    """
    app = cdk.App(context=merge_context(cdk_json_context(), context or {}), outdir=outdir)
    settings = stage_settings(app)
    chosen = app.node.try_get_context("stage")
    wanted = list(stages) if stages is not None else [chosen] if chosen else list(settings)
    for stage in wanted:
        if stage not in settings:
            raise ConfigError(f"stage {stage!r} is not in cdk.json's {STAGES_KEY} ({', '.join(settings)})")
        stack = cdk.Stack(
            app,
            stack_id(stage),
            description=f"Breakwater ({stage}): multitenant async ingest that never builds insurmountable "
            "queue backlogs",
        )
        Breakwater(
            stack, "Breakwater", config=load_config(settings[stage]), processor=PROCESSOR, output_prefix=""
        )
    apply_nag_packs(app)
    return app


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
