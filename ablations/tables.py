"""Markdown tables for the commands that print them (bench, estimate)."""

from __future__ import annotations

from typing import Iterable, Sequence


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A GitHub markdown table; cells are written with ``str``.

    >>> print(markdown_table(["a", "b"], [[1, "x"]]))
    | a | b |
    |---|---|
    | 1 | x |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
