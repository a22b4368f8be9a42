"""Start one of this repository's modules as a child process that talks over its stdin and stdout.

The load clients' handshake: the child says :data:`READY` once its imports are done, then reads one
JSON request line (:func:`start_ready_child`, :func:`read_request`), so the parent starts its clock
only when the child can act on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
READY = "ready"


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


def start_ready_child(module: str, what: str) -> subprocess.Popen[str]:
    """:func:`start_module` with ``functions/`` on its path, returned once it said :data:`READY`."""
    child = start_module(module, {**os.environ, "PYTHONPATH": str(ROOT / "functions")})
    assert child.stdout is not None
    if child.stdout.readline().strip() != READY:  # its imports done: what it runs can start on time
        child.kill()
        status = child.wait()
        raise RuntimeError(f"{what} did not start (exit status {status})")
    return child


def read_request() -> dict[str, Any]:
    """In the child: say :data:`READY`, read the parent's request line, and lower this process's
    priority by its ``nice``."""
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    request: dict[str, Any] = json.loads(sys.stdin.readline())
    if request.get("nice"):
        os.nice(int(request["nice"]))
    return request
