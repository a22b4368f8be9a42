"""Rows of figures printed in columns, one per configuration: the embedded scenarios' and the
simulator's comparison tables."""

from __future__ import annotations

from collections.abc import Sequence


def aligned(names: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]]) -> str:
    """A header of ``names``, then each row's label and its cells (one per name), right-aligned."""
    width = max(len(label) for label, _ in rows)
    cols = [max(len(name), *(len(cells[i]) for _, cells in rows)) for i, name in enumerate(names)]
    lines = [" " * width + "  " + "  ".join(name.rjust(cols[i]) for i, name in enumerate(names))]
    for label, cells in rows:
        lines.append(
            label.ljust(width) + "  " + "  ".join(cell.rjust(cols[i]) for i, cell in enumerate(cells))
        )
    return "\n".join(lines)
