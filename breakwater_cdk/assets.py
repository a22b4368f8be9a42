"""Where the construct's Lambda and Glue code comes from, installed from the wheel or in a checkout.

The wheel ships the runtime library as the top-level package ``breakwater`` (the processor contract a
user's code imports) and the handlers and the replay job as this package's data (``handlers/``,
``glue_jobs/``); in a checkout they are ``functions/`` and ``glue_jobs/`` beside this package.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import breakwater

PACKAGE = Path(__file__).resolve().parent
RUNTIME_LIBRARY = Path(breakwater.__file__).resolve().parent
VERSION = breakwater.__version__
PY_EXCLUDE = shutil.ignore_patterns("__pycache__", "*.pyc")


def _shipped(name: str, checkout: str) -> Path:
    inside = PACKAGE / name
    return inside if inside.is_dir() else PACKAGE.parent / checkout


HANDLERS = _shipped("handlers", "functions")  # one directory per handler: <name>/handler.py
GLUE_JOBS = _shipped("glue_jobs", "glue_jobs")


def stage_runtime_layer() -> Path:
    """The layer's tree: ``python/breakwater/``, on the functions' path as Lambda mounts layers."""
    staging = Path(tempfile.mkdtemp(prefix="breakwater-runtime-layer-"))
    shutil.copytree(RUNTIME_LIBRARY, staging / "python" / "breakwater", ignore=PY_EXCLUDE)
    return staging


def stage_replay_library() -> Path:
    """``breakwater/`` and ``glue_jobs/`` side by side: the tree of the replay job's ``--extra-py-files``.

    CDK zips a directory asset itself (no Docker); staging gives the zip the two top-level packages
    the job imports, as ``ReplayArgs``' local runner ships them (``ship_runtime_library``).
    """
    staging = Path(tempfile.mkdtemp(prefix="breakwater-replay-lib-"))
    shutil.copytree(RUNTIME_LIBRARY, staging / "breakwater", ignore=PY_EXCLUDE)
    shutil.copytree(GLUE_JOBS, staging / "glue_jobs", ignore=PY_EXCLUDE)
    return staging
