"""Writes a benchmark's results as a markdown file (and prints it)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def write_report(
    path: Path, title: str, facts: Sequence[str], header: Sequence[str], aligns: str,
    rows: Sequence[Sequence[str]],
) -> str:
    """``facts`` become a bullet list; ``aligns`` has one character per column: l or r."""
    rule = ["---:" if a == "r" else "---" for a in aligns]
    lines = [f"# {title}", "", *(f"- {fact}" for fact in facts), "",
             "| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |",
             *("| " + " | ".join(row) + " |" for row in rows), ""]
    text = "\n".join(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text)
    return text
