"""Synthesize the CDK app in-process: the same template and assets ``cdk deploy`` uploads."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CloudAssembly:
    """The synthesized stack: its template, and the file assets (path -> bucket and key) it references."""

    directory: Path
    stack_name: str
    template: dict[str, Any]

    @property
    def template_path(self) -> Path:
        return self.directory / f"{self.stack_name}.template.json"

    @property
    def assets(self) -> dict[str, Any]:
        manifest = self.directory / f"{self.stack_name}.assets.json"
        return dict(json.loads(manifest.read_text(encoding="utf-8")).get("files", {}))

    def resources(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {
            logical_id: resource
            for logical_id, resource in self.template.get("Resources", {}).items()
            if resource.get("Type") == resource_type
        }


def synthesize(outdir: Path, context: dict[str, Any] | None = None, stage: str = "dev") -> CloudAssembly:
    """``app.build_app(context)``'s stack of ``stage`` synthesized into ``outdir``; ``context`` is
    deep-merged over cdk.json's (the stage's own settings then apply on top)."""
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")
    import app as cdk_app  # the CDK entry point; imported late, it loads jsii (a node process)

    outdir.mkdir(parents=True, exist_ok=True)
    built = cdk_app.build_app(context=context, outdir=str(outdir), stages=[stage])
    built.synth()
    stack_name = cdk_app.stack_id(stage)
    template = json.loads((outdir / f"{stack_name}.template.json").read_text(encoding="utf-8"))
    return CloudAssembly(directory=outdir, stack_name=stack_name, template=template)
