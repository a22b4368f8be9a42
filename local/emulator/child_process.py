"""Start one of this repository's modules as a child process that talks over its stdin and stdout."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_module(module: str, env: Mapping[str, str]) -> subprocess.Popen[str]:
    """``python -m module`` with this interpreter, from the repository's root, ``ROOT`` first on its path.

    Its stdin and stdout are text pipes (its protocol with the parent); stderr is inherited.
    """
    path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(  # noqa: S603 - this interpreter and a module of this repository
        [sys.executable, "-m", module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONPATH": path},
        cwd=ROOT,
    )
