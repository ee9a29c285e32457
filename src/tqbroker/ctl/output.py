"""Printing what the tools found: ``--format table`` (a header of column names, then aligned
columns, as kafka-topics and kafka-consumer-groups print) or ``--format json`` (a list of
objects, one per row, keyed by the column names in lower case, ``_`` for ``-``).

In a table, ``true``/``false`` for booleans, ``-`` for what is unknown (Kafka's way), compact
JSON for arguments and other tables; JSON output keeps the values as they are.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

FORMATS = ("table", "json")


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def key(column: str) -> str:
    """A column's key in JSON: ``CURRENT-OFFSET`` is ``current_offset``."""
    return column.lower().replace("-", "_")


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned columns under their names (the last column not padded)."""
    shown = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(row[i]) for row in shown]) for i, c in enumerate(columns)]
    lines = []
    for row in [list(columns), *shown]:
        padded = [text.ljust(widths[i]) for i, text in enumerate(row[:-1])]
        lines.append("  ".join([*padded, row[-1]]) if row else "")
    return "\n".join(lines)


def emit(
    style: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    out: TextIO | None = None,
) -> None:
    """Print ``rows`` in ``style``."""
    out = out or sys.stdout
    if style == "json":
        keys = [key(c) for c in columns]
        records: list[Mapping[str, Any]] = [dict(zip(keys, row, strict=True)) for row in rows]
        print(json.dumps(records, ensure_ascii=False), file=out)
    else:
        print(table(columns, rows), file=out)
