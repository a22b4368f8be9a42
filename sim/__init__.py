"""A discrete-event simulator of Breakwater at seed scale: the blueprint's own policy code in virtual time."""

import sys
from pathlib import Path

# The runtime library (``breakwater``) lives in functions/, as the Lambda asset ships it.
_FUNCTIONS = str(Path(__file__).resolve().parents[1] / "functions")
if _FUNCTIONS not in sys.path:
    sys.path.insert(0, _FUNCTIONS)
